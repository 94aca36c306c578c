//! What every model registry of a server shares ([`Hub`]): the memory budget of the host and of
//! each GPU with the admission rule (a load that does not fit first unloads the least recently
//! used idle models; when that is not enough it is refused, naming what holds the memory), the
//! keep-alive pass, the load-wait counters `/metrics` reads, and the admin surface: each
//! service's registry is registered here as a [`Control`], so `hearth models` and `SIGHUP`
//! reach every model through one place.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use utoipa::ToSchema;

use super::unit::Phase;
use super::{KeepAlive, ModelError};
use crate::model_table::{self, RawModelTable, TableError};

/// How often idle models are checked against their keep-alive.
const TICK: Duration = Duration::from_millis(200);

/// Where a model's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    Host,
    Gpu(usize),
}

impl From<hearth_infer::DeviceSpec> for Place {
    fn from(device: hearth_infer::DeviceSpec) -> Place {
        match device {
            hearth_infer::DeviceSpec::Cpu => Place::Host,
            hearth_infer::DeviceSpec::Cuda(n) => Place::Gpu(n),
        }
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Host => f.write_str("cpu"),
            Place::Gpu(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What a model holds once loaded: its weights and, for a text model, its KV-cache budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub place: Place,
    pub bytes: u64,
}

/// How much the loaded models may hold, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub host: u64,
    /// Each GPU's; `None`: 90% of what its driver reports (unlimited where it reports nothing).
    pub gpu: Option<u64>,
}

impl Budget {
    /// `[loading] ram_budget_mb` and `gpu_budget_mb` when set; otherwise 90% of the machine's
    /// memory (`/proc/meminfo`) and of each GPU's (its driver's figure, read when a model is
    /// first loaded there).
    pub fn from_config(ram_mb: Option<u64>, gpu_mb: Option<u64>) -> Budget {
        let host = match ram_mb {
            Some(mb) => mb << 20,
            None => machine_memory().map(|b| b / 10 * 9).unwrap_or(u64::MAX),
        };
        Budget {
            host,
            gpu: gpu_mb.map(|mb| mb << 20),
        }
    }

    fn cap(&self, place: Place) -> u64 {
        match place {
            Place::Host => self.host,
            Place::Gpu(n) => self
                .gpu
                .unwrap_or_else(|| hearth_infer::gpu_memory(n).map_or(u64::MAX, |b| b / 10 * 9)),
        }
    }
}

/// The machine's memory from `/proc/meminfo`'s `MemTotal`.
fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn mib(bytes: u64) -> String {
    if bytes == u64::MAX {
        "unlimited".into()
    } else {
        format!("{} MiB", bytes.div_ceil(1 << 20))
    }
}

/// A load refused by the budget, with what holds the memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{model} needs {need} on {place}, the budget there is {cap} and {held_total} is held{by}",
    need = mib(*need),
    cap = mib(*cap),
    held_total = mib(held.iter().map(|h| h.bytes).sum()),
    by = holders(held)
)]
pub struct BudgetError {
    pub model: String,
    pub place: Place,
    pub need: u64,
    pub cap: u64,
    pub held: Vec<Holder>,
}

/// A model holding memory that could not be unloaded to make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub model: String,
    pub bytes: u64,
    /// `busy (N requests)`, `pinned`, `loading`, `unloading` or `idle`.
    pub why: String,
}

fn holders(held: &[Holder]) -> String {
    if held.is_empty() {
        return String::new();
    }
    let list: Vec<String> = held
        .iter()
        .map(|h| format!("{} ({}, {})", h.model, mib(h.bytes), h.why))
        .collect();
    format!(" by {}", list.join(", "))
}

/// A unit as the budget sees it, whatever it serves.
pub(super) trait Held: Send + Sync {
    fn name(&self) -> String;
    fn need(&self) -> Need;
    fn phase(&self) -> Phase;
    /// When it was last used, if it could be unloaded now (ready, idle, not pinned).
    fn evictable(&self) -> Option<Instant>;
    fn busy(&self) -> usize;
    fn pinned(&self) -> bool;
    /// Starts unloading it if it is still idle.
    fn evict(&self) -> bool;
}

/// A registry's keep-alive pass (promoting new versions, unloading idle and retired units).
pub(super) trait Tick: Send + Sync {
    fn tick(&self);
}

/// One service's models as the admin API and a reload reach them.
pub trait Control: Send + Sync {
    /// `text`, `image`, `embedding`, `rerank`.
    fn kind(&self) -> &'static str;
    fn rows(&self) -> Vec<ModelRow>;
    /// Loads `id` (waiting for it), or `None` when it is not this service's.
    fn load(&self, id: &str) -> Option<BoxFuture<'static, Result<(), ModelError>>>;
    /// Downloads `id`'s weights without loading them, or `None` when it is not this service's.
    fn pull(&self, id: &str) -> Option<BoxFuture<'static, Result<(), ModelError>>>;
    /// Unloads `id` now or when its running requests end, or `None` when it is not this
    /// service's.
    fn unload(&self, id: &str) -> Option<Result<(), ModelError>>;
    /// Resolves this service's rows of a newly read table, changing nothing; the returned step
    /// applies them. A table this service refuses refuses the whole reload.
    fn plan(
        &self,
        table: &RawModelTable,
    ) -> Result<Box<dyn FnOnce() -> Changes + Send>, TableError>;
}

/// One model id as `hearth models list` shows it (the admin API's row, read back by the CLI).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelRow {
    pub id: String,
    /// `text`, `embedding`, `rerank` or `image`.
    pub kind: String,
    pub state: Phase,
    /// Why it failed to load, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What it holds once loaded (weights and KV budget), whether loaded now or not.
    pub memory_bytes: u64,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// ISO 8601 UTC; absent until first loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used: Option<String>,
    /// `-1`, or how long it stays loaded idle (`300s`).
    pub keep_alive: String,
    pub pinned: bool,
    /// Requests holding it or running on it.
    pub in_flight: usize,
    /// Asked to unload: it goes when its running requests end.
    pub unload_when_idle: bool,
    /// Other ids served by the same loaded weights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares_with: Vec<String>,
    /// A new version loading beside this one after a reload (it takes over once ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<Phase>,
    /// The download in progress, while its weights come from a hub.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull: Option<super::PullState>,
}

/// What a reload changed, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Loading anew beside the running version; new requests switch once it is ready.
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
}

impl Changes {
    /// Adds `other`'s ids (another registry's changes) to these.
    pub fn extend(&mut self, other: Changes) {
        self.added.extend(other.added);
        self.removed.extend(other.removed);
        self.changed.extend(other.changed);
        self.unchanged.extend(other.unchanged);
    }
}

/// Counters `/metrics` reads.
#[derive(Debug, Default)]
pub struct Counters {
    load_waits: AtomicU64,
    load_wait_micros: AtomicU64,
    loads: AtomicU64,
    unloads: AtomicU64,
}

/// What [`Counters`] held when read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CountersSnapshot {
    /// Requests that waited for a model to load, and their total wait.
    pub load_waits: u64,
    pub load_wait_seconds: f64,
    pub loads: u64,
    pub unloads: u64,
}

impl Counters {
    pub(super) fn waited(&self, d: Duration) {
        self.load_waits.fetch_add(1, Ordering::Relaxed);
        self.load_wait_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
    pub(super) fn loaded(&self) {
        self.loads.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn unloaded(&self) {
        self.unloads.fetch_add(1, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            load_waits: self.load_waits.load(Ordering::Relaxed),
            load_wait_seconds: self.load_wait_micros.load(Ordering::Relaxed) as f64 / 1e6,
            loads: self.loads.load(Ordering::Relaxed),
            unloads: self.unloads.load(Ordering::Relaxed),
        }
    }
}

/// The rules every registry of one server follows.
#[derive(Debug, Clone)]
pub struct HubConfig {
    pub budget: Budget,
    /// How long a request waits for its model to load before a 503.
    pub load_wait: Duration,
    /// A row's `keep_alive` when it gives none.
    pub keep_alive: KeepAlive,
    /// Where `hearth models reload` and `SIGHUP` read the table again.
    pub table: PathBuf,
}

struct Inner {
    config: HubConfig,
    admission: Mutex<()>,
    units: Mutex<Vec<Weak<dyn Held>>>,
    ticks: Mutex<Vec<Weak<dyn Tick>>>,
    controls: Mutex<Vec<Arc<dyn Control>>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// Each kind's (`text`, `image`) counters.
    counters: Mutex<Vec<(&'static str, Arc<Counters>)>>,
    runtime: tokio::runtime::Handle,
}

/// Shared by every model registry of one server. Cheap to clone.
#[derive(Clone)]
pub struct Hub(Arc<Inner>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hub {
    /// A hub whose keep-alive pass runs on the current runtime until `stop` is cancelled.
    pub fn start(config: HubConfig, stop: CancellationToken) -> Hub {
        let hub = Hub(Arc::new(Inner {
            config,
            admission: Mutex::new(()),
            units: Mutex::new(Vec::new()),
            ticks: Mutex::new(Vec::new()),
            controls: Mutex::new(Vec::new()),
            reloading: tokio::sync::Mutex::new(()),
            counters: Mutex::new(Vec::new()),
            runtime: tokio::runtime::Handle::current(),
        }));
        let weak = Arc::downgrade(&hub.0);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                let ticks: Vec<_> = lock(&inner.ticks)
                    .iter()
                    .filter_map(Weak::upgrade)
                    .collect();
                for t in ticks {
                    t.tick();
                }
            }
        });
        hub
    }

    pub fn config(&self) -> &HubConfig {
        &self.0.config
    }
    pub(super) fn load_wait(&self) -> Duration {
        self.0.config.load_wait
    }
    /// The counters of `kind`'s models.
    pub fn counters(&self, kind: &'static str) -> Arc<Counters> {
        let mut all = lock(&self.0.counters);
        match all.iter().find(|(k, _)| *k == kind) {
            Some((_, c)) => Arc::clone(c),
            None => {
                let c = Arc::new(Counters::default());
                all.push((kind, Arc::clone(&c)));
                c
            }
        }
    }
    pub(super) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.0.runtime
    }
    pub(super) fn admission(&self) -> MutexGuard<'_, ()> {
        lock(&self.0.admission)
    }

    pub(super) fn track(&self, unit: Arc<dyn Held>) {
        let mut units = lock(&self.0.units);
        units.retain(|u| u.strong_count() > 0);
        units.push(Arc::downgrade(&unit));
    }

    pub(super) fn ticks(&self, tick: Weak<dyn Tick>) {
        lock(&self.0.ticks).push(tick);
    }

    /// Makes `control`'s models reachable by the admin API and reloads.
    pub fn register(&self, control: Arc<dyn Control>) {
        lock(&self.0.controls).push(control);
    }

    /// Whether `unit` fits beside what is held on its device; with `evict`, unloading idle
    /// units (least recently used first) to make room. The units it started unloading are
    /// returned: the load waits for them to be gone. Called under [`Hub::admission`].
    pub(super) fn admit(
        &self,
        unit: &Arc<dyn Held>,
        evict: bool,
    ) -> Result<Vec<Arc<dyn Held>>, BudgetError> {
        let need = unit.need();
        let cap = self.0.config.budget.cap(need.place);
        let others: Vec<Arc<dyn Held>> = lock(&self.0.units)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|u| !Arc::ptr_eq(u, unit))
            .filter(|u| u.need().place == need.place && u.phase().holds_memory())
            .collect();
        let held: u64 = others.iter().map(|u| u.need().bytes).sum();
        let fits = |freed: u64| held.saturating_sub(freed).saturating_add(need.bytes) <= cap;
        if fits(0) {
            return Ok(Vec::new());
        }
        let refuse = || BudgetError {
            model: unit.name(),
            place: need.place,
            need: need.bytes,
            cap,
            held: others
                .iter()
                .map(|u| Holder {
                    model: u.name(),
                    bytes: u.need().bytes,
                    why: match (u.phase(), u.pinned(), u.busy()) {
                        (Phase::Loading, ..) => "loading".into(),
                        (Phase::Unloading, ..) => "unloading".into(),
                        (_, true, _) => "pinned".into(),
                        (_, _, n) if n > 0 => format!("busy, {n} requests"),
                        _ => "idle".into(),
                    },
                })
                .collect(),
        };
        if !evict || need.bytes > cap {
            return Err(refuse());
        }
        let mut idle: Vec<(Instant, Arc<dyn Held>)> = others
            .iter()
            .filter_map(|u| Some((u.evictable()?, Arc::clone(u))))
            .collect();
        idle.sort_by_key(|(used, _)| *used);
        let (mut freed, mut chosen) = (0u64, Vec::new());
        for (_, u) in idle {
            if fits(freed) {
                break;
            }
            freed += u.need().bytes;
            chosen.push(u);
        }
        if !fits(freed) {
            return Err(refuse());
        }
        let mut evicted = Vec::new();
        for u in chosen {
            if !u.evict() {
                // It took a request since it was counted idle: the room is not there.
                return Err(refuse());
            }
            info!(model = %u.name(), for_model = %unit.name(), "unloading the least recently used idle model to make room");
            evicted.push(u);
        }
        Ok(evicted)
    }

    /// Every model of every registered service.
    pub fn rows(&self) -> Vec<ModelRow> {
        let controls: Vec<_> = lock(&self.0.controls).clone();
        controls.iter().flat_map(|c| c.rows()).collect()
    }

    /// Loads `id`, waiting for it (at most the load wait).
    pub async fn load(&self, id: &str) -> Result<(), ModelError> {
        let controls: Vec<_> = lock(&self.0.controls).clone();
        for c in controls {
            if let Some(loading) = c.load(id) {
                return loading.await;
            }
        }
        Err(ModelError::Unknown(id.into()))
    }

    /// Downloads `id`'s weights (resuming a download cut short), without loading them.
    pub async fn pull(&self, id: &str) -> Result<(), ModelError> {
        let controls: Vec<_> = lock(&self.0.controls).clone();
        for c in controls {
            if let Some(pulling) = c.pull(id) {
                return pulling.await;
            }
        }
        Err(ModelError::Unknown(id.into()))
    }

    /// Unloads `id` now if idle, else once its running requests end.
    pub fn unload(&self, id: &str) -> Result<(), ModelError> {
        let controls: Vec<_> = lock(&self.0.controls).clone();
        controls
            .iter()
            .find_map(|c| c.unload(id))
            .unwrap_or_else(|| Err(ModelError::Unknown(id.into())))
    }

    /// Reads the model table again and applies it to every service: added ids become available,
    /// removed ones unload once idle, changed ones load beside the running version and take
    /// over when ready. A table any service refuses changes nothing and answers the error.
    pub async fn reload(&self) -> Result<Changes, TableError> {
        let _one = self.0.reloading.lock().await;
        let path = self.0.config.table.clone();
        let table = tokio::task::spawn_blocking(move || model_table::load(&path))
            .await
            .map_err(|e| TableError::Read {
                path: self.0.config.table.clone(),
                source: std::io::Error::other(e.to_string()),
            })??;
        let controls: Vec<_> = lock(&self.0.controls).clone();
        let mut steps = Vec::new();
        for c in &controls {
            steps.push(c.plan(&table).inspect_err(|e| {
                warn!(kind = c.kind(), error = %e, "reload refused: the running models stay");
            })?);
        }
        let mut changes = Changes::default();
        for step in steps {
            changes.extend(step());
        }
        info!(?changes, "model table reloaded");
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_what_holds_the_memory() {
        let e = BudgetError {
            model: "big".into(),
            place: Place::Host,
            need: 300 << 20,
            cap: 500 << 20,
            held: vec![Holder {
                model: "chat".into(),
                bytes: 250 << 20,
                why: "busy, 1 requests".into(),
            }],
        };
        assert_eq!(
            e.to_string(),
            "big needs 300 MiB on cpu, the budget there is 500 MiB and 250 MiB is held by chat (250 MiB, busy, 1 requests)"
        );
        assert!(machine_memory().unwrap() > 0);
    }
}
