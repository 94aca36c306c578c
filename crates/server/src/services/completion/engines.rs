//! One scheduler per distinct set of weights, loaded in the background at start-up through the
//! shared model registry ([`Models`]). Model ids whose `models.toml` entries load the same weights
//! the same way (alpha-3.3 and beta-4-mini both serve SmolLM2) share one engine, and so one
//! batch: on a small CPU box two engines would only fight over the same cores. The shared engine
//! takes the scheduler limits of the first id in id order.

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_infer::{KernelPath, TextModel, TextModelConfig};
use hearth_scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};

use super::catalog::Catalog;
use crate::models::{ModelError, Models, Served};

impl Served for SchedulerHandle {
    fn unavailable(&self) -> Option<String> {
        SchedulerHandle::unavailable(self)
    }
}

pub struct Engines {
    models: Models<SchedulerHandle>,
}

impl Engines {
    /// Starts loading every model of the catalog on background threads and returns at once.
    /// Every engine tells refused clients to wait `retry_after` (`[completion] retry_after_secs`);
    /// the fast backend runs on `kernel` where the CPU has it (the configuration's `kernel`).
    pub fn start(catalog: &Catalog, retry_after: Duration, kernel: Option<KernelPath>) -> Engines {
        let mut groups: Vec<(TextModelConfig, SchedulerConfig, Vec<String>)> = Vec::new();
        for entry in catalog.entries() {
            match groups.iter_mut().find(|(load, _, _)| *load == entry.load) {
                Some((_, _, ids)) => ids.push(entry.spec.id.clone()),
                None => groups.push((
                    entry.load.clone(),
                    entry.scheduler.clone(),
                    vec![entry.spec.id.clone()],
                )),
            }
        }
        let mut models = Models::default();
        for (mut load, mut scheduler, ids) in groups {
            scheduler.retry_after = retry_after;
            load.kernel = kernel;
            models.load(&ids, move || {
                let model = TextModel::load(&load).map_err(|e| e.to_string())?;
                Scheduler::spawn(model, scheduler).map_err(|e| e.to_string())
            });
        }
        Engines { models }
    }

    /// The engine of `id`, waiting while it loads.
    pub async fn get(&self, id: &str) -> Result<SchedulerHandle, ModelError> {
        self.models.get(id).await
    }

    /// `ready`, `loading` or `unavailable: <why>` per model id (reported by the health check).
    pub fn status(&self) -> BTreeMap<String, String> {
        self.models
            .status()
            .into_iter()
            .map(|(id, a)| (id, a.describe()))
            .collect()
    }

    /// What the listener's `/metrics` reads at scrape time: every engine's scheduler counters,
    /// engines that finish loading later included.
    pub fn metrics(&self) -> crate::metrics::TextEngines {
        crate::metrics::TextEngines::new(self.models.clone())
    }

    /// Drains every engine (new requests refused, running ones get their grace period).
    pub async fn shutdown(&self) {
        let mut handles: Vec<SchedulerHandle> = Vec::new();
        for (_, handle) in self.models.all_loaded() {
            if !handles.iter().any(|h| h.name() == handle.name()) {
                handles.push(handle);
            }
        }
        futures::future::join_all(handles.iter().map(|h| h.shutdown())).await;
    }
}
