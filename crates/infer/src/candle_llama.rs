//! The batched transformer forward on candle ops, for every family (built from GGUF by
//! `candle_gguf.rs`, and from a llama-family safetensors checkpoint here): the llama layout with
//! each family's options (biases, Q/K norms, fused matrices, post-norms, RoPE scaling).
//!
//! One call advances every step of the batch: all rows (prefill chunks and single decode tokens)
//! go through the norms, projections and MLP as one `[rows, hidden]` matrix; RoPE uses each row's
//! own position; K/V are written in place into each sequence's cache; attention runs per row
//! over its own sequence's cache. Only the last row of each step reaches the output head.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use crate::attn::{self, AttnShape, RopeScaling, RopeStyle, RowRef};
use crate::config::KvPrecision;
use crate::gguf::Hparams;
use crate::model::{Backend, Step};
use crate::Error;

/// Token embedding table; quantized tables stay quantized and only the looked-up rows are
/// dequantized (SmolLM2's table would be 113 MB as f32).
pub(crate) enum Embeddings {
    /// Always in host memory; rows are dequantized on the CPU and moved to the device.
    Quantized {
        table: Arc<QTensor>,
        dtype: GgmlDType,
        row_bytes: usize,
        n_embd: usize,
    },
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

/// The Q, K and V projections: three matrices, or Phi-3's one fused `[q; k; v]`.
pub(crate) enum Qkv {
    Separate { q: QMatMul, k: QMatMul, v: QMatMul },
    Fused(QMatMul),
}

/// Q, K and V rows on the host, row-major.
type HostQkv = (Vec<f32>, Vec<f32>, Vec<f32>);

impl Qkv {
    /// Q, K and V of `h`'s rows on the host (`qd`, `kvd`, `kvd` wide per row), with `bias`
    /// (`[q; k; v]`, Qwen2) added.
    fn project(
        &self,
        h: &Tensor,
        qd: usize,
        kvd: usize,
        bias: Option<&[f32]>,
    ) -> Result<HostQkv, Error> {
        let (mut q, mut k, mut v) = match self {
            Qkv::Separate { q, k, v } => (
                to_host(&q.forward(h)?)?,
                to_host(&k.forward(h)?)?,
                to_host(&v.forward(h)?)?,
            ),
            Qkv::Fused(w) => {
                let all = to_host(&w.forward(h)?)?;
                let rows = all.len() / (qd + 2 * kvd);
                let (mut q, mut k, mut v) = (
                    Vec::with_capacity(rows * qd),
                    Vec::with_capacity(rows * kvd),
                    Vec::with_capacity(rows * kvd),
                );
                for row in all.chunks_exact(qd + 2 * kvd) {
                    q.extend_from_slice(&row[..qd]);
                    k.extend_from_slice(&row[qd..qd + kvd]);
                    v.extend_from_slice(&row[qd + kvd..]);
                }
                (q, k, v)
            }
        };
        if let Some(b) = bias {
            let (bq, rest) = b.split_at(qd);
            let (bk, bv) = rest.split_at(kvd);
            for (x, b) in [(&mut q, bq), (&mut k, bk), (&mut v, bv)] {
                for row in x.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                }
            }
        }
        Ok((q, k, v))
    }
}

/// The MLP's gate and up projections: two matrices, or Phi-3's one fused `[gate; up]`.
pub(crate) enum GateUp {
    Separate { gate: QMatMul, up: QMatMul },
    Fused(QMatMul),
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
}

pub(crate) struct Layer {
    pub attn_norm: Tensor,
    pub qkv: Qkv,
    /// Qwen2 (and llama files that carry them): `[q; k; v]` biases, on the host.
    pub qkv_bias: Option<Vec<f32>>,
    pub wo: QMatMul,
    /// Gemma 3, Qwen3: RMSNorm over each head of Q and K (host weights, `head_dim` long).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub gate_up: GateUp,
    pub down: QMatMul,
    pub post_ffn_norm: Option<Tensor>,
    pub rope_theta: f32,
    pub window: Option<usize>,
}

/// A loaded transformer on candle.
pub(crate) struct CandleModel {
    pub hp: Hparams,
    pub device: Device,
    pub embeddings: Embeddings,
    /// Gemma multiplies embeddings by sqrt(hidden).
    pub embed_scale: Option<f64>,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    pub output: QMatMul,
    pub rope: RopeStyle,
    pub rope_scaling: RopeScaling,
    pub activation: Activation,
    pub attn_scale: f32,
    /// What the attention rounds to f16 (see [`KvPrecision`]).
    pub kv: KvPrecision,
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor, Error> {
    Ok(candle_nn::ops::rms_norm(x, w, eps)?)
}

fn to_host(t: &Tensor) -> Result<Vec<f32>, Error> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

impl Backend for CandleModel {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn forward(&mut self, steps: &mut [Step<'_>], logits: &mut Vec<f32>) -> Result<(), Error> {
        let hp = &self.hp;
        let (hd, qd, kvd, eps) = (
            hp.head_dim,
            hp.n_head * hp.head_dim,
            hp.kv_dim(),
            hp.rms_eps,
        );
        let mut ids = Vec::new();
        let mut rows = Vec::new();
        let mut last_rows = Vec::with_capacity(steps.len());
        for (si, st) in steps.iter().enumerate() {
            for (i, &t) in st.tokens.iter().enumerate() {
                ids.push(t);
                rows.push(RowRef {
                    step: si,
                    pos: st.seq.len + i,
                });
            }
            last_rows.push((rows.len() - 1) as u32);
        }
        let n_rows = ids.len();
        let mut x = self.embeddings.lookup(&ids, &self.device)?;
        if let Some(s) = self.embed_scale {
            x = (x * s)?;
        }
        let mut cs = Vec::with_capacity(hd / 2);
        for (il, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, eps)?;
            let (mut q, mut k, v) = layer.qkv.project(&h, qd, kvd, layer.qkv_bias.as_deref())?;
            if let Some(w) = &layer.q_norm {
                attn::rms_norm_chunks(&mut q, w, eps);
            }
            if let Some(w) = &layer.k_norm {
                attn::rms_norm_chunks(&mut k, w, eps);
            }
            // An f16 cache keeps K/V at f16 precision, as llama.cpp's default cache does.
            let f16_kv = self.kv.rounds_to_f16();
            let mut v = v;
            if f16_kv {
                attn::round_f16_slice(&mut v);
            }
            for (r, row) in rows.iter().enumerate() {
                attn::rope_row(
                    &mut q[r * qd..(r + 1) * qd],
                    hd,
                    row.pos,
                    layer.rope_theta,
                    self.rope,
                    &self.rope_scaling,
                    &mut cs,
                );
                attn::rope_row(
                    &mut k[r * kvd..(r + 1) * kvd],
                    hd,
                    row.pos,
                    layer.rope_theta,
                    self.rope,
                    &self.rope_scaling,
                    &mut cs,
                );
                if f16_kv {
                    // Without flash attention llama.cpp converts Q to f16 for the Q·K products.
                    attn::round_f16_slice(&mut q[r * qd..(r + 1) * qd]);
                    attn::round_f16_slice(&mut k[r * kvd..(r + 1) * kvd]);
                }
                let seq = &mut *steps[row.step].seq;
                let at = row.pos * kvd..(row.pos + 1) * kvd;
                seq.k[il][at.clone()].copy_from_slice(&k[r * kvd..(r + 1) * kvd]);
                seq.v[il][at].copy_from_slice(&v[r * kvd..(r + 1) * kvd]);
            }
            let caches: Vec<(&[f32], &[f32])> =
                steps.iter().map(|s| (&s.seq.k[il], &s.seq.v[il])).collect();
            let mut out = vec![0.0f32; n_rows * qd];
            let shape = AttnShape {
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim: hd,
                scale: self.attn_scale,
                f16_kv,
                window: layer.window,
            };
            attn::attention(&q, &rows, &caches, shape, &mut out);
            let attn_out = layer
                .wo
                .forward(&Tensor::from_vec(out, (n_rows, qd), &self.device)?)?;
            let attn_out = match &layer.post_attn_norm {
                Some(w) => rms_norm(&attn_out, w, eps)?,
                None => attn_out,
            };
            x = (x + attn_out)?;
            let h = rms_norm(&x, &layer.ffn_norm, eps)?;
            let (gate, up) = layer.gate_up.forward(&h)?;
            let gate = match self.activation {
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
        let idx = Tensor::from_vec(last_rows, steps.len(), &self.device)?;
        let last = rms_norm(&x.index_select(&idx, 0)?, &self.norm, eps)?;
        let out = self.output.forward(&last)?;
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
                q: QMatMul::Tensor(take(&p("self_attn.q_proj"))?),
                k: QMatMul::Tensor(take(&p("self_attn.k_proj"))?),
                v: QMatMul::Tensor(take(&p("self_attn.v_proj"))?),
            },
            qkv_bias: None,
            wo: QMatMul::Tensor(take(&p("self_attn.o_proj"))?),
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: take(&p("post_attention_layernorm"))?,
            gate_up: GateUp::Separate {
                gate: QMatMul::Tensor(take(&p("mlp.gate_proj"))?),
                up: QMatMul::Tensor(take(&p("mlp.up_proj"))?),
            },
            down: QMatMul::Tensor(take(&p("mlp.down_proj"))?),
            post_ffn_norm: None,
            rope_theta: hp.rope_theta,
            window: None,
        });
    }
    Ok(CandleModel {
        norm: take("model.norm.weight")?,
        attn_scale: 1.0 / (hp.head_dim as f32).sqrt(),
        kv: KvPrecision::default(),
        hp,
        device: device.clone(),
        embeddings: Embeddings::Dense(embed.to_device(&Device::Cpu)?),
        embed_scale: None,
        layers,
        output: QMatMul::Tensor(output),
        rope: RopeStyle::Neox,
        rope_scaling: RopeScaling::NONE,
        activation: Activation::Silu,
    })
}
