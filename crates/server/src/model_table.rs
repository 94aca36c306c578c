//! The model table (`models.toml`) as a file: one typed raw value for all of it
//! ([`RawModelTable`]: `[defaults]`, `[text."id"]`, `[image."id"]`, `[embedding."id"]`,
//! `[rerank."id"]`), read
//! and deserialized once by `app::start` when a service that serves models runs and kept in
//! `AppState`, from which each service resolves its own part (`completion::catalog` the text
//! rows, `completion::encoders` the embedding and rerank rows, `imagine::catalog` the image
//! rows). Every table in it refuses a key it does not know, naming
//! the key, where it stands (`[defaults] thread`, `[txt."my-model"]`) and the closest known key
//! ([`crate::config::closest`], the rule `hearth.toml`'s variables use too).
//!
//! Adding a model kind (as `[embedding."id"]` was) is one field of [`RawModelTable`] (a map from id
//! to its raw row, a struct with `#[serde(deny_unknown_fields)]`) plus its service's resolver.
//! The unknown-key check needs nothing more: serde hands it the known keys of whatever table
//! refused one.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use hearth_imagine::HubSource;

use crate::models::KeepAlive;
use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, IntoDeserializer, Visitor};
use serde::Deserialize;

/// The whole model table as written: every key optional unless a row cannot do without it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModelTable {
    #[serde(default)]
    pub defaults: RawDefaults,
    #[serde(default)]
    pub text: BTreeMap<String, RawTextModel>,
    #[serde(default)]
    pub image: BTreeMap<String, RawImageModel>,
    #[serde(default)]
    pub embedding: BTreeMap<String, RawEncoderModel>,
    #[serde(default)]
    pub rerank: BTreeMap<String, RawEncoderModel>,
}

/// `[defaults]`: what a row that does not say takes.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    pub device: Option<String>,
    pub threads: Option<usize>,
}

/// A `[text."id"]` row (resolved by `completion::catalog`, which documents each key).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTextModel {
    pub weights: Option<String>,
    pub hf: Option<String>,
    pub file: Option<String>,
    pub revision: Option<String>,
    pub tokenizer: Option<String>,
    pub chat_template: Option<String>,
    pub temperature_max: Option<f32>,
    pub default_temperature: Option<f32>,
    pub max_output_tokens: Option<usize>,
    pub default_max_output_tokens: Option<usize>,
    pub max_input_tokens: Option<usize>,
    pub context_length: Option<usize>,
    pub input_price_per_million: Option<String>,
    pub output_price_per_million: Option<String>,
    pub device: Option<String>,
    pub threads: Option<usize>,
    pub max_active: Option<usize>,
    pub max_queued: Option<usize>,
    pub kv_budget_mb: Option<u64>,
    pub queue_timeout_ms: Option<u64>,
    pub prefill_chunk: Option<usize>,
    pub max_step_tokens: Option<usize>,
    pub gather_window_us: Option<u64>,
    pub shutdown_grace_ms: Option<u64>,
    pub kv_precision: Option<String>,
    pub numerics: Option<String>,
    pub dtype: Option<String>,
    pub prefix_reuse: Option<bool>,
    pub speculative: Option<RawSpeculative>,
    pub keep_alive: Option<KeepAlive>,
    pub pinned: Option<bool>,
}

/// A text row's `speculative = { method = "ngram", ... }` or `{ method = "draft", model = "id" }`
/// (resolved by `completion::catalog`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpeculative {
    pub method: String,
    pub model: Option<String>,
    pub max_draft: Option<usize>,
    pub min_match: Option<usize>,
    pub max_match: Option<usize>,
}

/// An `[image."id"]` row (resolved by `imagine::catalog`, which documents each key).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImageModel {
    pub weights: Option<PathBuf>,
    pub unet_file: Option<PathBuf>,
    pub hf: Option<HubSource>,
    pub tiny_weights: Option<PathBuf>,
    pub price_per_image: String,
    pub guidance_scale: Option<f64>,
    pub default_steps: Option<usize>,
    pub max_steps: Option<usize>,
    pub default_size: Option<usize>,
    pub min_size: Option<usize>,
    pub max_size: Option<usize>,
    pub max_pixels: Option<usize>,
    pub max_queued: Option<usize>,
    pub device: Option<String>,
    pub dtype: Option<String>,
    pub loras: Option<BTreeMap<String, PathBuf>>,
    pub keep_alive: Option<KeepAlive>,
    pub pinned: Option<bool>,
}

/// An `[embedding."id"]` or `[rerank."id"]` row (resolved by `completion::encoders`; the keys
/// are documented by `completion::embeddings` and `completion::rerank`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEncoderModel {
    pub weights: String,
    pub input_price_per_million: String,
    pub device: Option<String>,
    pub precision: Option<String>,
    pub shortens: Option<bool>,
    pub max_inputs: Option<usize>,
    pub max_batch_tokens: Option<usize>,
    pub max_queued: Option<usize>,
    pub keep_alive: Option<KeepAlive>,
    pub pinned: Option<bool>,
}

/// What is wrong with the model table.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML at all.
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    /// A key no table of the file knows where it stands.
    #[error("{path}: {place}: unknown {what}{}", suggestion(.closest, .known))]
    UnknownKey {
        path: PathBuf,
        /// `[defaults] thread`, `[text."m"] weight`, or for a section `[txt."m"]`.
        place: String,
        /// `key` or, for a top-level table, `section txt`.
        what: String,
        closest: Option<&'static str>,
        known: &'static [&'static str],
    },
    /// A value of the wrong type, or a row without a key it needs.
    #[error("{path}: {place}: {message}")]
    Value {
        path: PathBuf,
        place: String,
        message: String,
    },
    /// A row whose values do not resolve (a bad price, limits that contradict).
    #[error("{path}: [{section}.\"{id}\"] {message}")]
    Invalid {
        path: PathBuf,
        section: &'static str,
        id: String,
        message: String,
    },
    #[error("{path}: no [{section}.\"...\"] entry")]
    Empty {
        path: PathBuf,
        section: &'static str,
    },
}

/// `; the closest is threads`, or the keys that are known when none is close.
fn suggestion(closest: &Option<&str>, known: &[&str]) -> String {
    match closest {
        Some(near) => format!("; the closest is {near}"),
        None => format!("; known here: {}", known.join(", ")),
    }
}

/// Reads and parses the table at `path`.
pub fn load(path: &Path) -> Result<RawModelTable, TableError> {
    let text = std::fs::read_to_string(path).map_err(|source| TableError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// Parses table text (read from `path`, which errors name).
pub fn parse(path: &Path, text: &str) -> Result<RawModelTable, TableError> {
    let value: toml::Table = toml::from_str(text).map_err(|e| TableError::Syntax {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let value = toml::Value::Table(value);
    serde_path_to_error::deserialize(Value(&value)).map_err(|e| {
        let keys: Vec<String> = e.path().iter().map(|s| s.to_string()).collect();
        match e.into_inner() {
            Error::UnknownKey { key, known } => {
                let closest = crate::config::closest(&key, known.iter().copied());
                // The path ends at the unknown key; before it, the table that refused it.
                let table = keys.split_last().map_or(&keys[..], |(_, table)| table);
                let (place, what) = match value.get(key.as_str()) {
                    Some(section) if table.is_empty() => top_level(&key, section),
                    _ => (key_place(table, &key), "key".to_string()),
                };
                TableError::UnknownKey {
                    path: path.to_path_buf(),
                    place,
                    what,
                    closest,
                    known,
                }
            }
            Error::Other(message) => TableError::Value {
                path: path.to_path_buf(),
                // A table's own error (a missing key) is placed at the table, a value's at its key.
                place: match keys.split_last() {
                    Some((key, table)) if !is_table(&value, &keys) => key_place(table, key),
                    _ => place(&keys),
                },
                message,
            },
        }
    })
}

/// Whether the value at `keys` under `root` is a table.
fn is_table(root: &toml::Value, keys: &[String]) -> bool {
    keys.iter()
        .try_fold(root, |v, k| v.get(k.as_str()))
        .is_some_and(toml::Value::is_table)
}

/// `[defaults] threads`: a key and the table it stands in (or the key alone at the top level).
fn key_place(table: &[String], key: &str) -> String {
    if table.is_empty() {
        key.to_string()
    } else {
        format!("{} {key}", place(table))
    }
}

/// `[text."alpha-3.3"]` for the path `text`, `alpha-3.3`; a row's id is always quoted, as the
/// shipped table writes it.
fn place(keys: &[String]) -> String {
    match keys {
        [] => "the top level".into(),
        [section] => format!("[{section}]"),
        [section, id, rest @ ..] => {
            let mut out = format!("[{section}.{id:?}");
            for k in rest {
                out.push('.');
                out.push_str(k);
            }
            out.push(']');
            out
        }
    }
}

/// Where an unknown top-level key stands and what it is: `[txt."my-model"]`, a section of rows
/// (named by its first row); `[txt]`, a plain table; or a value at the top level.
fn top_level(key: &str, value: &toml::Value) -> (String, String) {
    let section = format!("section {key}");
    match value.as_table() {
        Some(rows) => match rows.iter().next() {
            Some((id, row)) if row.is_table() => (place(&[key.into(), id.clone()]), section),
            _ => (place(&[key.into()]), section),
        },
        None => (place(&[]), format!("key {key}")),
    }
}

/// The rule every kind's reload follows for the files its rows name: each must exist, else the
/// table is refused (`label` says which key named it, as `loras: ink = `). At start such a row
/// loads and fails, and health says why; on a reload the missing file would replace a running
/// model.
pub fn must_exist(
    table: &Path,
    section: &'static str,
    id: &str,
    label: &str,
    file: &Path,
) -> Result<(), TableError> {
    if file.exists() {
        return Ok(());
    }
    Err(TableError::Invalid {
        path: table.to_path_buf(),
        section,
        id: id.to_string(),
        message: format!("{label}{} does not exist", file.display()),
    })
}

/// `p` as written in the table at `path`: relative paths are relative to the table's folder.
pub fn relative_to(path: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        path.parent().unwrap_or(Path::new(".")).join(p)
    }
}

// ---------------------------------------------------------------------------------------------
// The parsed TOML as a serde deserializer whose error keeps an unknown key typed (toml's own
// error words it as text), so that it can be named and matched to the closest known key.

/// What serde reports while reading the table's values.
#[derive(Debug)]
enum Error {
    UnknownKey {
        key: String,
        known: &'static [&'static str],
    },
    Other(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnknownKey { key, .. } => write!(f, "unknown key {key}"),
            Error::Other(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Error::Other(message.to_string())
    }
    fn unknown_field(key: &str, known: &'static [&'static str]) -> Self {
        Error::UnknownKey {
            key: key.to_string(),
            known,
        }
    }
}

/// One TOML value, deserialized through serde's own value deserializers with [`Error`].
#[derive(Clone, Copy)]
struct Value<'a>(&'a toml::Value);

impl<'de> IntoDeserializer<'de, Error> for Value<'_> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> de::Deserializer<'de> for Value<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            toml::Value::String(s) => visitor.visit_str(s),
            toml::Value::Integer(i) => visitor.visit_i64(*i),
            toml::Value::Float(f) => visitor.visit_f64(*f),
            toml::Value::Boolean(b) => visitor.visit_bool(*b),
            toml::Value::Datetime(d) => visitor.visit_string(d.to_string()),
            toml::Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.iter().map(Value));
                let out = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(out)
            }
            toml::Value::Table(table) => {
                let mut map =
                    MapDeserializer::new(table.iter().map(|(k, v)| (k.as_str(), Value(v))));
                let out = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(out)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            toml::Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        parse(Path::new("/srv/models.toml"), text)
            .unwrap_err()
            .to_string()
    }

    /// A text row and an image row that resolve.
    const BOTH: &str = "[defaults]\ndevice = \"cpu\"\nthreads = 2\n\n\
        [text.\"m\"]\nweights = \"m.gguf\"\ninput_price_per_million = \"1\"\noutput_price_per_million = \"2\"\n\n\
        [image.\"i\"]\nweights = \"sdxl\"\nprice_per_image = \"0.04\"\nhf = { base = \"a/b\" }\n";

    #[test]
    fn a_table_with_both_kinds_parses_once_into_every_section() {
        let t = parse(Path::new("/srv/models.toml"), BOTH).unwrap();
        assert_eq!(t.defaults.threads, Some(2));
        assert_eq!(t.text["m"].weights.as_deref(), Some("m.gguf"));
        assert_eq!(t.image["i"].price_per_image, "0.04");
        assert_eq!(t.image["i"].hf.as_ref().unwrap().base, "a/b");
    }

    #[test]
    fn a_misspelt_defaults_key_is_refused_by_name_with_the_closest() {
        let err = error("[defaults]\nthread = 0\n");
        assert_eq!(
            err,
            "/srv/models.toml: [defaults] thread: unknown key; the closest is threads"
        );
    }

    #[test]
    fn a_misspelt_section_is_refused_by_name_with_the_closest() {
        let err = error(&BOTH.replace("[text.", "[txt."));
        assert_eq!(
            err,
            "/srv/models.toml: [txt.\"m\"]: unknown section txt; the closest is text"
        );
        let err = error("[imgae.x]\nprice_per_image = \"1\"\n");
        assert!(
            err.contains("[imgae.\"x\"]") && err.ends_with("the closest is image"),
            "{err}"
        );
    }

    #[test]
    fn a_misspelt_row_key_is_refused_by_name_with_the_closest() {
        let err = error(&BOTH.replace("input_price_per_million", "input_price_per_milion"));
        assert_eq!(
            err,
            "/srv/models.toml: [text.\"m\"] input_price_per_milion: unknown key; \
             the closest is input_price_per_million"
        );
        let err = error(&BOTH.replace("price_per_image = ", "price_per_imag = "));
        assert_eq!(
            err,
            "/srv/models.toml: [image.\"i\"] price_per_imag: unknown key; the closest is price_per_image"
        );
        // Inside a row's own table too.
        let err = error(&BOTH.replace("base = ", "bse = "));
        assert!(
            err.contains("[image.\"i\".hf] bse: unknown key; the closest is base"),
            "{err}"
        );
    }

    #[test]
    fn a_key_close_to_nothing_is_refused_with_the_keys_known_there() {
        assert_eq!(
            error("[defaults]\ncolour = \"red\"\n"),
            "/srv/models.toml: [defaults] colour: unknown key; known here: device, threads"
        );
        assert_eq!(
            error("threads = 2\n"),
            "/srv/models.toml: the top level: unknown key threads; known here: defaults, text, image, embedding, rerank"
        );
    }

    #[test]
    fn a_wrong_type_or_a_missing_key_names_its_place() {
        assert_eq!(
            error("[defaults]\nthreads = \"two\"\n"),
            "/srv/models.toml: [defaults] threads: invalid type: string \"two\", expected usize"
        );
        assert_eq!(
            error("[image.\"i\"]\nweights = \"w\"\n"),
            "/srv/models.toml: [image.\"i\"]: missing field `price_per_image`"
        );
        let err = error("[text\n");
        assert!(
            err.starts_with("/srv/models.toml: TOML parse error"),
            "{err}"
        );
    }
}
