//! Per-model scheduler limits. Resolved values only: the server's config layer owns defaults
//! coming from files and flags and builds one of these per model.

use std::time::Duration;

use crate::Error;

/// Limits and knobs of one model's engine loop.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Name used for the engine thread, logs and metrics (the model id).
    pub name: String,
    /// Most sequences in the running batch at once.
    pub max_active: usize,
    /// Most requests waiting for a slot beyond the free ones; past it `submit` answers `Overloaded`.
    pub max_queued: usize,
    /// Budget for the KV caches of all running sequences, in bytes. A sequence reserves
    /// `(prompt + max_tokens) × kv_bytes_per_token` (clipped to the context) when admitted.
    pub kv_budget_bytes: u64,
    /// Longest a request waits for admission before `submit` answers `QueueTimeout`.
    pub queue_timeout: Duration,
    /// Prompt tokens fed per prefill chunk. Chunk boundaries depend only on this, never on the
    /// other sequences, so a prompt's numerics do not depend on what runs beside it.
    pub prefill_chunk: usize,
    /// Soft limit on the tokens of one step (decode rows plus prefill chunks). At least one
    /// prefill chunk runs per step when any prompt is waiting, so a long prompt always progresses.
    /// A burst of requests is prefilled in as few steps as this allows: every step that carries
    /// prefill work delays the running streams' next token by its length, so a few large steps
    /// touch far fewer inter-token gaps than many small ones (and batch the weights better).
    pub max_step_tokens: usize,
    /// How long an idle engine that has just taken a request waits for more before its first
    /// step: each further arrival extends the wait by this much, up to 25 times it in all.
    /// Requests sent together (a client's parallel calls) then start in one prefill step rather
    /// than the first alone and the rest a step later. Zero starts at once.
    pub gather_window: Duration,
    /// Capacity of each stream's event channel. A stream whose channel is full is paused (it
    /// takes no step, keeps its KV cache) until its reader catches up.
    pub channel_capacity: usize,
    /// A stream paused this long (its reader takes nothing) is aborted as `Disconnected`.
    pub stall_timeout: Duration,
    /// On shutdown, how long running streams may go on before they are aborted.
    pub shutdown_grace: Duration,
    /// How long a client is told to wait (`Retry-After`) when this engine refuses a request
    /// for load: queue full, queue timeout, shutting down (and a stream cut by shutdown).
    pub retry_after: Duration,
    /// Whether a request starts from a kept KV cache that holds the start of its prompt (the
    /// previous turn of a chat, a shared system prompt) and prefills only the rest.
    pub prefix_reuse: bool,
    /// How a decoding stream drafts tokens for the model to verify in one step, if at all.
    pub speculation: Speculation,
}

/// Speculative decoding: a stream drafts the tokens it expects next, and one step feeds its last
/// token and the draft together; each position's logits are sampled in turn exactly as plain
/// decoding would sample them, and the stream keeps the draft up to the first token that differs
/// (plus the one sampled there). The output is what it would be without speculation, token for
/// token, with the same seed; only the number of steps changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Speculation {
    /// One token a step.
    #[default]
    Off,
    /// Prompt lookup: the draft is what followed the latest earlier occurrence of the stream's
    /// last tokens in its prompt and output.
    Ngram(Ngram),
    /// A draft model (given to [`Scheduler::spawn_with_draft`](crate::Scheduler::spawn_with_draft)):
    /// a smaller model with the same vocabulary keeps a cache of its own per stream and proposes
    /// its greedy tokens, as many as its confidence and the stream's acceptance make worth a row.
    Draft(DraftModel),
}

impl Speculation {
    /// Whether the bounds make sense (see [`Ngram::check`] and [`DraftModel::check`]).
    pub fn check(&self) -> Result<(), String> {
        match self {
            Speculation::Off => Ok(()),
            Speculation::Ngram(n) => n.check(),
            Speculation::Draft(d) => d.check(),
        }
    }
}

/// Most tokens one step may draft for a stream.
pub const MAX_DRAFT: usize = 64;
/// Longest run of last tokens prompt lookup may match.
pub const MAX_MATCH: usize = 16;

/// Prompt-lookup drafting's bounds. The draft length adapts to what the stream accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ngram {
    /// Most tokens drafted for one step.
    pub max_draft: usize,
    /// Shortest run of last tokens that must match earlier to draft.
    pub min_match: usize,
    /// Longest run of last tokens looked up (the longest that matches is used).
    pub max_match: usize,
}

impl Ngram {
    /// Whether the bounds make sense: at least one token drafted and matched, at most
    /// [`MAX_DRAFT`] and [`MAX_MATCH`], `min_match <= max_match`.
    pub fn check(&self) -> Result<(), String> {
        DraftModel {
            max_draft: self.max_draft,
        }
        .check()?;
        if self.min_match == 0 || self.max_match > MAX_MATCH || self.min_match > self.max_match {
            return Err(format!(
                "speculation's min_match and max_match must satisfy 1 <= min_match <= max_match \
                 <= {MAX_MATCH}, got {} and {}",
                self.min_match, self.max_match
            ));
        }
        Ok(())
    }
}

/// Draft-model speculation's bound. How many tokens a step drafts below it adapts to the draft
/// model's own confidence, the stream's acceptance and what a drafted token costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftModel {
    /// Most tokens drafted for one step.
    pub max_draft: usize,
}

impl DraftModel {
    /// Whether at least one and at most [`MAX_DRAFT`] tokens may be drafted.
    pub fn check(&self) -> Result<(), String> {
        if self.max_draft == 0 || self.max_draft > MAX_DRAFT {
            return Err(format!(
                "speculation's max_draft must be within 1..={MAX_DRAFT}, got {}",
                self.max_draft
            ));
        }
        Ok(())
    }
}

impl Default for DraftModel {
    fn default() -> Self {
        DraftModel { max_draft: 8 }
    }
}

impl Default for Ngram {
    fn default() -> Self {
        Ngram {
            max_draft: 8,
            min_match: 2,
            max_match: 4,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            name: "model".into(),
            max_active: 16,
            max_queued: 64,
            kv_budget_bytes: 2 << 30,
            queue_timeout: Duration::from_secs(30),
            prefill_chunk: 128,
            max_step_tokens: 512,
            gather_window: Duration::from_millis(1),
            channel_capacity: 64,
            stall_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            retry_after: Duration::from_secs(1),
            prefix_reuse: true,
            speculation: Speculation::Off,
        }
    }
}

impl SchedulerConfig {
    pub(crate) fn check(&self) -> Result<(), Error> {
        let bad = |what: &str| Err(Error::InvalidConfig(format!("{what} must be at least 1")));
        if self.max_active == 0 {
            return bad("max_active");
        }
        if self.prefill_chunk == 0 {
            return bad("prefill_chunk");
        }
        if self.max_step_tokens == 0 {
            return bad("max_step_tokens");
        }
        self.speculation.check().map_err(Error::InvalidConfig)?;
        if self.channel_capacity < 2 {
            return Err(Error::InvalidConfig(
                "channel_capacity must be at least 2".into(),
            ));
        }
        Ok(())
    }
}
