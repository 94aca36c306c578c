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

use crate::service::Service;

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

/// Everything that can be set, all optional; see hearth.example.toml for each key.
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
    pub kernel: Option<String>,
    #[serde(default)]
    pub auth: RawAuthConfig,
    #[serde(default)]
    pub completion: RawCompletionConfig,
    #[serde(default)]
    pub markdown: RawMarkdownConfig,
    #[serde(default)]
    pub imagine: RawImagineConfig,
    #[serde(default)]
    pub loading: RawLoadingConfig,
    #[serde(default)]
    pub billing: RawBillingConfig,
    #[serde(default)]
    pub server: crate::serve::RawServerConfig,
    #[serde(default)]
    pub store: RawStoreConfig,
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
        let schema = serde_json::to_value(RawConfig::default()).unwrap_or_default();
        if let Some(message) = misspelt_key(&schema, &json, "") {
            return Err(parse(message));
        }
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
                    // A key that takes a string gets the text as it is, even when it reads
                    // as a number (`HEARTH_BILLING_INITIAL_BALANCE=100`).
                    if !slot.is_string() && check::<RawConfig>("", layer.clone()).is_err() {
                        set_at(&mut layer, &path, Value::String(value.clone()));
                    }
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

/// The first key of `layer` that `schema` (the serialized default `RawConfig`) does not know,
/// when a known key is close to it: `[auth] adr: unknown key; the closest is addr`, the form the
/// model table's refusals take. A key with nothing close is left to serde, whose message lists
/// the keys known there.
fn misspelt_key(schema: &Value, layer: &Value, table: &str) -> Option<String> {
    let (Some(known), Some(given)) = (schema.as_object(), layer.as_object()) else {
        return None;
    };
    for (key, value) in given {
        match known.get(key) {
            Some(inner) => {
                let path = if table.is_empty() {
                    key.clone()
                } else {
                    format!("{table}.{key}")
                };
                if let Some(message) = misspelt_key(inner, value, &path) {
                    return Some(message);
                }
            }
            None => {
                let near = closest(key, known.keys().map(String::as_str))?;
                let place = if table.is_empty() {
                    key.clone()
                } else {
                    format!("[{table}] {key}")
                };
                return Some(format!("{place}: unknown key; the closest is {near}"));
            }
        }
    }
    None
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

/// Every configuration key, as dotted paths (`auth.oidc.jwks_url`), in declaration order.
pub fn keys() -> Vec<String> {
    fn walk(value: &Value, prefix: &str, out: &mut Vec<String>) {
        let Some(obj) = value.as_object() else {
            return;
        };
        for (k, v) in obj {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if v.is_object() {
                walk(v, &path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &serde_json::to_value(RawConfig::default()).unwrap_or_default(),
        "",
        &mut out,
    );
    out
}

/// The `HEARTH_*` variable that sets `key` (`auth.oidc.jwks_url` -> `HEARTH_AUTH_OIDC_JWKS_URL`).
pub fn env_name(key: &str) -> String {
    format!("HEARTH_{}", key.replace('.', "_").to_ascii_uppercase())
}

/// The variable of the configuration key closest to the unknown variable `name` (by edit
/// distance), to suggest in the warning about it.
pub fn closest_env_name(name: &str) -> Option<String> {
    let names: Vec<String> = keys().iter().map(|k| env_name(k)).collect();
    closest(name, names.iter().map(String::as_str)).map(str::to_string)
}

/// The known name closest to the unknown `name`, if one is close: within a third of its length
/// in edit distance (at least 2), the first of equals. The one suggestion rule of every
/// configuration file and variable (`hearth.toml`'s variables, `models.toml`'s keys).
pub fn closest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let within = (name.len() / 3).max(2);
    known
        .into_iter()
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|&(distance, _)| distance <= within)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance over bytes (names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(x != y));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Puts `value` at `path` in the object `root` (the path exists).
fn set_at(root: &mut Value, path: &[String], value: Value) {
    let mut slot = root;
    for segment in path {
        slot = &mut slot[segment.as_str()];
    }
    *slot = value;
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
    /// The CPU kernel path the fast text backend is asked for (`HEARTH_KERNEL`, for A/B runs);
    /// `None`: the best the CPU has.
    pub kernel: Option<hearth_infer::KernelPath>,
    pub auth: AuthConfig,
    pub completion: CompletionConfig,
    pub markdown: MarkdownConfig,
    pub imagine: ImagineConfig,
    pub loading: LoadingConfig,
    pub billing: BillingConfig,
    pub server: crate::serve::ServerConfig,
    pub store: StoreConfig,
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
            None => Service::ALL.to_vec(),
            Some(list) => {
                let mut out = Vec::new();
                for name in list {
                    let s = Service::from_str(name).map_err(|e| invalid("services", e))?;
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
        let kernel = match self.kernel.as_deref().map(str::trim) {
            None => None,
            Some(name) => Some(hearth_infer::KernelPath::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = hearth_infer::KernelPath::ALL.map(|p| p.name()).into();
                invalid(
                    "kernel",
                    format!("{name:?}: expected one of {}", names.join(", ")),
                )
            })?),
        };
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
            kernel,
            auth: self.auth.resolve()?,
            completion: self.completion.resolve()?,
            markdown: self.markdown.resolve()?,
            imagine: self.imagine.resolve()?,
            loading: self.loading.resolve()?,
            billing: self.billing.resolve()?,
            server: self.server.resolve()?,
            store: self.store.resolve()?,
        })
    }
}

mod auth;
mod billing;
mod completion;
mod imagine;
mod loading;
mod markdown;
mod store;
pub use auth::{AuthConfig, IdpChoice, RawAuthConfig, RawOidcConfig};
pub use billing::{BillingConfig, RawBillingConfig};
pub use completion::{CompletionConfig, RawCompletionConfig};
pub use imagine::{ImagineConfig, RawImagineConfig};
pub use loading::{HubVars, LoadingConfig, RawLoadingConfig};
pub use markdown::{MarkdownConfig, RawMarkdownConfig};
pub use store::{RawStoreConfig, StoreChoice, StoreConfig};

#[cfg(test)]
mod tests;
