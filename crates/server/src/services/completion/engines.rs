//! One scheduler per distinct set of weights, loaded in the background at start-up. Model ids
//! whose `models.toml` entries load the same weights the same way (alpha-3.3 and beta-4-mini
//! both serve SmolLM2) share one engine, and so one batch: on a small CPU box two engines
//! would only fight over the same cores. The shared engine takes the scheduler limits of the
//! first id in id order. A failed load is kept with its reason and answered as a gateway error.

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_infer::TextModel;
use hearth_scheduler::{Scheduler, SchedulerHandle, StreamRegistry};
use tokio::sync::watch;
use tracing::{error, info};

use super::catalog::Catalog;

#[derive(Clone)]
pub enum EngineState {
    Loading,
    Ready(SchedulerHandle),
    Failed(String),
}

/// How long a request waits for a model that is still loading.
const LOAD_WAIT: Duration = Duration::from_secs(120);

pub struct Engines {
    slots: BTreeMap<String, watch::Receiver<EngineState>>,
    registry: StreamRegistry,
}

impl Engines {
    /// Starts loading every model of the catalog on background threads and returns at once.
    pub fn start(catalog: &Catalog) -> Engines {
        let registry = StreamRegistry::new();
        let mut groups: Vec<(hearth_infer::TextModelConfig, watch::Receiver<EngineState>)> =
            Vec::new();
        let mut slots = BTreeMap::new();
        for entry in catalog.entries() {
            if let Some((_, rx)) = groups.iter().find(|(load, _)| *load == entry.load) {
                slots.insert(entry.spec.id.clone(), rx.clone());
                continue;
            }
            let (tx, rx) = watch::channel(EngineState::Loading);
            let load = entry.load.clone();
            let sched_cfg = entry.scheduler.clone();
            let id = entry.spec.id.clone();
            let registry = registry.clone();
            let spawned = std::thread::Builder::new().name(format!("load-{id}")).spawn(move || {
                let started = std::time::Instant::now();
                let state = match TextModel::load(&load) {
                    Ok(model) => match Scheduler::spawn_with_registry(model, sched_cfg, registry) {
                        Ok(handle) => {
                            info!(model = %id, ms = started.elapsed().as_millis() as u64, "model loaded");
                            EngineState::Ready(handle)
                        }
                        Err(e) => EngineState::Failed(e.to_string()),
                    },
                    Err(e) => EngineState::Failed(e.to_string()),
                };
                if let EngineState::Failed(why) = &state {
                    error!(model = %id, error = %why, "model failed to load");
                }
                tx.send_replace(state);
            });
            let rx = match spawned {
                Ok(_) => rx,
                Err(e) => {
                    watch::channel(EngineState::Failed(format!("cannot start the loader: {e}"))).1
                }
            };
            groups.push((entry.load.clone(), rx.clone()));
            slots.insert(entry.spec.id.clone(), rx);
        }
        Engines { slots, registry }
    }

    pub fn registry(&self) -> &StreamRegistry {
        &self.registry
    }

    /// The engine of `id`, waiting while it loads. `Err` carries why it is unavailable.
    pub async fn get(&self, id: &str) -> Result<SchedulerHandle, String> {
        let mut rx = self
            .slots
            .get(id)
            .ok_or_else(|| format!("no engine for model {id}"))?
            .clone();
        let state = tokio::time::timeout(
            LOAD_WAIT,
            rx.wait_for(|s| !matches!(s, EngineState::Loading)),
        )
        .await
        .map_err(|_| format!("model {id} is still loading"))?
        .map_err(|_| format!("the loader of model {id} stopped"))?
        .clone();
        match state {
            EngineState::Ready(handle) => match handle.unavailable() {
                None => Ok(handle),
                Some(why) => Err(why),
            },
            EngineState::Failed(why) => Err(why),
            EngineState::Loading => Err(format!("model {id} is still loading")),
        }
    }

    /// `ready`, `loading` or `unavailable: <why>` per model id (reported by the health check).
    pub fn status(&self) -> BTreeMap<String, String> {
        self.slots
            .iter()
            .map(|(id, rx)| {
                let s = match &*rx.borrow() {
                    EngineState::Loading => "loading".to_string(),
                    EngineState::Ready(h) => match h.unavailable() {
                        None => "ready".to_string(),
                        Some(why) => format!("unavailable: {why}"),
                    },
                    EngineState::Failed(why) => format!("unavailable: {why}"),
                };
                (id.clone(), s)
            })
            .collect()
    }

    /// Drains every engine (new requests refused, running ones get their grace period).
    pub async fn shutdown(&self) {
        let mut handles: Vec<SchedulerHandle> = Vec::new();
        for rx in self.slots.values() {
            if let EngineState::Ready(h) = &*rx.borrow() {
                if !handles.iter().any(|x| x.name() == h.name()) {
                    handles.push(h.clone());
                }
            }
        }
        futures::future::join_all(handles.iter().map(|h| h.shutdown())).await;
    }
}
