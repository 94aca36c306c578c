//! The batched transformer forward on candle ops, for every family (built from GGUF by
//! `candle_gguf.rs`, and from a llama-family safetensors checkpoint here): the llama layout with
//! each family's options (biases, Q/K norms, fused matrices, post-norms, RoPE scaling).
//!
//! Everything stays on the model's device (a GPU under CUDA): weights, the KV cache (blocks of
//! one pool per model, `device_kv.rs`), RoPE, norms and attention. One call advances every step
//! of the batch: all rows (prefill chunks and single decode tokens) go through the norms,
//! projections and MLP as one `[rows, hidden]` matrix; RoPE uses each row's own position; the
//! new K/V rows of all steps are scattered into the pool at once. Attention runs once for all
//! the steps of each length (all the one-token steps together, say): their cached keys are
//! gathered into one padded batch, masked past each sequence's own position. Only the last row of each step reaches
//! the output head, and its logits are the only thing brought back to the host.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};

use crate::attn::{RopeScaling, RopeStyle};
use crate::config::KvPrecision;
use crate::device_kv::{self, SharedPool, BLOCK};
use crate::gguf::Hparams;
use crate::model::{Backend, Sequence, Step};
use crate::Error;

/// Token embedding table; quantized tables stay quantized and only the looked-up rows are
/// dequantized (SmolLM2's table would be 113 MB as f32).
pub(crate) enum Embeddings {
    /// In host memory; the looked-up rows are dequantized on the CPU and moved to the device.
    Quantized {
        table: Arc<QTensor>,
        dtype: GgmlDType,
        row_bytes: usize,
        n_embd: usize,
    },
    /// On the model's device, in its activation dtype ([`CandleModel::configure`]).
    Dense(Tensor),
}

impl Embeddings {
    pub fn quantized(table: Arc<QTensor>) -> Result<Self, Error> {
        let (rows, n_embd) = table.shape().dims2()?;
        let dtype = table.dtype();
        let bytes = table.storage_size_in_bytes();
        if rows == 0 || !bytes.is_multiple_of(rows) || !n_embd.is_multiple_of(dtype.block_size()) {
            return Err(Error::metadata(
                "token_embd.weight",
                "unexpected shape for its quantization",
            ));
        }
        Ok(Embeddings::Quantized {
            row_bytes: bytes / rows,
            table,
            dtype,
            n_embd,
        })
    }

    fn lookup(&self, ids: &[u32], device: &Device) -> Result<Tensor, Error> {
        match self {
            Embeddings::Dense(t) => {
                let idx = Tensor::from_slice(ids, ids.len(), t.device())?;
                Ok(t.index_select(&idx, 0)?.to_device(device)?)
            }
            Embeddings::Quantized {
                table,
                dtype,
                row_bytes,
                n_embd,
            } => {
                let data = table.data()?;
                let mut buf = Vec::with_capacity(ids.len() * row_bytes);
                for &id in ids {
                    let start = id as usize * row_bytes;
                    buf.extend_from_slice(&data[start..start + row_bytes]);
                }
                let storage =
                    QStorage::from_data(std::borrow::Cow::Owned(buf), &Device::Cpu, *dtype)?;
                let rows = QTensor::new(storage, (ids.len(), *n_embd))?;
                Ok(rows.dequantize(&Device::Cpu)?.to_device(device)?)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    Silu,
    /// tanh approximation, as ggml's GELU.
    GeluTanh,
}

/// A weight matrix: quantized (candle's quantized matmul, which takes f32 rows) or dense in the
/// model's activation dtype.
pub(crate) struct Linear(pub QMatMul);

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        Ok(match &self.0 {
            QMatMul::QTensor(_) if x.dtype() != DType::F32 => self
                .0
                .forward(&x.to_dtype(DType::F32)?)?
                .to_dtype(x.dtype())?,
            w => w.forward(x)?,
        })
    }

    fn convert(&mut self, dtype: DType) -> Result<(), Error> {
        if let QMatMul::Tensor(w) | QMatMul::TensorF16(w) = &self.0 {
            self.0 = QMatMul::Tensor(w.to_dtype(dtype)?);
        }
        Ok(())
    }
}

/// The Q, K and V projections: three matrices, or Phi-3's one fused `[q; k; v]`.
pub(crate) enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

impl Qkv {
    /// Q, K and V of `h`'s rows (`qd`, `kvd`, `kvd` wide).
    fn project(
        &self,
        h: &Tensor,
        qd: usize,
        kvd: usize,
    ) -> Result<(Tensor, Tensor, Tensor), Error> {
        Ok(match self {
            Qkv::Separate { q, k, v } => (q.forward(h)?, k.forward(h)?, v.forward(h)?),
            Qkv::Fused(w) => {
                let all = w.forward(h)?;
                (
                    all.narrow(1, 0, qd)?.contiguous()?,
                    all.narrow(1, qd, kvd)?.contiguous()?,
                    all.narrow(1, qd + kvd, kvd)?.contiguous()?,
                )
            }
        })
    }

    fn linears(&mut self) -> Vec<&mut Linear> {
        match self {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Fused(w) => vec![w],
        }
    }
}

/// The MLP's gate and up projections: two matrices, or Phi-3's one fused `[gate; up]`.
pub(crate) enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

impl GateUp {
    fn forward(&self, h: &Tensor) -> Result<(Tensor, Tensor), Error> {
        Ok(match self {
            GateUp::Separate { gate, up } => (gate.forward(h)?, up.forward(h)?),
            GateUp::Fused(w) => {
                let both = w.forward(h)?;
                let ff = both.dim(1)? / 2;
                (
                    both.narrow(1, 0, ff)?.contiguous()?,
                    both.narrow(1, ff, ff)?.contiguous()?,
                )
            }
        })
    }

    fn linears(&mut self) -> Vec<&mut Linear> {
        match self {
            GateUp::Separate { gate, up } => vec![gate, up],
            GateUp::Fused(w) => vec![w],
        }
    }
}

pub(crate) struct Layer {
    pub attn_norm: Tensor,
    pub qkv: Qkv,
    /// Qwen2 (and llama files that carry them): the Q, K and V biases.
    pub qkv_bias: Option<[Tensor; 3]>,
    pub wo: Linear,
    /// Gemma 3, Qwen3: RMSNorm over each head of Q and K (`head_dim` long).
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub gate_up: GateUp,
    pub down: Linear,
    pub post_ffn_norm: Option<Tensor>,
    pub rope_theta: f32,
    pub window: Option<usize>,
}

impl Layer {
    fn convert(&mut self, dtype: DType) -> Result<(), Error> {
        for t in [&mut self.attn_norm, &mut self.ffn_norm]
            .into_iter()
            .chain(self.q_norm.iter_mut())
            .chain(self.k_norm.iter_mut())
            .chain(self.post_attn_norm.iter_mut())
            .chain(self.post_ffn_norm.iter_mut())
            .chain(self.qkv_bias.iter_mut().flatten())
        {
            *t = t.to_dtype(dtype)?;
        }
        let mut linears = self.qkv.linears();
        linears.extend(self.gate_up.linears());
        linears.push(&mut self.wo);
        linears.push(&mut self.down);
        for l in linears {
            l.convert(dtype)?;
        }
        Ok(())
    }
}

/// A loaded transformer on candle.
pub(crate) struct CandleModel {
    hp: Hparams,
    device: Device,
    /// The weights and the family's options.
    m: Parts,
    attn_scale: f32,
    /// What the attention rounds to f16 (see [`KvPrecision`]); set with [`CandleModel::configure`].
    kv: KvPrecision,
    /// The dtype of activations and dense weights: f32 on the CPU, f16 on a GPU.
    act: DType,
    pool: SharedPool,
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor, Error> {
    Ok(candle_nn::ops::rms_norm(x, w, eps)?)
}

/// Softmax over the last dimension. On the CPU its sum is taken in f64, so that the masked
/// padding of a batched attention (exact zeros) cannot change a row's weights: candle's f32 sum
/// adds in an order that depends on the row's length, and a last-bit difference in one layer's
/// weights becomes a different 8-bit rounding of the next matmul's input. On a GPU the fused
/// kernel (whose sums depend on the launch anyway).
fn softmax(x: &Tensor) -> Result<Tensor, Error> {
    if !x.device().is_cpu() {
        return Ok(candle_nn::ops::softmax_last_dim(x)?);
    }
    let e = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?;
    let sum = e
        .to_dtype(DType::F64)?
        .sum_keepdim(D::Minus1)?
        .to_dtype(DType::F32)?;
    Ok(e.broadcast_div(&sum)?)
}

fn to_host(t: &Tensor) -> Result<Vec<f32>, Error> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// A model's weights and its family's options, as the loaders build them.
pub(crate) struct Parts {
    pub embeddings: Embeddings,
    pub embed_scale: Option<f64>,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    pub output: Linear,
    pub rope: RopeStyle,
    pub rope_scaling: RopeScaling,
    pub activation: Activation,
}

impl CandleModel {
    /// The model from its parts, computing in f32 with an f32 cache (see [`Self::configure`]).
    pub(crate) fn new(hp: Hparams, device: &Device, parts: Parts) -> CandleModel {
        let pool = SharedPool::new(hp.n_layer, hp.kv_dim(), DType::F32, device);
        CandleModel {
            attn_scale: 1.0 / (hp.head_dim as f32).sqrt(),
            kv: KvPrecision::default(),
            act: DType::F32,
            pool,
            device: device.clone(),
            m: parts,
            hp,
        }
    }

    /// Sets the attention's precision and the activation dtype (`act`: f32, or f16/bf16 for a
    /// GPU, which then keeps its dense weights and its cache in that dtype too). Sequences made
    /// before belong to the old cache pool and are refused afterwards.
    pub(crate) fn configure(&mut self, kv: KvPrecision, act: DType) -> Result<(), Error> {
        for l in &mut self.m.layers {
            l.convert(act)?;
        }
        self.m.norm = self.m.norm.to_dtype(act)?;
        self.m.output.convert(act)?;
        if let Embeddings::Dense(t) = &mut self.m.embeddings {
            // Looked up on the device: only ids go there, not rows.
            *t = t.to_device(&self.device)?.to_dtype(act)?;
        }
        let cache = match (act, kv) {
            (DType::F32, KvPrecision::F32) => DType::F32,
            (DType::F32, KvPrecision::F16) => DType::F16,
            (other, _) => other,
        };
        self.pool = SharedPool::new(self.hp.n_layer, self.hp.kv_dim(), cache, &self.device);
        self.kv = kv;
        self.act = act;
        Ok(())
    }

    /// The activation dtype `dtype` asks for on `device`: `auto` is f16 on a GPU (tensor cores,
    /// half the bytes) and f32 on the CPU.
    pub(crate) fn act_for(device: &Device, dtype: crate::config::Dtype) -> DType {
        use crate::config::Dtype;
        match dtype {
            Dtype::Auto if device.is_cpu() => DType::F32,
            Dtype::Auto | Dtype::F16 => DType::F16,
            Dtype::F32 => DType::F32,
            Dtype::BF16 => DType::BF16,
        }
    }
}

/// One attention call of a step: `b` sequences of `qr` query rows each, rows
/// `first..first + b * qr` of the step (in its row order).
struct Group {
    first: usize,
    b: usize,
    qr: usize,
    /// Key positions per sequence after padding (`blocks per sequence * BLOCK`).
    t: usize,
    /// `[b * blocks per sequence]` pool blocks (u32).
    blocks: Tensor,
    /// `[b, 1, 1, qr, t]` f32: 0 where a row may attend, -inf elsewhere; then the same for the
    /// sliding window (when a layer has one).
    mask: Tensor,
    mask_window: Option<Tensor>,
}

/// What a step needs on the device besides the weights, built on the host once per step.
struct Plan {
    /// Step and absolute position of each row, one-token steps first.
    rows: Vec<(usize, usize)>,
    ids: Vec<u32>,
    /// `[rows]` u32: each row's pool row.
    write_at: Tensor,
    /// Per step, the index (in row order) of its last row.
    last: Tensor,
    groups: Vec<Group>,
    /// `(cos, sin)` per RoPE base, `[rows, 1, head_dim / 2]` each, the activation dtype.
    rope: HashMap<u32, (Tensor, Tensor)>,
}

impl CandleModel {
    fn plan(&self, steps: &[Step<'_>]) -> Result<Plan, Error> {
        let dev = &self.device;
        let blocks_of = |si: usize| -> Result<&[u32], Error> {
            steps[si]
                .seq
                .device
                .as_ref()
                .map(|d| d.blocks())
                .ok_or_else(|| {
                    Error::InvalidBatch("a host cache given to the candle backend".into())
                })
        };
        // Steps of the same length attend together (one-token steps above all): their queries
        // need no padding, only their keys.
        let mut by_len: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (si, st) in steps.iter().enumerate() {
            by_len.entry(st.tokens.len()).or_default().push(si);
        }
        let mut rows = Vec::new();
        let mut ids = Vec::new();
        let mut last = vec![0u32; steps.len()];
        let mut groups = Vec::new();
        let window = self.m.layers.iter().find_map(|l| l.window);
        let mut add_group =
            |members: &[usize], rows: &mut Vec<(usize, usize)>| -> Result<(), Error> {
                if members.is_empty() {
                    return Ok(());
                }
                let first = rows.len();
                let qr = steps[members[0]].tokens.len();
                let nb = members
                    .iter()
                    .map(|&si| (steps[si].seq.len + steps[si].tokens.len()).div_ceil(BLOCK))
                    .max()
                    .unwrap_or(1);
                let t = nb * BLOCK;
                let mut blocks = Vec::with_capacity(members.len() * nb);
                let mut mask = vec![f32::NEG_INFINITY; members.len() * qr * t];
                let mut mask_w = window.map(|_| vec![f32::NEG_INFINITY; members.len() * qr * t]);
                for (bi, &si) in members.iter().enumerate() {
                    let own = blocks_of(si)?;
                    let used = (steps[si].seq.len + steps[si].tokens.len()).div_ceil(BLOCK);
                    blocks.extend((0..nb).map(|i| own[i.min(used - 1)]));
                    for (i, &tok) in steps[si].tokens.iter().enumerate() {
                        let pos = steps[si].seq.len + i;
                        rows.push((si, pos));
                        ids.push(tok);
                        let m = &mut mask[(bi * qr + i) * t..(bi * qr + i + 1) * t];
                        m[..=pos].fill(0.0);
                        if let (Some(mw), Some(w)) = (mask_w.as_mut(), window) {
                            let m = &mut mw[(bi * qr + i) * t..(bi * qr + i + 1) * t];
                            m[(pos + 1).saturating_sub(w)..=pos].fill(0.0);
                        }
                    }
                    last[si] = (rows.len() - 1) as u32;
                }
                let b = members.len();
                let shape = (b, 1, 1, qr, t);
                groups.push(Group {
                    first,
                    b,
                    qr,
                    t,
                    blocks: Tensor::from_vec(blocks, b * nb, dev)?,
                    mask: Tensor::from_vec(mask, shape, dev)?,
                    mask_window: mask_w
                        .map(|m| Tensor::from_vec(m, shape, dev))
                        .transpose()?,
                });
                Ok(())
            };
        for members in by_len.values() {
            add_group(members, &mut rows)?;
        }
        let mut write_at = Vec::with_capacity(rows.len());
        for &(si, pos) in &rows {
            write_at.push(device_kv::row(blocks_of(si)?, pos));
        }
        let mut rope = HashMap::new();
        let half = self.hp.head_dim / 2;
        let mut cs = Vec::with_capacity(half);
        for l in &self.m.layers {
            if rope.contains_key(&l.rope_theta.to_bits()) {
                continue;
            }
            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            for &(_, pos) in &rows {
                cs.clear();
                crate::attn::rope_angles(
                    self.hp.head_dim,
                    pos,
                    l.rope_theta,
                    &self.m.rope_scaling,
                    &mut cs,
                );
                cos.extend(cs.iter().map(|c| c.0));
                sin.extend(cs.iter().map(|c| c.1));
            }
            let shape = (rows.len(), 1, half);
            let cos = Tensor::from_vec(cos, shape, dev)?.to_dtype(self.act)?;
            let sin = Tensor::from_vec(sin, shape, dev)?.to_dtype(self.act)?;
            rope.insert(l.rope_theta.to_bits(), (cos, sin));
        }
        let n = rows.len();
        Ok(Plan {
            write_at: Tensor::from_vec(write_at, n, dev)?,
            last: Tensor::from_vec(last, steps.len(), dev)?,
            rows,
            ids,
            groups,
            rope,
        })
    }

    /// Causal attention of `q` (`[rows, n_head, head_dim]`) over layer `il`'s cache, one call
    /// per group; returns `[rows, n_head * head_dim]`.
    fn attention(
        &self,
        il: usize,
        q: &Tensor,
        plan: &Plan,
        pool: &device_kv::Pool,
    ) -> Result<Tensor, Error> {
        let hp = &self.hp;
        let (nkv, hd) = (hp.n_head_kv, hp.head_dim);
        let group = hp.n_head / nkv;
        let f16_kv = self.kv == KvPrecision::F16 && self.act == DType::F32;
        let mut outs = Vec::with_capacity(plan.groups.len());
        for g in &plan.groups {
            let (b, qr, t) = (g.b, g.qr, g.t);
            // [b, n_kv, group * qr, hd]
            let qg = q
                .narrow(0, g.first, b * qr)?
                .reshape((b, qr, nkv, group, hd))?
                .permute((0, 2, 3, 1, 4))?
                .reshape((b, nkv, group * qr, hd))?;
            let (k, v) = pool.gather(il, &g.blocks)?;
            let heads = |x: Tensor| -> Result<Tensor, Error> {
                Ok(x.reshape((b, t, nkv, hd))?
                    .transpose(1, 2)?
                    .to_dtype(self.act)?
                    .contiguous()?)
            };
            let (k, v) = (heads(k)?, heads(v)?);
            let scores = qg.matmul(&k.t()?)?.to_dtype(DType::F32)?;
            let scores = (scores * self.attn_scale as f64)?.reshape((b, nkv, group, qr, t))?;
            let mask = match (self.m.layers[il].window, &g.mask_window) {
                (Some(_), Some(m)) => m,
                _ => &g.mask,
            };
            let p = softmax(&scores.broadcast_add(mask)?)?;
            let p = if f16_kv {
                // llama.cpp's f16 cache: the weights are rounded to f16 for the sum over V.
                p.to_dtype(DType::F16)?.to_dtype(DType::F32)?
            } else {
                p.to_dtype(self.act)?
            };
            let o = p.reshape((b, nkv, group * qr, t))?.matmul(&v)?;
            outs.push(
                o.reshape((b, nkv, group, qr, hd))?
                    .permute((0, 3, 1, 2, 4))?
                    .reshape((b * qr, hp.n_head * hd))?,
            );
        }
        Ok(if outs.len() == 1 {
            outs.pop().expect("one group")
        } else {
            Tensor::cat(&outs, 0)?
        })
    }

    fn rope(&self, x: &Tensor, cs: &(Tensor, Tensor)) -> Result<Tensor, Error> {
        let (n, heads, hd) = x.dims3()?;
        let x = x.reshape((n, heads, 1, hd))?;
        let y = match self.m.rope {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cs.0, &cs.1)?,
            RopeStyle::Neox => candle_nn::rotary_emb::rope(&x, &cs.0, &cs.1)?,
        };
        Ok(y.reshape((n, heads, hd))?)
    }
}

impl Backend for CandleModel {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn new_sequence(
        &self,
        layers: usize,
        kv_dim: usize,
        capacity: usize,
    ) -> Result<Sequence, Error> {
        Sequence::on_device(&self.pool, layers, kv_dim, capacity)
    }

    fn accepts(&self, seq: &Sequence) -> bool {
        seq.device
            .as_ref()
            .is_some_and(|d| d.pool().same(&self.pool))
    }

    fn kv_value_bytes(&self) -> usize {
        self.pool.lock().dtype().size_in_bytes()
    }

    fn max_rows(&self) -> usize {
        // A GPU call's cost is mostly its kernel launches, not its rows' memory.
        if self.device.is_cpu() {
            crate::pieces::MAX_ROWS
        } else {
            8192
        }
    }

    fn forward(&mut self, steps: &mut [Step<'_>], logits: &mut Vec<f32>) -> Result<(), Error> {
        let hp = &self.hp;
        let (hd, qd, kvd, eps) = (
            hp.head_dim,
            hp.n_head * hp.head_dim,
            hp.kv_dim(),
            hp.rms_eps,
        );
        let plan = self.plan(steps)?;
        let n = plan.rows.len();
        let mut x = self
            .m
            .embeddings
            .lookup(&plan.ids, &self.device)?
            .to_dtype(self.act)?;
        if let Some(s) = self.m.embed_scale {
            x = (x * s)?;
        }
        let pool = self.pool.lock();
        let f16_q = self.kv == KvPrecision::F16 && self.act == DType::F32;
        for (il, layer) in self.m.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, eps)?;
            let (mut q, mut k, mut v) = layer.qkv.project(&h, qd, kvd)?;
            if let Some([bq, bk, bv]) = &layer.qkv_bias {
                q = q.broadcast_add(bq)?;
                k = k.broadcast_add(bk)?;
                v = v.broadcast_add(bv)?;
            }
            let mut q = q.reshape((n, hp.n_head, hd))?;
            let mut k = k.reshape((n, hp.n_head_kv, hd))?;
            if let Some(w) = &layer.q_norm {
                q = rms_norm(&q, w, eps)?;
            }
            if let Some(w) = &layer.k_norm {
                k = rms_norm(&k, w, eps)?;
            }
            let cs = &plan.rope[&layer.rope_theta.to_bits()];
            let mut q = self.rope(&q, cs)?;
            let k = self.rope(&k, cs)?;
            if f16_q {
                // Without flash attention llama.cpp converts Q to f16 for the Q·K products.
                q = q.to_dtype(DType::F16)?.to_dtype(DType::F32)?;
            }
            let cache = pool.dtype();
            pool.write(
                il,
                &plan.write_at,
                &k.reshape((n, kvd))?.to_dtype(cache)?,
                &v.to_dtype(cache)?,
            )?;
            let out = self.attention(il, &q, &plan, &pool)?;
            let attn_out = layer.wo.forward(&out)?;
            let attn_out = match &layer.post_attn_norm {
                Some(w) => rms_norm(&attn_out, w, eps)?,
                None => attn_out,
            };
            x = (x + attn_out)?;
            let h = rms_norm(&x, &layer.ffn_norm, eps)?;
            let (gate, up) = layer.gate_up.forward(&h)?;
            let gate = match self.m.activation {
                Activation::Silu => gate.silu()?,
                Activation::GeluTanh => gate.gelu()?,
            };
            let ffn_out = layer.down.forward(&(gate * up)?)?;
            let ffn_out = match &layer.post_ffn_norm {
                Some(w) => rms_norm(&ffn_out, w, eps)?,
                None => ffn_out,
            };
            x = (x + ffn_out)?;
        }
        let last = rms_norm(&x.index_select(&plan.last, 0)?, &self.m.norm, eps)?;
        let out = self.m.output.forward(&last)?;
        logits.clear();
        logits.extend(to_host(&out)?);
        Ok(())
    }
}

/// The llama family from Hugging Face tensor names (`model.layers.N.self_attn.q_proj.weight`, ...),
/// as read from safetensors; HF checkpoints use NeoX-style RoPE.
pub(crate) fn from_hf_tensors(
    mut t: HashMap<String, Tensor>,
    hp: Hparams,
    device: &Device,
) -> Result<CandleModel, Error> {
    let mut take = |name: &str| -> Result<Tensor, Error> {
        let w = t
            .remove(name)
            .ok_or_else(|| Error::metadata(name, "tensor missing from the checkpoint"))?;
        Ok(w.to_dtype(DType::F32)?.to_device(device)?)
    };
    let embed = take("model.embed_tokens.weight")?;
    let output = match take("lm_head.weight") {
        Ok(w) => w,
        Err(_) => embed.clone(),
    };
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("model.layers.{il}.{s}.weight");
        layers.push(Layer {
            attn_norm: take(&p("input_layernorm"))?,
            qkv: Qkv::Separate {
                q: Linear(QMatMul::Tensor(take(&p("self_attn.q_proj"))?)),
                k: Linear(QMatMul::Tensor(take(&p("self_attn.k_proj"))?)),
                v: Linear(QMatMul::Tensor(take(&p("self_attn.v_proj"))?)),
            },
            qkv_bias: None,
            wo: Linear(QMatMul::Tensor(take(&p("self_attn.o_proj"))?)),
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: take(&p("post_attention_layernorm"))?,
            gate_up: GateUp::Separate {
                gate: Linear(QMatMul::Tensor(take(&p("mlp.gate_proj"))?)),
                up: Linear(QMatMul::Tensor(take(&p("mlp.up_proj"))?)),
            },
            down: Linear(QMatMul::Tensor(take(&p("mlp.down_proj"))?)),
            post_ffn_norm: None,
            rope_theta: hp.rope_theta,
            window: None,
        });
    }
    let parts = Parts {
        norm: take("model.norm.weight")?,
        embeddings: Embeddings::Dense(embed),
        embed_scale: None,
        layers,
        output: Linear(QMatMul::Tensor(output)),
        rope: RopeStyle::Neox,
        rope_scaling: RopeScaling::NONE,
        activation: Activation::Silu,
    };
    Ok(CandleModel::new(hp, device, parts))
}
