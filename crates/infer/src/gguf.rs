//! GGUF metadata: typed access to keys and the hyperparameters every backend needs. The CPU fast
//! path (`src/fast/`) reuses [`Hparams`] so both backends agree on the model's shape.

use std::fs::File;
use std::io::Cursor;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;

use crate::attn::RopeScaling;
use crate::Error;

/// Typed reads of GGUF metadata with errors that name the key.
pub(crate) struct Meta<'a>(pub &'a gguf_file::Content);

impl Meta<'_> {
    fn get(&self, key: &str) -> Result<&Value, Error> {
        self.0
            .metadata
            .get(key)
            .ok_or_else(|| Error::metadata(key, "missing"))
    }
    fn opt<T>(
        &self,
        key: &str,
        f: impl FnOnce(&Value) -> candle_core::Result<T>,
    ) -> Result<Option<T>, Error> {
        match self.0.metadata.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).map_err(|e| Error::metadata(key, e)),
        }
    }
    pub fn string(&self, key: &str) -> Result<String, Error> {
        self.get(key)?
            .to_string()
            .cloned()
            .map_err(|e| Error::metadata(key, e))
    }
    pub fn opt_string(&self, key: &str) -> Result<Option<String>, Error> {
        self.opt(key, |v| v.to_string().cloned())
    }
    /// Any integer type, as usize.
    pub fn usize(&self, key: &str) -> Result<usize, Error> {
        self.opt_usize(key)?
            .ok_or_else(|| Error::metadata(key, "missing"))
    }
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, Error> {
        self.opt(key, |v| match v {
            Value::U8(x) => Ok(*x as usize),
            Value::U16(x) => Ok(*x as usize),
            Value::U32(x) => Ok(*x as usize),
            Value::U64(x) => Ok(*x as usize),
            Value::I8(x) if *x >= 0 => Ok(*x as usize),
            Value::I16(x) if *x >= 0 => Ok(*x as usize),
            Value::I32(x) if *x >= 0 => Ok(*x as usize),
            Value::I64(x) if *x >= 0 => Ok(*x as usize),
            other => candle_core::bail!("expected a non-negative integer, got {other:?}"),
        })
    }
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, Error> {
        Ok(self.opt_usize(key)?.map(|v| v as u32))
    }
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, Error> {
        self.opt(key, |v| match v {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            other => candle_core::bail!("expected a float, got {other:?}"),
        })
    }
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, Error> {
        self.opt(key, |v| v.to_bool())
    }
    pub fn string_array(&self, key: &str) -> Result<Vec<String>, Error> {
        let arr = self
            .get(key)?
            .to_vec()
            .map_err(|e| Error::metadata(key, e))?;
        arr.iter()
            .map(|v| v.to_string().cloned().map_err(|e| Error::metadata(key, e)))
            .collect()
    }
    pub fn opt_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, Error> {
        self.opt(key, |v| v.to_vec()?.iter().map(|x| x.to_i32()).collect())
    }
    pub fn opt_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, Error> {
        self.opt(key, |v| v.to_vec()?.iter().map(|x| x.to_f32()).collect())
    }
}

/// The supported transformer families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// llama, mistral, SmolLM2, Llama 3.x (with its `rope_freqs` factors) ...: RMSNorm,
    /// interleaved RoPE, SwiGLU, GQA.
    Llama,
    /// Qwen2 / Qwen2.5: the llama block with biases on Q, K and V, NeoX RoPE.
    Qwen2,
    /// Qwen3: the llama block with RMS norms on each Q and K head, NeoX RoPE.
    Qwen3,
    /// Phi-3: fused QKV and gate/up matrices, NeoX RoPE.
    Phi3,
    /// Gemma 3: q/k norms, post-norms, GELU gate, NeoX RoPE with local/global bases, sliding window.
    Gemma3,
}

impl Arch {
    /// The `general.architecture` names each family is read from.
    pub const NAMES: &'static str = "llama, mistral, qwen2, qwen3, phi3, gemma3";

    fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "phi3" => Arch::Phi3,
            "gemma3" => Arch::Gemma3,
            _ => return None,
        })
    }

    /// Whether RoPE rotates (i, i + d/2) pairs (GGUF llama files are permuted for (2i, 2i+1)).
    pub fn neox_rope(self) -> bool {
        !matches!(self, Arch::Llama)
    }

    /// The MLP's gate function: GELU for Gemma 3, SiLU for the rest. Both backends read it here.
    pub(crate) fn activation(self) -> Activation {
        match self {
            Arch::Gemma3 => Activation::GeluTanh,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => Activation::Silu,
        }
    }
}

/// The gate function of a family's MLP (`gate(x) * up(x)`), as [`Arch::activation`] picks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    Silu,
    /// tanh approximation, as ggml's GELU.
    GeluTanh,
}

/// Model shape and numerics read from GGUF metadata (`{arch}.*` keys).
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub arch: Arch,
    /// The GGUF `general.architecture` string.
    pub arch_name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Gemma 3: RoPE base of the sliding-window layers.
    pub rope_theta_local: f32,
    /// Window of the sliding layers (positions attended, the current one included).
    pub sliding_window: Option<usize>,
    /// Gemma 3: every `sliding_window_pattern`-th layer is global.
    pub sliding_window_pattern: usize,
    pub vocab_size: usize,
    /// Linear RoPE scaling (`rope.scaling.type = linear`): positions are multiplied by this
    /// (1 / `rope.scaling.factor`); 1 otherwise.
    pub rope_freq_scale: f32,
    /// `rope.scaling.attn_factor` (Phi-3's LongRoPE): RoPE's cos and sin are multiplied by it.
    pub rope_attn_factor: f32,
    /// `{arch}.pooling_type`: the file is an embedding model whose vector pools the final
    /// hidden states so (llama.cpp's key; absent or 0, none, in a chat model).
    pub pooling: Option<Pooling>,
}

/// How an embedding model's hidden states become one vector (llama.cpp's `pooling_type`;
/// `mean`, `cls`, `last`, `rank` by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every position's (1).
    Mean,
    /// The first position's (2).
    Cls,
    /// The last position's (3).
    Last,
    /// A reranker's (4): the last position's, through the file's classifier head
    /// (`cls.output`), read by `TextModel::rank` (`rank.rs`).
    Rank,
}

impl std::str::FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> Result<Pooling, String> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Ok(Pooling::Rank),
            other => Err(format!("pooling {other:?}: mean, cls, last or rank")),
        }
    }
}

impl Pooling {
    /// llama.cpp's `pooling_type` value for this kind.
    pub fn gguf_value(self) -> u32 {
        match self {
            Pooling::Mean => 1,
            Pooling::Cls => 2,
            Pooling::Last => 3,
            Pooling::Rank => 4,
        }
    }

    /// llama.cpp's value of `pooling_type`: `None` for 0 (no pooling), an error for a kind
    /// Hearth does not pool.
    fn from_gguf(value: u32, key: &str) -> Result<Option<Pooling>, Error> {
        if value == 0 {
            return Ok(None);
        }
        [Pooling::Mean, Pooling::Cls, Pooling::Last, Pooling::Rank]
            .into_iter()
            .find(|p| p.gguf_value() == value)
            .map(Some)
            .ok_or_else(|| {
                Error::metadata(
                    key,
                    format!(
                        "pooling type {value} is not supported (1 mean, 2 cls, 3 last, 4 rank are)"
                    ),
                )
            })
    }
}

impl Hparams {
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, Error> {
        let meta = Meta(content);
        let arch_name = meta.string("general.architecture")?;
        let arch = Arch::from_name(&arch_name)
            .ok_or_else(|| Error::UnsupportedArchitecture(arch_name.clone()))?;
        let k = |s: &str| format!("{arch_name}.{s}");
        let rope_freq_scale = match meta.opt_string(&k("rope.scaling.type"))?.as_deref() {
            None | Some("none") => 1.0,
            Some("linear") => match meta.opt_f32(&k("rope.scaling.factor"))? {
                Some(f) if f.is_finite() && f >= 1.0 => 1.0 / f,
                Some(f) => {
                    return Err(Error::metadata(
                        k("rope.scaling.factor"),
                        format!("{f} is not a scaling factor of at least 1"),
                    ))
                }
                None => return Err(Error::metadata(k("rope.scaling.factor"), "missing")),
            },
            Some(other) => {
                return Err(Error::metadata(
                    k("rope.scaling.type"),
                    format!("RoPE scaling {other:?} is not supported (none and linear are; Llama 3's factors come as the rope_freqs tensor)"),
                ))
            }
        };
        let n_embd = meta.usize(&k("embedding_length"))?;
        let n_head = meta.usize(&k("attention.head_count"))?;
        let head_dim = meta
            .opt_usize(&k("attention.key_length"))?
            .unwrap_or(n_embd / n_head.max(1));
        if let Some(rot) = meta.opt_usize(&k("rope.dimension_count"))? {
            if rot != head_dim {
                return Err(Error::metadata(
                    k("rope.dimension_count"),
                    format!("RoPE over {rot} of {head_dim} head dimensions (partial rotary) is not supported"),
                ));
            }
        }
        let vocab_size = match meta.opt_usize(&k("vocab_size"))? {
            Some(v) => v,
            None => meta.string_array("tokenizer.ggml.tokens")?.len(),
        };
        let hp = Hparams {
            arch,
            n_layer: meta.usize(&k("block_count"))?,
            n_embd,
            n_ff: meta.usize(&k("feed_forward_length"))?,
            n_head,
            n_head_kv: meta
                .opt_usize(&k("attention.head_count_kv"))?
                .unwrap_or(n_head),
            head_dim,
            // A LongRoPE file (Phi-3) is served within its original context, where llama.cpp
            // uses its short factors; past it the long ones would change every cached key.
            context_length: match (
                meta.opt_usize(&k("context_length"))?.unwrap_or(2048),
                meta.opt_usize(&k("rope.scaling.original_context_length"))?,
            ) {
                (ctx, Some(orig)) if arch == Arch::Phi3 => ctx.min(orig),
                (ctx, _) => ctx,
            },
            rms_eps: meta
                .opt_f32(&k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            rope_theta: meta.opt_f32(&k("rope.freq_base"))?.unwrap_or(match arch {
                Arch::Gemma3 => 1_000_000.0,
                _ => 10_000.0,
            }),
            rope_theta_local: meta
                .opt_f32(&k("rope.local_freq_base"))?
                .unwrap_or(10_000.0),
            // Applied as the file says (Gemma 3's local layers; every layer of any other
            // family), as the model was trained. llama.cpp ignores it outside Gemma 3.
            sliding_window: meta.opt_usize(&k("attention.sliding_window"))?,
            sliding_window_pattern: meta
                .opt_usize(&k("attention.sliding_window_type"))?
                .unwrap_or(6),
            vocab_size,
            rope_freq_scale,
            rope_attn_factor: meta.opt_f32(&k("rope.scaling.attn_factor"))?.unwrap_or(1.0),
            pooling: match meta.opt_u32(&k("pooling_type"))? {
                Some(v) => Pooling::from_gguf(v, &k("pooling_type"))?,
                None => None,
            },
            arch_name,
        };
        hp.validate()?;
        Ok(hp)
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |what: &str| {
            Err(Error::metadata(
                format!("{}.{what}", self.arch_name),
                "inconsistent hyperparameters",
            ))
        };
        if self.n_layer == 0
            || self.n_embd == 0
            || self.n_head == 0
            || self.head_dim == 0
            || self.vocab_size == 0
        {
            return bad("block_count/embedding_length/head_count");
        }
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad("attention.head_count_kv");
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad("attention.key_length");
        }
        Ok(())
    }

    /// Width of one position's K (or V) in one layer: `n_head_kv * head_dim`.
    /// RoPE as this file's forward applies it, given the factors tensor's values.
    pub(crate) fn rope_scaling(&self, factors: Option<Vec<f32>>) -> RopeScaling {
        RopeScaling {
            factors,
            freq_scale: self.rope_freq_scale,
            mscale: self.rope_attn_factor,
        }
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Whether layer `il` attends within the sliding window only: every layer of a file that
    /// declares a window, all but every `sliding_window_pattern`-th in Gemma 3.
    pub fn is_sliding(&self, il: usize) -> bool {
        match (self.sliding_window, self.arch) {
            (None, _) => false,
            (Some(_), Arch::Gemma3) => !(il + 1).is_multiple_of(self.sliding_window_pattern.max(1)),
            (Some(_), _) => true,
        }
    }
}

/// An opened GGUF file: its metadata and a memory map to read tensors from without a copy
/// through a buffered reader.
pub(crate) struct GgufFile {
    pub content: gguf_file::Content,
    mmap: memmap2::Mmap,
    pub file_bytes: u64,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self, Error> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let file_bytes = file.metadata().map_err(io)?.len();
        let mmap = mmap(&file).map_err(io)?;
        let content = gguf_file::Content::read(&mut Cursor::new(&mmap[..])).map_err(|e| {
            // The reason only: candle's message carries a backtrace under RUST_BACKTRACE.
            let reason = match e {
                candle_core::Error::WithBacktrace { inner, .. } => inner.to_string(),
                e => e.to_string(),
            };
            Error::NotGguf {
                path: path.to_path_buf(),
                reason,
            }
        })?;
        Ok(GgufFile {
            content,
            mmap,
            file_bytes,
        })
    }

    pub fn tensor(&self, name: &str, device: &Device) -> Result<QTensor, Error> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(Error::metadata(name, "tensor missing from the GGUF file"));
        }
        Ok(self
            .content
            .tensor(&mut Cursor::new(&self.mmap[..]), name, device)?)
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }
}

/// The one unsafe site of the crate: mapping the weights file read-only. Sound as long as the
/// file is not truncated while mapped, which weights files are not.
#[allow(unsafe_code)]
fn mmap(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: read-only map of a weights file that nothing writes while the model loads.
    unsafe { memmap2::Mmap::map(file) }
}

/// The tensors of RoPE factors (one divisor per rotated pair, `head_dim / 2` long) in a file:
/// the one the forward applies (Llama 3's `rope_freqs`, or Phi-3's LongRoPE short factors: the
/// file is served within its original context, `Hparams::context_length`, where llama.cpp uses
/// them), and one that is only checked (LongRoPE's long factors).
pub(crate) fn rope_factor_tensors(
    has: impl Fn(&str) -> bool,
) -> (Option<&'static str>, Option<&'static str>) {
    if has("rope_freqs.weight") {
        (Some("rope_freqs.weight"), None)
    } else if has("rope_factors_short.weight") {
        let long = "rope_factors_long.weight";
        (Some("rope_factors_short.weight"), has(long).then_some(long))
    } else {
        (None, None)
    }
}

/// Refuses a file with a tensor the loader never read (say, a bias or scaling table the
/// `backend`'s forward for `hp`'s architecture does not apply): running without it would give
/// wrong answers. A reranker's head is read beside the backend (`rank.rs`).
pub(crate) fn refuse_unused(
    content: &gguf_file::Content,
    used: impl Fn(&str) -> bool,
    backend: &str,
    hp: &Hparams,
) -> Result<(), Error> {
    let arch = &hp.arch_name;
    let mut unused: Vec<&String> = content
        .tensor_infos
        .keys()
        .filter(|k| !used(k.as_str()) && !crate::rank::reads(hp, k))
        .collect();
    unused.sort();
    match unused.first() {
        None => Ok(()),
        Some(first) => Err(Error::metadata(
            first.as_str(),
            format!(
                "tensor not understood by the {backend} backend for architecture {arch} ({} such tensor(s)); running without it would give wrong answers",
                unused.len()
            ),
        )),
    }
}
