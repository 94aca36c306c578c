//! One scheduler per distinct set of weights, in the service's model registry ([`Models`]):
//! loaded at start-up when it fits the memory budget, on demand otherwise, and unloaded when idle
//! past its keep-alive. Model ids whose `models.toml` entries load the same weights the same way
//! (alpha-3.3 and beta-4-mini both serve SmolLM2) share one engine, and so one batch: on a small
//! CPU box two engines would only fight over the same cores. The shared engine takes the
//! scheduler limits of the first id in id order.

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_infer::hub::{HubPull, PullProgress};
use hearth_infer::{KernelPath, TextModel, TextModelConfig, WeightSource};
use hearth_scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};

use super::catalog::Catalog;
use crate::config::HubVars;
use crate::models::{
    Changes, FileStamp, Hub, Keep, Lease, ModelError, ModelRow, Models, Need, Progress, Puller,
    Served, UnitSpec,
};

impl Served for SchedulerHandle {
    fn unavailable(&self) -> Option<String> {
        SchedulerHandle::unavailable(self)
    }
    fn in_flight(&self) -> usize {
        SchedulerHandle::in_flight(self)
    }
    async fn stop(self) {
        // Idle when called: nothing is cut short; resolves once the engine thread has exited
        // and dropped the model.
        self.shutdown().await;
    }
}

/// What makes two engines the same: how the weights load (and the draft model's, if one
/// drafts), the scheduler's limits (its name aside) and the files as they are on disk now.
#[derive(Debug, PartialEq)]
pub struct EngineKey {
    load: TextModelConfig,
    draft: Option<TextModelConfig>,
    scheduler: SchedulerConfig,
    files: Vec<FileStamp>,
}

/// The files of a local source as they are now (none for a hub source: its download is checked
/// by hash).
fn stamps(load: &TextModelConfig) -> Vec<FileStamp> {
    match &load.source {
        WeightSource::Local { path } => FileStamp::of(path),
        _ => Vec::new(),
    }
}

/// `load` with a hub source pulled first (reporting to `progress`), then loaded.
fn load_model(
    vars: &HubVars,
    mut load: TextModelConfig,
    progress: &Progress,
) -> Result<TextModel, String> {
    if let Some(source) = hub_source(&load.source) {
        load.source = WeightSource::Local {
            path: download(vars, &source, progress)?,
        };
    }
    TextModel::load(&load).map_err(|e| e.to_string())
}

/// A hub source as a download.
fn hub_source(source: &WeightSource) -> Option<HubPull> {
    match source {
        WeightSource::HfHub {
            repo,
            file,
            revision,
        } => Some(HubPull {
            repo: repo.clone(),
            revision: revision.clone(),
            file: file.clone(),
        }),
        _ => None,
    }
}

/// Downloads `source` through hf-hub from the hub `vars` name, resuming a cut download and
/// checking each file's checksum, reporting to `progress`; its local path.
fn download(
    vars: &HubVars,
    source: &HubPull,
    progress: &Progress,
) -> Result<std::path::PathBuf, String> {
    vars.client()
        .pull(source, &|p: &PullProgress| {
            progress.report(&p.file, p.done, p.total)
        })
        .map_err(|e| e.to_string())
}

pub struct Engines {
    models: Models<SchedulerHandle, EngineKey>,
    retry_after: Duration,
    kernel: Option<KernelPath>,
    /// Where `hf = ...` rows are pulled from.
    pulls: HubVars,
}

impl Engines {
    /// A registry on `hub` serving `catalog` (loading what fits now, in the background). Every
    /// engine tells refused clients to wait `retry_after` (`[completion] retry_after_secs`); the
    /// fast backend runs on `kernel` where the CPU has it (the configuration's `kernel`); hub
    /// rows are pulled from where `pulls` says.
    pub fn start(
        catalog: &Catalog,
        hub: &Hub,
        (retry_after, kernel): (Duration, Option<KernelPath>),
        pulls: HubVars,
    ) -> Engines {
        let engines = Engines {
            models: Models::new("text", hub),
            retry_after,
            kernel,
            pulls,
        };
        engines.apply(catalog, hub);
        engines
    }

    /// Routes the catalog's ids to engines, keeping every engine whose key is unchanged.
    pub fn apply(&self, catalog: &Catalog, hub: &Hub) -> Changes {
        let mut specs: Vec<UnitSpec<SchedulerHandle, EngineKey>> = Vec::new();
        for entry in catalog.entries() {
            let id = entry.spec.id.clone();
            let mut load = entry.load.clone();
            load.kernel = self.kernel;
            let draft = entry.draft.as_ref().map(|d| TextModelConfig {
                kernel: self.kernel,
                ..d.load.clone()
            });
            let mut scheduler = entry.scheduler.clone();
            scheduler.retry_after = self.retry_after;
            let key = EngineKey {
                files: [Some(&load), draft.as_ref()]
                    .into_iter()
                    .flatten()
                    .flat_map(stamps)
                    .collect(),
                load,
                draft,
                scheduler: SchedulerConfig {
                    name: String::new(),
                    ..scheduler.clone()
                },
            };
            if let Some(same) = specs
                .iter_mut()
                .find(|s| (&s.key.load, &s.key.draft) == (&key.load, &key.draft))
            {
                same.ids.push(id);
                continue;
            }
            let weights: u64 = key.files.iter().map(|f| f.len).sum();
            let need = Need {
                place: key.load.device.into(),
                bytes: weights + scheduler.kv_budget_bytes,
            };
            let (load, draft) = (key.load.clone(), key.draft.clone());
            let sources: Vec<HubPull> = [Some(&load), draft.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|l| hub_source(&l.source))
                .collect();
            let pull = (!sources.is_empty()).then(|| -> Puller {
                let vars = self.pulls.clone();
                std::sync::Arc::new(move |progress: &Progress| {
                    sources
                        .iter()
                        .try_for_each(|source| download(&vars, source, progress).map(drop))
                })
            });
            let vars = self.pulls.clone();
            specs.push(UnitSpec {
                ids: vec![id],
                key,
                load: std::sync::Arc::new(move |progress: &Progress| {
                    let model = load_model(&vars, load.clone(), progress)?;
                    let spawned = match &draft {
                        None => Scheduler::spawn(model, scheduler.clone()),
                        Some(d) => {
                            let d = load_model(&vars, d.clone(), progress)
                                .map_err(|e| format!("its draft model: {e}"))?;
                            Scheduler::spawn_with_draft(model, d, scheduler.clone())
                        }
                    };
                    spawned.map_err(|e| e.to_string())
                }),
                pull,
                need,
                keep: Keep {
                    keep_alive: entry.keep_alive.unwrap_or(hub.config().keep_alive),
                    pinned: entry.pinned,
                },
                preload: true,
            });
        }
        self.models.apply(specs)
    }

    /// The engine of `id`, loading it first if it is not loaded.
    pub async fn get(&self, id: &str) -> Result<Lease<SchedulerHandle>, ModelError> {
        self.models.get(id).await
    }

    pub fn models(&self) -> &Models<SchedulerHandle, EngineKey> {
        &self.models
    }

    pub fn rows(&self) -> Vec<ModelRow> {
        self.models.rows()
    }

    /// `ready`, `loading`, `unloaded`, `unloading` or `unavailable: <why>` per model id
    /// (reported by the health check).
    pub fn status(&self) -> BTreeMap<String, String> {
        self.models.health()
    }

    /// What the listener's `/metrics` reads at scrape time: every engine's scheduler counters,
    /// engines that load later included.
    pub fn metrics(&self) -> crate::metrics::TextEngines<EngineKey> {
        crate::metrics::TextEngines::new(self.models.clone())
    }

    /// Drains every engine (new requests refused, running ones get their grace period), those
    /// a reload is replacing included.
    pub async fn shutdown(&self) {
        let handles = self.models.every_loaded_unit();
        futures::future::join_all(handles.iter().map(|h| h.shutdown())).await;
    }
}
