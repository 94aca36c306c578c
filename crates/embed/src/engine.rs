//! The engine: one thread owns a model and encodes what clients queue (texts to embed, pairs to
//! score), several clients' inputs in one forward pass. Inputs are sorted by length and cut into batches of at most
//! `max_batch_tokens` padded tokens, so short inputs are not padded to long ones; each client
//! gets its outputs back in its own order. The queue is bounded by inputs: a request that would
//! overfill it is refused at once (`Error::Busy`), and a request whose client has gone is skipped
//! before it costs a forward pass.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use crate::encoder::Tokens;
use crate::error::{Error, Result};

/// A model the engine can run: one forward pass over a batch of checked inputs, one output per
/// input in their order, each as it would be alone.
pub trait Encode: Send + Sync + 'static {
    type Output: Send + 'static;

    fn encode(&self, inputs: &[&Tokens]) -> Result<Vec<Self::Output>>;
}

/// How the engine batches and queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Padded tokens in one forward pass at most (inputs × the longest of them).
    pub max_batch_tokens: usize,
    /// Inputs waiting at most, all clients together.
    pub max_queued: usize,
    /// How long an idle engine waits for more requests to join the first.
    pub gather_window: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_tokens: 1024,
            max_queued: 4096,
            gather_window: Duration::from_micros(500),
        }
    }
}

/// What the engine has done, for metrics.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Requests taken into the queue.
    pub requests: AtomicUsize,
    /// Requests refused because the queue was full.
    pub refused: AtomicUsize,
    /// Inputs waiting now.
    pub queued: AtomicUsize,
    /// Forward passes run.
    pub batches: AtomicUsize,
    /// Inputs encoded.
    pub inputs: AtomicUsize,
    /// Requests skipped because their client had gone.
    pub abandoned: AtomicUsize,
}

/// [`EngineStats`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub requests: u64,
    pub refused: u64,
    pub queued: u64,
    pub batches: u64,
    pub inputs: u64,
    pub abandoned: u64,
}

impl EngineStats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let read = |a: &AtomicUsize| a.load(Ordering::Relaxed) as u64;
        StatsSnapshot {
            requests: read(&self.requests),
            refused: read(&self.refused),
            queued: read(&self.queued),
            batches: read(&self.batches),
            inputs: read(&self.inputs),
            abandoned: read(&self.abandoned),
        }
    }
}

struct Job<O> {
    inputs: Vec<Tokens>,
    reply: oneshot::Sender<Result<Vec<O>>>,
}

/// A handle on a running engine; cloned freely. The engine stops when every handle is gone.
pub struct Engine<M: Encode> {
    model: Arc<M>,
    jobs: mpsc::UnboundedSender<Job<M::Output>>,
    stats: Arc<EngineStats>,
    max_queued: usize,
}

impl<M: Encode> Clone for Engine<M> {
    fn clone(&self) -> Self {
        Engine {
            model: self.model.clone(),
            jobs: self.jobs.clone(),
            stats: self.stats.clone(),
            max_queued: self.max_queued,
        }
    }
}

impl<M: Encode> Engine<M> {
    /// Starts the engine's thread on `model`.
    pub fn start(model: M, config: EngineConfig) -> Engine<M> {
        let model = Arc::new(model);
        let stats = Arc::new(EngineStats::default());
        let (jobs, rx) = mpsc::unbounded_channel();
        let run = Runner {
            model: model.clone(),
            stats: stats.clone(),
            config: config.clone(),
        };
        std::thread::Builder::new()
            .name("encoder-engine".into())
            .spawn(move || run.run(rx))
            .expect("spawning the embedding engine's thread");
        Engine {
            model,
            jobs,
            stats,
            max_queued: config.max_queued,
        }
    }

    /// The model, for tokenizing and its limits.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// What the engine has done.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Tells, once every handle is dropped, whether the engine's thread has let the model go
    /// (and so freed its weights).
    pub fn released(&self) -> impl Fn() -> bool + Send + 'static {
        let model = Arc::downgrade(&self.model);
        move || model.strong_count() == 0
    }

    /// The outputs of `inputs` (each checked by the model), in their order.
    pub async fn encode(&self, inputs: Vec<Tokens>) -> Result<Vec<M::Output>> {
        let n = inputs.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        // Reserve room in the queue, or refuse.
        let mut queued = self.stats.queued.load(Ordering::Relaxed);
        loop {
            if queued + n > self.max_queued {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Error::Busy { queued });
            }
            match self.stats.queued.compare_exchange(
                queued,
                queued + n,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => queued = now,
            }
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        if self.jobs.send(Job { inputs, reply }).is_err() {
            self.stats.queued.fetch_sub(n, Ordering::AcqRel);
            return Err(Error::Stopped);
        }
        answer.await.map_err(|_| Error::Stopped)?
    }
}

struct Runner<M> {
    model: Arc<M>,
    stats: Arc<EngineStats>,
    config: EngineConfig,
}

impl<M: Encode> Runner<M> {
    fn run(self, mut rx: mpsc::UnboundedReceiver<Job<M::Output>>) {
        while let Some(first) = rx.blocking_recv() {
            let mut jobs = vec![first];
            // Requests that arrive together are embedded together.
            std::thread::sleep(self.config.gather_window);
            while let Ok(job) = rx.try_recv() {
                jobs.push(job);
            }
            self.serve(jobs);
        }
    }

    fn serve(&self, jobs: Vec<Job<M::Output>>) {
        let taken: usize = jobs.iter().map(|j| j.inputs.len()).sum();
        let (live, gone): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|j| !j.reply.is_closed());
        self.stats
            .abandoned
            .fetch_add(gone.len(), Ordering::Relaxed);
        // Every input of every live job, shortest first.
        let mut order: Vec<(usize, usize)> = live
            .iter()
            .enumerate()
            .flat_map(|(j, job)| (0..job.inputs.len()).map(move |i| (j, i)))
            .collect();
        order.sort_by_key(|&(j, i)| live[j].inputs[i].len());
        let mut out: Vec<Vec<Option<M::Output>>> = live
            .iter()
            .map(|j| j.inputs.iter().map(|_| None).collect())
            .collect();
        let mut failed: Option<String> = None;
        let mut at = 0;
        while at < order.len() && failed.is_none() {
            // As many as fit in the budget at the length of the batch's longest (the last).
            let mut end = at + 1;
            while end < order.len() {
                let (j, i) = order[end];
                let longest = live[j].inputs[i].len();
                if (end + 1 - at) * longest > self.config.max_batch_tokens {
                    break;
                }
                end += 1;
            }
            let batch: Vec<&Tokens> = order[at..end]
                .iter()
                .map(|&(j, i)| &live[j].inputs[i])
                .collect();
            match self.model.encode(&batch) {
                Ok(vectors) => {
                    for (&(j, i), v) in order[at..end].iter().zip(vectors) {
                        out[j][i] = Some(v);
                    }
                    self.stats.batches.fetch_add(1, Ordering::Relaxed);
                    self.stats.inputs.fetch_add(end - at, Ordering::Relaxed);
                }
                Err(e) => {
                    warn!(error = %e, "an encoder batch failed");
                    failed = Some(e.to_string());
                }
            }
            at = end;
        }
        self.stats.queued.fetch_sub(taken, Ordering::AcqRel);
        for (job, vectors) in live.into_iter().zip(out) {
            let answer = vectors
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    let reason = failed
                        .clone()
                        .unwrap_or_else(|| "an input was left out".into());
                    Error::Model(candle_core::Error::Msg(reason))
                });
            let _ = job.reply.send(answer);
        }
    }
}
