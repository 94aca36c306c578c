//! The text-model table: the `[text."id"]` rows of the parsed `models.toml`
//! ([`RawModelTable`], read once by `model_table`) resolved into what the service needs per model
//! id: the spec's limits and prices ([`TextModelSpec`]), how to load the weights
//! (`hearth_infer::TextModelConfig`) and the scheduler's limits (`SchedulerConfig`).
//!
//! Keys beyond the shipped file (all optional): `default_temperature`,
//! `default_max_output_tokens`, `context_length` (caps the model's own), `max_active`,
//! `max_queued`, `kv_budget_mb`, `queue_timeout_ms`, `prefill_chunk`, `max_step_tokens`,
//! `gather_window_us`, `shutdown_grace_ms`, `prefix_reuse`, `device`, `threads`, `numerics`,
//! `speculative` (`{ method = "ngram", max_draft = 8, min_match = 2, max_match = 4 }`: prompt
//! lookup drafts tokens that one step verifies; `{ method = "draft", model = "id", max_draft = 8 }`:
//! the weights of another row, with the same vocabulary, draft them; `method = "off"` turns it
//! off; see `hearth_scheduler::Speculation`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hearth_billing::Price;
use hearth_infer::{DeviceSpec, TextModelConfig, WeightSource};
use hearth_scheduler::SchedulerConfig;
use rust_decimal::Decimal;

use crate::models::KeepAlive;

/// The spec's limits, the prices and the defaults of one public model id.
#[derive(Debug, Clone, PartialEq)]
pub struct TextModelSpec {
    pub id: String,
    pub temperature_min: f32,
    pub temperature_max: f32,
    pub default_temperature: f32,
    pub max_output_tokens: usize,
    pub default_max_output_tokens: usize,
    pub max_input_tokens: usize,
    /// Caps the loaded model's context length (e.g. to bound KV memory); `None` = the model's.
    pub context_length: Option<usize>,
    pub input_price_per_million: Price,
    pub output_price_per_million: Price,
}

/// One model id fully resolved.
#[derive(Debug, Clone)]
pub struct TextModelEntry {
    pub spec: TextModelSpec,
    pub load: TextModelConfig,
    pub scheduler: SchedulerConfig,
    /// `keep_alive`; `None`: `[loading] keep_alive`.
    pub keep_alive: Option<KeepAlive>,
    /// `pinned`: never unloaded.
    pub pinned: bool,
    /// The model drafting for this one (`speculative = { method = "draft", model = ... }`).
    pub draft: Option<DraftEntry>,
}

/// A draft model: the id of the row whose weights draft, and how that row loads them.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftEntry {
    pub id: String,
    pub load: TextModelConfig,
}

/// Every text model id, in id order.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    models: BTreeMap<String, TextModelEntry>,
}

impl Catalog {
    pub fn new(entries: impl IntoIterator<Item = TextModelEntry>) -> Self {
        Catalog {
            models: entries
                .into_iter()
                .map(|e| (e.spec.id.clone(), e))
                .collect(),
        }
    }
    pub fn ids(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }
    pub fn get(&self, id: &str) -> Option<&TextModelSpec> {
        self.models.get(id).map(|e| &e.spec)
    }
    pub fn entry(&self, id: &str) -> Option<&TextModelEntry> {
        self.models.get(id)
    }
    pub fn entries(&self) -> impl Iterator<Item = &TextModelEntry> {
        self.models.values()
    }
}

/// Default of `maxOutputTokens` when a request leaves it out (capped by the model's maximum).
pub const DEFAULT_MAX_OUTPUT_TOKENS: usize = 512;
/// Default temperature when a request leaves it out (capped by the model's maximum).
pub const DEFAULT_TEMPERATURE: f32 = 0.7;

pub use crate::model_table::TableError as CatalogError;
use crate::model_table::{self, RawDefaults, RawModelTable, RawTextModel};

mod speculative;

/// Parses model-table text as if read from `base/models.toml`.
#[cfg(test)]
pub(crate) fn parse(text: &str, base: &Path) -> Result<Catalog, CatalogError> {
    let path = base.join("models.toml");
    resolve(&model_table::parse(&path, text)?, &path)
}

/// Every `[text."id"]` row of the table read from `path`, resolved.
pub(crate) fn resolve(table: &RawModelTable, path: &Path) -> Result<Catalog, CatalogError> {
    let mut entries = Vec::new();
    let mut drafts = Vec::new();
    for (id, m) in &table.text {
        let (entry, draft) = resolve_row(id, m, &table.defaults, path)?;
        entries.push(entry);
        drafts.push(draft);
    }
    speculative::resolve_drafts(&mut entries, drafts, path)?;
    Ok(Catalog::new(entries))
}

/// That every local file the catalog names is there: a reload refuses a table naming a missing
/// one, so that a typo never takes a running model's place (at start-up the same row loads,
/// fails, and health says why).
pub(crate) fn check_files(catalog: &Catalog, path: &Path) -> Result<(), CatalogError> {
    for e in catalog.entries() {
        let weights = match &e.load.source {
            WeightSource::Local { path } => Some(path),
            _ => None,
        };
        for file in weights.into_iter().chain(&e.load.tokenizer) {
            model_table::must_exist(path, "text", &e.spec.id, "", file)?;
        }
    }
    Ok(())
}

/// A row's price per million tokens, from the decimal string under `key`.
pub(crate) fn per_million(key: &str, v: &str) -> Result<Price, String> {
    let d: Decimal = v
        .trim()
        .parse()
        .map_err(|e| format!("{key} = {v:?}: {e}"))?;
    Price::per_million(d).map_err(|e| format!("{key} = {v:?}: {e}"))
}

/// A row's device: its own `device`, else `[defaults] device`, else the CPU.
pub(crate) fn device(row: &Option<String>, defaults: &RawDefaults) -> Result<DeviceSpec, String> {
    row.as_deref()
        .or(defaults.device.as_deref())
        .unwrap_or("cpu")
        .parse()
}

/// One `[text."id"]` row, with `[defaults]` filling what it leaves out, and the id of the row
/// its `speculative` names as its draft model (which [`resolve`] looks up).
fn resolve_row(
    id: &str,
    m: &RawTextModel,
    defaults: &RawDefaults,
    table: &Path,
) -> Result<(TextModelEntry, Option<String>), CatalogError> {
    let invalid = |message: String| CatalogError::Invalid {
        path: table.to_path_buf(),
        section: "text",
        id: id.to_string(),
        message,
    };
    let price = |key: &str, v: &Option<String>| -> Result<Price, CatalogError> {
        let v = v
            .as_deref()
            .ok_or_else(|| invalid(format!("{key} is required (a decimal string)")))?;
        per_million(key, v).map_err(invalid)
    };
    let source = match (&m.weights, &m.hf) {
        (Some(w), None) => WeightSource::Local {
            path: model_table::relative_to(table, Path::new(w)),
        },
        (None, Some(repo)) => WeightSource::HfHub {
            repo: repo.clone(),
            file: m.file.clone(),
            revision: m.revision.clone(),
        },
        (Some(_), Some(_)) => return Err(invalid("give either weights or hf, not both".into())),
        (None, None) => {
            return Err(invalid(
                "weights (a local path) or hf (a repository) is required".into(),
            ))
        }
    };
    let device = device(&m.device, defaults).map_err(invalid)?;
    let temperature_max = m.temperature_max.unwrap_or(5.0);
    if !(0.0..=5.0).contains(&temperature_max) {
        return Err(invalid(format!(
            "temperature_max must be within 0..=5, got {temperature_max}"
        )));
    }
    let max_output_tokens = m.max_output_tokens.unwrap_or(2048);
    if !(1..=16384).contains(&max_output_tokens) {
        return Err(invalid(format!(
            "max_output_tokens must be within 1..=16384, got {max_output_tokens}"
        )));
    }
    let default_max_output_tokens = m
        .default_max_output_tokens
        .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS)
        .clamp(1, max_output_tokens);
    let default_temperature = m
        .default_temperature
        .unwrap_or(DEFAULT_TEMPERATURE)
        .clamp(0.0, temperature_max);
    let spec = TextModelSpec {
        id: id.to_string(),
        temperature_min: 0.0,
        temperature_max,
        default_temperature,
        max_output_tokens,
        default_max_output_tokens,
        max_input_tokens: m.max_input_tokens.unwrap_or(128_000),
        context_length: m.context_length,
        input_price_per_million: price("input_price_per_million", &m.input_price_per_million)?,
        output_price_per_million: price("output_price_per_million", &m.output_price_per_million)?,
    };
    let kv_precision = parse_or_default(&m.kv_precision).map_err(invalid)?;
    check_numerics(m.numerics.as_deref()).map_err(invalid)?;
    let dtype = parse_or_default(&m.dtype).map_err(invalid)?;
    let load = TextModelConfig {
        source,
        kv_precision,
        dtype,
        tokenizer: m
            .tokenizer
            .as_deref()
            .map(|t| model_table::relative_to(table, Path::new(t))),
        chat_template: m.chat_template.clone(),
        device,
        threads: m.threads.or(defaults.threads).unwrap_or(0),
        ..TextModelConfig::local(PathBuf::new())
    };
    let base_cfg = SchedulerConfig::default();
    let (speculation, draft) = speculative::speculation(m.speculative.as_ref()).map_err(invalid)?;
    let scheduler = SchedulerConfig {
        name: id.to_string(),
        max_active: m.max_active.unwrap_or(base_cfg.max_active),
        max_queued: m.max_queued.unwrap_or(base_cfg.max_queued),
        kv_budget_bytes: m
            .kv_budget_mb
            .map(|mb| mb << 20)
            .unwrap_or(base_cfg.kv_budget_bytes),
        queue_timeout: m
            .queue_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(base_cfg.queue_timeout),
        prefill_chunk: m.prefill_chunk.unwrap_or(base_cfg.prefill_chunk),
        max_step_tokens: m.max_step_tokens.unwrap_or(base_cfg.max_step_tokens),
        gather_window: m
            .gather_window_us
            .map(Duration::from_micros)
            .unwrap_or(base_cfg.gather_window),
        shutdown_grace: m
            .shutdown_grace_ms
            .map(Duration::from_millis)
            .unwrap_or(base_cfg.shutdown_grace),
        prefix_reuse: m.prefix_reuse.unwrap_or(base_cfg.prefix_reuse),
        speculation,
        ..base_cfg
    };
    let entry = TextModelEntry {
        spec,
        load,
        scheduler,
        keep_alive: m.keep_alive,
        pinned: m.pinned.unwrap_or(false),
        draft: None,
    };
    Ok((entry, draft))
}

/// `numerics`: only "fast", the SIMD kernels every build serves with, is accepted (the key is
/// kept so that tables written for it still load). llama.cpp's arithmetic emulated bit for bit
/// is the hearth-infer-parity crate's, which no serving build contains.
fn check_numerics(numerics: Option<&str>) -> Result<(), String> {
    match numerics.map(str::trim) {
        None | Some("fast") => Ok(()),
        Some("ggml") => Err(
            "numerics \"ggml\" (the llama.cpp parity emulator) is not part of \
             the server: it lives in the hearth-infer-parity crate, for tests; use \"fast\" or \
             leave the key out"
                .into(),
        ),
        Some(other) => Err(format!("numerics {other:?}: expected \"fast\"")),
    }
}

/// An optional key parsed by its type's `FromStr` (whose message names the key), or the default.
fn parse_or_default<T: std::str::FromStr<Err = String> + Default>(
    text: &Option<String>,
) -> Result<T, String> {
    text.as_deref()
        .map_or_else(|| Ok(T::default()), |t| t.parse())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table at `path` read and resolved, as the server does at start.
    fn load(path: &Path) -> Result<Catalog, CatalogError> {
        resolve(&model_table::load(path)?, path)
    }

    /// A one-model table with `extra` keys.
    pub(super) fn table(extra: &str) -> String {
        format!("[text.\"alpha-3.3\"]\nweights = \"w.gguf\"\ninput_price_per_million = \"1\"\noutput_price_per_million = \"1\"\n{extra}")
    }

    #[test]
    fn kv_precision_and_numerics_are_read_and_checked() {
        let dir = std::env::temp_dir().join(format!("hearth-kv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("models.toml");
        // The alpha-3.3 row with `keys` added, as loaded from a file.
        let load_with = |keys: &str| {
            std::fs::write(&path, table(keys)).unwrap();
            load(&path).map(|c| c.entry("alpha-3.3").unwrap().load.clone())
        };
        let error = |keys: &str| load_with(keys).unwrap_err().to_string();
        assert_eq!(
            load_with("kv_precision = \"f16\"").unwrap().kv_precision,
            hearth_infer::KvPrecision::F16
        );
        assert_eq!(
            load_with("kv_precision = \"q8_0\"").unwrap().kv_precision,
            hearth_infer::KvPrecision::Q8_0
        );
        assert_eq!(
            load_with("kv_precision = \"q4_0\"").unwrap().kv_precision,
            hearth_infer::KvPrecision::Q4_0
        );
        assert_eq!(
            load_with("").unwrap().kv_precision,
            hearth_infer::KvPrecision::F32
        );
        // The parity emulator is not in serving builds: a model table cannot select it.
        assert!(load_with("numerics = \"fast\"").is_ok());
        let err = error("numerics = \"ggml\"");
        assert!(err.contains("parity"), "{err}");
        let err = error("numerics = \"exact\"");
        assert!(
            err.contains("numerics") && err.contains("alpha-3.3"),
            "{err}"
        );
        let err = error("kv_precision = \"q8\"");
        assert!(
            err.contains("kv_precision") && err.contains("alpha-3.3"),
            "{err}"
        );
        assert_eq!(
            load_with("dtype = \"bf16\"").unwrap().dtype,
            hearth_infer::Dtype::BF16
        );
        assert_eq!(load_with("").unwrap().dtype, hearth_infer::Dtype::Auto);
        let err = error("dtype = \"fp8\"");
        assert!(err.contains("dtype") && err.contains("alpha-3.3"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scheduler_keys_are_read_with_defaults() {
        let base = Path::new("/models");
        let cat = parse(&table("gather_window_us = 0\nmax_step_tokens = 64"), base).unwrap();
        let cfg = &cat.entry("alpha-3.3").unwrap().scheduler;
        assert_eq!(cfg.gather_window, Duration::ZERO);
        assert_eq!(cfg.max_step_tokens, 64);
        let cat = parse(&table(""), base).unwrap();
        let cfg = &cat.entry("alpha-3.3").unwrap().scheduler;
        assert_eq!(cfg.gather_window, SchedulerConfig::default().gather_window);
        assert_eq!(cfg.gather_window, Duration::from_millis(1));
    }

    #[test]
    fn the_shipped_models_toml_resolves_every_spec_model() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models.toml");
        let catalog = load(&path).expect("models.toml parses");
        assert_eq!(
            catalog.ids(),
            ["alpha-3.3", "beta-4-mini", "gamma-3.5-sonnet"]
        );
        let beta = catalog.get("beta-4-mini").unwrap();
        assert_eq!(beta.temperature_max, 2.0);
        assert_eq!(beta.max_output_tokens, 16384);
        assert_eq!(
            beta.input_price_per_million.amount(),
            "0.15".parse::<Decimal>().unwrap()
        );
        let gamma = catalog.entry("gamma-3.5-sonnet").unwrap();
        assert_eq!(gamma.spec.temperature_max, 1.0);
        assert!(gamma
            .load
            .chat_template
            .as_deref()
            .is_some_and(|t| t.contains("<start_of_turn>")));
    }

    #[test]
    fn the_text_rows_of_a_table_with_both_kinds_resolve_with_its_defaults() {
        let path = Path::new("/srv/models.toml");
        let text = format!(
            "[defaults]\nthreads = 3\n\n{}\n[image.a]\nprice_per_image = \"1\"\n",
            table("")
        );
        let raw = model_table::parse(path, &text).unwrap();
        let catalog = resolve(&raw, path).unwrap();
        assert_eq!(catalog.ids(), ["alpha-3.3"]);
        assert_eq!(catalog.entry("alpha-3.3").unwrap().load.threads, 3);
    }

    #[test]
    fn a_bad_price_names_the_model_and_key() {
        let err = parse("[text.m]\nweights = \"x.gguf\"\ninput_price_per_million = \"abc\"\noutput_price_per_million = \"1\"\n", Path::new("."))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("\"m\"") && text.contains("input_price_per_million"),
            "{text}"
        );
    }

    #[test]
    fn defaults_are_capped_by_the_model_row() {
        let c = parse("[text.m]\nweights = \"x.gguf\"\nmax_output_tokens = 100\ntemperature_max = 0.5\ninput_price_per_million = \"1\"\noutput_price_per_million = \"2\"\n", Path::new("/w"))
            .unwrap();
        let e = c.entry("m").unwrap();
        assert_eq!(e.spec.default_max_output_tokens, 100);
        assert_eq!(e.spec.default_temperature, 0.5);
        assert_eq!(
            e.load.source,
            WeightSource::Local {
                path: PathBuf::from("/w/x.gguf")
            }
        );
    }
}
