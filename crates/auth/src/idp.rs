//! Identity providers: what proves who a user is when they ask for a service token.

use chrono::{DateTime, Duration, TimeZone, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::oidc::OidcIdp;
use crate::{token_id, Error};

/// Issuer of the built-in provider's tokens.
pub const SHARED_SECRET_ISSUER: &str = "hearth-idp";
/// Audience of the built-in provider's tokens.
pub const SHARED_SECRET_AUDIENCE: &str = "hearth";

/// Who an identity token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdpIdentity {
    pub subject: String,
    pub is_marketing: bool,
    pub expires_at: DateTime<Utc>,
    /// [`token_id`] of the identity token: ties service tokens to it for logout.
    pub token_id: String,
}

/// The provider chosen in the configuration.
#[derive(Debug)]
pub enum IdentityProvider {
    SharedSecret(SharedSecretIdp),
    Oidc(OidcIdp),
}

impl IdentityProvider {
    pub fn name(&self) -> &'static str {
        match self {
            IdentityProvider::SharedSecret(_) => "shared-secret",
            IdentityProvider::Oidc(_) => "oidc",
        }
    }

    /// Verifies an identity token for sign-in: signature, issuer, audience, expiry, not-before.
    pub async fn verify(&self, token: &str) -> Result<IdpIdentity, Error> {
        match self {
            IdentityProvider::SharedSecret(p) => p.verify(token, true),
            IdentityProvider::Oidc(p) => p.verify(token, true).await,
        }
    }

    /// Verifies an identity token for logout: like [`verify`](Self::verify) but an expired
    /// token is accepted (its sessions may outlive it).
    pub async fn verify_for_logout(&self, token: &str) -> Result<IdpIdentity, Error> {
        match self {
            IdentityProvider::SharedSecret(p) => p.verify(token, false),
            IdentityProvider::Oidc(p) => p.verify(token, false).await,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct SharedClaims {
    iss: String,
    aud: String,
    sub: String,
    iat: i64,
    exp: i64,
    jti: String,
    #[serde(default)]
    marketing: bool,
}

/// The built-in provider: HS256 identity tokens signed with a secret from the data dir.
pub struct SharedSecretIdp {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl std::fmt::Debug for SharedSecretIdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedSecretIdp")
    }
}

impl SharedSecretIdp {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
        }
    }

    /// Makes an identity token for `user`, valid `ttl` from now.
    pub fn mint(&self, user: &str, ttl: Duration, marketing: bool) -> Result<String, Error> {
        self.mint_at(Utc::now(), user, ttl, marketing)
    }

    /// Makes an identity token as if it were `now`.
    pub fn mint_at(
        &self,
        now: DateTime<Utc>,
        user: &str,
        ttl: Duration,
        marketing: bool,
    ) -> Result<String, Error> {
        if user.is_empty() {
            return Err(Error::Invalid("user must not be empty".into()));
        }
        let claims = SharedClaims {
            iss: SHARED_SECRET_ISSUER.into(),
            aud: SHARED_SECRET_AUDIENCE.into(),
            sub: user.into(),
            iat: now.timestamp(),
            exp: (now + ttl).timestamp(),
            jti: uuid::Uuid::new_v4().to_string(),
            marketing,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(Error::Signing)
    }

    fn verify(&self, token: &str, check_exp: bool) -> Result<IdpIdentity, Error> {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_issuer(&[SHARED_SECRET_ISSUER]);
        v.set_audience(&[SHARED_SECRET_AUDIENCE]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = 0;
        v.validate_exp = check_exp;
        let claims = jsonwebtoken::decode::<SharedClaims>(token, &self.decoding, &v)
            .map_err(Error::from_jwt)?
            .claims;
        if check_exp && claims.exp <= Utc::now().timestamp() {
            return Err(Error::Expired);
        }
        Ok(IdpIdentity {
            subject: claims.sub,
            is_marketing: claims.marketing,
            expires_at: Utc
                .timestamp_opt(claims.exp, 0)
                .single()
                .unwrap_or_default(),
            token_id: token_id(token),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn minted_identity_token_verifies_and_carries_marketing() {
        let idp = IdentityProvider::SharedSecret(SharedSecretIdp::new(
            b"s3cret-s3cret-s3cret-s3cret-s3cr",
        ));
        let IdentityProvider::SharedSecret(inner) = &idp else {
            unreachable!()
        };
        let token = inner.mint("alice", Duration::seconds(300), true).unwrap();
        let id = idp.verify(&token).await.unwrap();
        assert_eq!(id.subject, "alice");
        assert!(id.is_marketing);
        assert_eq!(id.token_id, token_id(&token));
    }

    #[tokio::test]
    async fn expired_identity_token_refused_at_sign_in_but_accepted_for_logout() {
        let inner = SharedSecretIdp::new(b"s3cret-s3cret-s3cret-s3cret-s3cr");
        let token = inner
            .mint_at(
                Utc::now() - Duration::hours(1),
                "bob",
                Duration::seconds(60),
                false,
            )
            .unwrap();
        let idp = IdentityProvider::SharedSecret(inner);
        assert!(matches!(idp.verify(&token).await, Err(Error::Expired)));
        assert_eq!(idp.verify_for_logout(&token).await.unwrap().subject, "bob");
    }
}
