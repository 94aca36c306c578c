//! The authentication service's configuration: token lifetimes, issuer and audience, the
//! identity provider (shared secret or OIDC).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{addr, invalid, origin_of, public_url, string_or_list, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
    /// `shared-secret` (default) or `oidc`.
    pub identity_provider: Option<String>,
    pub token_lifetime_default_secs: Option<i64>,
    pub token_lifetime_min_secs: Option<i64>,
    pub token_lifetime_max_secs: Option<i64>,
    /// `iss` of issued service tokens.
    pub issuer: Option<String>,
    /// `aud` of issued service tokens.
    pub audience: Option<String>,
    /// Origins `/ui?callback=` may redirect to, besides Hearth's own services and `allowed_origins`.
    #[serde(default, deserialize_with = "string_or_list")]
    pub callback_origins: Option<Vec<String>>,
    #[serde(default)]
    pub oidc: RawOidcConfig,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOidcConfig {
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub jwks_file: Option<PathBuf>,
    pub jwks_url: Option<String>,
    #[serde(default, deserialize_with = "string_or_list")]
    pub algorithms: Option<Vec<String>>,
    pub marketing_claim: Option<String>,
    pub cache_ttl_secs: Option<u64>,
    pub refetch_min_interval_secs: Option<u64>,
    pub leeway_secs: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub addr: SocketAddr,
    /// Base URL others use to reach this service; `None`: `http://` + the bound address.
    pub public_url: Option<String>,
    pub identity_provider: IdpChoice,
    pub token_lifetime_default_secs: i64,
    pub token_lifetime_min_secs: i64,
    pub token_lifetime_max_secs: i64,
    pub issuer: String,
    pub audience: String,
    pub callback_origins: Vec<String>,
}

/// Which identity provider verifies `idpToken`.
#[derive(Debug, Clone)]
pub enum IdpChoice {
    SharedSecret,
    Oidc(hearth_auth::OidcConfig),
}

impl RawAuthConfig {
    pub(super) fn resolve(&self) -> Result<AuthConfig, ConfigError> {
        let min = self.token_lifetime_min_secs.unwrap_or(60);
        let max = self.token_lifetime_max_secs.unwrap_or(30 * 24 * 3600);
        let default = self.token_lifetime_default_secs.unwrap_or(3600);
        if min < 1 || min > max {
            return Err(invalid(
                "auth.token_lifetime_min_secs",
                "must be at least 1 and at most the maximum",
            ));
        }
        if !(min..=max).contains(&default) {
            return Err(invalid(
                "auth.token_lifetime_default_secs",
                format!("must lie within {min}..={max}"),
            ));
        }
        let callback_origins = self.callback_origins.clone().unwrap_or_default();
        for o in &callback_origins {
            if origin_of(o).is_none() {
                return Err(invalid(
                    "auth.callback_origins",
                    format!("{o:?} is not an origin like https://app.example.com"),
                ));
            }
        }
        let identity_provider = match self.identity_provider.as_deref().unwrap_or("shared-secret") {
            "shared-secret" => IdpChoice::SharedSecret,
            "oidc" => IdpChoice::Oidc(self.oidc.resolve()?),
            other => {
                return Err(invalid(
                    "auth.identity_provider",
                    format!("{other:?}: expected \"shared-secret\" or \"oidc\""),
                ))
            }
        };
        Ok(AuthConfig {
            addr: addr("auth.addr", &self.addr, "127.0.0.1:8081")?,
            public_url: public_url("auth.public_url", &self.public_url)?,
            identity_provider,
            token_lifetime_default_secs: default,
            token_lifetime_min_secs: min,
            token_lifetime_max_secs: max,
            issuer: self.issuer.clone().unwrap_or_else(|| "hearth".into()),
            audience: self
                .audience
                .clone()
                .unwrap_or_else(|| "hearth-services".into()),
            callback_origins,
        })
    }
}

impl RawOidcConfig {
    pub(super) fn resolve(&self) -> Result<hearth_auth::OidcConfig, ConfigError> {
        use hearth_auth::{Algorithm, JwksSource};
        let issuer = self.issuer.clone().ok_or_else(|| {
            invalid(
                "auth.oidc.issuer",
                "required with identity_provider = \"oidc\"",
            )
        })?;
        let audience = self.audience.clone().ok_or_else(|| {
            invalid(
                "auth.oidc.audience",
                "required with identity_provider = \"oidc\"",
            )
        })?;
        let jwks = match (&self.jwks_file, &self.jwks_url) {
            (Some(f), None) => JwksSource::File(f.clone()),
            (None, Some(u)) => {
                url::Url::parse(u).map_err(|e| invalid("auth.oidc.jwks_url", e))?;
                JwksSource::Url(u.clone())
            }
            _ => {
                return Err(invalid(
                    "auth.oidc",
                    "set exactly one of jwks_file and jwks_url",
                ))
            }
        };
        let names = self
            .algorithms
            .clone()
            .unwrap_or_else(|| vec!["RS256".into(), "ES256".into(), "EdDSA".into()]);
        let mut algorithms = Vec::new();
        for name in &names {
            let alg = Algorithm::from_str(name).map_err(|_| {
                invalid(
                    "auth.oidc.algorithms",
                    format!("unknown algorithm {name:?}"),
                )
            })?;
            if matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
                return Err(invalid(
                    "auth.oidc.algorithms",
                    format!("{name} is symmetric; only public-key algorithms are allowed"),
                ));
            }
            algorithms.push(alg);
        }
        Ok(hearth_auth::OidcConfig {
            issuer,
            audience,
            jwks,
            algorithms,
            marketing_claim: self
                .marketing_claim
                .clone()
                .unwrap_or_else(|| "marketing".into()),
            cache_ttl: std::time::Duration::from_secs(self.cache_ttl_secs.unwrap_or(3600)),
            refetch_min_interval: std::time::Duration::from_secs(
                self.refetch_min_interval_secs.unwrap_or(30),
            ),
            leeway_secs: self.leeway_secs.unwrap_or(30),
        })
    }
}
