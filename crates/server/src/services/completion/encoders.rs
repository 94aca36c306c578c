//! What the embedding and rerank routes share: a model table row of an encoder model resolved
//! ([`EncoderEntry`]: its weights, device, price and engine limits), loaded on its first request,
//! and the one way such a request is paid for ([`charged`]: priced per token read, held, run,
//! settled at the same price; released when the engine refuses or the client goes away).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hearth_billing::Price;
use hearth_embed::{Encode, Engine, EngineConfig, Precision, StatsSnapshot};
use hearth_infer::DeviceSpec;
use hearth_store::LedgerMeta;
use serde_json::{Map, Value};
use tokio::sync::OnceCell;
use tracing::warn;

use super::CompletionState;
use crate::error::ApiError;
use crate::model_table::{self, RawDefaults, RawEncoderModel, TableError};

/// How an encoder model is read from its folder (onto the CPU or a GPU, at a precision).
pub type Loader<M> = fn(&Path, Option<usize>, Precision) -> hearth_embed::Result<M>;

/// One `[embedding."id"]` or `[rerank."id"]` row, resolved.
pub struct EncoderEntry<M: Encode> {
    pub id: String,
    pub gpu: Option<usize>,
    pub price: Price,
    /// Inputs (texts, or documents to rank) in one request at most.
    pub max_inputs: usize,
    weights: PathBuf,
    precision: Precision,
    engine_config: EngineConfig,
    load: Loader<M>,
    /// Loaded on the first request (a model a table names but nobody uses costs nothing).
    engine: OnceCell<Result<Engine<M>, String>>,
}

impl<M: Encode> EncoderEntry<M> {
    /// The model's engine, loading it first if no request has yet.
    pub async fn engine(&self) -> Result<&Engine<M>, ApiError> {
        let loaded = self
            .engine
            .get_or_init(|| async {
                let (dir, gpu, config, load, precision) = (
                    self.weights.clone(),
                    self.gpu,
                    self.engine_config.clone(),
                    self.load,
                    self.precision,
                );
                let id = self.id.clone();
                tokio::task::spawn_blocking(move || {
                    load(&dir, gpu, precision)
                        .map(|m| Engine::start(m, config))
                        .map_err(|e| {
                            warn!(model = %id, error = %e, "the model failed to load");
                            e.to_string()
                        })
                })
                .await
                .unwrap_or_else(|e| Err(format!("loading panicked: {e}")))
            })
            .await;
        loaded
            .as_ref()
            .map_err(|why| ApiError::gateway(format!("model {} is unavailable: {why}", self.id)))
    }
}

/// Every row of one encoder kind, by id.
pub struct EncoderModels<M: Encode> {
    models: BTreeMap<String, Arc<EncoderEntry<M>>>,
}

impl<M: Encode> Default for EncoderModels<M> {
    fn default() -> Self {
        EncoderModels {
            models: BTreeMap::new(),
        }
    }
}

impl<M: Encode> EncoderModels<M> {
    pub fn ids(&self) -> impl Iterator<Item = &String> {
        self.models.keys()
    }

    pub fn get(&self, id: &str) -> Option<&Arc<EncoderEntry<M>>> {
        self.models.get(id)
    }

    /// The row a request names, if it may take `count` inputs (`field` and `noun` name them in
    /// the refusal): 404 `model_not_found`, or 400.
    pub fn admit(
        &self,
        model: &str,
        count: usize,
        field: &str,
        noun: &str,
    ) -> Result<Arc<EncoderEntry<M>>, ApiError> {
        let entry = self
            .get(model)
            .cloned()
            .ok_or_else(|| super::openai::model_not_found(model))?;
        if count > entry.max_inputs {
            return Err(ApiError::invalid_request(
                field,
                format!(
                    "{count} {noun}; at most {} in one request",
                    entry.max_inputs
                ),
            ));
        }
        Ok(entry)
    }

    /// The counters of each model loaded so far.
    pub fn stats(&self) -> Vec<(String, StatsSnapshot)> {
        self.models
            .iter()
            .filter_map(|(id, m)| match m.engine.get() {
                Some(Ok(engine)) => Some((id.clone(), engine.stats().snapshot())),
                _ => None,
            })
            .collect()
    }

    /// The `section` rows of the table read from `path`; a row that names no `precision` runs
    /// at `precision`.
    pub fn resolve(
        rows: &BTreeMap<String, RawEncoderModel>,
        defaults: &RawDefaults,
        path: &Path,
        section: &'static str,
        load: Loader<M>,
        precision: Precision,
    ) -> Result<Self, TableError> {
        let mut models = BTreeMap::new();
        for (id, m) in rows {
            let invalid = |message: String| TableError::Invalid {
                path: path.to_path_buf(),
                section,
                id: id.clone(),
                message,
            };
            let price =
                super::catalog::per_million("input_price_per_million", &m.input_price_per_million)
                    .map_err(invalid)?;
            let gpu = match super::catalog::device(&m.device, defaults).map_err(invalid)? {
                DeviceSpec::Cpu => None,
                DeviceSpec::Cuda(n) => Some(n),
            };
            let precision = match &m.precision {
                Some(p) => p.parse().map_err(invalid)?,
                None => precision,
            };
            let positive = |key: &str, v: Option<usize>, default: usize| match v {
                Some(0) => Err(invalid(format!("{key} must be at least 1"))),
                v => Ok(v.unwrap_or(default)),
            };
            let defaults = EngineConfig::default();
            let entry = EncoderEntry {
                id: id.clone(),
                gpu,
                price,
                max_inputs: positive("max_inputs", m.max_inputs, 2048)?,
                weights: model_table::relative_to(path, Path::new(&m.weights)),
                precision,
                engine_config: EngineConfig {
                    max_batch_tokens: positive(
                        "max_batch_tokens",
                        m.max_batch_tokens,
                        defaults.max_batch_tokens,
                    )?,
                    max_queued: positive("max_queued", m.max_queued, defaults.max_queued)?,
                    ..defaults
                },
                load,
                engine: OnceCell::new(),
            };
            models.insert(id.clone(), Arc::new(entry));
        }
        Ok(EncoderModels { models })
    }
}

/// A request body's object, every key one of `known` (else 400 naming it), and its non-empty
/// `model`.
pub fn object_and_model<'a>(
    body: &'a Value,
    known: &[&str],
) -> Result<(&'a Map<String, Value>, String), ApiError> {
    let object = body
        .as_object()
        .ok_or_else(|| ApiError::invalid_request("body", "must be a JSON object"))?;
    if let Some(key) = object.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::invalid_request(key, "unknown field"));
    }
    let model = match object.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => {
            return Err(ApiError::invalid_request(
                "model",
                "must be a non-empty string",
            ))
        }
        None => return Err(ApiError::invalid_request("model", "is required")),
    };
    Ok((object, model))
}

/// An encoder model's refusal, at the edge (`field` names what the request gave).
pub fn refusal(e: hearth_embed::Error, field: &str) -> ApiError {
    use hearth_embed::Error as E;
    match e {
        E::TooLong { .. } | E::Empty { .. } | E::UnknownToken { .. } | E::Tokenize(_) => {
            ApiError::invalid_request(field, e)
        }
        E::Busy { .. } | E::Stopped => ApiError::overloaded(e.to_string(), RETRY_AFTER),
        E::Load { .. } => ApiError::gateway(e.to_string()),
        E::Model(_) | E::Decoder(_) => ApiError::internal(e),
    }
}

/// When a refused client should try again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs `work` paid for: `tokens` at the entry's price held from `user` first, settled at the
/// same price when it succeeds, given back (before the answer, so a balance read after it has
/// the funds back) when it fails. Dropped unsettled (the client gone), the hold is released.
pub async fn charged<M: Encode, T>(
    cs: &CompletionState,
    user: &str,
    entry: &EncoderEntry<M>,
    tokens: usize,
    reason: &str,
    field: &str,
    work: impl std::future::Future<Output = hearth_embed::Result<T>>,
) -> Result<T, ApiError> {
    let margin = cs.app.billing.margin(None);
    let cost = entry
        .price
        .cost(tokens as u64, margin)
        .map_err(ApiError::from)?;
    let meta = LedgerMeta {
        reason: format!("{reason} {}", entry.id),
        developer_id: None,
        application_id: None,
    };
    let hold = cs
        .app
        .billing
        .hold(user, cost, meta)
        .await
        .map_err(ApiError::from)?;
    match work.await {
        Ok(out) => {
            hold.settle(cost).await.map_err(ApiError::from)?;
            Ok(out)
        }
        Err(e) => {
            if let Err(release) = hold.release().await {
                warn!(error = %release, "releasing the hold of a refused request failed");
            }
            Err(refusal(e, field))
        }
    }
}
