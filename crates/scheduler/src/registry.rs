//! [`CancelHandle`] stops one stream; [`StreamRegistry`] finds a running stream by id to cancel
//! it (shared by every engine of a server, so one id space spans them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::Error;

/// Stops one stream (queued or running) within one engine step. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    fn same(&self, other: &CancelHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Stream id -> cancel handle of every queued or running stream. Share one registry between
/// the schedulers of several models so one lookup serves `/stream/shutdown`.
#[derive(Debug, Clone, Default)]
pub struct StreamRegistry(Arc<Mutex<HashMap<String, CancelHandle>>>);

impl StreamRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, CancelHandle>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Cancels the stream with this id. False when no queued or running stream has it (unknown
    /// or already ended): the caller answers 404.
    pub fn cancel(&self, stream_id: &str) -> bool {
        match self.map().get(stream_id) {
            Some(handle) if !handle.is_cancelled() => {
                handle.cancel();
                true
            }
            _ => false,
        }
    }

    /// True while the stream is queued or running.
    pub fn contains(&self, stream_id: &str) -> bool {
        self.map().contains_key(stream_id)
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn insert(&self, stream_id: &str, handle: CancelHandle) -> Result<(), Error> {
        let mut map = self.map();
        if map.contains_key(stream_id) {
            return Err(Error::DuplicateStreamId(stream_id.to_string()));
        }
        map.insert(stream_id.to_string(), handle);
        Ok(())
    }

    /// Removes the entry if it still belongs to `handle` (ids are never reused, but be exact).
    pub(crate) fn remove(&self, stream_id: &str, handle: &CancelHandle) {
        let mut map = self.map();
        if map.get(stream_id).is_some_and(|h| h.same(handle)) {
            map.remove(stream_id);
        }
    }
}
