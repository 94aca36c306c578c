//! Text models for Hearth: loading GGUF files and safetensors checkpoints (local or from the
//! Hugging Face cache/hub), the tokenizer and chat template of each model, sampling, incremental
//! detokenization, and one batched forward step over many sequences, each with its own KV cache.
//!
//! The weights of a [`TextModel`] are immutable after load; every [`Sequence`] owns its KV cache,
//! so one model serves many concurrent generations. This crate deliberately knows nothing of
//! scheduling, queues, HTTP, users or billing: the scheduler decides which sequences step
//! together, the server decides what a request may ask for.

mod attn;
mod candle_gguf;
mod candle_llama;
mod config;
mod constraint;
mod decode_attn;
mod error;
// The hand-written CPU backend (owned by the kernels engineer; see src/fast/mod.rs).
mod device_kv;
mod embed;
mod fast;
mod fused;
mod gemv;
mod gemv_rope;
pub(crate) mod gguf;
mod gguf_write;
pub mod hub;
mod kv;
mod kv_write;
mod load;
mod masked_softmax;
mod model;
mod pieces;
mod random;
mod random_file;
mod rank;
mod requantize;
mod sampler;
mod sequence;
mod template;
mod tokenizer;
pub mod tool_calls;

pub use config::{
    BackendChoice, DeviceSpec, Dtype, GpuTuning, KvPrecision, TextModelConfig, WeightSource,
};
pub use constraint::{ConstraintError, TokenConstraint, TokenMask};
pub use error::Error;
pub use gguf::{Arch, Hparams, Pooling};
pub use gguf_write::WeightType;
/// A GPU's memory, for the server's memory budget.
pub use hearth_gpu::total_memory as gpu_memory;
pub use hearth_kernels::KernelPath;
pub use hearth_types::{ChatMessage, Role, SamplingParams, ToolCall};
pub use model::{ModelInfo, Step, TextModel};
pub use random::LlamaShape;
pub use random_file::{write_random_gguf, write_tokenizer_gguf};
pub use rank::RankPrompt;
pub use requantize::{requantize, RequantizeReport};
pub use sampler::{Sampler, StepLogprobs};
pub use sequence::Sequence;
pub use tokenizer::{Detokenizer, TextTokenizer};
