//! The engine loop: owns the model on its own OS thread and runs one batched forward step after
//! another over every running sequence. Each iteration admits waiting requests (FCFS), reaps
//! cancelled / disconnected / stalled streams, plans a step (one decode row per running stream,
//! then prefill chunks), runs it, samples and sends events without ever blocking on a reader.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_infer::{
    ConstraintError, Sampler, Sequence, Step, TextModel, TextTokenizer, TokenConstraint,
};
use hearth_types::{AbortReason, FinishReason, TokenEvent, Usage};
use tokio::sync::mpsc::{self, error::TrySendError};
use tracing::{debug, error, info, info_span, warn, Span};

use crate::config::Speculation;
use crate::handle::{CancelHandle, Pending, RunState, Shared};
use crate::spare::{common_prefix, Spares, Taken, WORTH_A_COPY};
use crate::Error;

/// How long the loop sleeps when every running stream is paused on a full channel.
const PAUSED_POLL: Duration = Duration::from_millis(2);
/// Longest gathering of a burst, in gather windows. 16 parallel HTTP requests on a 2-core box
/// (authentication, the hold, tokenization) reach the queue over more than 8 ms; the callers
/// announce them (`SchedulerHandle::announce`) while they prepare them.
const GATHER_MAX_WINDOWS: u32 = 25;
/// How long the loop sleeps with nothing to do before looking at deadlines again.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// After the last stream ended at shutdown, how long undelivered final events may wait.
const FINAL_FLUSH: Duration = Duration::from_millis(500);

mod batch;
mod draft;
mod draft_model;
mod emit;
mod verify;

use batch::{Active, Batch};

pub(crate) struct Engine {
    model: TextModel,
    /// The draft model, when one drafts for `model`.
    draft: Option<TextModel>,
    batch: Batch,
}

/// Marks the engine gone however the thread ends (return or panic) and wakes `shutdown`.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let mut queue = self.0.lock();
        let panicking = std::thread::panicking();
        let why = if panicking {
            "the engine thread panicked"
        } else {
            "the engine has stopped"
        };
        queue.dead.get_or_insert_with(|| why.to_string());
        for pending in queue.waiting.drain(..) {
            let refusal = if panicking {
                Error::EngineUnavailable(why.to_string())
            } else {
                Error::ShuttingDown {
                    retry_after: self.0.config.retry_after,
                }
            };
            let _ = pending.admit.send(Err(refusal));
        }
        queue.active = 0;
        drop(queue);
        self.0.metrics.queue_depth.store(0, Relaxed);
        self.0.metrics.active.store(0, Relaxed);
        self.0.metrics.kv_bytes_in_use.store(0, Relaxed);
        if panicking {
            error!(model = %self.0.config.name, "engine thread panicked; the model is unavailable");
        }
        self.0.stopped.send_replace(true);
    }
}

impl Engine {
    pub(crate) fn new(model: TextModel, draft: Option<TextModel>, shared: Arc<Shared>) -> Self {
        let vocab = model.info().vocab_size;
        let tokenizer = Arc::clone(&shared.tokenizer);
        let draft_vocab = draft.as_ref().map_or(0, |d| d.info().vocab_size);
        Engine {
            model,
            draft,
            batch: Batch {
                shared,
                tokenizer,
                active: Vec::new(),
                closing: Vec::new(),
                kv_reserved: 0,
                spares: Spares::default(),
                vocab,
                cost: Default::default(),
                draft_cost: Default::default(),
                draft_acceptance: Default::default(),
                draft_vocab,
                admitted: 0,
            },
        }
    }

    pub(crate) fn run(self) {
        // The engine (and with it the model's weights and KV cache) is dropped inside `serve`,
        // before the guard says the engine stopped: whoever waits for that (an unload) finds the
        // memory freed.
        let _exit = ExitGuard(Arc::clone(&self.batch.shared));
        self.serve();
    }

    fn serve(mut self) {
        let name = self.batch.shared.config.name.clone();
        info!(model = %name, "engine started");
        loop {
            let idle = self.batch.active.is_empty();
            let mut draining = self.batch.admit(&self.model, self.draft.as_ref());
            if idle && draining.is_none() && !self.batch.active.is_empty() {
                self.batch.gather();
                draining = self.batch.admit(&self.model, self.draft.as_ref());
            }
            if let Some(deadline) = draining {
                if Instant::now() >= deadline && !self.batch.active.is_empty() {
                    info!(model = %name, streams = self.batch.active.len(), "grace period over, aborting");
                    let retry_after = self.batch.shared.config.retry_after;
                    self.batch.abort_all(AbortReason::Shutdown { retry_after });
                }
            }
            self.batch.reap();
            if draining.is_some() && self.batch.active.is_empty() {
                self.batch.final_flush();
                break;
            }
            if self.batch.plan() == 0 {
                self.batch.idle_wait(draining.is_some());
                continue;
            }
            self.step();
        }
        info!(model = %name, "engine stopped");
    }

    fn step(&mut self) {
        let started = Instant::now();
        let batch = &mut self.batch;
        if let Some(draft) = self.draft.as_mut() {
            batch.run_draft_model(draft);
        }
        // The model's step alone: the draft steps' time is `DraftCost`'s.
        let stepped = Instant::now();
        let mut rows = Vec::with_capacity(batch.active.len());
        let mut prefilling = false;
        let mut outputs = Vec::with_capacity(batch.active.len());
        let mut tokens = 0;
        let mut steps = Vec::with_capacity(batch.active.len());
        for (i, a) in batch.active.iter_mut().enumerate() {
            if let Some((from, to)) = a.planned.take() {
                let Active {
                    seq,
                    ids,
                    draft,
                    prompt_len,
                    ..
                } = a;
                prefilling |= from < *prompt_len;
                // A draft is verified at every position it feeds.
                let (tokens_here, outs) = if draft.is_empty() {
                    (&ids[from..to], 1)
                } else {
                    (&draft[..], draft.len())
                };
                steps.push(Step {
                    seq,
                    tokens: tokens_here,
                });
                rows.push(i);
                outputs.push(outs);
                tokens += to - from;
            }
        }
        let span = tracing::debug_span!("step", rows = rows.len(), tokens);
        let _enter = span.enter();
        let result = self.model.forward_rows(&mut steps, &outputs);
        drop(steps);
        let shared = Arc::clone(&batch.shared);
        let metrics = &shared.metrics;
        metrics.steps.fetch_add(1, Relaxed);
        metrics.batch_rows.record(rows.len() as u64);
        metrics.batch_tokens.record(tokens as u64);
        let took = match result {
            Ok(logits) => batch.after_step(&rows, &outputs, logits),
            Err(e) => {
                error!(error = %e, rows = rows.len(), "forward step failed; aborting its streams");
                let reason = AbortReason::EngineFailure(e.to_string());
                for &i in rows.iter().rev() {
                    batch.end(i, Err(reason.clone()));
                }
                0
            }
        };
        let elapsed = started.elapsed();
        metrics.step_time.record_duration(elapsed);
        if !prefilling && batch.shared.config.speculation != Speculation::Off {
            batch
                .cost
                .record(tokens, took, stepped.elapsed().as_secs_f64());
        }
    }
}
