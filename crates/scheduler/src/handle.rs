//! The async side: [`SchedulerHandle::submit`] queues a request and waits for its admission,
//! [`Generation`] is what a caller reads events from, [`CancelHandle`] stops one stream. Nothing
//! here ever blocks on the engine beyond a short mutex. Which stream has which id is the caller's
//! business: the scheduler keeps no map of them (the server's map of live streams is the one).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use hearth_infer::{SamplingParams, TextModel, TextTokenizer, TokenConstraint};
use hearth_types::{AbortReason, FinishReason, TokenEvent, Usage};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Span;

use crate::engine::Engine;
use crate::metrics::{Metrics, MetricsSnapshot};
pub(crate) use crate::queue::{Pending, Queue, RunState, Shared};
use crate::{Error, SchedulerConfig, Speculation};

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
}

/// One generation request, already tokenized and validated by the caller.
#[derive(Debug)]
pub struct Request {
    /// The rendered, tokenized prompt.
    pub prompt_ids: Vec<u32>,
    /// Sampling parameters; `params.max_tokens` is the most output tokens.
    pub params: SamplingParams,
    /// The stream's name in the engine's spans and logs, and [`Generation::stream_id`]. The
    /// caller chooses it and keeps it unique (the server's map of live streams refuses a
    /// duplicate); the scheduler looks nothing up by it.
    pub stream_id: String,
    /// The caller's span; the engine's per-request span is its child.
    pub span: Span,
    /// Keep generating through end-of-sequence tokens until `max_tokens` (benchmarks only, so
    /// that every stream produces the same number of tokens).
    pub ignore_eos: bool,
    /// What the output must follow (e.g. a JSON schema compiled by hearth-grammar): each step
    /// samples only among the tokens it allows, and the stream finishes with `Stop` once it is
    /// complete. A constraint that fails aborts this stream alone (`EngineFailure`).
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

/// Starts engines. See [`Scheduler::spawn`].
pub struct Scheduler;

impl Scheduler {
    /// Moves `model` onto a new OS thread running its engine loop. A configuration that
    /// speculates with a draft model is refused here: [`Scheduler::spawn_with_draft`] takes it.
    pub fn spawn(model: TextModel, config: SchedulerConfig) -> Result<SchedulerHandle, Error> {
        if matches!(config.speculation, Speculation::Draft(_)) {
            return Err(Error::InvalidConfig(
                "draft-model speculation needs its draft model".into(),
            ));
        }
        Self::start(model, None, config)
    }

    /// As [`spawn`](Scheduler::spawn), with `draft` proposing tokens for `model` to verify
    /// (`config.speculation` must be [`Speculation::Draft`]). The draft must read ids as the
    /// model does (the same tokenizer); each stream's KV budget counts both caches.
    pub fn spawn_with_draft(
        model: TextModel,
        draft: TextModel,
        config: SchedulerConfig,
    ) -> Result<SchedulerHandle, Error> {
        if !matches!(config.speculation, Speculation::Draft(_)) {
            return Err(Error::InvalidConfig(
                "a draft model is given but speculation is not `draft`".into(),
            ));
        }
        if let Some(why) = model.tokenizer().id_mismatch(&draft.tokenizer()) {
            return Err(Error::InvalidConfig(format!(
                "the draft model's vocabulary is not the model's: {why}"
            )));
        }
        Self::start(model, Some(draft), config)
    }

    fn start(
        model: TextModel,
        draft: Option<TextModel>,
        config: SchedulerConfig,
    ) -> Result<SchedulerHandle, Error> {
        config.check()?;
        let info = model.info();
        let draft_kv = draft.as_ref().map_or(0, |d| d.info().kv_bytes_per_token);
        let (stopped, stopped_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            context_length: info.context_length,
            vocab_size: info.vocab_size,
            kv_bytes_per_token: (info.kv_bytes_per_token + draft_kv) as u64,
            tokenizer: model.tokenizer(),
            config,
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                active: 0,
                state: RunState::Running,
                dead: None,
            }),
            wake: Condvar::new(),
            metrics: Metrics::default(),
            stopped,
            announced: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
        });
        let engine_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("engine-{}", shared.config.name))
            .spawn(move || Engine::new(model, draft, engine_shared).run())
            .map_err(|e| {
                Error::EngineUnavailable(format!("cannot start the engine thread: {e}"))
            })?;
        Ok(SchedulerHandle {
            inner: Arc::new(HandleInner {
                shared,
                stopped: stopped_rx,
            }),
        })
    }
}

struct HandleInner {
    shared: Arc<Shared>,
    stopped: watch::Receiver<bool>,
}

impl Drop for HandleInner {
    /// The last handle gone: drain like a shutdown (running streams finish within the grace).
    fn drop(&mut self) {
        self.shared.begin_shutdown();
    }
}

/// The async entry to one model's engine. Clone it freely; when the last clone is dropped the
/// engine drains and stops.
#[derive(Clone)]
pub struct SchedulerHandle {
    inner: Arc<HandleInner>,
}

impl std::fmt::Debug for SchedulerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerHandle")
            .field("name", &self.inner.shared.config.name)
            .finish()
    }
}

/// Removes a request from the queue if `submit` gives up on it (timeout or dropped future).
struct QueueGuard<'a> {
    shared: &'a Shared,
    id: u64,
    cancel: CancelHandle,
    armed: bool,
}

impl QueueGuard<'_> {
    /// True if the request was still waiting and is now removed.
    fn withdraw(&mut self) -> bool {
        self.armed = false;
        let mut queue = self.shared.lock();
        let before = queue.waiting.len();
        queue.waiting.retain(|p| p.id != self.id);
        let removed = queue.waiting.len() < before;
        self.shared
            .metrics
            .queue_depth
            .store(queue.waiting.len() as u64, Ordering::Relaxed);
        removed
    }
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            // The caller went away while waiting; if it was admitted meanwhile, the engine sees
            // the dropped receiver at its next step.
            self.cancel.cancel();
            self.withdraw();
        }
    }
}

/// A request on its way to [`SchedulerHandle::submit`]; see [`SchedulerHandle::announce`].
#[must_use = "the announcement ends when the guard is dropped"]
pub struct Announced {
    shared: Arc<Shared>,
}

impl Drop for Announced {
    fn drop(&mut self) {
        // No wake-up: a gathering engine looks again within a gather window, and a submit that
        // follows wakes it anyway.
        self.shared.announced.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SchedulerHandle {
    pub fn name(&self) -> &str {
        &self.inner.shared.config.name
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.inner.shared.config
    }

    /// The model's tokenizer and chat template (to count prompt tokens before submitting).
    pub fn tokenizer(&self) -> Arc<TextTokenizer> {
        Arc::clone(&self.inner.shared.tokenizer)
    }

    pub fn context_length(&self) -> usize {
        self.inner.shared.context_length
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.shared.metrics.snapshot()
    }

    /// Says that a request is on its way: its caller is still preparing it (authenticating,
    /// tokenizing, placing a hold) and will submit it, or give up, before dropping the guard.
    /// An idle engine that is gathering a burst into its first step waits for announced
    /// requests too, within the gather limit, so that a burst of HTTP requests whose
    /// preparation spreads over a few milliseconds starts in one step, as it would if the
    /// requests had been submitted together. Drop the guard just before `submit`.
    pub fn announce(&self) -> Announced {
        self.inner.shared.announced.fetch_add(1, Ordering::Relaxed);
        Announced {
            shared: Arc::clone(&self.inner.shared),
        }
    }

    /// Requests waiting for admission or running in the batch.
    pub fn in_flight(&self) -> usize {
        let queue = self.inner.shared.lock();
        queue.waiting.len() + queue.active
    }

    /// Why the engine is unavailable, if it is (the thread died).
    pub fn unavailable(&self) -> Option<String> {
        self.inner.shared.lock().dead.clone()
    }

    /// Queues `request` and waits until the engine admits it into the running batch.
    ///
    /// Refused at once, without queueing: `Overloaded` past the queue limit, `ShuttingDown`,
    /// `EngineUnavailable`, and requests that can never run (`EmptyPrompt`, `PromptTooLong`,
    /// `ExceedsKvBudget`). A request not admitted within the queue timeout
    /// gets `QueueTimeout`. Dropping the returned future withdraws the request.
    pub async fn submit(&self, request: Request) -> Result<Generation, Error> {
        let shared = &*self.inner.shared;
        let config = &shared.config;
        let Request {
            prompt_ids,
            params,
            stream_id,
            span,
            ignore_eos,
            constraint,
        } = request;
        let metrics = &shared.metrics;
        metrics.requests.fetch_add(1, Ordering::Relaxed);
        let refuse = |e: Error| {
            metrics.rejected.fetch_add(1, Ordering::Relaxed);
            Err(e)
        };

        let prompt_tokens = prompt_ids.len();
        if prompt_tokens == 0 {
            return refuse(Error::EmptyPrompt);
        }
        if params.max_tokens == 0 {
            return refuse(Error::ZeroMaxTokens);
        }
        // Checked here so that one bad request can never fail a step shared with others.
        if let Some(&id) = prompt_ids
            .iter()
            .find(|&&id| id as usize >= shared.vocab_size)
        {
            return refuse(Error::InvalidToken {
                id,
                vocab_size: shared.vocab_size,
            });
        }
        if prompt_tokens >= shared.context_length {
            return refuse(Error::PromptTooLong {
                got: prompt_tokens,
                max: shared.context_length - 1,
            });
        }
        let capacity = (prompt_tokens + params.max_tokens).min(shared.context_length);
        let kv_bytes = capacity as u64 * shared.kv_bytes_per_token;
        if kv_bytes > config.kv_budget_bytes {
            return refuse(Error::ExceedsKvBudget {
                prompt_tokens,
                max_tokens: params.max_tokens,
                needed_bytes: kv_bytes,
                budget_bytes: config.kv_budget_bytes,
            });
        }

        let cancel = CancelHandle::default();
        let (tx, events) = mpsc::channel(config.channel_capacity);
        let (admit, admitted) = oneshot::channel();
        let progress = Arc::new(AtomicUsize::new(0));
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut queue = shared.lock();
            let refusal = if let Some(why) = &queue.dead {
                Some(Error::EngineUnavailable(why.clone()))
            } else if matches!(queue.state, RunState::Draining { .. }) {
                Some(Error::ShuttingDown {
                    retry_after: config.retry_after,
                })
            } else {
                let free_slots = config.max_active.saturating_sub(queue.active);
                let limit = config.max_queued + free_slots;
                (queue.waiting.len() >= limit).then(|| Error::Overloaded {
                    waiting: queue.waiting.len(),
                    limit: config.max_queued,
                    retry_after: config.retry_after,
                })
            };
            if let Some(e) = refusal {
                drop(queue);
                return refuse(e);
            }
            queue.waiting.push_back(Pending {
                id,
                stream_id: stream_id.clone(),
                prompt: prompt_ids,
                params,
                ignore_eos,
                capacity,
                kv_bytes,
                tx,
                cancel: cancel.clone(),
                admit,
                enqueued: Instant::now(),
                span,
                progress: Arc::clone(&progress),
                constraint,
            });
            metrics
                .queue_depth
                .store(queue.waiting.len() as u64, Ordering::Relaxed);
        }
        shared.wake.notify_all();

        let mut guard = QueueGuard {
            shared,
            id,
            cancel: cancel.clone(),
            armed: true,
        };
        let started = Instant::now();
        let mut admitted = admitted;
        let admitted = match tokio::time::timeout(config.queue_timeout, &mut admitted).await {
            Ok(result) => result,
            Err(_elapsed) => {
                if guard.withdraw() {
                    return refuse(Error::QueueTimeout {
                        waited: started.elapsed(),
                        retry_after: config.retry_after,
                    });
                }
                // The engine took it in the same instant: its answer is already on its way.
                admitted.await
            }
        };
        guard.armed = false;
        drop(guard);
        match admitted {
            Ok(Ok(())) => Ok(Generation {
                stream_id,
                prompt_tokens,
                events,
                cancel,
                progress,
                done: false,
            }),
            Ok(Err(e)) => refuse(e),
            Err(_engine_gone) => refuse(Error::EngineUnavailable("the engine stopped".into())),
        }
    }

    /// Refuses new requests, lets running streams go on for the configured grace period, aborts
    /// the rest with `AbortReason::Shutdown`, and resolves when the engine thread has exited.
    pub async fn shutdown(&self) {
        self.inner.shared.begin_shutdown();
        let mut stopped = self.inner.stopped.clone();
        // An error means the engine's sender is gone, which also means it stopped.
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }
}

/// What one stream sends, in order: `Token`s, then exactly one `Finished` or `Aborted`.
/// Dropping it cancels the stream (the engine sees the closed channel within one step).
#[derive(Debug)]
pub struct Generation {
    stream_id: String,
    prompt_tokens: usize,
    events: mpsc::Receiver<TokenEvent>,
    cancel: CancelHandle,
    progress: Arc<AtomicUsize>,
    done: bool,
}

/// A whole generation read to its end (see [`Generation::collect`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub text: String,
    pub usage: Usage,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Finished(FinishReason),
    Aborted(AbortReason),
}

impl Generation {
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Output tokens generated so far (the engine's count, ahead of the events read).
    pub fn generated_tokens(&self) -> usize {
        self.progress.load(Ordering::Relaxed)
    }

    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Stops the stream; an `Aborted { reason: Cancelled }` event follows within one step.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// The next event; `None` after the terminal one. If the engine dies mid-stream this yields
    /// an `Aborted { EngineFailure }` with the partial usage instead of ending silently.
    pub async fn next(&mut self) -> Option<TokenEvent> {
        if self.done {
            return None;
        }
        match self.events.recv().await {
            Some(event) => {
                self.done = !matches!(event, TokenEvent::Token { .. });
                Some(event)
            }
            None => {
                self.done = true;
                Some(TokenEvent::Aborted {
                    usage: Usage {
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens: self.generated_tokens(),
                    },
                    reason: AbortReason::EngineFailure("the engine stopped".into()),
                })
            }
        }
    }

    /// Reads every event and returns the concatenated text with the terminal outcome.
    pub async fn collect(mut self) -> Output {
        let mut text = String::new();
        while let Some(event) = self.next().await {
            match event {
                TokenEvent::Token { text: piece, .. } => text.push_str(&piece),
                TokenEvent::Finished { usage, reason } => {
                    return Output {
                        text,
                        usage,
                        outcome: Outcome::Finished(reason),
                    }
                }
                TokenEvent::Aborted { usage, reason } => {
                    return Output {
                        text,
                        usage,
                        outcome: Outcome::Aborted(reason),
                    }
                }
            }
        }
        // `next` yields a terminal event before `None`; this only guards a future change.
        let usage = Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.generated_tokens(),
        };
        Output {
            text,
            usage,
            outcome: Outcome::Aborted(AbortReason::EngineFailure("stream ended early".into())),
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.done {
            self.cancel.cancel();
        }
    }
}
