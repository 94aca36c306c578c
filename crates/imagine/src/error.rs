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
