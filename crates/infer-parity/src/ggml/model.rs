//! The emulated model: its tensors as the GGUF stores them (read by `read.rs`), loading, its
//! cache, and the attention helpers its forward uses (`forward.rs`).

use std::sync::Arc;

use hearth_infer::{
    BackendChoice, DeviceSpec, KvPrecision, TextModelConfig, TextTokenizer, WeightSource,
};

use super::*;

mod read;
use read::Reader;

// ---------------------------------------------------------------------------------------------
// The model.
// ---------------------------------------------------------------------------------------------

/// A weight matrix as stored in the GGUF file (rows of raw blocks).
struct RawMatrix {
    ty: GgmlDType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl RawMatrix {
    /// (bytes, elements) of one block.
    fn block(&self) -> (usize, usize) {
        match self.ty {
            GgmlDType::Q4_1 => (Q4_1_BYTES, 32),
            GgmlDType::Q5_0 => (Q5_0_BYTES, 32),
            GgmlDType::Q4K => (Q4_K_BYTES, 256),
            GgmlDType::Q6K => (Q6_K_BYTES, 256),
            _ => (Q8_0_BYTES, 32),
        }
    }

    fn row_bytes(&self) -> usize {
        let (bytes, len) = self.block();
        self.cols / len * bytes
    }

    fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Whether activations are quantized to Q8_K (the K-quants) rather than Q8_0/Q8_1.
    fn k_quant(&self) -> bool {
        matches!(self.ty, GgmlDType::Q4K | GgmlDType::Q6K)
    }

    /// Whether activations are quantized with the block sum (Q8_1, for Q4_1) or not (Q8_0).
    fn wants_sum(&self) -> bool {
        self.ty == GgmlDType::Q4_1
    }

    fn dot(&self, r: usize, a: &[Q8Block]) -> f32 {
        match self.ty {
            GgmlDType::Q4_1 => dot_q4_1_q8_1(self.row(r), a),
            GgmlDType::Q5_0 => dot_q5_0_q8_0(self.row(r), a),
            _ => dot_q8_0_q8_0(self.row(r), a),
        }
    }

    /// A K-quant row against the Q8_K activations of token `t` of a product over `n` tokens.
    fn dot_k(&self, r: usize, a: &[Q8KBlock], t: usize, n: usize) -> f32 {
        match self.ty {
            GgmlDType::Q4K => dot_q4_k_q8_k(self.row(r), a, t < n - n % 4),
            _ if n >= 8 => dot_q6_k_tiled(self.row(r), a),
            _ => dot_q6_k_q8_k(self.row(r), a),
        }
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: RawMatrix,
    wk: RawMatrix,
    wv: RawMatrix,
    wo: RawMatrix,
    ffn_norm: Vec<f32>,
    gate: RawMatrix,
    up: RawMatrix,
    down: RawMatrix,
    /// Gemma 3's per-head Q and K norms and the norms after attention and after the MLP.
    gemma: Option<GemmaNorms>,
}

struct GemmaNorms {
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn: Vec<f32>,
    post_ffw: Vec<f32>,
}

/// A GGUF model run with llama.cpp's CPU arithmetic (see the module doc): load it with
/// [`GgmlModel::load`], make a [`Cache`] per sequence, and feed it tokens with
/// [`GgmlModel::forward`] (or [`GgmlModel::greedy`]).
pub struct GgmlModel {
    hp: Hparams,
    tokenizer: Arc<TextTokenizer>,
    pool: ThreadPool,
    embd: RawMatrix,
    /// `None`: tied to the embeddings.
    output: Option<RawMatrix>,
    norm: Vec<f32>,
    layers: Vec<Layer>,
    theta_scale: f32,
    /// Gemma 3: theta scale of the sliding-window layers.
    theta_scale_local: f32,
    kq_scale: f32,
}

fn unsupported(name: &str, what: impl std::fmt::Display) -> Error {
    metadata(
        name,
        format!("the llama.cpp emulator does not support {what}"),
    )
}

/// hearth-infer's error for a missing or bad tensor or key.
fn metadata(key: impl Into<String>, reason: impl std::fmt::Display) -> Error {
    Error::Metadata {
        key: key.into(),
        reason: reason.to_string(),
    }
}

impl Reader<'_> {
    /// A 2-D tensor's raw blocks, which must be of one of `types`.
    fn raw(&mut self, name: &str, types: &[GgmlDType]) -> Result<RawMatrix, Error> {
        let info = self.info(name)?;
        let (rows, cols) = info.shape.dims2().map_err(|e| metadata(name, e))?;
        if !types.contains(&info.ggml_dtype) {
            return Err(unsupported(
                name,
                format_args!("block type {:?} here (it takes {types:?})", info.ggml_dtype),
            ));
        }
        let mut m = RawMatrix {
            ty: info.ggml_dtype,
            rows,
            cols,
            data: Vec::new(),
        };
        if cols % m.block().1 != 0 {
            return Err(metadata(name, "row length is not whole blocks"));
        }
        let len = rows * m.row_bytes();
        self.read_at(self.content.tensor_data_offset + info.offset, len)?;
        m.data = std::mem::take(&mut self.buf);
        Ok(m)
    }
}

impl GgmlModel {
    /// Loads the local GGUF file `cfg` names (llama family with Q4_1 layer matrices, or Gemma 3
    /// with Q5_0/Q8_0/Q4_K/Q6_K ones), with its tokenizer and `cfg.chat_template`, on
    /// `cfg.threads` threads. What it does not emulate is refused, never approximated: another
    /// file, a KV precision other than f32, a device other than the CPU, the candle backend.
    pub fn load(cfg: &TextModelConfig) -> Result<GgmlModel, Error> {
        let refuse = |key, reason: &str| {
            Err(Error::InvalidConfig {
                key,
                reason: format!("the llama.cpp emulator {reason}"),
            })
        };
        let WeightSource::Local { path } = &cfg.source else {
            return refuse("weights", "reads a local GGUF file only");
        };
        if cfg.kv_precision != KvPrecision::F32 {
            return refuse("kv_precision", "emulates an f32 KV cache only");
        }
        if cfg.device != DeviceSpec::Cpu || cfg.backend == BackendChoice::Candle {
            return refuse("backend", "is llama.cpp's CPU backend, not candle's");
        }
        if !path.is_file() {
            return Err(Error::WeightsNotFound {
                path: path.clone(),
                hint: "run scripts/fetch-weights.sh".into(),
            });
        }
        let mut file = File::open(path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let content = Content::read(&mut file)?;
        let hp = Hparams::from_gguf(&content)?;
        let tokenizer = match &cfg.tokenizer {
            Some(_) => return refuse("tokenizer", "reads the tokenizer from the GGUF file"),
            None => {
                TextTokenizer::from_gguf_file_with_template(path, cfg.chat_template.as_deref())?
            }
        };
        from_gguf(path, file, &content, hp, Arc::new(tokenizer), cfg.threads)
    }

    /// The model's shape.
    pub fn hparams(&self) -> &Hparams {
        &self.hp
    }

    pub fn tokenizer(&self) -> Arc<TextTokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// An empty cache of `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> Cache {
        let per_layer = capacity * self.hp.kv_dim();
        let layers = || vec![vec![0f32; per_layer]; self.hp.n_layer];
        Cache {
            k: layers(),
            v: layers(),
            len: 0,
            capacity,
        }
    }

    /// Appends `tokens` to `cache` (in ubatches of 512, as llama.cpp decodes one sequence) and
    /// returns the logits of the last one. On error the cache keeps its length.
    pub fn forward(&mut self, cache: &mut Cache, tokens: &[u32]) -> Result<Vec<f32>, Error> {
        let mut logits = Vec::new();
        self.forward_tapped(cache, tokens, &mut logits, &mut NoTap)?;
        cache.len += tokens.len();
        Ok(logits)
    }

    /// Greedy ids after `prompt`: `n` of them, or fewer when a stop token comes (it is the
    /// last id returned), as llama.cpp's greedy sampler picks (the first largest logit).
    pub fn greedy(&mut self, prompt: &[u32], n: usize) -> Result<Vec<u32>, Error> {
        let mut cache = self.new_cache(prompt.len() + n);
        let (mut out, mut next) = (Vec::with_capacity(n), prompt.to_vec());
        while out.len() < n {
            let logits = self.forward(&mut cache, &next)?;
            let id = argmax(&logits);
            out.push(id);
            if self.tokenizer.is_stop(id) {
                break;
            }
            next = vec![id];
        }
        Ok(out)
    }
}

/// The first index of the largest value.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// One sequence's K/V cache, as llama.cpp's f32 cache holds it: per layer, `capacity` rows of
/// `kv_dim` values (`[position][kv_head][head_dim]`, K after RoPE); positions `0..len` are valid.
#[derive(Debug, Clone)]
pub struct Cache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
}

impl Cache {
    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Loads the emulation from an opened GGUF file.
fn from_gguf(
    path: &Path,
    file: File,
    content: &Content,
    hp: Hparams,
    tokenizer: Arc<TextTokenizer>,
    threads: usize,
) -> Result<GgmlModel, Error> {
    let gemma = hp.arch == Arch::Gemma3;
    if !matches!(hp.arch, Arch::Llama | Arch::Gemma3)
        || hp.rope_freq_scale != 1.0
        || (!gemma && hp.sliding_window.is_some())
    {
        return Err(unsupported(
            "general.architecture",
            "anything but plain llama-family and Gemma 3 files",
        ));
    }
    if !hp.head_dim.is_multiple_of(64)
        || !hp.n_embd.is_multiple_of(32)
        || !hp.n_ff.is_multiple_of(16)
    {
        return Err(unsupported(
            "attention.key_length",
            "head sizes other than multiples of 64 (or rows of partial blocks)",
        ));
    }
    let mut rd = Reader {
        path,
        file,
        content,
        buf: Vec::new(),
    };
    let (e, hd) = (hp.n_embd, hp.head_dim);
    let layer_types: &[GgmlDType] = if gemma {
        &[
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ]
    } else {
        &[GgmlDType::Q4_1]
    };
    let head_types = [GgmlDType::Q8_0, GgmlDType::Q4_1];
    let embd = rd.raw("token_embd.weight", &[GgmlDType::Q8_0])?;
    if embd.rows != hp.vocab_size || embd.cols != e {
        return Err(metadata(
            "token_embd.weight",
            "shape differs from vocab_size x embedding_length",
        ));
    }
    let output = if rd.has("output.weight") {
        Some(rd.raw("output.weight", &head_types)?)
    } else {
        None
    };
    for name in [
        "rope_freqs.weight",
        "blk.0.attn_q.bias",
        "blk.0.attn_output.bias",
        "rope_factors_long.weight",
    ] {
        if rd.has(name) {
            return Err(unsupported(name, "this tensor"));
        }
    }
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}.weight");
        let layer = Layer {
            attn_norm: rd.vector(&p("attn_norm"), e)?,
            wq: rd.raw(&p("attn_q"), layer_types)?,
            wk: rd.raw(&p("attn_k"), layer_types)?,
            wv: rd.raw(&p("attn_v"), layer_types)?,
            wo: rd.raw(&p("attn_output"), layer_types)?,
            ffn_norm: rd.vector(&p("ffn_norm"), e)?,
            gate: rd.raw(&p("ffn_gate"), layer_types)?,
            up: rd.raw(&p("ffn_up"), layer_types)?,
            down: rd.raw(&p("ffn_down"), layer_types)?,
            gemma: if gemma {
                Some(GemmaNorms {
                    q_norm: rd.vector(&p("attn_q_norm"), hd)?,
                    k_norm: rd.vector(&p("attn_k_norm"), hd)?,
                    post_attn: rd.vector(&p("post_attention_norm"), e)?,
                    post_ffw: rd.vector(&p("post_ffw_norm"), e)?,
                })
            } else {
                None
            },
        };
        let shapes = [
            (&layer.wq, hp.n_head * hd, e),
            (&layer.wk, hp.kv_dim(), e),
            (&layer.wv, hp.kv_dim(), e),
            (&layer.wo, e, hp.n_head * hd),
            (&layer.gate, hp.n_ff, e),
            (&layer.up, hp.n_ff, e),
            (&layer.down, e, hp.n_ff),
        ];
        if shapes.iter().any(|(m, r, c)| m.rows != *r || m.cols != *c) {
            return Err(metadata(
                p("attn_q"),
                "layer shapes differ from the hyperparameters",
            ));
        }
        layers.push(layer);
    }
    let norm = rd.vector("output_norm.weight", e)?;
    Ok(GgmlModel {
        // llama.cpp: theta_scale = powf(freq_base, -2.0f / n_dims); kq_scale = 1 / sqrtf(n_embd_head).
        theta_scale: hp.rope_theta.powf(-2.0 / hd as f32),
        theta_scale_local: hp.rope_theta_local.powf(-2.0 / hd as f32),
        // Gemma 3 scales Q by 1 / sqrt(head_dim) itself and attends with scale 1.
        kq_scale: if gemma { 1.0 } else { 1.0 / (hd as f32).sqrt() },
        pool: ThreadPool::new(threads),
        hp,
        tokenizer,
        embd,
        output,
        norm,
        layers,
    })
}

/// Per-ubatch buffers.
#[derive(Default)]
struct Bufs {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    acts: Vec<Q8Block>,
    kacts: Vec<Q8KBlock>,
    tmp: Vec<f32>,
}

/// Something that looks at named intermediate tensors (tests compare them with llama.cpp's).
/// Names follow llama.cpp's graph (`name-il` for layer `il`, `name` alone for `None`).
trait Tap {
    fn tap(&mut self, name: &str, il: Option<usize>, data: &[f32]);
}

/// Looks at nothing.
struct NoTap;

impl Tap for NoTap {
    fn tap(&mut self, _: &str, _: Option<usize>, _: &[f32]) {}
}

/// ggml's RMSNorm of each `e`-wide row of `x` with weight `w`, into `out` (resized).
/// `v` emptied and refilled with `len` zeros (its allocation kept).
fn zeroed(v: &mut Vec<f32>, len: usize) {
    v.clear();
    v.resize(len, 0.0);
}

/// The buffer `v` holds, taken out of it and zeroed to `len` (the caller gives it back).
fn take_zeroed(v: &mut Vec<f32>, len: usize) -> Vec<f32> {
    let mut out = std::mem::take(v);
    zeroed(&mut out, len);
    out
}

/// The residual connection: `x += y`, element by element.
fn add_into(x: &mut [f32], y: &[f32]) {
    for (xv, &yv) in x.iter_mut().zip(y) {
        *xv += yv;
    }
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, e: usize, out: &mut Vec<f32>) {
    out.clear();
    out.resize(x.len(), 0.0);
    for (xr, hr) in x.chunks_exact(e).zip(out.chunks_exact_mut(e)) {
        rms_norm(xr, w, eps, hr);
    }
}

/// Attention shape: query heads, query heads per KV head, head size, K/V row width.
#[derive(Debug, Clone, Copy)]
struct AttnDims {
    nh: usize,
    group: usize,
    hd: usize,
    kvd: usize,
}

impl AttnDims {
    fn of(hp: &Hparams) -> AttnDims {
        AttnDims {
            nh: hp.n_head,
            group: hp.n_head / hp.n_head_kv,
            hd: hp.head_dim,
            kvd: hp.kv_dim(),
        }
    }
}

/// Attention of the tokens of `q` (positions `p0..`) over one layer's cache, per token and head,
/// in llama.cpp's orders: K·Q by `vec_dot_f32`, softmax over the live positions, V·softmax over
/// the KV length padded to `KV_PAD` (tinyBLAS for two or more tokens, `vec_dot_f32` for one).
/// Positions before `first(pos)` are masked (sliding windows). Writes `out` (tokens × heads × hd).
#[allow(clippy::too_many_arguments)]
fn attend(
    k_cache: &[f32],
    v_cache: &[f32],
    q: &[f32],
    p0: usize,
    d: AttnDims,
    kq_scale: f32,
    first: impl Fn(usize) -> usize,
    out: &mut Vec<f32>,
) {
    let AttnDims { nh, group, hd, kvd } = d;
    let qd = nh * hd;
    let n = q.len() / qd;
    let n_kv_max = (p0 + n).div_ceil(KV_PAD) * KV_PAD;
    let (mut kq, mut w, mut vt) = (
        vec![0f32; n_kv_max],
        vec![0f32; n_kv_max],
        vec![0f32; n_kv_max],
    );
    out.clear();
    out.resize(n * qd, 0.0);
    for t in 0..n {
        let pos = p0 + t;
        let live = pos + 1;
        let masked = first(pos);
        let padded = live.div_ceil(KV_PAD) * KV_PAD;
        for head in 0..nh {
            let kvh = head / group;
            let qh = &q[t * qd + head * hd..t * qd + (head + 1) * hd];
            for (i, o) in kq[..live].iter_mut().enumerate() {
                *o = if i < masked {
                    f32::NEG_INFINITY
                } else {
                    dot_f32(&k_cache[i * kvd + kvh * hd..i * kvd + (kvh + 1) * hd], qh)
                };
            }
            soft_max(&kq[..live], kq_scale, &mut w[..padded]);
            let o = &mut out[t * qd + head * hd..t * qd + (head + 1) * hd];
            for (dd, o) in o.iter_mut().enumerate() {
                for (i, x) in vt[..live].iter_mut().enumerate() {
                    *x = v_cache[i * kvd + kvh * hd + dd];
                }
                vt[live..padded].fill(0.0);
                *o = if n >= 2 {
                    dot_f32_tinyblas(&vt[..padded], &w[..padded])
                } else {
                    dot_f32(&vt[..padded], &w[..padded])
                };
            }
        }
    }
}

mod forward;
#[cfg(test)]
mod tests;
