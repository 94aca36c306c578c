//! The embedding crate's errors; the HTTP edge maps each to its status once.

/// What loading a model or embedding inputs can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model folder is missing a file, or holds one that does not parse or that this crate
    /// cannot run (a module sentence-transformers has and Hearth does not).
    #[error("the embedding model at {path} cannot be loaded: {reason}")]
    Load { path: String, reason: String },
    /// The tokenizer refused a text.
    #[error("the text cannot be tokenized: {0}")]
    Tokenize(String),
    /// An input is longer than the model reads (and truncation was not asked for).
    #[error("input {index} has {tokens} tokens; the model reads at most {max}")]
    TooLong {
        index: usize,
        tokens: usize,
        max: usize,
    },
    /// An input is empty: no token to embed.
    #[error("input {index} is empty")]
    Empty { index: usize },
    /// A token id outside the model's vocabulary.
    #[error("input {index} has token id {id}; the model's vocabulary has {vocab} ids")]
    UnknownToken { index: usize, id: u64, vocab: usize },
    /// The engine's queue is full: try again shortly.
    #[error("the embedding engine is busy: {queued} inputs are queued")]
    Busy { queued: usize },
    /// The engine has stopped (the server is shutting down).
    #[error("the embedding engine has stopped")]
    Stopped,
    /// The model's computation failed.
    #[error("the embedding model failed: {0}")]
    Model(#[from] candle_core::Error),

    #[error("the embedding model failed: {0}")]
    Decoder(String),
}

pub type Result<T> = std::result::Result<T, Error>;
