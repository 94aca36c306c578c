//! One registry of served models for the completion and image services: each model loads on a
//! thread of its own at start-up, requests wait for it (at most [`LOAD_WAIT`]), and health reads
//! its state without waiting. A load that fails is kept with its reason.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{error, info};

/// How long a request waits for a model that is still loading.
pub const LOAD_WAIT: Duration = Duration::from_secs(120);

/// What a registry serves: a loaded model's handle, cheap to clone.
pub trait Served: Clone + Send + Sync + 'static {
    /// Why a loaded model cannot serve now (its engine or worker stopped), if it cannot.
    fn unavailable(&self) -> Option<String>;
}

/// A model's state as health reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Loading,
    Ready,
    Unavailable(String),
}

impl Availability {
    /// `ready`, `loading` or `unavailable: <why>`.
    pub fn describe(&self) -> String {
        match self {
            Availability::Loading => "loading".into(),
            Availability::Ready => "ready".into(),
            Availability::Unavailable(why) => format!("unavailable: {why}"),
        }
    }
}

/// Why [`Models::get`] has no model to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("no model {0}")]
    Unknown(String),
    #[error("model {0} is still loading after {secs} s", secs = LOAD_WAIT.as_secs())]
    StillLoading(String),
    #[error("model {id} is unavailable: {why}")]
    Unavailable { id: String, why: String },
}

#[derive(Clone)]
enum State<T> {
    Loading,
    Ready(T),
    Failed(String),
}

/// Model ids and the state of what serves each; ids may share one loaded model.
pub struct Models<T> {
    slots: BTreeMap<String, watch::Receiver<State<T>>>,
}

/// A clone sees the same loads (the metrics export reads one at scrape time).
impl<T> Clone for Models<T> {
    fn clone(&self) -> Self {
        Self {
            slots: self.slots.clone(),
        }
    }
}

impl<T> Default for Models<T> {
    fn default() -> Self {
        Self {
            slots: BTreeMap::new(),
        }
    }
}

impl<T: Served> Models<T> {
    /// Starts `load` on a thread of its own (named `load-<first id>`) and returns at once; every
    /// id in `ids` is served by what it loads.
    pub fn load(
        &mut self,
        ids: &[String],
        load: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) {
        let Some(first) = ids.first().cloned() else {
            return;
        };
        let (tx, rx) = watch::channel(State::Loading);
        let name = first.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("load-{first}"))
            .spawn(move || {
                let started = std::time::Instant::now();
                let state = match load() {
                    Ok(model) => {
                        let ms = started.elapsed().as_millis() as u64;
                        info!(model = %name, ms, "model loaded");
                        State::Ready(model)
                    }
                    Err(why) => {
                        error!(model = %name, error = %why, "model failed to load");
                        State::Failed(why)
                    }
                };
                tx.send_replace(state);
            });
        let rx = match spawned {
            Ok(_) => rx,
            Err(e) => watch::channel(State::Failed(format!("cannot start the loader: {e}"))).1,
        };
        for id in ids {
            self.slots.insert(id.clone(), rx.clone());
        }
    }

    /// The model serving `id`, waiting while it loads (at most [`LOAD_WAIT`]).
    pub async fn get(&self, id: &str) -> Result<T, ModelError> {
        let mut rx = self
            .slots
            .get(id)
            .ok_or_else(|| ModelError::Unknown(id.to_string()))?
            .clone();
        let unavailable = |why: String| ModelError::Unavailable {
            id: id.to_string(),
            why,
        };
        let state = tokio::time::timeout(LOAD_WAIT, rx.wait_for(|s| !matches!(s, State::Loading)))
            .await
            .map_err(|_| ModelError::StillLoading(id.to_string()))?
            .map_err(|_| unavailable("its loader stopped".into()))?
            .clone();
        match state {
            State::Ready(model) => match model.unavailable() {
                None => Ok(model),
                Some(why) => Err(unavailable(why)),
            },
            State::Failed(why) => Err(unavailable(why)),
            State::Loading => Err(ModelError::StillLoading(id.to_string())),
        }
    }

    /// The loaded model of `id` now, if it is loaded (without waiting).
    pub fn loaded(&self, id: &str) -> Option<T> {
        match &*self.slots.get(id)?.borrow() {
            State::Ready(model) => Some(model.clone()),
            _ => None,
        }
    }

    /// Each id's state, without waiting.
    pub fn status(&self) -> BTreeMap<String, Availability> {
        self.slots
            .iter()
            .map(|(id, rx)| {
                let availability = match &*rx.borrow() {
                    State::Loading => Availability::Loading,
                    State::Ready(model) => match model.unavailable() {
                        None => Availability::Ready,
                        Some(why) => Availability::Unavailable(why),
                    },
                    State::Failed(why) => Availability::Unavailable(why.clone()),
                };
                (id.clone(), availability)
            })
            .collect()
    }

    /// Every loaded model, once per id (ids that share a model give it once each).
    pub fn all_loaded(&self) -> Vec<(String, T)> {
        self.slots
            .keys()
            .filter_map(|id| Some((id.clone(), self.loaded(id)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[derive(Debug, Clone)]
    struct Fake(Arc<AtomicBool>);

    impl Served for Fake {
        fn unavailable(&self) -> Option<String> {
            (!self.0.load(Ordering::SeqCst)).then(|| "it stopped".to_string())
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn ids_share_a_load_requests_wait_for_it_and_health_reads_each_state() {
        let mut models = Models::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let a = Arc::clone(&alive);
        models.load(&ids(&["a", "b"]), move || {
            wait.recv().unwrap();
            Ok(Fake(a))
        });
        models.load(&ids(&["c"]), || Err("no such file".into()));
        assert_eq!(models.status()["a"], Availability::Loading);

        let waiting = models.get("b");
        go.send(()).unwrap();
        assert!(waiting.await.is_ok(), "a request waits for the load");
        assert_eq!(models.status()["a"], Availability::Ready);
        let failed = models.get("c").await.unwrap_err();
        assert_eq!(
            failed,
            ModelError::Unavailable {
                id: "c".into(),
                why: "no such file".into()
            }
        );
        assert_eq!(models.status()["c"].describe(), "unavailable: no such file");
        assert!(matches!(models.get("x").await, Err(ModelError::Unknown(_))));

        // A loaded model whose engine stopped is unavailable, to requests and to health.
        alive.store(false, Ordering::SeqCst);
        assert!(matches!(
            models.get("a").await,
            Err(ModelError::Unavailable { .. })
        ));
        assert_eq!(models.status()["b"].describe(), "unavailable: it stopped");
        assert_eq!(models.all_loaded().len(), 2);
    }
}
