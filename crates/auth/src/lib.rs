//! Tokens: Hearth's own service tokens (HS256 JWTs with issuer, audience, `jti`, `iat`, `exp`)
//! and verification of identity-provider tokens, either the built-in `shared-secret` provider
//! (HS256 with a secret kept in the data dir; `hearth idp mint` makes its tokens) or `oidc`
//! (RS256/ES256/EdDSA ID tokens checked against a cached JWKS from a file or a URL).
//!
//! This crate serves no HTTP and keeps no state beyond key material and a JWKS cache: whether a
//! token was revoked is the store's business, and mapping errors to statuses the server's.

mod error;
mod idp;
mod oidc;
mod secret;
mod service;

pub use error::Error;
pub use idp::{
    IdentityProvider, IdpIdentity, SharedSecretIdp, SHARED_SECRET_AUDIENCE, SHARED_SECRET_ISSUER,
};
pub use oidc::{JwksSource, OidcConfig, OidcIdp};
pub use secret::{load_or_create_secret, new_secret, token_id};
pub use service::{IssuedToken, ServiceClaims, ServiceTokens};

pub use jsonwebtoken::Algorithm;

pub type Result<T, E = Error> = std::result::Result<T, E>;
