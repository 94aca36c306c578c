//! One loadable set of weights ([`Unit`]): its phase (unloaded, loading, ready, unloading,
//! failed), the loader that brings it in again whenever it is wanted, the requests holding it
//! ([`Lease`]) and when it was last used. Every transition happens under the unit's one lock, so
//! a lease and an unload never cross: a unit leaves memory only while nothing holds it.

use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{error, info};
use utoipa::ToSchema;

use super::hub::{BudgetError, Counters, Held, Hub, Need};
use super::{KeepAlive, ModelError, Served};

/// Brings a unit's weights in, telling `Progress` how a download goes; called again after every
/// unload.
pub type Loader<T> = Arc<dyn Fn(&Progress) -> Result<T, String> + Send + Sync>;

/// Downloads a unit's weights without loading them (`hearth models pull`).
pub type Puller = Arc<dyn Fn(&Progress) -> Result<(), String> + Send + Sync>;

/// A download in progress: the file and its bytes so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullState {
    pub file: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// Where a unit's download stands, written by its loader or puller.
#[derive(Debug, Default)]
pub struct Progress {
    now: Mutex<Option<PullState>>,
    /// One download of a unit at a time (a load and `hearth models pull` never race).
    one: Mutex<()>,
}

impl Progress {
    pub fn report(&self, file: &str, done_bytes: u64, total_bytes: u64) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = Some(PullState {
            file: file.to_string(),
            done_bytes,
            total_bytes,
        });
    }
    pub fn now(&self) -> Option<PullState> {
        self.now.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn clear(&self) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
    /// Runs `download` as the unit's one download, clearing the progress after.
    pub fn exclusive<R>(&self, download: impl FnOnce() -> R) -> R {
        let _one = self.one.lock().unwrap_or_else(|p| p.into_inner());
        let r = download();
        self.clear();
        r
    }
}

/// Where a unit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Unloaded,
    Loading,
    Ready,
    /// Stopping; its memory is still held until it has.
    Unloading,
    Failed,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Unloaded,
        Phase::Loading,
        Phase::Ready,
        Phase::Unloading,
        Phase::Failed,
    ];

    /// Its name on the wire, in `/metrics` and in `hearth models list`.
    pub fn word(self) -> &'static str {
        match self {
            Phase::Unloaded => "unloaded",
            Phase::Loading => "loading",
            Phase::Ready => "ready",
            Phase::Unloading => "unloading",
            Phase::Failed => "failed",
        }
    }

    /// Whether the unit holds (or is about to hold) its memory.
    pub fn holds_memory(self) -> bool {
        matches!(self, Phase::Loading | Phase::Ready | Phase::Unloading)
    }
}

enum Slot<T> {
    Unloaded,
    Loading,
    Ready(T),
    Unloading,
    Failed(String),
}

struct State<T> {
    slot: Slot<T>,
    /// Requests between `lease` and the end of their use.
    leases: usize,
    last_used: Instant,
    /// Asked to leave (by hand, or retired by a reload): goes when idle.
    unload_when_idle: bool,
}

/// How a unit is kept: changeable by a reload without reloading the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    pub keep_alive: KeepAlive,
    pub pinned: bool,
}

pub struct Unit<T> {
    /// The ids it serves, joined (for logs and refusals).
    pub(super) name: Mutex<String>,
    load: Loader<T>,
    pull: Option<Puller>,
    pub(super) progress: Progress,
    pub(super) need: Need,
    keep: Mutex<Keep>,
    state: Mutex<State<T>>,
    phase: watch::Sender<Phase>,
    hub: Hub,
    /// Its kind's counters (`/metrics`).
    counters: Arc<Counters>,
    me: Weak<Unit<T>>,
}

impl<T: Served> Unit<T> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        name: String,
        load: Loader<T>,
        pull: Option<Puller>,
        need: Need,
        keep: Keep,
        hub: Hub,
        counters: Arc<Counters>,
    ) -> Arc<Self> {
        let unit = Arc::new_cyclic(|me| Unit {
            name: Mutex::new(name),
            load,
            pull,
            progress: Progress::default(),
            need,
            keep: Mutex::new(keep),
            state: Mutex::new(State {
                slot: Slot::Unloaded,
                leases: 0,
                last_used: Instant::now(),
                unload_when_idle: false,
            }),
            phase: watch::channel(Phase::Unloaded).0,
            hub: hub.clone(),
            counters,
            me: me.clone(),
        });
        hub.track(Arc::clone(&unit) as Arc<dyn Held>);
        unit
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, state: &mut State<T>, slot: Slot<T>) {
        let phase = match &slot {
            Slot::Unloaded => Phase::Unloaded,
            Slot::Loading => Phase::Loading,
            Slot::Ready(_) => Phase::Ready,
            Slot::Unloading => Phase::Unloading,
            Slot::Failed(_) => Phase::Failed,
        };
        state.slot = slot;
        self.phase.send_replace(phase);
    }

    pub fn keep(&self) -> Keep {
        *self.keep.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_keep(&self, keep: Keep) {
        *self.keep.lock().unwrap_or_else(|p| p.into_inner()) = keep;
    }

    pub(super) fn set_name(&self, name: String) {
        *self.name.lock().unwrap_or_else(|p| p.into_inner()) = name;
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Why it failed, when it did.
    pub fn failure(&self) -> Option<String> {
        match &self.lock().slot {
            Slot::Failed(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// The loaded value now, without waiting or counting a use (health, metrics, job lookups).
    pub fn loaded(&self) -> Option<T> {
        match &self.lock().slot {
            Slot::Ready(value) => Some(value.clone()),
            _ => None,
        }
    }

    /// Requests holding it or running on it.
    pub fn in_flight(&self) -> usize {
        let state = self.lock();
        state.leases
            + match &state.slot {
                Slot::Ready(value) => value.in_flight(),
                _ => 0,
            }
    }

    pub fn idle_for(&self) -> Duration {
        self.lock().last_used.elapsed()
    }

    pub fn unload_when_idle(&self) -> bool {
        self.lock().unload_when_idle
    }

    /// Starts loading it on a thread of its own if it is unloaded or failed, within the budget
    /// (`evict`: making room by unloading idle units, least recently used first). `Ok` when it
    /// is loading or loaded afterwards.
    pub fn start_load(&self, evict: bool) -> Result<(), BudgetError> {
        let admission = self.hub.admission();
        {
            let state = self.lock();
            if !matches!(state.slot, Slot::Unloaded | Slot::Failed(_)) {
                return Ok(());
            }
        }
        let me = self
            .me
            .upgrade()
            .expect("a unit is reached through its Arc");
        let evicted = self.hub.admit(&(Arc::clone(&me) as Arc<dyn Held>), evict)?;
        {
            let mut state = self.lock();
            state.unload_when_idle = false;
            self.set(&mut state, Slot::Loading);
        }
        drop(admission);
        let name = self.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let thread = std::thread::Builder::new()
            .name(format!(
                "load-{}",
                name.split(',').next().unwrap_or_default()
            ))
            .spawn(move || me.run_load(&evicted));
        if let Err(e) = thread {
            let mut state = self.lock();
            self.set(
                &mut state,
                Slot::Failed(format!("cannot start the loader: {e}")),
            );
        }
        Ok(())
    }

    /// The loader thread: waits for what was evicted to be gone, then loads.
    fn run_load(&self, evicted: &[Arc<dyn Held>]) {
        let name = self.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let deadline = Instant::now() + Duration::from_secs(120);
        while evicted.iter().any(|e| e.phase().holds_memory()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let started = Instant::now();
        let loaded = self.progress.exclusive(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.load)(&self.progress)))
                .unwrap_or_else(|_| Err("the loader panicked".into()))
        });
        let mut state = self.lock();
        match loaded {
            Ok(value) => {
                let ms = started.elapsed().as_millis() as u64;
                info!(model = %name, ms, "model loaded");
                self.counters.loaded();
                state.last_used = Instant::now();
                self.set(&mut state, Slot::Ready(value));
            }
            Err(why) => {
                error!(model = %name, error = %why, "model failed to load");
                self.set(&mut state, Slot::Failed(why));
            }
        }
    }

    /// A use of the loaded value, loading it first (and waiting, at most the hub's load wait)
    /// when it is not. A request arriving while an unload waits for idleness keeps it loaded.
    pub async fn lease(&self, id: &str) -> Result<Lease<T>, ModelError> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.hub.load_wait();
        let mut phase = self.phase.subscribe();
        let mut waited = false;
        loop {
            phase.borrow_and_update();
            let wants_load = {
                let mut state = self.lock();
                match &state.slot {
                    Slot::Ready(value) => {
                        if let Some(why) = value.unavailable() {
                            return Err(ModelError::Unavailable { id: id.into(), why });
                        }
                        let value = value.clone();
                        state.leases += 1;
                        state.unload_when_idle = false;
                        drop(state);
                        if waited {
                            self.counters.waited(started.elapsed());
                        }
                        let unit = self
                            .me
                            .upgrade()
                            .expect("a unit is reached through its Arc");
                        return Ok(Lease { unit, value });
                    }
                    Slot::Failed(why) => {
                        return Err(ModelError::Unavailable {
                            id: id.into(),
                            why: why.clone(),
                        })
                    }
                    Slot::Unloaded => true,
                    Slot::Loading | Slot::Unloading => false,
                }
            };
            if wants_load {
                self.start_load(true).map_err(|e| ModelError::NoRoom {
                    id: id.into(),
                    why: e.to_string(),
                })?;
            }
            waited = true;
            match tokio::time::timeout_at(deadline, phase.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => unreachable!("the unit owns its sender"),
                Err(_) => {
                    self.counters.waited(started.elapsed());
                    return Err(ModelError::StillLoading {
                        id: id.into(),
                        waited: self.hub.load_wait(),
                    });
                }
            }
        }
    }

    /// Marks it to leave once idle and, if it is idle now, starts unloading it. Whether it is
    /// unloading (or already out) afterwards.
    pub fn request_unload(&self) -> bool {
        self.lock().unload_when_idle = true;
        self.try_unload("asked") || !self.phase().holds_memory()
    }

    /// Starts unloading it if it is loaded and idle; the value is stopped on the runtime and its
    /// memory counted until then.
    pub(super) fn try_unload(&self, why: &'static str) -> bool {
        let mut state = self.lock();
        let idle = state.leases == 0 && matches!(&state.slot, Slot::Ready(v) if v.in_flight() == 0);
        if !idle {
            return false;
        }
        let Slot::Ready(value) = std::mem::replace(&mut state.slot, Slot::Unloading) else {
            return false;
        };
        state.unload_when_idle = false;
        self.phase.send_replace(Phase::Unloading);
        drop(state);
        let me = self
            .me
            .upgrade()
            .expect("a unit is reached through its Arc");
        let name = self.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.counters.unloaded();
        self.hub.runtime().spawn(async move {
            value.stop().await;
            super::release_memory();
            info!(model = %name, reason = why, "model unloaded");
            let mut state = me.lock();
            me.set(&mut state, Slot::Unloaded);
        });
        true
    }

    /// Downloads its weights without loading them; `None` when they are local.
    pub fn pull(&self) -> Option<Result<(), String>> {
        let pull = self.pull.as_ref()?;
        Some(self.progress.exclusive(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pull(&self.progress)))
                .unwrap_or_else(|_| Err("the download panicked".into()))
        }))
    }

    /// Marks a failed unit unloaded, so the next load tries again.
    pub(super) fn forget_failure(&self) {
        let mut state = self.lock();
        if matches!(state.slot, Slot::Failed(_)) {
            self.set(&mut state, Slot::Unloaded);
        }
    }

    /// A keep-alive pass: unloads it when idle past its keep-alive or when asked to leave.
    pub(super) fn tick(&self, retired: bool) {
        let keep = self.keep();
        let (asked, idle_for) = {
            let mut state = self.lock();
            // A stream running on it past its lease keeps it in use: idleness counts from its end.
            if matches!(&state.slot, Slot::Ready(v) if v.in_flight() > 0) {
                state.last_used = Instant::now();
            }
            (state.unload_when_idle, state.last_used.elapsed())
        };
        if retired || asked {
            self.try_unload(if retired {
                "dropped from the table"
            } else {
                "asked"
            });
        } else if !keep.pinned && keep.keep_alive.expired(idle_for) {
            self.try_unload("keep_alive expired");
        }
    }
}

impl<T: Served> Held for Unit<T> {
    fn name(&self) -> String {
        self.name.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn need(&self) -> Need {
        self.need
    }
    fn phase(&self) -> Phase {
        Unit::phase(self)
    }
    fn evictable(&self) -> Option<Instant> {
        if self.keep().pinned {
            return None;
        }
        let state = self.lock();
        match &state.slot {
            Slot::Ready(v) if state.leases == 0 && v.in_flight() == 0 => Some(state.last_used),
            _ => None,
        }
    }
    fn busy(&self) -> usize {
        self.in_flight()
    }
    fn pinned(&self) -> bool {
        self.keep().pinned
    }
    fn evict(&self) -> bool {
        self.try_unload("evicted for another model")
    }
}

/// One request's use of a loaded model: while it lives the model stays in memory; dropping it
/// marks the model used now (its keep-alive counts from here).
pub struct Lease<T: Served> {
    unit: Arc<Unit<T>>,
    value: T,
}

impl<T: Served + std::fmt::Debug> std::fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Lease").field(&self.value).finish()
    }
}

impl<T: Served> Deref for Lease<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Served> Drop for Lease<T> {
    fn drop(&mut self) {
        let mut state = self.unit.lock();
        state.leases = state.leases.saturating_sub(1);
        state.last_used = Instant::now();
    }
}
