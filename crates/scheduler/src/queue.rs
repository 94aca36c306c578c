//! The state the handles and the engine thread share: the queue of requests waiting for
//! admission, the run state, and the engine's figures.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use hearth_infer::{SamplingParams, TextTokenizer, TokenConstraint};
use hearth_types::TokenEvent;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Span;

use crate::handle::CancelHandle;
use crate::metrics::Metrics;
use crate::{Error, SchedulerConfig};

/// A request waiting for admission, owned by the shared queue until the engine takes it.
pub(crate) struct Pending {
    pub id: u64,
    pub stream_id: String,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub ignore_eos: bool,
    /// KV positions the sequence is allocated (prompt + max output, clipped to the context).
    pub capacity: usize,
    pub kv_bytes: u64,
    pub tx: mpsc::Sender<TokenEvent>,
    pub cancel: CancelHandle,
    pub admit: oneshot::Sender<Result<(), Error>>,
    pub enqueued: Instant,
    pub span: Span,
    pub progress: Arc<AtomicUsize>,
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

pub(crate) enum RunState {
    Running,
    /// Refusing new work; running streams end by `deadline` or are aborted.
    Draining {
        deadline: Instant,
    },
}

pub(crate) struct Queue {
    pub waiting: VecDeque<Pending>,
    /// Sequences in the engine's batch, kept here so `submit` can count free slots.
    pub active: usize,
    pub state: RunState,
    /// Set when the engine thread is gone, with the reason.
    pub dead: Option<String>,
}

/// State shared by the handles and the engine thread.
pub(crate) struct Shared {
    pub config: SchedulerConfig,
    pub queue: Mutex<Queue>,
    pub wake: Condvar,
    pub metrics: Metrics,
    pub tokenizer: Arc<TextTokenizer>,
    pub context_length: usize,
    pub vocab_size: usize,
    pub kv_bytes_per_token: u64,
    pub stopped: watch::Sender<bool>,
    /// Requests announced by their callers and not yet queued (see [`SchedulerHandle::announce`]).
    pub announced: AtomicUsize,
    pub next_id: AtomicU64,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts draining (idempotent): new requests are refused, running ones get the grace period.
    pub fn begin_shutdown(&self) {
        let mut queue = self.lock();
        if matches!(queue.state, RunState::Running) {
            queue.state = RunState::Draining {
                deadline: Instant::now() + self.config.shutdown_grace,
            };
        }
        drop(queue);
        self.wake.notify_all();
    }
}
