//! OpenID Connect ID tokens verified against a JWKS (from a file or a URL), cached.

use chrono::{TimeZone, Utc};
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

use crate::idp::IdpIdentity;
use crate::{token_id, Error};

/// Where the provider's public keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    File(PathBuf),
    Url(String),
}

/// Settings of the `oidc` identity provider.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    /// Required `iss` of ID tokens.
    pub issuer: String,
    /// Required `aud` (Hearth's client id at the provider).
    pub audience: String,
    pub jwks: JwksSource,
    /// Accepted signature algorithms; only asymmetric ones (RS*, PS*, ES*, EdDSA) may be listed.
    pub algorithms: Vec<Algorithm>,
    /// Boolean claim that marks a marketing account (absent = false).
    pub marketing_claim: String,
    /// Keys are fetched again after this long.
    pub cache_ttl: Duration,
    /// A token with an unknown `kid` triggers a refetch at most this often.
    pub refetch_min_interval: Duration,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

struct Cache {
    keys: Option<JwkSet>,
    fetched_at: Option<Instant>,
}

/// The `oidc` identity provider.
pub struct OidcIdp {
    config: OidcConfig,
    client: reqwest::Client,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for OidcIdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcIdp")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn is_asymmetric(alg: Algorithm) -> bool {
    !matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

impl OidcIdp {
    /// Checks the configuration; keys are loaded on first use.
    pub fn new(config: OidcConfig) -> Result<Self, Error> {
        if config.algorithms.is_empty() {
            return Err(Error::Config("the algorithm allow-list is empty".into()));
        }
        if let Some(alg) = config.algorithms.iter().find(|a| !is_asymmetric(**a)) {
            return Err(Error::Config(format!(
                "{alg:?} is symmetric; only public-key algorithms may verify ID tokens"
            )));
        }
        if config.issuer.is_empty() || config.audience.is_empty() {
            return Err(Error::Config("issuer and audience must be set".into()));
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::Config(format!("http client: {e}")))?;
        Ok(Self {
            config,
            client,
            cache: Mutex::new(Cache {
                keys: None,
                fetched_at: None,
            }),
        })
    }

    async fn fetch(&self) -> Result<JwkSet, Error> {
        let set: JwkSet = match &self.config.jwks {
            JwksSource::File(path) => {
                let text = tokio::fs::read_to_string(path)
                    .await
                    .map_err(|source| Error::Io {
                        path: path.clone(),
                        source,
                    })?;
                serde_json::from_str(&text)
                    .map_err(|e| Error::Jwks(format!("{}: {e}", path.display())))?
            }
            JwksSource::Url(url) => {
                let resp = self
                    .client
                    .get(url)
                    .send()
                    .await
                    .map_err(|e| Error::Jwks(format!("{url}: {e}")))?;
                let resp = resp
                    .error_for_status()
                    .map_err(|e| Error::Jwks(format!("{url}: {e}")))?;
                resp.json()
                    .await
                    .map_err(|e| Error::Jwks(format!("{url}: {e}")))?
            }
        };
        tracing::info!(keys = set.keys.len(), "identity-provider keys loaded");
        Ok(set)
    }

    /// Finds the key for `kid`, loading the set when it is missing or stale and refetching once
    /// (rate-limited) when the kid is unknown, which is how a key rotation is picked up.
    async fn key_for(&self, kid: Option<&str>) -> Result<Jwk, Error> {
        let mut cache = self.cache.lock().await;
        let stale = cache
            .fetched_at
            .is_none_or(|t| t.elapsed() >= self.config.cache_ttl);
        if cache.keys.is_none() || stale {
            match self.fetch().await {
                Ok(set) => {
                    cache.keys = Some(set);
                    cache.fetched_at = Some(Instant::now());
                }
                // A stale set still beats none when the provider is briefly unreachable.
                Err(e) if cache.keys.is_some() => {
                    tracing::warn!(error = %e, "keeping stale identity-provider keys")
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(jwk) = cache.keys.as_ref().and_then(|set| pick(set, kid)) {
            return Ok(jwk);
        }
        let may_refetch = cache
            .fetched_at
            .is_none_or(|t| t.elapsed() >= self.config.refetch_min_interval);
        if may_refetch {
            let set = self.fetch().await?;
            cache.keys = Some(set);
            cache.fetched_at = Some(Instant::now());
            if let Some(jwk) = cache.keys.as_ref().and_then(|set| pick(set, kid)) {
                return Ok(jwk);
            }
        }
        Err(Error::UnknownKey {
            kid: kid.map(str::to_string),
        })
    }

    pub(crate) async fn verify(&self, token: &str, check_exp: bool) -> Result<IdpIdentity, Error> {
        // `alg: none` and unknown algorithms fail to parse here.
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| Error::Invalid(format!("malformed header ({e})")))?;
        if !self.config.algorithms.contains(&header.alg) {
            return Err(Error::AlgorithmNotAllowed(format!("{:?}", header.alg)));
        }
        let jwk = self.key_for(header.kid.as_deref()).await?;
        if let Some(key_alg) = jwk.common.key_algorithm {
            if format!("{key_alg:?}") != format!("{:?}", header.alg) {
                return Err(Error::Invalid(format!(
                    "key is for {key_alg:?}, token says {:?}",
                    header.alg
                )));
            }
        }
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            return Err(Error::Invalid(
                "symmetric keys never verify ID tokens".into(),
            ));
        }
        let key =
            DecodingKey::from_jwk(&jwk).map_err(|e| Error::Jwks(format!("unusable key: {e}")))?;
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.config.issuer]);
        v.set_audience(&[&self.config.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.validate_nbf = true;
        v.validate_exp = check_exp;
        v.leeway = self.config.leeway_secs;
        let claims =
            jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &key, &v)
                .map_err(Error::from_jwt)?
                .claims;
        let subject = match claims.get("sub") {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(Error::Invalid("sub must be a non-empty string".into())),
        };
        let exp = claims
            .get("exp")
            .and_then(serde_json::Value::as_i64)
            .ok_or_else(|| Error::Invalid("exp must be an integer".into()))?;
        let is_marketing = claims
            .get(&self.config.marketing_claim)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        Ok(IdpIdentity {
            subject,
            is_marketing,
            expires_at: Utc.timestamp_opt(exp, 0).single().unwrap_or_default(),
            token_id: token_id(token),
        })
    }
}

/// The key named by `kid`; with no `kid`, the set's only key.
fn pick(set: &JwkSet, kid: Option<&str>) -> Option<Jwk> {
    match kid {
        Some(kid) => set.find(kid).cloned(),
        None if set.keys.len() == 1 => set.keys.first().cloned(),
        None => None,
    }
}
