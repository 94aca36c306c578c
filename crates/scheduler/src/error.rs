//! The scheduler's typed errors. Every refusal for load (`Overloaded`, `QueueTimeout`,
//! `ShuttingDown`) carries how long the client should wait, the engine's configured
//! `retry_after`, and [`Error::retry_after`] reads it: the HTTP layer sends that figure as
//! `Retry-After` with its 503 and decides none of its own. `EngineUnavailable` maps to a
//! gateway error, the rest to bad requests.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Too many requests are already waiting; refused at once, never queued without bound.
    #[error("the model is overloaded: {waiting} requests already waiting (limit {limit})")]
    Overloaded {
        waiting: usize,
        limit: usize,
        retry_after: Duration,
    },
    /// The request waited in the queue longer than the configured queue timeout.
    #[error("no slot became free within {}ms", waited.as_millis())]
    QueueTimeout {
        waited: Duration,
        retry_after: Duration,
    },
    /// The prompt plus the output it may generate can never fit the KV-cache budget.
    #[error(
        "prompt of {prompt_tokens} tokens plus {max_tokens} output tokens needs {needed_bytes} bytes \
         of KV cache, more than the model's budget of {budget_bytes} bytes"
    )]
    ExceedsKvBudget {
        prompt_tokens: usize,
        max_tokens: usize,
        needed_bytes: u64,
        budget_bytes: u64,
    },
    /// The prompt leaves no room in the model's context window.
    #[error("prompt is {got} tokens, the model's context holds at most {max} (output included)")]
    PromptTooLong { got: usize, max: usize },
    #[error("prompt token {id} is outside the model's vocabulary of {vocab_size}")]
    InvalidToken { id: u32, vocab_size: usize },
    #[error("prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// The request was cancelled (its `CancelHandle`, or its caller went away) before it was
    /// admitted.
    #[error("request cancelled before it started")]
    Cancelled,
    /// New work is refused: the scheduler is draining for shutdown.
    #[error("the model is shutting down")]
    ShuttingDown { retry_after: Duration },
    /// The engine thread is gone (it panicked or failed to start).
    #[error("the model's engine is unavailable: {0}")]
    EngineUnavailable(String),
    /// The configuration cannot work (a zero limit, say).
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Model(#[from] hearth_infer::Error),
}

impl Error {
    /// How long a client should wait before retrying: `Some` exactly for the refusals that are
    /// about load ("too busy now, try again later", HTTP 503), with the engine's figure.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Overloaded { retry_after, .. }
            | Error::QueueTimeout { retry_after, .. }
            | Error::ShuttingDown { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
}
