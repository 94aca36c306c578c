//! GGUF decoder embedders and rerankers: llama-family files (llama, mistral, qwen2, qwen3, phi3,
//! gemma3) that declare `{arch}.pooling_type`, as Qwen3-Embedding's and other decoder embedders'
//! GGUF conversions do, or rank pooling with a classifier head, as Qwen3-Reranker's does. Run on
//! hearth-infer's CPU path: causal attention over the text, the final normed hidden states pooled
//! as the file says (mean, first or last position), then scaled to unit length by
//! `EmbeddingModel`; or, for a reranker, the last position through the head (`hearth_infer`'s
//! `rank.rs`). Both as llama.cpp's server answers (`tests/decoder.rs` holds them against it on
//! generated models). Tokens are the file's own tokenizer's, its BOS added where the file says
//! so, as llama.cpp adds it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use hearth_infer::{KvPrecision, Pooling, RankPrompt, TextModel, TextModelConfig, TextTokenizer};

use crate::encoder::{check, check_ids, load_error, Tokens};
use crate::error::{Error, Result};

/// Whether `path` names a GGUF file (a decoder embedder) rather than a model folder.
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// A loaded GGUF decoder: an embedder, or a reranker (pooling type rank).
pub struct Decoder {
    /// One forward at a time: the model keeps its scratch buffers.
    model: Mutex<TextModel>,
    tokenizer: Arc<TextTokenizer>,
    pooling: hearth_infer::Pooling,
    /// A reranker's prompt format.
    prompt: Option<RankPrompt>,
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
    /// Loads the embedder `file` on the CPU, its cache in f16 as llama.cpp's default. A file
    /// without `{arch}.pooling_type` (a chat model) or with rank pooling (a reranker) is refused.
    pub fn load(file: &Path) -> Result<Decoder> {
        let decoder = Self::open(file)?;
        match decoder.pooling {
            Pooling::Rank => Err(load_error(
                file,
                "the file is a reranker (pooling type rank): declare it as a [rerank] model",
            )),
            _ => Ok(decoder),
        }
    }

    /// Loads the reranker `file` (pooling type rank, with its classifier head) on the CPU.
    pub fn load_ranker(file: &Path) -> Result<Decoder> {
        let decoder = Self::open(file)?;
        match decoder.prompt {
            Some(_) => Ok(decoder),
            None => Err(load_error(
                file,
                "the file is an embedding model, not a reranker (its pooling type is not rank)",
            )),
        }
    }

    fn open(file: &Path) -> Result<Decoder> {
        let mut cfg = TextModelConfig::local(file);
        cfg.kv_precision = KvPrecision::F16;
        let model = TextModel::load(&cfg).map_err(|e| load_error(file, e))?;
        let Some(pooling) = model.pooling() else {
            return Err(load_error(
                file,
                "the file declares no pooling (`{arch}.pooling_type`): a chat model, not an \
                 embedding model or a reranker",
            ));
        };
        Ok(Decoder {
            tokenizer: model.tokenizer(),
            pooling,
            prompt: model.rank_prompt(),
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

    /// A reranker's prompt for `query` and `document`. A prompt past the context has its
    /// document's text cut (at a character boundary, by about the tokens too many, retried a
    /// few times as the cut text may tokenize a little differently); one whose query alone
    /// does not fit is refused (`index` names the document).
    pub fn pair(&self, index: usize, query: &str, document: &str) -> Result<Tokens> {
        let Some(prompt) = &self.prompt else {
            return Err(Error::Decoder("the model is not a reranker".into()));
        };
        let tokenize = |e: hearth_infer::Error| Error::Tokenize(e.to_string());
        let mut ids = prompt.tokens(query, document).map_err(tokenize)?;
        if ids.len() > self.max_tokens {
            // Where each of the document's own tokens ends, in bytes: the cuts to choose from.
            let ends: Vec<usize> = self
                .tokenizer
                .encode_plain(document)
                .map_err(tokenize)?
                .iter()
                .scan(0, |at, &id| {
                    *at += self.tokenizer.token_bytes(id).len();
                    Some(*at)
                })
                .collect();
            let mut keep = ends.len();
            for _ in 0..4 {
                if ids.len() <= self.max_tokens || keep == 0 {
                    break;
                }
                keep = keep.saturating_sub(ids.len() - self.max_tokens);
                let mut cut = keep
                    .checked_sub(1)
                    .map_or(0, |k| ends[k])
                    .min(document.len());
                while !document.is_char_boundary(cut) {
                    cut -= 1;
                }
                ids = prompt.tokens(query, &document[..cut]).map_err(tokenize)?;
            }
        }
        check(index, ids.into(), self.max_tokens)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, TextModel>> {
        self.model
            .lock()
            .map_err(|_| Error::Decoder("a forward panicked before".into()))
    }

    /// Each input's pooled vector, not yet normalised (short inputs share forwards, each its
    /// own sequence).
    pub fn embed(&self, inputs: &[&Tokens]) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<&[u32]> = inputs.iter().map(|t| t.ids.as_slice()).collect();
        self.lock()?
            .embed_batch(&ids, self.pooling)
            .map_err(|e| Error::Decoder(e.to_string()))
    }

    /// A reranker's score of each prompt (from [`Self::pair`]).
    pub fn score(&self, inputs: &[&Tokens]) -> Result<Vec<f32>> {
        let ids: Vec<&[u32]> = inputs.iter().map(|t| t.ids.as_slice()).collect();
        self.lock()?
            .rank(&ids)
            .map_err(|e| Error::Decoder(e.to_string()))
    }
}
