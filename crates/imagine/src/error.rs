//! The crate's one error type. The server maps it to HTTP in its own `error.rs`.

use std::path::PathBuf;

/// Everything that can go wrong loading or running an image model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request parameter is outside what the model accepts. `field` is the request field name.
    #[error("{field}: {message}")]
    InvalidParams {
        field: &'static str,
        message: String,
    },
    /// The worker's queue is full; the client should come back after `retry_after` (the
    /// worker's figure, [`crate::RETRY_AFTER`]).
    #[error("image queue full ({waiting} waiting)")]
    Overloaded {
        waiting: usize,
        retry_after: std::time::Duration,
    },
    /// The client went away (or the caller cancelled) before the image was finished.
    #[error("generation cancelled")]
    Cancelled,
    /// The worker thread is gone (it panicked or was shut down).
    #[error("image worker stopped")]
    WorkerStopped,
    /// A model file is missing or unreadable.
    #[error("model file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A config/tokenizer JSON file does not have the expected shape.
    #[error("model config {path}: {message}")]
    Config { path: PathBuf, message: String },
    /// Fetching a file from the Hugging Face hub failed.
    #[error("hub download {repo}/{file}: {message}")]
    Hub {
        repo: String,
        file: String,
        message: String,
    },
    /// The requested device cannot be used by this build.
    #[error("device {0} is not available in this build")]
    Device(String),
    /// A tensor operation failed (shape mismatch in weights, out of memory, ...).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The pipeline panicked (a bug); the worker survives and reports it.
    #[error("image generation panicked")]
    Panicked,
    /// PNG encoding failed.
    #[error("png encoding: {0}")]
    Png(String),
    /// A LoRA file that cannot be read, or that does not fit the model; `file` names it.
    #[error("LoRA {file}: {problem}")]
    Lora { file: String, problem: LoraProblem },
}

/// What is wrong with a LoRA file; each names the tensor key at fault where there is one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoraProblem {
    #[error("not a safetensors file: {0}")]
    NotSafetensors(String),
    #[error("{bytes} bytes, more than the {max} a LoRA file may have")]
    TooLarge { bytes: u64, max: u64 },
    #[error("{count} tensors, more than the {max} a LoRA file may have")]
    TooManyTensors { count: usize, max: usize },
    #[error("no LoRA weights in the file")]
    Empty,
    #[error(
        "{key}: not a LoRA weight Hearth reads (lora_A/lora_B, lora.down/lora.up or \
         lora_down/lora_up weights and alpha; LoHa, LoKr and DoRA are not supported)"
    )]
    UnsupportedKey { key: String },
    #[error("{key}: {dtype} is not a float type")]
    Dtype { key: String, dtype: String },
    #[error("{key} and {other} are the same half of one module")]
    DuplicateKey { key: String, other: String },
    #[error("{key} is missing: {present} has no partner")]
    MissingHalf { key: String, present: String },
    #[error("{key}: shape {got:?}, expected {want}")]
    Shape {
        key: String,
        got: Vec<usize>,
        want: String,
    },
    #[error("{key}: rank {rank}, but {other} has rank {other_rank}")]
    RankMismatch {
        key: String,
        rank: usize,
        other: String,
        other_rank: usize,
    },
    #[error("{key}: rank {rank} is outside 1..={max}")]
    Rank {
        key: String,
        rank: usize,
        max: usize,
    },
    #[error("{key}: alpha {value} is not a finite number")]
    Alpha { key: String, value: f64 },
    #[error("{key}: holds NaN or infinite values")]
    NonFinite { key: String },
    #[error("adapter metadata: {0}")]
    Metadata(String),
    #[error("{0} is not supported")]
    Unsupported(String),
    #[error("{key}: this model has no adapter-capable layer by that name")]
    UnknownModule { key: String },
    #[error("{key} and {other} both adapt {layer}")]
    SameLayer {
        key: String,
        other: String,
        layer: String,
    },
    #[error("loaded for another model")]
    OtherModel,
}

impl Error {
    pub(crate) fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Config {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Short alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
