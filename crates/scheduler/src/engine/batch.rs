//! The batch the engine loop owns: running sequences, admission, reaping, planning a step,
//! sampling and sending events without ever blocking on a reader.

use super::draft::{Drafter, StepCost, MAX_MODEL_SHARE};
use super::draft_model::{DraftAcceptance, DraftCost};
use super::emit::Emitter;
use super::*;
use crate::config::Speculation;

/// One running sequence: its KV cache, its tokens and its way back to the reader.
pub(super) struct Active {
    pub(super) stream_id: String,
    pub(super) seq: Sequence,
    /// Prompt followed by the generated tokens (the repetition penalty's context too).
    pub(super) ids: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) generated: usize,
    pub(super) max_tokens: usize,
    pub(super) ignore_eos: bool,
    pub(super) capacity: usize,
    pub(super) kv_bytes: u64,
    pub(super) sampler: Sampler,
    /// What the request's output must follow (a grammar), if anything.
    pub(super) constraint: Option<Box<dyn TokenConstraint>>,
    /// Detokenizer, stop strings, log-probabilities waiting for their text.
    pub(super) emit: Emitter,
    pub(super) tx: mpsc::Sender<TokenEvent>,
    pub(super) cancel: CancelHandle,
    /// Events not yet accepted by the channel. Non-empty means the stream is paused.
    pub(super) outbox: VecDeque<TokenEvent>,
    pub(super) paused_since: Option<Instant>,
    pub(super) enqueued: Instant,
    pub(super) last_token: Option<Instant>,
    /// Tokens this step feeds, chosen by `plan`: positions of `ids`, or with a draft, the
    /// positions of `draft` as they will be.
    pub(super) planned: Option<(usize, usize)>,
    /// The drafter, when the model speculates.
    pub(super) drafter: Option<Drafter>,
    /// This step's tokens when it verifies a draft: the last token, then the drafted ones
    /// (empty otherwise).
    pub(super) draft: Vec<u32>,
    /// The draft model's cache of this stream's tokens, when a draft model drafts
    /// (`draft_model.rs`; dropped if the draft model cannot go on with it).
    pub(super) draft_seq: Option<Sequence>,
    /// The most tokens the draft model may propose for this step (set by `plan`).
    pub(super) draft_allowed: usize,
    pub(super) progress: Arc<AtomicUsize>,
    pub(super) span: Span,
}

impl Active {
    pub(super) fn fed(&self) -> usize {
        self.seq.len()
    }
    pub(super) fn prefilling(&self) -> bool {
        self.fed() < self.prompt_len
    }
    pub(super) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated,
        }
    }
    /// Drops the draft model's cache of this stream, if it has one, and returns the bytes its
    /// reservation held (for [`Batch::release_kv`]).
    pub(super) fn drop_draft_cache(&mut self) -> u64 {
        let bytes = self.draft_seq.take().map_or(0, |d| d.kv_bytes() as u64);
        self.kv_bytes -= bytes;
        bytes
    }
}

/// A stream that has ended but whose last events wait for room in its channel.
pub(super) struct Closing {
    pub(super) tx: mpsc::Sender<TokenEvent>,
    pub(super) outbox: VecDeque<TokenEvent>,
    pub(super) since: Instant,
}

pub(super) enum Flush {
    /// Everything sent.
    Empty,
    /// The channel is full; the rest waits.
    Full,
    /// The reader is gone.
    Closed,
}

pub(super) fn flush(tx: &mpsc::Sender<TokenEvent>, outbox: &mut VecDeque<TokenEvent>) -> Flush {
    while let Some(event) = outbox.pop_front() {
        match tx.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(event)) => {
                outbox.push_front(event);
                return Flush::Full;
            }
            Err(TrySendError::Closed(_)) => {
                outbox.clear();
                return Flush::Closed;
            }
        }
    }
    Flush::Empty
}

/// The batch and everything the loop owns besides the model (kept apart so the model's
/// borrowed logits can be read while the batch is changed).
pub(super) struct Batch {
    pub(super) shared: Arc<Shared>,
    pub(super) tokenizer: Arc<TextTokenizer>,
    pub(super) active: Vec<Active>,
    pub(super) closing: Vec<Closing>,
    pub(super) kv_reserved: u64,
    /// KV caches of ended sequences, for reuse; they count against the budget with the active.
    pub(super) spares: Spares,
    pub(super) vocab: usize,
    /// What a drafted row costs, learned from the decoding steps.
    pub(super) cost: StepCost,
    /// What a drafted token costs in draft-model steps, learned from them.
    pub(super) draft_cost: DraftCost,
    /// How often the draft model's first tokens were confirmed lately.
    pub(super) draft_acceptance: DraftAcceptance,
    /// The draft model's vocabulary size (0 without one).
    pub(super) draft_vocab: usize,
    /// Streams admitted so far (for [`Batch::gets_draft`]).
    pub(super) admitted: u64,
}

/// With a draft model that costs more than it saves, one new stream in this many still drafts.
const DRAFT_PROBE: u64 = 32;

impl Batch {
    /// Moves waiting requests into the batch in arrival order while slots and KV budget allow.
    /// Returns the shutdown deadline when draining.
    pub(super) fn admit(
        &mut self,
        model: &TextModel,
        draft: Option<&TextModel>,
    ) -> Option<Instant> {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let mut queue = shared.lock();
        let draining = match queue.state {
            RunState::Running => None,
            RunState::Draining { deadline } => Some(deadline),
        };
        // Requests cancelled while waiting leave without a slot.
        let mut i = 0;
        while i < queue.waiting.len() {
            if queue.waiting[i].cancel.is_cancelled() || queue.waiting[i].tx.is_closed() {
                if let Some(p) = queue.waiting.remove(i) {
                    let _ = p.admit.send(Err(Error::Cancelled));
                }
            } else {
                i += 1;
            }
        }
        if draining.is_some() {
            for p in queue.waiting.drain(..) {
                let _ = p.admit.send(Err(Error::ShuttingDown {
                    retry_after: config.retry_after,
                }));
            }
        }
        while let Some(front) = queue.waiting.front() {
            let fits = self.active.len() < config.max_active
                && self.kv_reserved + front.kv_bytes <= config.kv_budget_bytes;
            if !fits {
                break; // FCFS: nobody overtakes the head of the queue
            }
            let Some(p) = queue.waiting.pop_front() else {
                break;
            };
            // Before the caller hears it is admitted, so it never sees itself still queued.
            shared
                .metrics
                .queue_depth
                .store(queue.waiting.len() as u64, Relaxed);
            // A kept cache if one fits; else a new one, for which kept caches make room.
            let room = config.kv_budget_bytes - self.kv_reserved;
            let reused = &shared.metrics.prefix_reused_tokens;
            // The draft model's own cache, for a stream that gets one.
            let draft = draft.filter(|_| self.gets_draft());
            let taken = self
                .spares
                .take(p.capacity, room, &p.prompt, config.prefix_reuse);
            // A cache taken whole needs no room; anything allocated anew (the cache, a draft
            // cache) gets it from the kept caches.
            if draft.is_some() || !matches!(taken, Some((Taken::Whole(..), _))) {
                self.spares.shrink_to(room - p.kv_bytes);
            }
            let (seq, kept_draft) = match taken {
                Some((Taken::Whole(seq, n), kept_draft)) => {
                    reused.fetch_add(n as u64, Relaxed);
                    (Ok(seq), kept_draft)
                }
                // The prompt's start sits in a smaller cache: a new cache, that start copied in.
                Some((Taken::CopyFrom(from, n), kept_draft)) => {
                    let seq = model.new_sequence(p.capacity).map(|mut seq| {
                        let copied = seq.copy_prefix(&from, n);
                        reused.fetch_add(copied as u64, Relaxed);
                        seq
                    });
                    (seq, kept_draft)
                }
                None => (model.new_sequence(p.capacity), None),
            };
            // A running sequence may hold a longer start of the prompt than any kept cache
            // (requests that arrive together with one system prompt): copy it from there.
            let seq = seq.map(|mut seq| {
                if config.prefix_reuse {
                    let copied = self.copy_from_running(&mut seq, &p.prompt, |a| Some(&a.seq));
                    reused.fetch_add(copied as u64, Relaxed);
                }
                seq
            });
            // The draft cache holds what it can of the prompt already.
            let seq = seq.and_then(|seq| {
                let draft_seq = draft
                    .map(|d| self.draft_cache(d, &p, kept_draft))
                    .transpose()?;
                Ok((seq, draft_seq))
            });
            // An allocation failure is the request's, not the engine's: refuse it and go on.
            match seq {
                Ok((seq, draft_seq)) => self.start(p, seq, draft_seq),
                Err(e) => {
                    let _ = p.admit.send(Err(e.into()));
                }
            }
        }
        queue.active = self.active.len();
        shared
            .metrics
            .queue_depth
            .store(queue.waiting.len() as u64, Relaxed);
        shared
            .metrics
            .active
            .store(self.active.len() as u64, Relaxed);
        shared
            .metrics
            .kv_bytes_in_use
            .store(self.kv_reserved, Relaxed);
        draining
    }

    /// Copies into `seq` the positions of the running stream whose cache (`cache_of` it: its
    /// own, or its draft model's) shares the longest start with `prompt` (all but its last
    /// token), when that is at least [`WORTH_A_COPY`] longer than what `seq` holds already;
    /// returns how many positions it added. Only positions of the stream's tokens are read,
    /// which hold what a fresh prefill of the same tokens computes.
    pub(super) fn copy_from_running(
        &self,
        seq: &mut Sequence,
        prompt: &[u32],
        cache_of: impl Fn(&Active) -> Option<&Sequence>,
    ) -> usize {
        let usable = prompt.len().saturating_sub(1).min(seq.capacity());
        let best = self
            .active
            .iter()
            .filter_map(|a| {
                let from = cache_of(a)?;
                let held = from.len().min(a.ids.len());
                Some((from, common_prefix(&a.ids[..held], prompt).min(usable)))
            })
            .max_by_key(|&(_, n)| n);
        match best {
            Some((from, n)) if n >= seq.len() + WORTH_A_COPY => {
                let before = seq.len();
                seq.copy_prefix(from, n).saturating_sub(before)
            }
            _ => 0,
        }
    }

    pub(super) fn start(&mut self, p: Pending, seq: Sequence, draft_seq: Option<Sequence>) {
        let Pending {
            stream_id,
            prompt,
            params,
            ignore_eos,
            capacity,
            tx,
            cancel,
            admit,
            enqueued,
            span,
            progress,
            constraint,
            ..
        } = p;
        let metrics = &self.shared.metrics;
        metrics.queue_wait.record_duration(enqueued.elapsed());
        metrics
            .prompt_tokens
            .fetch_add(prompt.len() as u64, Relaxed);
        let span = info_span!(parent: &span, "generation", %stream_id, prompt_tokens = prompt.len(), max_tokens = params.max_tokens);
        span.in_scope(|| {
            debug!(
                queued_ms = enqueued.elapsed().as_millis() as u64,
                "admitted"
            )
        });
        // A kept cache may be a little larger than asked: account what it really holds.
        let kv_bytes = (seq.kv_bytes() + draft_seq.as_ref().map_or(0, Sequence::kv_bytes)) as u64;
        self.kv_reserved += kv_bytes;
        self.active.push(Active {
            stream_id,
            seq,
            prompt_len: prompt.len(),
            ids: prompt,
            generated: 0,
            max_tokens: params.max_tokens,
            ignore_eos,
            capacity,
            kv_bytes,
            sampler: Sampler::new(&params),
            constraint,
            emit: Emitter::new(self.tokenizer.detokenizer(), &params.stop),
            tx,
            cancel,
            outbox: VecDeque::new(),
            paused_since: None,
            enqueued,
            last_token: None,
            planned: None,
            drafter: match self.shared.config.speculation {
                Speculation::Off => None,
                Speculation::Ngram(bounds) => Some(Drafter::new(bounds)),
                Speculation::Draft(bounds) => {
                    draft_seq.is_some().then(|| Drafter::for_model(bounds))
                }
            },
            draft: Vec::new(),
            draft_seq,
            draft_allowed: 0,
            progress,
            span,
        });
        // Counted before the caller hears it is admitted, so it never reads metrics without
        // itself.
        metrics.active.store(self.active.len() as u64, Relaxed);
        metrics.kv_bytes_in_use.store(self.kv_reserved, Relaxed);
        if admit.send(Ok(())).is_err() {
            // `submit` was dropped in the same instant; the closed channel ends it at once.
            let id = self.active.last().map(|a| a.stream_id.as_str());
            debug!(stream_id = id, "admitted after its caller left");
        }
    }

    /// Ends streams whose reader asked to stop or went away, or stalled too long; delivers what
    /// paused streams and closing streams still owe.
    pub(super) fn reap(&mut self) {
        let stall = self.shared.config.stall_timeout;
        let mut i = self.active.len();
        while i > 0 {
            i -= 1;
            let a = &mut self.active[i];
            if a.cancel.is_cancelled() {
                self.end(i, Err(AbortReason::Cancelled));
                continue;
            }
            match flush(&a.tx, &mut a.outbox) {
                Flush::Closed => self.end(i, Err(AbortReason::Disconnected)),
                Flush::Empty => a.paused_since = None,
                Flush::Full => {
                    let since = *a.paused_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= stall {
                        a.span
                            .in_scope(|| warn!("reader stalled; aborting the stream"));
                        self.end(i, Err(AbortReason::Disconnected));
                    }
                }
            }
        }
        let paused = self.active.iter().filter(|a| !a.outbox.is_empty()).count();
        self.shared.metrics.paused.store(paused as u64, Relaxed);
        self.closing.retain_mut(|c| {
            matches!(flush(&c.tx, &mut c.outbox), Flush::Full) && c.since.elapsed() < stall
        });
    }

    /// Chooses what the next step feeds: one token for every stream that is decoding and not
    /// paused, with its draft when it speculates (while the step's token budget lasts), then
    /// whole prefill chunks in arrival order while the budget lasts. Returns the number of rows.
    pub(super) fn plan(&mut self) -> usize {
        let config = &self.shared.config;
        let mut budget = config.max_step_tokens;
        let mut rows = 0;
        let share = self.draft_share();
        let mut freed = 0;
        for a in self.active.iter_mut() {
            a.planned = None;
            a.draft.clear();
            if a.outbox.is_empty() && !a.prefilling() {
                budget = budget.saturating_sub(1);
                let fed = a.fed();
                // A draft model's tokens are not drafted yet: only their budget is kept.
                let drafted = a.plan_draft(budget, share);
                budget -= drafted;
                if a.drafter.as_ref().is_some_and(Drafter::gave_up) {
                    // Its draft model does not pay: its cache goes, and its budget with it.
                    freed += a.drop_draft_cache();
                }
                a.planned = Some((fed, fed + 1 + a.draft.len().saturating_sub(1)));
                rows += 1;
            }
        }
        for (nth, a) in self
            .active
            .iter_mut()
            .filter(|a| a.prefilling())
            .enumerate()
        {
            let from = a.fed();
            let to = (from + config.prefill_chunk).min(a.prompt_len);
            // The first prompt in line always gets its chunk, so prefill never starves.
            if nth > 0 && to - from > budget {
                break;
            }
            a.planned = Some((from, to));
            budget = budget.saturating_sub(to - from);
            rows += 1;
        }
        self.release_kv(freed);
        rows
    }

    /// Gives back `bytes` of the KV reservation (a stream's draft cache that was dropped).
    pub(super) fn release_kv(&mut self, bytes: u64) {
        if bytes > 0 {
            self.kv_reserved -= bytes;
            let metrics = &self.shared.metrics;
            metrics.kv_bytes_in_use.store(self.kv_reserved, Relaxed);
        }
    }

    /// Whether the stream admitted now gets a draft cache: yes, unless a drafted token is known
    /// to cost a larger share of a token's time than the draft model's first tokens were lately
    /// confirmed (then not even one drafted token pays, and the draft model's prefill of the
    /// prompt and its stream's first drafts are spared), but even then one stream in
    /// [`DRAFT_PROBE`], so that cost and acceptance are learned again as the batch and the
    /// prompts change.
    fn gets_draft(&mut self) -> bool {
        self.admitted += 1;
        self.draft_share() < self.draft_acceptance.first_token()
            || self.admitted.is_multiple_of(DRAFT_PROBE)
    }

    /// The share of a token's time one drafted token costs: a row of the model's step, and with
    /// a draft model, its draft steps too.
    pub(super) fn draft_share(&self) -> f64 {
        let rows = self.cost.share();
        match self.shared.config.speculation {
            Speculation::Draft(_) => {
                (rows + self.draft_cost.share(&self.cost)).min(MAX_MODEL_SHARE)
            }
            _ => rows,
        }
    }

    /// Removes sequence `i` from the batch at once (its KV cache is freed here) and queues its
    /// final events.
    pub(super) fn end(&mut self, i: usize, outcome: Result<FinishReason, AbortReason>) {
        let mut a = self.active.remove(i);
        self.kv_reserved -= a.kv_bytes;
        let usage = a.usage();
        let metrics = &self.shared.metrics;
        let terminal = match outcome {
            Ok(reason) => {
                metrics.finished.fetch_add(1, Relaxed);
                a.span.in_scope(|| {
                    info!(
                        completion_tokens = usage.completion_tokens,
                        ?reason,
                        "finished"
                    )
                });
                TokenEvent::Finished { usage, reason }
            }
            Err(reason) => {
                metrics.aborted.fetch_add(1, Relaxed);
                a.span.in_scope(|| {
                    info!(
                        completion_tokens = usage.completion_tokens,
                        ?reason,
                        "aborted"
                    )
                });
                TokenEvent::Aborted { usage, reason }
            }
        };
        // Cancelled and finished streams still get their text: whatever the detokenizer and the
        // stop-string check hold (nothing after a stop string).
        let last_id = a.ids.last().copied().unwrap_or_default();
        a.emit.finish(last_id, &mut a.outbox);
        a.outbox.push_back(terminal);
        if let Flush::Full = flush(&a.tx, &mut a.outbox) {
            self.closing.push(Closing {
                tx: a.tx,
                outbox: a.outbox,
                since: Instant::now(),
            });
        }
        let config = &self.shared.config;
        let room = config.kv_budget_bytes.saturating_sub(self.kv_reserved);
        self.spares
            .put(a.seq, a.draft_seq, a.ids, room, config.max_active);
        self.shared
            .metrics
            .active
            .store(self.active.len() as u64, Relaxed);
        self.shared
            .metrics
            .kv_bytes_in_use
            .store(self.kv_reserved, Relaxed);
    }

    pub(super) fn abort_all(&mut self, reason: AbortReason) {
        for i in (0..self.active.len()).rev() {
            self.end(i, Err(reason.clone()));
        }
    }

    /// Gives undelivered final events a short while to go out before the thread exits.
    pub(super) fn final_flush(&mut self) {
        let until = Instant::now() + FINAL_FLUSH;
        while !self.closing.is_empty() && Instant::now() < until {
            self.closing
                .retain_mut(|c| matches!(flush(&c.tx, &mut c.outbox), Flush::Full));
            std::thread::sleep(PAUSED_POLL);
        }
    }

    /// Waits while the rest of a burst arrives: until no request has come for `gather_window`
    /// and none is announced (being prepared by its caller), or the first step is full (more
    /// requests could not join it), or `GATHER_MAX_WINDOWS` windows have passed.
    pub(super) fn gather(&self) {
        let config = &self.shared.config;
        let window = config.gather_window;
        if window.is_zero() {
            return;
        }
        let until = Instant::now() + window * GATHER_MAX_WINDOWS;
        let mut queue = self.shared.lock();
        loop {
            let seen = queue.waiting.len();
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || !matches!(queue.state, RunState::Running) {
                return;
            }
            // What the first step would prefill: a chunk of each prompt, in arrival order, while
            // the token budget and the slots last (as `plan` and `admit` will take them).
            let chunks = self
                .active
                .iter()
                .map(|a| a.prompt_len)
                .chain(queue.waiting.iter().map(|p| p.prompt.len()));
            let mut tokens = 0;
            let full = chunks.enumerate().any(|(i, len)| {
                tokens += len.min(config.prefill_chunk);
                i + 1 >= config.max_active || tokens >= config.max_step_tokens
            });
            if full {
                return;
            }
            queue = match self.shared.wake.wait_timeout(queue, window.min(left)) {
                Ok((q, _)) => q,
                Err(poisoned) => poisoned.into_inner().0,
            };
            if queue.waiting.len() <= seen && self.shared.announced.load(Relaxed) == 0 {
                return;
            }
        }
    }

    /// Sleeps until a request arrives (or briefly, when streams are paused or draining).
    pub(super) fn idle_wait(&self, draining: bool) {
        let queue = self.shared.lock();
        // Checked under the lock, so a request pushed before we sleep is never missed.
        let quiet = queue.waiting.is_empty() && self.active.is_empty() && self.closing.is_empty();
        let timeout = if quiet && !draining {
            IDLE_POLL
        } else {
            PAUSED_POLL
        };
        let _unused = self
            .shared
            .wake
            .wait_timeout(queue, timeout)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
}
