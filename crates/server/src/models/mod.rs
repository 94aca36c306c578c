//! The served models at run time. Each service keeps one registry ([`Models`]): model ids routed
//! to loadable units of weights (ids whose rows load the same weights the same way share one
//! unit), each unit loaded at start-up when it fits, on demand when a request wants it, and
//! unloaded when idle past its keep-alive, by hand, for another model's room, or when a reload
//! drops it. A reload that changes a model loads the new unit beside the old one and switches
//! the id over once the new one is ready, so a running stream finishes on the version it began
//! on. Every registry shares one [`Hub`]: the memory budget, the keep-alive pass and the admin
//! surface (`hearth models`, `SIGHUP`).

mod hub;
mod keep_alive;
mod unit;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;

pub use hub::{
    Budget, BudgetError, Changes, Control, Counters, CountersSnapshot, Holder, Hub, HubConfig,
    ModelRow, Need, Place,
};
pub use keep_alive::KeepAlive;
use unit::Unit;
pub use unit::{Keep, Lease, Loader, Phase, Progress, PullState, Puller};

/// How long a request waits for its model to load by default (`[loading] load_wait_secs`).
pub const LOAD_WAIT: Duration = Duration::from_secs(120);
/// `Retry-After` of a request refused because its model is still loading or has no room yet.
pub const RETRY_LOAD_AFTER: Duration = Duration::from_secs(5);

/// What a registry serves: a loaded model's handle, cheap to clone.
pub trait Served: Clone + Send + Sync + 'static {
    /// Why a loaded model cannot serve now (its engine or worker stopped), if it cannot.
    fn unavailable(&self) -> Option<String>;
    /// Requests queued or running on it (past the lease that admitted them).
    fn in_flight(&self) -> usize;
    /// Stops it; resolves once its memory is released. Called only when it is idle.
    fn stop(self) -> impl Future<Output = ()> + Send;
}

/// For a `Served::stop` whose value lets its memory go on a thread of its own: waits until
/// `released` says it has, a minute at most (then warns that `what` is still held).
pub async fn until_released(released: impl Fn() -> bool, what: &str) {
    for _ in 0..6000 {
        if released() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::warn!("{what} was still held a minute after it was unloaded");
}

/// A model's state as health reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Unloaded,
    Loading,
    Ready,
    Unloading,
    Unavailable(String),
}

impl Availability {
    /// `ready`, `loading`, `unloaded`, `unloading` or `unavailable: <why>`.
    pub fn describe(&self) -> String {
        match self {
            Availability::Unloaded => "unloaded".into(),
            Availability::Loading => "loading".into(),
            Availability::Ready => "ready".into(),
            Availability::Unloading => "unloading".into(),
            Availability::Unavailable(why) => format!("unavailable: {why}"),
        }
    }
}

/// What the process's allocator does to hand freed memory back to the system, called after every
/// unload (the `hearth` binary sets mimalloc's collection). Process-wide, as the allocator is.
static RELEASE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what runs after every unload to give the freed memory back (once per process).
pub fn on_unload_release(release: fn()) {
    let _ = RELEASE.set(release);
}

fn release_memory() {
    if let Some(release) = RELEASE.get() {
        release();
    }
}

/// One weights file as it is on disk: a file replaced under the same name is a new version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileStamp {
    pub path: std::path::PathBuf,
    pub len: u64,
    pub modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    /// The file at `path`, or every file under the folder at `path` (three levels deep, as a
    /// diffusers folder nests), sorted.
    pub fn of(path: &std::path::Path) -> Vec<FileStamp> {
        fn walk(path: &std::path::Path, depth: usize, out: &mut Vec<FileStamp>) {
            let Ok(meta) = std::fs::metadata(path) else {
                return;
            };
            if meta.is_file() {
                out.push(FileStamp {
                    path: path.to_path_buf(),
                    len: meta.len(),
                    modified: meta.modified().ok(),
                });
            } else if meta.is_dir() && depth > 0 {
                for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
                    walk(&entry.path(), depth - 1, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(path, 3, &mut out);
        out.sort();
        out
    }
}

/// What a service resolved from the model table (its catalog), swapped whole by a reload:
/// a request reads the version current when it starts and keeps it to its end.
pub struct Current<T>(std::sync::RwLock<Arc<T>>);

impl<T> Current<T> {
    pub fn new(value: T) -> Self {
        Current(std::sync::RwLock::new(Arc::new(value)))
    }
    pub fn now(&self) -> Arc<T> {
        Arc::clone(&self.0.read().unwrap_or_else(|p| p.into_inner()))
    }
    pub fn replace(&self, value: T) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(value);
    }
}

/// Why a registry has no model to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("no model {0}")]
    Unknown(String),
    #[error("model {id} is still loading after {} s", waited.as_secs())]
    StillLoading { id: String, waited: Duration },
    #[error("model {id} is unavailable: {why}")]
    Unavailable { id: String, why: String },
    #[error("model {id} cannot be loaded now: {why}")]
    NoRoom { id: String, why: String },
    #[error("model {0} is pinned: it stays loaded")]
    Pinned(String),
    #[error("model {0} has local weights: there is nothing to pull")]
    Local(String),
}

/// One unit of a reload or start-up: the ids it serves and how to load it.
pub struct UnitSpec<T, K> {
    pub ids: Vec<String>,
    /// What makes two rows the same weights loaded the same way (a changed key is a new
    /// version).
    pub key: K,
    pub load: Loader<T>,
    /// Downloads the weights alone, for those that come from a hub.
    pub pull: Option<Puller>,
    pub need: Need,
    pub keep: Keep,
    /// Load it now (start-up, or a reload adding it) when it fits without unloading others.
    pub preload: bool,
}

struct Route<T> {
    now: Arc<Unit<T>>,
    /// A new version loading after a reload; it takes over once ready.
    next: Option<Arc<Unit<T>>>,
}

impl<T: Served> Route<T> {
    fn promote(&mut self) {
        if self
            .next
            .as_ref()
            .is_some_and(|n| n.phase() == Phase::Ready)
        {
            self.now = self.next.take().expect("checked");
        }
    }
}

struct Table<T, K> {
    routes: BTreeMap<String, Route<T>>,
    /// Every unit, routed or still leaving.
    units: Vec<(K, Arc<Unit<T>>)>,
}

struct Inner<T, K> {
    kind: &'static str,
    hub: Hub,
    table: Mutex<Table<T, K>>,
}

/// One service's model ids and the units serving them. Cheap to clone.
pub struct Models<T, K> {
    inner: Arc<Inner<T, K>>,
}

impl<T, K> Clone for Models<T, K> {
    fn clone(&self) -> Self {
        Models {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T: Served, K: PartialEq + Send + 'static> hub::Tick for Inner<T, K> {
    fn tick(&self) {
        let mut table = self.lock();
        for route in table.routes.values_mut() {
            route.promote();
        }
        let routed: Vec<Arc<Unit<T>>> = table
            .routes
            .values()
            .flat_map(|r| std::iter::once(&r.now).chain(&r.next))
            .cloned()
            .collect();
        let is_routed = |u: &Arc<Unit<T>>| routed.iter().any(|r| Arc::ptr_eq(r, u));
        for (_, unit) in &table.units {
            unit.tick(!is_routed(unit));
        }
        table
            .units
            .retain(|(_, u)| is_routed(u) || u.phase().holds_memory());
    }
}

impl<T: Served, K> Inner<T, K> {
    fn lock(&self) -> MutexGuard<'_, Table<T, K>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: Served, K: PartialEq + Send + 'static> Models<T, K> {
    /// An empty registry of `kind` models on `hub`.
    pub fn new(kind: &'static str, hub: &Hub) -> Self {
        let inner = Arc::new(Inner {
            kind,
            hub: hub.clone(),
            table: Mutex::new(Table {
                routes: BTreeMap::new(),
                units: Vec::new(),
            }),
        });
        let weak: std::sync::Weak<dyn hub::Tick> = Arc::downgrade(&inner) as _;
        hub.ticks(weak);
        Models { inner }
    }

    pub fn kind(&self) -> &'static str {
        self.inner.kind
    }

    /// Routes ids as `specs` say. A spec whose key a unit already has keeps that unit (and its
    /// loaded weights); an id whose unit changes while its old one serves keeps the old one
    /// until the new one is ready; ids left out are dropped, and units nothing routes to any
    /// more unload once idle.
    pub fn apply(&self, specs: Vec<UnitSpec<T, K>>) -> Changes {
        let mut table = self.inner.lock();
        let mut old = std::mem::take(&mut table.routes);
        let mut changes = Changes::default();
        for spec in specs {
            let existing = table
                .units
                .iter()
                .find(|(k, _)| *k == spec.key)
                .map(|(_, u)| Arc::clone(u));
            let unit = match existing {
                Some(unit) => {
                    unit.set_keep(spec.keep);
                    unit.set_name(spec.ids.join(","));
                    unit.forget_failure();
                    unit
                }
                None => {
                    let unit = Unit::new(
                        spec.ids.join(","),
                        spec.load,
                        spec.pull,
                        spec.need,
                        spec.keep,
                        self.inner.hub.clone(),
                        self.inner.hub.counters(self.inner.kind),
                    );
                    table.units.push((spec.key, Arc::clone(&unit)));
                    unit
                }
            };
            let mut start = spec.preload;
            for id in spec.ids {
                let route = match old.remove(&id) {
                    None => {
                        changes.added.push(id.clone());
                        Route {
                            now: Arc::clone(&unit),
                            next: None,
                        }
                    }
                    Some(r) if Arc::ptr_eq(&r.now, &unit) => {
                        changes.unchanged.push(id.clone());
                        Route {
                            now: r.now,
                            next: None,
                        }
                    }
                    Some(r) if r.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, &unit)) => {
                        changes.unchanged.push(id.clone());
                        r
                    }
                    Some(r) if r.now.phase() == Phase::Ready => {
                        changes.changed.push(id.clone());
                        start = true;
                        Route {
                            now: r.now,
                            next: Some(Arc::clone(&unit)),
                        }
                    }
                    Some(_) => {
                        changes.changed.push(id.clone());
                        Route {
                            now: Arc::clone(&unit),
                            next: None,
                        }
                    }
                };
                table.routes.insert(id, route);
            }
            if start {
                // A new version loads beside the old one only when both fit; otherwise it
                // loads on the next request, once the old one has left.
                if let Err(e) = unit.start_load(false) {
                    tracing::warn!(model = %e.model, error = %e, "not loaded now: the budget has no room");
                    for route in table.routes.values_mut() {
                        if route.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, &unit)) {
                            route.now = route.next.take().expect("checked");
                        }
                    }
                }
            }
        }
        changes.removed = old.into_keys().collect();
        changes
    }

    fn unit(&self, id: &str) -> Option<Arc<Unit<T>>> {
        let mut table = self.inner.lock();
        let route = table.routes.get_mut(id)?;
        route.promote();
        Some(Arc::clone(&route.now))
    }

    /// The model serving `id`, loading it first when it is not loaded (waiting at most the
    /// hub's load wait).
    pub async fn get(&self, id: &str) -> Result<Lease<T>, ModelError> {
        let unit = self
            .unit(id)
            .ok_or_else(|| ModelError::Unknown(id.to_string()))?;
        unit.lease(id).await
    }

    /// The loaded model of `id` now, if it is loaded (without waiting or loading).
    pub fn loaded(&self, id: &str) -> Option<T> {
        self.unit(id)?.loaded()
    }

    /// Each id's state, without waiting.
    pub fn status(&self) -> BTreeMap<String, Availability> {
        let table = self.inner.lock();
        table
            .routes
            .iter()
            .map(|(id, r)| {
                let a = match r.now.phase() {
                    Phase::Unloaded => Availability::Unloaded,
                    Phase::Loading => Availability::Loading,
                    Phase::Unloading => Availability::Unloading,
                    Phase::Failed => Availability::Unavailable(r.now.failure().unwrap_or_default()),
                    Phase::Ready => match r.now.loaded().and_then(|m| m.unavailable()) {
                        None => Availability::Ready,
                        Some(why) => Availability::Unavailable(why),
                    },
                };
                (id.clone(), a)
            })
            .collect()
    }

    /// Each id's state in health's words (`ready`, `loading`, `unloaded`, `unloading`,
    /// `unavailable: <why>`).
    pub fn health(&self) -> BTreeMap<String, String> {
        self.status()
            .into_iter()
            .map(|(id, a)| (id, a.describe()))
            .collect()
    }

    /// Every id whose model is loaded, with it (ids that share a model give it once each).
    pub fn all_loaded(&self) -> Vec<(String, T)> {
        let units: Vec<(String, Arc<Unit<T>>)> = {
            let table = self.inner.lock();
            table
                .routes
                .iter()
                .map(|(id, r)| (id.clone(), Arc::clone(&r.now)))
                .collect()
        };
        units
            .into_iter()
            .filter_map(|(id, u)| Some((id, u.loaded()?)))
            .collect()
    }

    /// Every loaded unit once, routed or still leaving (to drain them all at shutdown).
    pub fn every_loaded_unit(&self) -> Vec<T> {
        let table = self.inner.lock();
        table.units.iter().filter_map(|(_, u)| u.loaded()).collect()
    }

    /// The ids as `hearth models list` shows them.
    pub fn rows(&self) -> Vec<ModelRow> {
        let table = self.inner.lock();
        let now = chrono::Utc::now();
        table
            .routes
            .iter()
            .map(|(id, r)| {
                let unit = &r.now;
                let keep = unit.keep();
                let idle = chrono::Duration::from_std(unit.idle_for()).unwrap_or_default();
                ModelRow {
                    id: id.clone(),
                    kind: self.inner.kind.to_string(),
                    state: unit.phase(),
                    error: unit.failure(),
                    memory_bytes: unit.need.bytes,
                    device: unit.need.place.to_string(),
                    last_used: Some(
                        (now - idle).to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    ),
                    keep_alive: keep.keep_alive.to_string(),
                    pinned: keep.pinned,
                    in_flight: unit.in_flight(),
                    unload_when_idle: unit.unload_when_idle(),
                    shares_with: table
                        .routes
                        .iter()
                        .filter(|(other, o)| *other != id && Arc::ptr_eq(&o.now, unit))
                        .map(|(other, _)| other.clone())
                        .collect(),
                    next: r.next.as_ref().map(|n| n.phase()),
                    pull: unit.progress.now(),
                }
            })
            .collect()
    }

    /// Loads `id` (trying again if it had failed), waiting for it; `None` when `id` is not
    /// here.
    pub fn load(&self, id: &str) -> Option<BoxFuture<'static, Result<(), ModelError>>> {
        let unit = self.unit(id)?;
        unit.forget_failure();
        let id = id.to_string();
        Some(Box::pin(async move { unit.lease(&id).await.map(drop) }))
    }

    /// Downloads `id`'s weights without loading them, on a blocking thread; `None` when `id` is
    /// not here.
    pub fn pull(&self, id: &str) -> Option<BoxFuture<'static, Result<(), ModelError>>> {
        let unit = self.unit(id)?;
        let id = id.to_string();
        Some(Box::pin(async move {
            let pulled = tokio::task::spawn_blocking(move || unit.pull())
                .await
                .unwrap_or_else(|e| Some(Err(e.to_string())));
            match pulled {
                None => Err(ModelError::Local(id)),
                Some(Ok(())) => Ok(()),
                Some(Err(why)) => Err(ModelError::Unavailable { id, why }),
            }
        }))
    }

    /// Sets how long `id`'s model stays loaded when idle (Ollama's per-request `keep_alive`), until
    /// a reload sets it back to its row's; a pinned model stays pinned.
    pub fn set_keep_alive(&self, id: &str, keep_alive: KeepAlive) {
        if let Some(unit) = self.unit(id) {
            let pinned = unit.keep().pinned;
            unit.set_keep(Keep { keep_alive, pinned });
        }
    }

    /// Unloads `id` now if idle, else once its running requests end (a request arriving before
    /// then keeps it); pinned models are refused. `None` when `id` is not here.
    pub fn unload(&self, id: &str) -> Option<Result<(), ModelError>> {
        let unit = self.unit(id)?;
        if unit.keep().pinned {
            return Some(Err(ModelError::Pinned(id.to_string())));
        }
        unit.request_unload();
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests;
