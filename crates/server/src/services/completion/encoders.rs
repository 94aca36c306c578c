//! What the embedding and rerank routes share: a model table row of an encoder model resolved
//! ([`EncoderEntry`]: its weights, device, price and engine limits), the rows of one kind with
//! their engines in the shared model registry ([`EncoderModels`]: each loaded on its first
//! request, within the memory budget, unloaded past its keep-alive, swapped by a reload), and
//! the one way such a request is paid for ([`charged`]: priced per token read, held, run,
//! settled at the same price; released when the engine refuses or the client goes away).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hearth_billing::Price;
use hearth_embed::{Encode, Engine, EngineConfig, Precision, StatsSnapshot};
use hearth_infer::DeviceSpec;
use hearth_store::LedgerMeta;
use serde_json::{Map, Value};
use tracing::warn;

use super::CompletionState;
use crate::error::ApiError;
use crate::model_table::{self, RawDefaults, RawEncoderModel, TableError};
use crate::models::{
    Changes, Current, FileStamp, Hub, Keep, KeepAlive, Lease, ModelRow, Models, Need, Place,
    Progress, Served, UnitSpec,
};

/// How an encoder model is read from its folder (onto the CPU or a GPU, at a precision).
pub type ReadWeights<M> = fn(&Path, Option<usize>, Precision) -> hearth_embed::Result<M>;

/// One `[embedding."id"]` or `[rerank."id"]` row, resolved.
pub struct EncoderEntry<M: Encode> {
    pub id: String,
    pub gpu: Option<usize>,
    pub price: Price,
    /// Inputs (texts, or documents to rank) in one request at most.
    pub max_inputs: usize,
    /// Trained so that its vectors may be cut short (`shortens`, embedding rows only).
    pub shortens: bool,
    weights: PathBuf,
    precision: Precision,
    engine_config: EngineConfig,
    keep_alive: Option<KeepAlive>,
    pinned: bool,
    read: ReadWeights<M>,
}

/// An engine in the registry: loaded when a request wants it, stopped when it leaves.
impl<M: Encode> Served for Engine<M> {
    fn unavailable(&self) -> Option<String> {
        // A batch that fails answers its requests with the error; the engine serves on.
        None
    }
    fn in_flight(&self) -> usize {
        // `queued` counts inputs (waiting, or in the pass running), not requests. A request
        // holds its lease until its outputs are back, so this part only tells whether inputs
        // of requests whose clients left are still in the engine: one, until they are gone.
        usize::from(self.stats().queued.load(Ordering::Relaxed) > 0)
    }
    async fn stop(self) {
        // The engine's thread ends, dropping the model, once its last handle is gone.
        let released = self.released();
        drop(self);
        crate::models::until_released(released, "an encoder engine's model").await;
    }
}

/// What makes two encoder engines the same: how the weights load, the engine's limits and the
/// files as they are on disk now.
#[derive(Debug, PartialEq)]
pub struct EncoderKey {
    weights: PathBuf,
    gpu: Option<usize>,
    precision: Precision,
    engine: EngineConfig,
    files: Vec<FileStamp>,
}

/// The rows of one encoder kind, by id, as a table resolves them.
pub struct EncoderRows<M: Encode>(BTreeMap<String, Arc<EncoderEntry<M>>>);

impl<M: Encode> EncoderRows<M> {
    /// Refuses a row whose weights do not exist (a reload that would only fail on use).
    pub fn check_files(&self, path: &Path, section: &'static str) -> Result<(), TableError> {
        for e in self.0.values() {
            model_table::must_exist(path, section, &e.id, "", &e.weights)?;
        }
        Ok(())
    }
}

/// Every row of one encoder kind (swapped whole by a reload) and their engines in the
/// registry. Ids whose rows load the same weights the same way share one engine, with the
/// keep-alive of the first of them.
pub struct EncoderModels<M: Encode> {
    rows: Current<EncoderRows<M>>,
    models: Models<Engine<M>, EncoderKey>,
}

impl<M: Encode> EncoderModels<M> {
    /// A registry of `kind` (`embedding`, `rerank`) on `hub` serving `rows`, each loaded on
    /// its first request.
    pub fn start(kind: &'static str, rows: EncoderRows<M>, hub: &Hub) -> Self {
        let models = EncoderModels {
            rows: Current::new(EncoderRows(BTreeMap::new())),
            models: Models::new(kind, hub),
        };
        models.apply(rows, hub);
        models
    }

    /// Routes `rows`' ids to engines (an engine whose key is unchanged keeps its loaded
    /// model), then serves `rows`: prices and limits apply to the next request.
    pub fn apply(&self, rows: EncoderRows<M>, hub: &Hub) -> Changes {
        let mut specs: Vec<UnitSpec<Engine<M>, EncoderKey>> = Vec::new();
        for entry in rows.0.values() {
            let key = EncoderKey {
                weights: entry.weights.clone(),
                gpu: entry.gpu,
                precision: entry.precision,
                engine: entry.engine_config.clone(),
                files: FileStamp::of(&entry.weights),
            };
            if let Some(same) = specs.iter_mut().find(|s| s.key == key) {
                same.ids.push(entry.id.clone());
                continue;
            }
            let need = Need {
                place: entry.gpu.map_or(Place::Host, Place::Gpu),
                bytes: key.files.iter().map(|f| f.len).sum(),
            };
            let (dir, gpu, precision, config, read) = (
                entry.weights.clone(),
                entry.gpu,
                entry.precision,
                entry.engine_config.clone(),
                entry.read,
            );
            specs.push(UnitSpec {
                ids: vec![entry.id.clone()],
                key,
                load: Arc::new(move |_: &Progress| {
                    read(&dir, gpu, precision)
                        .map(|m| Engine::start(m, config.clone()))
                        .map_err(|e| e.to_string())
                }),
                pull: None,
                need,
                keep: Keep {
                    keep_alive: entry.keep_alive.unwrap_or(hub.config().keep_alive),
                    pinned: entry.pinned,
                },
                // A model a table names but nobody uses costs nothing.
                preload: false,
            });
        }
        let changes = self.models.apply(specs);
        self.rows.replace(rows);
        changes
    }

    pub fn models(&self) -> &Models<Engine<M>, EncoderKey> {
        &self.models
    }

    pub fn rows(&self) -> Vec<ModelRow> {
        self.models.rows()
    }

    /// Each id's state as health reports it (`ready`, `unloaded`, ...).
    pub fn status(&self) -> BTreeMap<String, String> {
        self.models.health()
    }

    pub fn ids(&self) -> Vec<String> {
        self.rows.now().0.keys().cloned().collect()
    }

    pub fn get(&self, id: &str) -> Option<Arc<EncoderEntry<M>>> {
        self.rows.now().0.get(id).cloned()
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

    /// The engine of `entry`, loading it first if it is not loaded; it stays loaded while the
    /// lease lives (hold it until the encode is done). A model that cannot load is a
    /// `GatewayError` "model X is unavailable: why".
    pub async fn lease(&self, entry: &EncoderEntry<M>) -> Result<Lease<Engine<M>>, ApiError> {
        self.models.get(&entry.id).await.map_err(ApiError::from)
    }

    /// The counters of each engine loaded now, under the first of the ids it serves.
    pub fn stats(&self) -> Vec<(String, StatsSnapshot)> {
        let loaded = self.models.all_loaded();
        let mut out: Vec<(String, &Engine<M>)> = Vec::new();
        for (id, engine) in &loaded {
            if !out
                .iter()
                .any(|(_, e)| std::ptr::eq(e.stats(), engine.stats()))
            {
                out.push((id.clone(), engine));
            }
        }
        out.into_iter()
            .map(|(id, e)| (id, e.stats().snapshot()))
            .collect()
    }

    /// The `section` rows of the table read from `path`; a row that names no `precision` runs
    /// at `precision`.
    pub fn resolve(
        rows: &BTreeMap<String, RawEncoderModel>,
        defaults: &RawDefaults,
        path: &Path,
        section: &'static str,
        read: ReadWeights<M>,
        precision: Precision,
    ) -> Result<EncoderRows<M>, TableError> {
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
                shortens: m.shortens == Some(true),
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
                keep_alive: m.keep_alive,
                pinned: m.pinned == Some(true),
                read,
            };
            models.insert(id.clone(), Arc::new(entry));
        }
        Ok(EncoderRows(models))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A model that holds a buffer and answers each input's length.
    struct Counter(Vec<u8>);

    impl Encode for Counter {
        type Output = usize;
        fn encode(&self, inputs: &[&hearth_embed::Tokens]) -> hearth_embed::Result<Vec<usize>> {
            Ok(inputs.iter().map(|t| t.len() + self.0.len()).collect())
        }
    }

    #[tokio::test]
    async fn an_idle_engine_stops_once_its_thread_has_let_the_model_go() {
        let engine = Engine::start(Counter(vec![0; 1 << 20]), EngineConfig::default());
        let released = engine.released();
        assert_eq!(Served::in_flight(&engine), 0);
        assert!(Served::unavailable(&engine).is_none());
        assert!(!released());
        engine.stop().await;
        assert!(
            released(),
            "stop returned while the engine still held the model"
        );
    }
}
