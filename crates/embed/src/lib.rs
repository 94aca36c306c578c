//! Embedding models for Hearth: sentence-transformers folders (BERT-family encoders) on candle
//! with their pooling and normalisation ([`EmbeddingModel`]), and an [`Engine`] thread that
//! batches requests across clients. The HTTP route and its billing are the server's.

mod engine;
mod error;
mod model;

pub use engine::{Engine, EngineConfig, EngineStats, StatsSnapshot};
pub use error::{Error, Result};
pub use model::{EmbeddingModel, Pooling};
