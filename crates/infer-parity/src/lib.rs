//! llama.cpp parity for Hearth's text models: [`GgmlModel`], a scalar emulation of llama.cpp's
//! CPU arithmetic (ggml-cpu on x86-64 with AVX-512, f32 KV cache), bit for bit, for SmolLM2's
//! Q4_1 and Gemma 3's Q4_K_M quant types; and (in `tests/parity.rs`) the checks of Hearth's
//! tokenizers, chat templates and greedy tokens against llama.cpp's fixtures, the emulator's
//! token for token.
//!
//! It owns nothing a server runs: no serving crate depends on it, so a model table can never
//! select the emulator. It reads GGUF files, tokenizers and shapes through hearth-infer's public
//! API ([`hearth_infer::Hparams`], [`hearth_infer::TextTokenizer`]) and runs on
//! hearth-kernels' thread pool; it does not touch `TextModel`'s backends or caches.

mod ggml;

pub use ggml::{Cache, GgmlModel};
