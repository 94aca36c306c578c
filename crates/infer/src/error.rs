//! The crate's one error type. Callers map it to their own (the scheduler wraps it, the server
//! picks HTTP statuses); nothing here knows about HTTP.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a text model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("weights file {path} not found: {hint}")]
    WeightsNotFound { path: PathBuf, hint: String },
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file read as GGUF that is not one (another format, a header cut short).
    #[error("{path} is not a GGUF file: {reason}")]
    NotGguf { path: PathBuf, reason: String },
    #[error("unsupported model architecture {0:?} (supported: llama, mistral, qwen2, qwen3, phi3, gemma3)")]
    UnsupportedArchitecture(String),
    #[error("model file is missing or has a bad value for {key}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("context full: {needed} positions needed, the sequence holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("a sequence of {requested} tokens exceeds the model's context length {max}")]
    SequenceTooLong { requested: usize, max: usize },
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    InvalidToken { id: u32, vocab_size: usize },
    /// A step the batch cannot run: no tokens, or a sequence twice in one call.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A step's sequence was made by another model or backend (its cache is not this one's).
    #[error("step {step}'s sequence was made by another model")]
    ForeignSequence { step: usize },
    /// A setting the chosen device or backend cannot honour (say, `backend = "fast"` on a GPU).
    #[error("{key}: {reason}")]
    InvalidConfig { key: &'static str, reason: String },
    /// The model's forward threads could not be started.
    #[error("cannot start {threads} inference threads: {source}")]
    ThreadPool {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
    /// A CPU kernel refused its input (a shape the fast backend should never pass: a bug).
    #[error("CPU kernel: {0}")]
    Kernel(#[from] hearth_kernels::Error),
    #[error("no memory for a KV cache of {bytes} bytes: {source}")]
    KvMemory {
        bytes: usize,
        source: std::io::Error,
    },
    #[error("device {0} is not available in this build (enable the `cuda` feature)")]
    DeviceUnavailable(String),
    #[error("Hugging Face hub: {0}")]
    Hub(String),
    /// A file could not be pulled from the Hugging Face hub; [`crate::hub::PullFailure`] says
    /// why (not found, refused, cut off, wrong size, checksum mismatch, ...).
    #[error("pulling {file} of {repo} from the hub: {failure}")]
    Pull {
        repo: String,
        file: String,
        #[source]
        failure: crate::hub::PullFailure,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl Error {
    pub(crate) fn metadata(key: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Metadata {
            key: key.into(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn tokenizer(e: impl std::fmt::Display) -> Self {
        Error::Tokenizer(e.to_string())
    }
}
