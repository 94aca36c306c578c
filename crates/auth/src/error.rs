use std::path::PathBuf;

/// Why a token was refused or key material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Well-formed and correctly signed, but past its `exp`.
    #[error("token expired")]
    Expired,
    /// Malformed, badly signed, wrong issuer/audience, not yet valid, or missing claims.
    #[error("invalid token: {0}")]
    Invalid(String),
    #[error("token algorithm {0} is not allowed")]
    AlgorithmNotAllowed(String),
    #[error("no key with kid {kid:?} in the identity provider's key set")]
    UnknownKey { kid: Option<String> },
    #[error("identity-provider key set unavailable: {0}")]
    Jwks(String),
    #[error("invalid identity-provider configuration: {0}")]
    Config(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: secret file is malformed ({reason})")]
    BadSecret { path: PathBuf, reason: &'static str },
    #[error("signing failed: {0}")]
    Signing(jsonwebtoken::errors::Error),
}

impl Error {
    /// Maps a jsonwebtoken verification failure: expiry is told apart, the rest is `Invalid`.
    pub(crate) fn from_jwt(e: jsonwebtoken::errors::Error) -> Self {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::ExpiredSignature => Error::Expired,
            K::InvalidAlgorithm => Error::Invalid("algorithm does not match the key".into()),
            K::InvalidSignature => Error::Invalid("bad signature".into()),
            K::InvalidIssuer => Error::Invalid("wrong issuer".into()),
            K::InvalidAudience => Error::Invalid("wrong audience".into()),
            K::ImmatureSignature => Error::Invalid("not valid yet (nbf)".into()),
            K::MissingRequiredClaim(c) => Error::Invalid(format!("missing claim {c}")),
            _ => Error::Invalid(format!("malformed token ({e})")),
        }
    }
}
