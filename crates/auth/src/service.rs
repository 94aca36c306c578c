//! Hearth's own service tokens.

use chrono::{DateTime, Duration, TimeZone, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::Error;

/// The claims of a service token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceClaims {
    pub iss: String,
    pub aud: String,
    /// The user id.
    pub sub: String,
    pub jti: String,
    pub iat: i64,
    pub exp: i64,
    /// Whether the user is a marketing account (copied from the identity token at issue).
    #[serde(default)]
    pub mkt: bool,
}

impl ServiceClaims {
    pub fn expires_at(&self) -> DateTime<Utc> {
        Utc.timestamp_opt(self.exp, 0).single().unwrap_or_default()
    }
}

/// A freshly issued token and what the issuer needs to remember about it.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub token: String,
    pub jti: String,
    pub expires_at: DateTime<Utc>,
}

/// Issues and verifies service tokens with one HS256 key.
pub struct ServiceTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    issuer: String,
    audience: String,
}

impl std::fmt::Debug for ServiceTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceTokens")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

impl ServiceTokens {
    pub fn new(secret: &[u8], issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            issuer: issuer.into(),
            audience: audience.into(),
        }
    }

    /// Issues a token for `user_id` valid for `lifetime` from now.
    pub fn issue(
        &self,
        user_id: &str,
        is_marketing: bool,
        lifetime: Duration,
    ) -> Result<IssuedToken, Error> {
        self.issue_at(Utc::now(), user_id, is_marketing, lifetime)
    }

    /// Issues a token as if it were `now` (tests use a past `now` to make expired tokens).
    pub fn issue_at(
        &self,
        now: DateTime<Utc>,
        user_id: &str,
        is_marketing: bool,
        lifetime: Duration,
    ) -> Result<IssuedToken, Error> {
        let expires_at = now + lifetime;
        let claims = ServiceClaims {
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            sub: user_id.to_string(),
            jti: uuid::Uuid::new_v4().to_string(),
            iat: now.timestamp(),
            exp: expires_at.timestamp(),
            mkt: is_marketing,
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(Error::Signing)?;
        Ok(IssuedToken {
            token,
            expires_at: claims.expires_at(),
            jti: claims.jti,
        })
    }

    fn validation(&self, check_exp: bool) -> Validation {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = 0;
        v.validate_exp = check_exp;
        v
    }

    /// Verifies signature, issuer, audience and expiry. Expiry is reported as [`Error::Expired`]
    /// only for a correctly signed token; anything else wrong is [`Error::Invalid`].
    pub fn verify(&self, token: &str) -> Result<ServiceClaims, Error> {
        let data =
            jsonwebtoken::decode::<ServiceClaims>(token, &self.decoding, &self.validation(true))
                .map_err(Error::from_jwt)?;
        // jsonwebtoken accepts `exp == now`; a token is dead from its expiry second on.
        if data.claims.exp <= Utc::now().timestamp() {
            return Err(Error::Expired);
        }
        Ok(data.claims)
    }

    /// Like [`verify`](Self::verify) but accepts an expired token (logout of an expired token).
    pub fn verify_ignoring_expiry(&self, token: &str) -> Result<ServiceClaims, Error> {
        jsonwebtoken::decode::<ServiceClaims>(token, &self.decoding, &self.validation(false))
            .map(|d| d.claims)
            .map_err(Error::from_jwt)
    }

    /// Signs and verifies a throwaway token: proves the key material works (health checks).
    pub fn self_check(&self) -> Result<(), Error> {
        let t = self.issue("health-check", false, Duration::seconds(60))?;
        self.verify(&t.token).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> ServiceTokens {
        ServiceTokens::new(b"0123456789abcdef0123456789abcdef", "hearth-test", "hearth")
    }

    #[test]
    fn issued_token_verifies_with_its_claims() {
        let t = tokens();
        let issued = t.issue("alice", true, Duration::seconds(600)).unwrap();
        let claims = t.verify(&issued.token).unwrap();
        assert_eq!(claims.sub, "alice");
        assert!(claims.mkt);
        assert_eq!(claims.jti, issued.jti);
        assert_eq!(claims.exp - claims.iat, 600);
    }

    #[test]
    fn expired_token_is_told_apart_from_a_bad_one() {
        let t = tokens();
        let past = Utc::now() - Duration::hours(2);
        let issued = t
            .issue_at(past, "alice", false, Duration::seconds(60))
            .unwrap();
        assert!(matches!(t.verify(&issued.token), Err(Error::Expired)));
        assert_eq!(
            t.verify_ignoring_expiry(&issued.token).unwrap().sub,
            "alice"
        );
        let other =
            ServiceTokens::new(b"another-secret-another-secret-xx", "hearth-test", "hearth");
        let forged = other.issue("alice", false, Duration::seconds(60)).unwrap();
        assert!(matches!(t.verify(&forged.token), Err(Error::Invalid(_))));
    }

    #[test]
    fn token_for_another_audience_is_refused() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let other = ServiceTokens::new(secret, "hearth-test", "someone-else");
        let issued = other.issue("alice", false, Duration::seconds(60)).unwrap();
        assert!(matches!(
            tokens().verify(&issued.token),
            Err(Error::Invalid(_))
        ));
    }
}
