//! What every model of this crate stands on: a BERT-family encoder loaded from a Hugging Face
//! folder (`config.json`, `model.safetensors`, `tokenizer.json`) onto candle, its tokenizer with
//! the file's own padding and truncation taken off (lengths are this crate's to check), and one
//! forward pass over a padded batch of [`Tokens`].

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationParams, TruncationStrategy};

use crate::error::{Error, Result};
use crate::fast::{FastBert, Shape};

/// One input's token ids, special tokens included. Ids from `second` on are the second text of
/// a pair (token type 1); a single text has `second == ids.len()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    pub ids: Vec<u32>,
    pub second: usize,
}

impl Tokens {
    /// How many tokens the input has.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Precision, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(format!(
                "precision must be \"f32\" or \"bf16\", not {other:?}"
            )),
        }
    }
}

impl From<Vec<u32>> for Tokens {
    fn from(ids: Vec<u32>) -> Self {
        let second = ids.len();
        Tokens { ids, second }
    }
}

/// The last layer's vectors of a batch, packed: input `i`'s rows are
/// `rows[starts[i] * width..starts[i + 1] * width]`.
pub(crate) struct Hidden {
    pub rows: Vec<f32>,
    pub starts: Vec<usize>,
    pub width: usize,
}

impl Hidden {
    /// Input `i`'s token vectors, one after another.
    pub fn input(&self, i: usize) -> &[f32] {
        &self.rows[self.starts[i] * self.width..self.starts[i + 1] * self.width]
    }

    /// How many inputs.
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }
}

/// What runs the encoder: candle (f32, CPU or CUDA), or Hearth's kernels (bf16 products, on a
/// CPU with AVX-512 BF16).
enum Net {
    Candle { bert: BertModel, device: Device },
    Fast(FastBert),
}

/// How precisely the encoder's matrix products run (`f32` or `bf16` in a model table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// f32 throughout, on candle.
    F32,
    /// bf16 products with f32 sums on Hearth's kernels where the CPU has AVX-512 BF16 (twice
    /// the arithmetic a cycle), f32 elsewhere.
    Bf16,
}

/// A loaded encoder and its tokenizer.
pub(crate) struct Encoder {
    net: Net,
    tokenizer: Tokenizer,
    /// The tokenizer with truncation at `max_tokens` on (the longer text of a pair first).
    truncating: Tokenizer,
    max_tokens: usize,
    hidden: usize,
    vocab: usize,
    pad_id: u32,
}

/// A folder read: the encoder, `config.json` as it is (for what the model on top needs) and the
/// weights (for its head).
pub(crate) struct Folder {
    pub encoder: Encoder,
    pub config: serde_json::Value,
    pub weights: VarBuilder<'static>,
}

pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Result<T> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| load_error(&path, e))?;
    serde_json::from_str(&text).map_err(|e| load_error(&path, e))
}

pub(crate) fn load_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Load {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Token ids a client gave: each below `vocab`, cut to `max_tokens` when `truncate`, then as
/// [`check`]. One rule for every model kind.
pub(crate) fn check_ids(
    index: usize,
    ids: &[u64],
    vocab: usize,
    max_tokens: usize,
    truncate: bool,
) -> Result<Tokens> {
    if let Some(&id) = ids.iter().find(|&&id| id >= vocab as u64) {
        return Err(Error::UnknownToken { index, id, vocab });
    }
    let mut ids: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
    if truncate {
        ids.truncate(max_tokens);
    }
    check(index, ids.into(), max_tokens)
}

/// An input's tokens refused when empty or longer than `max_tokens` (`index` names it).
pub(crate) fn check(index: usize, tokens: Tokens, max_tokens: usize) -> Result<Tokens> {
    if tokens.is_empty() {
        return Err(Error::Empty { index });
    }
    if tokens.len() > max_tokens {
        return Err(Error::TooLong {
            index,
            tokens: tokens.len(),
            max: max_tokens,
        });
    }
    Ok(tokens)
}

/// A `tokenizer.json` with the file's own padding and truncation taken off (MiniLM's pads and
/// cuts at 128): lengths are for the caller to check, and a count is the text's.
pub fn open_tokenizer(path: &Path) -> Result<Tokenizer> {
    let mut tokenizer = Tokenizer::from_file(path).map_err(|e| load_error(path, e))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| load_error(path, e))?;
    Ok(tokenizer)
}

impl Folder {
    /// Reads `dir` onto the CPU, or onto CUDA device `gpu` (with the `cuda` feature). Inputs are
    /// limited to `max_tokens` when given, and to the model's positions in any case.
    pub fn load(
        dir: &Path,
        gpu: Option<usize>,
        max_tokens: Option<usize>,
        precision: Precision,
    ) -> Result<Folder> {
        let device = match gpu {
            None => Device::Cpu,
            Some(n) => Device::new_cuda(n).map_err(|e| load_error(dir, e))?,
        };
        let config_path = dir.join("config.json");
        let raw: serde_json::Value = read_json(dir, "config.json")?;
        let config: Config =
            serde_json::from_value(raw.clone()).map_err(|e| load_error(&config_path, e))?;
        let number = |key: &str| {
            raw[key]
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| load_error(&config_path, format!("no {key}")))
        };
        let hidden = number("hidden_size")?;
        let vocab = number("vocab_size")?;
        let positions = raw["max_position_embeddings"].as_u64().unwrap_or(512) as usize;
        let max_tokens = max_tokens.unwrap_or(positions).min(positions);
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = open_tokenizer(&tokenizer_path)?;
        let mut truncating = tokenizer.clone();
        truncating
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                ..Default::default()
            }))
            .map_err(|e| load_error(&tokenizer_path, e))?;
        let pad_id = raw["pad_token_id"].as_u64().unwrap_or(0) as u32;
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|e| load_error(&path, e))?;
        let weights = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &device)
            .map_err(|e| load_error(&path, e))?;
        let exact_gelu = matches!(raw["hidden_act"].as_str(), None | Some("gelu"));
        let absolute = matches!(
            raw["position_embedding_type"].as_str(),
            None | Some("absolute")
        );
        let net = if precision == Precision::Bf16
            && gpu.is_none()
            && hearth_kernels::bf16_simd()
            && exact_gelu
            && absolute
        {
            let shape = Shape {
                hidden,
                heads: number("num_attention_heads")?,
                layers: number("num_hidden_layers")?,
                ffn: number("intermediate_size")?,
                vocab,
                positions,
                types: raw["type_vocab_size"].as_u64().unwrap_or(2) as usize,
                eps: raw["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32,
            };
            Net::Fast(FastBert::load(&weights, shape, 0).map_err(|e| load_error(&path, e))?)
        } else {
            let bert =
                BertModel::load(weights.clone(), &config).map_err(|e| load_error(&path, e))?;
            Net::Candle { bert, device }
        };
        Ok(Folder {
            encoder: Encoder {
                net,
                tokenizer,
                truncating,
                max_tokens,
                hidden,
                vocab,
                pad_id,
            },
            config: raw,
            weights,
        })
    }
}

impl Encoder {
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// A text's tokens, the model's special tokens around them; cut to the longest input when
    /// `truncate`, refused when longer otherwise (`index` names it).
    pub fn tokenize(&self, index: usize, text: &str, truncate: bool) -> Result<Tokens> {
        let tokenizer = if truncate {
            &self.truncating
        } else {
            &self.tokenizer
        };
        let encoding = tokenizer
            .encode(text, true)
            .map_err(|e| Error::Tokenize(e.to_string()))?;
        self.check(index, encoding.get_ids().to_vec().into())
    }

    /// A pair's tokens (`[CLS] first [SEP] second [SEP]` for BERT), always cut to the longest
    /// input, the longer text first.
    pub fn tokenize_pair(&self, index: usize, first: &str, second: &str) -> Result<Tokens> {
        let encoding = self
            .truncating
            .encode((first, second), true)
            .map_err(|e| Error::Tokenize(e.to_string()))?;
        let types = encoding.get_type_ids();
        let start = types.iter().position(|&t| t != 0).unwrap_or(types.len());
        self.check(
            index,
            Tokens {
                ids: encoding.get_ids().to_vec(),
                second: start,
            },
        )
    }

    /// Token ids given as they are: each known to the model, not too many.
    pub fn check_ids(&self, index: usize, ids: &[u64], truncate: bool) -> Result<Tokens> {
        check_ids(index, ids, self.vocab, self.max_tokens, truncate)
    }

    fn check(&self, index: usize, tokens: Tokens) -> Result<Tokens> {
        check(index, tokens, self.max_tokens)
    }

    /// Whether the encoder runs on Hearth's kernels (bf16 products).
    pub fn is_fast(&self) -> bool {
        matches!(self.net, Net::Fast(_))
    }

    /// The last layer's vectors of a batch, each input's as it would be alone.
    pub fn forward(&self, inputs: &[&Tokens]) -> Result<Hidden> {
        match &self.net {
            Net::Fast(fast) => Ok(fast.forward(inputs)),
            Net::Candle { bert, device } => self.forward_candle(bert, device, inputs),
        }
    }

    /// On candle: the inputs padded to the longest and the padding masked out, which leaves
    /// each input's vectors as they would be alone; then packed.
    fn forward_candle(
        &self,
        bert: &BertModel,
        device: &Device,
        inputs: &[&Tokens],
    ) -> Result<Hidden> {
        let longest = inputs.iter().map(|i| i.len()).max().unwrap_or(0);
        let n = inputs.len();
        let mut ids = Vec::with_capacity(n * longest);
        let mut types = Vec::with_capacity(n * longest);
        let mut mask = Vec::with_capacity(n * longest);
        for input in inputs {
            let (len, second) = (input.len(), input.second.min(input.len()));
            ids.extend_from_slice(&input.ids);
            ids.extend(std::iter::repeat_n(self.pad_id, longest - len));
            types.extend(std::iter::repeat_n(0u32, second));
            types.extend(std::iter::repeat_n(1u32, len - second));
            types.extend(std::iter::repeat_n(0u32, longest - len));
            mask.extend(std::iter::repeat_n(1u32, len));
            mask.extend(std::iter::repeat_n(0u32, longest - len));
        }
        let ids = Tensor::from_vec(ids, (n, longest), device)?;
        let types = Tensor::from_vec(types, (n, longest), device)?;
        let mask = Tensor::from_vec(mask, (n, longest), device)?;
        let padded = bert
            .forward(&ids, &types, Some(&mask))?
            .to_dtype(DType::F32)?
            .to_vec3::<f32>()?;
        let mut starts = vec![0];
        let mut rows =
            Vec::with_capacity(inputs.iter().map(|i| i.len()).sum::<usize>() * self.hidden);
        for (input, vectors) in inputs.iter().zip(padded) {
            for v in &vectors[..input.len()] {
                rows.extend_from_slice(v);
            }
            starts.push(starts.last().unwrap() + input.len());
        }
        Ok(Hidden {
            rows,
            starts,
            width: self.hidden,
        })
    }
}
