//! Continuous batching for text models. For each loaded model, [`Scheduler::spawn`] moves the
//! `TextModel` onto its own OS thread running an engine loop; [`SchedulerHandle::submit`] queues
//! a tokenized [`Request`] and, once admitted, hands back a [`Generation`]: a bounded channel of
//! `TokenEvent`s plus a cancel handle. The loop joins waiting requests at the next step, ingests
//! prompts in fixed-size chunks interleaved with decoding, and frees a sequence's KV cache the
//! step it finishes, is cancelled, or its reader goes away. Limits (active sequences, queue
//! length, KV budget, queue timeout) refuse work at once with a typed [`Error`].
//!
//! A slow reader never stalls the batch: when a stream's channel is full that stream is
//! **paused** (it skips steps, keeps its KV cache and resumes when the reader catches up) and is
//! aborted as `Disconnected` only after `stall_timeout` without progress.
//!
//! Deliberately absent: tokenization of chat messages, validation of user input, billing and
//! anything HTTP (the server does those); the model math (hearth-infer does that).

mod config;
mod engine;
mod error;
mod handle;
pub mod metrics;
mod queue;
mod spare;

pub use config::{DraftModel, Ngram, SchedulerConfig, Speculation, MAX_DRAFT, MAX_MATCH};
pub use error::Error;
pub use handle::{
    Announced, CancelHandle, Generation, Outcome, Output, Request, Scheduler, SchedulerHandle,
};
pub use metrics::MetricsSnapshot;
