//! Encoder models for Hearth: sentence-transformers folders (BERT-family encoders) on candle
//! with their pooling and normalisation ([`EmbeddingModel`]), cross-encoders that score a query
//! against documents ([`Reranker`]), and an [`Engine`] thread that batches requests across
//! clients for either. The HTTP routes and their billing are the server's.

mod decoder;
mod encoder;
mod engine;
mod error;
mod fast;
mod model;
mod rerank;

pub use decoder::is_gguf;
pub use encoder::{open_tokenizer, Precision, Tokens};
pub use engine::{Encode, Engine, EngineConfig, EngineStats, StatsSnapshot};
pub use error::{Error, Result};
pub use model::{normalize, EmbeddingModel, Pooling};
pub use rerank::{Activation, Reranker};
