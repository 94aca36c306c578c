//! Configuration: a [`RawConfig`] (every field optional) is layered from `hearth.toml`, `HEARTH_*`
//! environment variables and command-line flags (later layers win), then resolved once into a
//! [`Config`] where built-in defaults fill every gap. Only `cli` reads the environment; it hands
//! the variables in.
//!
//! Adding a setting to a service is a local edit: a field in its `Raw*Config` section, the same
//! field in its resolved section, and one line in that section's `resolve`. The environment
//! mapping (`HEARTH_<SECTION>_<KEY>`) follows from the struct, nothing else to touch.

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::services::Service;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: &str, message: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        message: message.to_string(),
    }
}

/// A list given either as a TOML/JSON array or as one comma-separated string (handy in env vars).
fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        One(String),
        Many(Vec<String>),
    }
    Ok(Option::<Either>::deserialize(d)?.map(|e| match e {
        Either::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        Either::Many(v) => v,
    }))
}

// ---------------------------------------------------------------------------------------------
// Raw layer

/// Everything that can be set, all optional; see README.md "Configuration" for each key.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub env: Option<String>,
    pub region: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub models: Option<PathBuf>,
    pub max_body_bytes: Option<usize>,
    #[serde(default, deserialize_with = "string_or_list")]
    pub allowed_origins: Option<Vec<String>>,
    #[serde(default, deserialize_with = "string_or_list")]
    pub services: Option<Vec<String>>,
    #[serde(default)]
    pub auth: RawAuthConfig,
    #[serde(default)]
    pub completion: RawCompletionConfig,
    #[serde(default)]
    pub markdown: RawMarkdownConfig,
    #[serde(default)]
    pub imagine: RawImagineConfig,
    #[serde(default)]
    pub billing: RawBillingConfig,
    #[serde(default)]
    pub server: crate::serve::RawServerConfig,
}

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

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompletionConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMarkdownConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
    /// Largest uploaded file in bytes (default 50 MiB).
    pub max_upload_bytes: Option<usize>,
    /// Conversions running at once (default: the number of CPUs).
    pub max_concurrency: Option<usize>,
    /// Seconds one conversion may take (default 30).
    pub time_limit_secs: Option<u64>,
    /// E-mail attachments: `list` (default) or `convert`; a request may ask otherwise.
    pub attachments: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImagineConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBillingConfig {
    /// Decimal string credited to a user when first seen.
    pub initial_balance: Option<String>,
    /// Gross margin (percent, 0 to 99) applied when a request does not override it.
    pub default_margin_percent: Option<String>,
}

/// Layers of raw configuration, lowest first.
#[derive(Debug, Default)]
pub struct Layers {
    merged: Value,
}

fn merge_into(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                if v.is_null() {
                    continue;
                }
                merge_into(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

impl Layers {
    pub fn new() -> Self {
        Self {
            merged: Value::Object(Default::default()),
        }
    }

    /// Adds a layer given as TOML text (a `hearth.toml`); unknown keys are refused.
    pub fn toml(mut self, origin: &str, text: &str) -> Result<Self, ConfigError> {
        let parse = |message: String| ConfigError::Parse {
            origin: origin.to_string(),
            message,
        };
        let value: toml::Value = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
        let json = serde_json::to_value(value).map_err(|e| parse(e.to_string()))?;
        // Check this layer alone so that a typo is reported against its file.
        check::<RawConfig>(origin, json.clone())?;
        merge_into(&mut self.merged, json);
        Ok(self)
    }

    /// Reads and adds the TOML file at `path`.
    pub fn file(self, path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.toml(&path.display().to_string(), &text)
    }

    /// Adds the `HEARTH_*` variables among `vars`. `HEARTH_REGION` sets `region`,
    /// `HEARTH_AUTH_ADDR` sets `[auth] addr`, `HEARTH_AUTH_OIDC_JWKS_URL` sets `[auth.oidc]
    /// jwks_url`. Values are read as TOML values (`8`, `true`, `["a"]`), anything else as a string.
    /// Returns the names of `HEARTH_*` variables that match no key, for the caller to warn about.
    pub fn env(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Self, Vec<String>), ConfigError> {
        let schema = serde_json::to_value(RawConfig::default()).unwrap_or_default();
        let mut layer = Value::Object(Default::default());
        let mut unknown = Vec::new();
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("HEARTH_") else {
                continue;
            };
            let key = rest.to_ascii_lowercase();
            match key_path(&schema, &key) {
                Some(path) => {
                    let mut slot = &mut layer;
                    for segment in &path {
                        slot = slot
                            .as_object_mut()
                            .map(|o| {
                                o.entry(segment.clone())
                                    .or_insert(Value::Object(Default::default()))
                            })
                            .expect("path segments walk objects");
                    }
                    *slot = env_value(&value);
                }
                None => unknown.push(name),
            }
        }
        check::<RawConfig>("environment", layer.clone())?;
        merge_into(&mut self.merged, layer);
        Ok((self, unknown))
    }

    /// Adds a layer built in code (the command-line flags): its `None`s leave lower layers be.
    pub fn raw(mut self, raw: &RawConfig) -> Self {
        merge_into(
            &mut self.merged,
            serde_json::to_value(raw).unwrap_or_default(),
        );
        self
    }

    /// The merged raw configuration.
    pub fn build(self) -> Result<RawConfig, ConfigError> {
        check::<RawConfig>("configuration", self.merged)
    }
}

fn check<T: serde::de::DeserializeOwned>(origin: &str, value: Value) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Parse {
        origin: origin.to_string(),
        message: format!("{}: {}", e.path(), e.inner()),
    })
}

/// Finds the key path of an env-var name (lowercased, without `HEARTH_`) in the schema, where
/// nesting is written with `_`: `auth_oidc_jwks_url` -> `["auth", "oidc", "jwks_url"]`.
fn key_path(schema: &Value, name: &str) -> Option<Vec<String>> {
    let obj = schema.as_object()?;
    if obj.contains_key(name) && !obj[name].is_object() {
        return Some(vec![name.to_string()]);
    }
    for (k, v) in obj {
        if let (Some(rest), true) = (
            name.strip_prefix(k.as_str())
                .and_then(|r| r.strip_prefix('_')),
            v.is_object(),
        ) {
            if let Some(mut tail) = key_path(v, rest) {
                tail.insert(0, k.clone());
                return Some(tail);
            }
        }
    }
    None
}

fn env_value(text: &str) -> Value {
    match toml::from_str::<toml::Table>(&format!("v = {text}")) {
        Ok(mut t) => t
            .remove("v")
            .and_then(|v| serde_json::to_value(v).ok())
            .unwrap_or(Value::String(text.into())),
        Err(_) => Value::String(text.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// Resolved

/// The configuration the server runs with: every default applied, every value checked.
#[derive(Debug, Clone)]
pub struct Config {
    pub env: String,
    pub region: String,
    pub data_dir: PathBuf,
    pub models: PathBuf,
    pub max_body_bytes: usize,
    pub allowed_origins: Vec<String>,
    pub services: Vec<Service>,
    pub auth: AuthConfig,
    pub completion: CompletionConfig,
    pub markdown: MarkdownConfig,
    pub imagine: ImagineConfig,
    pub billing: BillingConfig,
    pub server: crate::serve::ServerConfig,
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

#[derive(Debug, Clone)]
pub struct CompletionConfig {
    pub addr: SocketAddr,
    pub public_url: Option<String>,
}

#[derive(Debug, Clone)]
pub struct MarkdownConfig {
    pub addr: SocketAddr,
    pub public_url: Option<String>,
    pub max_upload_bytes: usize,
    pub max_concurrency: usize,
    pub time_limit: std::time::Duration,
    pub attachments: hearth_markdown::Attachments,
}

#[derive(Debug, Clone)]
pub struct ImagineConfig {
    pub addr: SocketAddr,
    pub public_url: Option<String>,
}

#[derive(Debug, Clone)]
pub struct BillingConfig {
    pub initial_balance: Decimal,
    pub default_margin_percent: Decimal,
}

fn addr(key: &str, raw: &Option<String>, default: &str) -> Result<SocketAddr, ConfigError> {
    let text = raw.as_deref().unwrap_or(default);
    SocketAddr::from_str(text).map_err(|e| {
        invalid(
            key,
            format!("{text:?} is not an address like 127.0.0.1:8081 ({e})"),
        )
    })
}

fn public_url(key: &str, raw: &Option<String>) -> Result<Option<String>, ConfigError> {
    match raw {
        None => Ok(None),
        Some(s) => {
            let url = url::Url::parse(s).map_err(|e| invalid(key, format!("{s:?}: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(invalid(key, "must be an http or https URL"));
            }
            Ok(Some(s.trim_end_matches('/').to_string()))
        }
    }
}

/// Canonical `scheme://host[:port]` of an origin or URL, for comparisons.
pub fn origin_of(text: &str) -> Option<String> {
    let url = url::Url::parse(text).ok()?;
    match url.origin() {
        url::Origin::Tuple(..) => Some(url.origin().ascii_serialization()),
        url::Origin::Opaque(_) => None,
    }
}

fn decimal(key: &str, raw: &Option<String>, default: &str) -> Result<Decimal, ConfigError> {
    let text = raw.as_deref().unwrap_or(default);
    Decimal::from_str(text)
        .map_err(|e| invalid(key, format!("{text:?} is not a decimal number ({e})")))
}

impl RawConfig {
    /// Applies defaults and checks every value.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let services = match &self.services {
            None => crate::services::AVAILABLE.to_vec(),
            Some(list) => {
                let mut out = Vec::new();
                for name in list {
                    let s = Service::from_str(name).map_err(|e| invalid("services", e))?;
                    if !crate::services::AVAILABLE.contains(&s) {
                        return Err(invalid(
                            "services",
                            format!("the {s} service is not part of this build yet"),
                        ));
                    }
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
                if out.is_empty() {
                    return Err(invalid("services", "at least one service must be chosen"));
                }
                out
            }
        };
        let max_body_bytes = self.max_body_bytes.unwrap_or(1024 * 1024);
        if max_body_bytes < 1024 {
            return Err(invalid("max_body_bytes", "must be at least 1024"));
        }
        let allowed_origins = self.allowed_origins.clone().unwrap_or_default();
        for o in &allowed_origins {
            if o != "*" && origin_of(o).is_none() {
                return Err(invalid(
                    "allowed_origins",
                    format!("{o:?} is not an origin like https://example.com"),
                ));
            }
        }
        Ok(Config {
            env: self.env.clone().unwrap_or_else(|| "development".into()),
            region: self.region.clone().unwrap_or_else(|| "local".into()),
            data_dir: self
                .data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("data")),
            models: self
                .models
                .clone()
                .unwrap_or_else(|| PathBuf::from("models.toml")),
            max_body_bytes,
            allowed_origins,
            services,
            auth: self.auth.resolve()?,
            completion: CompletionConfig {
                addr: addr("completion.addr", &self.completion.addr, "127.0.0.1:8082")?,
                public_url: public_url("completion.public_url", &self.completion.public_url)?,
            },
            markdown: MarkdownConfig {
                addr: addr("markdown.addr", &self.markdown.addr, "127.0.0.1:8083")?,
                public_url: public_url("markdown.public_url", &self.markdown.public_url)?,
                max_upload_bytes: match self.markdown.max_upload_bytes.unwrap_or(50 * 1024 * 1024) {
                    0 => return Err(invalid("markdown.max_upload_bytes", "must be at least 1")),
                    n => n,
                },
                max_concurrency: match self.markdown.max_concurrency {
                    Some(0) => {
                        return Err(invalid("markdown.max_concurrency", "must be at least 1"))
                    }
                    Some(n) => n,
                    None => std::thread::available_parallelism()
                        .map(|n| n.get())
                        .unwrap_or(2),
                },
                time_limit: match self.markdown.time_limit_secs.unwrap_or(30) {
                    0 => return Err(invalid("markdown.time_limit_secs", "must be at least 1")),
                    n => std::time::Duration::from_secs(n),
                },
                attachments: match self.markdown.attachments.as_deref() {
                    None => hearth_markdown::Attachments::default(),
                    Some(s) => s.parse().map_err(|e| invalid("markdown.attachments", e))?,
                },
            },
            imagine: ImagineConfig {
                addr: addr("imagine.addr", &self.imagine.addr, "127.0.0.1:8084")?,
                public_url: public_url("imagine.public_url", &self.imagine.public_url)?,
            },
            billing: self.billing.resolve()?,
            server: self.server.resolve()?,
        })
    }
}

impl RawAuthConfig {
    fn resolve(&self) -> Result<AuthConfig, ConfigError> {
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
    fn resolve(&self) -> Result<hearth_auth::OidcConfig, ConfigError> {
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

impl RawBillingConfig {
    fn resolve(&self) -> Result<BillingConfig, ConfigError> {
        let initial_balance = decimal("billing.initial_balance", &self.initial_balance, "10")?;
        if initial_balance < Decimal::ZERO {
            return Err(invalid("billing.initial_balance", "must not be negative"));
        }
        let margin = decimal(
            "billing.default_margin_percent",
            &self.default_margin_percent,
            "0",
        )?;
        if margin < Decimal::ZERO || margin > Decimal::from(99) {
            return Err(invalid(
                "billing.default_margin_percent",
                "must lie within 0 to 99",
            ));
        }
        Ok(BillingConfig {
            initial_balance,
            default_margin_percent: margin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_resolve_to_the_documented_addresses() {
        let c = RawConfig::default().resolve().unwrap();
        assert_eq!(c.auth.addr.to_string(), "127.0.0.1:8081");
        assert_eq!(c.completion.addr.to_string(), "127.0.0.1:8082");
        assert_eq!(c.markdown.addr.to_string(), "127.0.0.1:8083");
        assert_eq!(c.imagine.addr.to_string(), "127.0.0.1:8084");
        assert_eq!(c.auth.token_lifetime_default_secs, 3600);
        assert!(matches!(c.auth.identity_provider, IdpChoice::SharedSecret));
    }

    #[test]
    fn later_layers_win_file_then_env_then_flags() {
        let file = "env = \"staging\"\nregion = \"file\"\n[auth]\naddr = \"127.0.0.1:9000\"\npublic_url = \"https://auth.example\"\n";
        let (layers, unknown) = Layers::new()
            .toml("hearth.toml", file)
            .unwrap()
            .env(env(&[
                ("HEARTH_REGION", "eu-1"),
                ("HEARTH_AUTH_ADDR", "127.0.0.1:9001"),
                ("HEARTH_AUTH_OIDC_LEEWAY_SECS", "5"),
                ("HEARTH_MAX_BODY_BYTES", "4096"),
                (
                    "HEARTH_ALLOWED_ORIGINS",
                    "https://a.example, https://b.example",
                ),
                ("HEARTH_BROWSER_TESTS", "1"),
                ("PATH", "/bin"),
            ]))
            .unwrap();
        let flags = RawConfig {
            auth: RawAuthConfig {
                addr: Some("127.0.0.1:0".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let raw = layers.raw(&flags).build().unwrap();
        assert_eq!(unknown, vec!["HEARTH_BROWSER_TESTS".to_string()]);
        let c = raw.resolve().unwrap();
        assert_eq!(c.env, "staging");
        assert_eq!(c.region, "eu-1");
        assert_eq!(c.auth.addr.to_string(), "127.0.0.1:0");
        assert_eq!(c.auth.public_url.as_deref(), Some("https://auth.example"));
        assert_eq!(c.max_body_bytes, 4096);
        assert_eq!(
            c.allowed_origins,
            vec!["https://a.example", "https://b.example"]
        );
        assert_eq!(raw.auth.oidc.leeway_secs, Some(5));
    }

    #[test]
    fn a_misspelt_key_is_reported_with_its_place() {
        let err = Layers::new()
            .toml("hearth.toml", "[auth]\nadress = \"x\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("hearth.toml"), "{err}");
        assert!(err.to_string().contains("adress"), "{err}");
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let raw: RawConfig = toml::from_str("[billing]\ndefault_margin_percent = \"100\"").unwrap();
        assert!(raw
            .resolve()
            .unwrap_err()
            .to_string()
            .starts_with("billing.default_margin_percent"));
        let raw: RawConfig = toml::from_str("services = [\"auth\", \"teleport\"]").unwrap();
        assert!(raw
            .resolve()
            .unwrap_err()
            .to_string()
            .starts_with("services"));
        let raw: RawConfig = toml::from_str("[auth]\nidentity_provider = \"oidc\"\n[auth.oidc]\nissuer = \"i\"\naudience = \"a\"\njwks_file = \"k.json\"\nalgorithms = [\"HS256\"]").unwrap();
        assert!(raw.resolve().unwrap_err().to_string().contains("symmetric"));
    }

    #[test]
    fn the_shipped_example_config_parses_and_resolves() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hearth.example.toml");
        let raw = Layers::new().file(&path).unwrap().build().unwrap();
        raw.resolve().unwrap();
    }
}
