//! The candle backend's attention: causal (optionally sliding-window) attention of each group of
//! a step's plan (`plan.rs`) over the blocks its sequences hold in the pool (`device_kv.rs`),
//! keys padded to the longest and masked; and RoPE.

use candle_core::{DType, Tensor, D};

use super::plan::{Keys, Mask, Plan};
use super::CandleModel;
use crate::attn::RopeStyle;
use crate::config::KvPrecision;
use crate::decode_attn::DecodeAttention;
use crate::device_kv::{self, BLOCK};
use crate::Error;

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

impl CandleModel {
    /// Causal attention of `q` (`[rows, n_head, head_dim]`) over layer `il`'s cache, one call
    /// per group; returns `[rows, n_head * head_dim]`.
    pub(super) fn attention(
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
            let (blocks, mask) = match &g.keys {
                Keys::Direct { meta } => {
                    let (k, v) = pool.layer(il);
                    let op = DecodeAttention {
                        meta: meta.clone(),
                        rows: b,
                        nb: t / BLOCK,
                        n_head: hp.n_head,
                        n_head_kv: nkv,
                        head_dim: hd,
                        scale: self.attn_scale,
                        window: self.m.layers[il].window.unwrap_or(0),
                        tiled: self.first_kernels,
                        min_chunk: self.decode_chunk,
                    };
                    outs.push(op.run(&q.narrow(0, g.first, b)?, k, v)?);
                    continue;
                }
                Keys::Gathered { blocks, mask } => (blocks, mask),
            };
            // [b, n_kv, group * qr, hd]
            let qg = q
                .narrow(0, g.first, b * qr)?
                .reshape((b, qr, nkv, group, hd))?
                .permute((0, 2, 3, 1, 4))?
                .reshape((b, nkv, group * qr, hd))?;
            let (k, v) = if self.fused {
                // On a GPU with the cache in the activations' dtype: one kernel each.
                let (k, v) = pool.layer(il);
                let gather = |x| crate::kv_write::gather_heads(x, blocks, b, nkv, BLOCK);
                (gather(k)?, gather(v)?)
            } else {
                let (k, v) = pool.gather(il, blocks)?;
                let heads = |x: Tensor| -> Result<Tensor, Error> {
                    Ok(x.reshape((b, t, nkv, hd))?
                        .transpose(1, 2)?
                        .to_dtype(self.act)?
                        .contiguous()?)
                };
                (heads(k)?, heads(v)?)
            };
            let scores = qg.matmul(&k.t()?)?;
            let window = self.m.layers[il].window;
            let p = match mask {
                Mask::Visible(visible) => crate::masked_softmax::MaskedSoftmax {
                    qr,
                    window: window.unwrap_or(0),
                    scale: self.attn_scale,
                }
                .run(&scores, visible)?,
                Mask::Added { mask, window: w } => {
                    let scores = (scores.to_dtype(DType::F32)? * self.attn_scale as f64)?
                        .reshape((b, nkv, group, qr, t))?;
                    let mask = match (window, w) {
                        (Some(_), Some(m)) => m,
                        _ => mask,
                    };
                    softmax(&scores.broadcast_add(mask)?)?
                }
            };
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

    pub(super) fn rope(&self, x: &Tensor, cs: &(Tensor, Tensor)) -> Result<Tensor, Error> {
        let (n, heads, hd) = x.dims3()?;
        let x = x.reshape((n, heads, 1, hd))?;
        let y = match self.m.rope {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cs.0, &cs.1)?,
            RopeStyle::Neox => candle_nn::rotary_emb::rope(&x, &cs.0, &cs.1)?,
        };
        Ok(y.reshape((n, heads, hd))?)
    }
}
