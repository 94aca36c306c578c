//! GGUF decoder embedders: llama-family files (llama, mistral, qwen2, qwen3, phi3, gemma3) that
//! declare `{arch}.pooling_type`, as Qwen3-Embedding's and other decoder embedders' GGUF
//! conversions do. Run on hearth-infer's CPU path: causal attention over the text, the final
//! normed hidden states pooled as the file says (mean, first or last position), then scaled to
//! unit length by `EmbeddingModel`, as llama.cpp's server answers (`tests/decoder.rs` holds them against llama.cpp
//! on generated models). Tokens are the file's own tokenizer's, its BOS added where the file
//! says so, as llama.cpp adds it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use hearth_infer::{KvPrecision, TextModel, TextModelConfig, TextTokenizer};

use crate::encoder::{check, check_ids, load_error, Tokens};
use crate::error::{Error, Result};

/// Whether `path` names a GGUF file (a decoder embedder) rather than a model folder.
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// A loaded decoder embedder.
pub struct Decoder {
    /// One forward at a time: the model keeps its scratch buffers.
    model: Mutex<TextModel>,
    tokenizer: Arc<TextTokenizer>,
    pooling: hearth_infer::Pooling,
    dimensions: usize,
    max_tokens: usize,
    vocab: usize,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("pooling", &self.pooling)
            .field("dimensions", &self.dimensions)
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// Loads `file` on the CPU, its cache in f16 as llama.cpp's default. A file without
    /// `{arch}.pooling_type` (a chat model) is refused.
    pub fn load(file: &Path) -> Result<Decoder> {
        let mut cfg = TextModelConfig::local(file);
        cfg.kv_precision = KvPrecision::F16;
        let model = TextModel::load(&cfg).map_err(|e| load_error(file, e))?;
        let Some(pooling) = model.pooling() else {
            return Err(load_error(
                file,
                "the file declares no pooling (`{arch}.pooling_type`): a chat model, not an \
                 embedding model",
            ));
        };
        Ok(Decoder {
            tokenizer: model.tokenizer(),
            pooling,
            dimensions: model.embedding_length(),
            max_tokens: model.info().context_length,
            vocab: model.info().vocab_size,
            model: Mutex::new(model),
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// A text's tokens, BOS first where the file says; cut or refused past the context.
    pub fn tokenize(&self, index: usize, text: &str, truncate: bool) -> Result<Tokens> {
        let mut ids = self
            .tokenizer
            .encode(text)
            .map_err(|e| Error::Tokenize(e.to_string()))?;
        if truncate {
            ids.truncate(self.max_tokens);
        }
        check(index, ids.into(), self.max_tokens)
    }

    pub fn check_ids(&self, index: usize, ids: &[u64], truncate: bool) -> Result<Tokens> {
        check_ids(index, ids, self.vocab, self.max_tokens, truncate)
    }

    /// Each input's pooled vector, not yet normalised (short inputs share forwards, each its
    /// own sequence).
    pub fn embed(&self, inputs: &[&Tokens]) -> Result<Vec<Vec<f32>>> {
        let mut model = self
            .model
            .lock()
            .map_err(|_| Error::Decoder("a forward panicked before".into()))?;
        let ids: Vec<&[u32]> = inputs.iter().map(|t| t.ids.as_slice()).collect();
        model
            .embed_batch(&ids, self.pooling)
            .map_err(|e| Error::Decoder(e.to_string()))
    }
}
