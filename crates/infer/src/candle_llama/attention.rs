//! The candle backend's step plan and attention: each row's position, pool row and RoPE angles,
//! the steps grouped by length, and causal (optionally sliding-window) attention of each group
//! over the blocks its sequences hold in the pool (`device_kv.rs`), keys padded to the longest
//! and masked.

use std::collections::HashMap;

use candle_core::{DType, Tensor, D};

use super::CandleModel;
use crate::attn::RopeStyle;
use crate::config::KvPrecision;
use crate::decode_attn::DecodeAttention;
use crate::device_kv::{self, BLOCK};
use crate::model::Step;
use crate::sequence::Cache;
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

/// One attention call of a step: `b` sequences of `qr` query rows each, rows
/// `first..first + b * qr` of the step (in its row order).
pub(super) struct Group {
    first: usize,
    b: usize,
    qr: usize,
    /// Key positions per sequence after padding (`blocks per sequence * BLOCK`).
    t: usize,
    keys: Keys,
}

/// How a group reaches its keys.
enum Keys {
    /// Gathered from the pool, padded and masked.
    Gathered {
        /// `[b * blocks per sequence]` pool blocks (u32).
        blocks: Tensor,
        mask: Mask,
    },
    /// One-token rows on a GPU: the decode attention kernel reads the pool in place, through
    /// the table of [`DecodeAttention::meta`].
    Direct { meta: Tensor },
}

/// Which positions each query row of a gathered group sees.
enum Mask {
    /// `[b, 1, 1, qr, t]` f32: 0 where a row may attend, -inf elsewhere; then the same for the
    /// sliding window (when a layer has one). Added to the scores on the general path.
    Added {
        mask: Tensor,
        window: Option<Tensor>,
    },
    /// `[b * qr]` u32: how many positions each query row sees (its position + 1), for the
    /// masked softmax kernel (`masked_softmax.rs`) on a GPU.
    Visible(Tensor),
}

/// What a step needs on the device besides the weights, built on the host once per step.
pub(super) struct Plan {
    /// Step and absolute position of each row, one-token steps first.
    pub(super) rows: Vec<(usize, usize)>,
    pub(super) ids: Vec<u32>,
    /// `[rows]` u32: each row's pool row.
    pub(super) write_at: Tensor,
    /// Per step, the index (in row order) of its last row.
    pub(super) last: Tensor,
    pub(super) groups: Vec<Group>,
    /// `(cos, sin)` per RoPE base, `[rows, 1, head_dim / 2]` each, the activation dtype.
    pub(super) rope: HashMap<u32, (Tensor, Tensor)>,
}

impl CandleModel {
    pub(super) fn plan(&self, steps: &[Step<'_>]) -> Result<Plan, Error> {
        let dev = &self.device;
        let blocks_of = |si: usize| -> Result<&[u32], Error> {
            match &steps[si].seq.cache {
                Cache::Device(d) => Ok(d.blocks()),
                Cache::Host(_) => Err(Error::ForeignSequence { step: si }),
            }
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
                let direct = self.direct_decode && qr == 1;
                let mut blocks = Vec::with_capacity(members.len() * (nb + 1));
                let mut lens = Vec::with_capacity(members.len());
                // The masked softmax kernel needs only each query's length; the general path a
                // mask of every (query, position).
                let masked = if direct || self.fused {
                    0
                } else {
                    members.len() * qr * t
                };
                let mut visible = Vec::new();
                let mut mask = vec![f32::NEG_INFINITY; masked];
                let mut mask_w = window.map(|_| vec![f32::NEG_INFINITY; masked]);
                for (bi, &si) in members.iter().enumerate() {
                    let own = blocks_of(si)?;
                    let len = steps[si].seq.len + steps[si].tokens.len();
                    let used = len.div_ceil(BLOCK);
                    blocks.extend((0..nb).map(|i| own[i.min(used - 1)]));
                    lens.push(len as u32);
                    for (i, &tok) in steps[si].tokens.iter().enumerate() {
                        let pos = steps[si].seq.len + i;
                        rows.push((si, pos));
                        ids.push(tok);
                        if direct {
                            continue;
                        }
                        if self.fused {
                            visible.push(pos as u32 + 1);
                            continue;
                        }
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
                let keys = if direct {
                    blocks.extend(lens);
                    Keys::Direct {
                        meta: Tensor::from_vec(blocks, b * (nb + 1), dev)?,
                    }
                } else {
                    let shape = (b, 1, 1, qr, t);
                    let mask = if self.fused {
                        Mask::Visible(Tensor::from_vec(visible, b * qr, dev)?)
                    } else {
                        Mask::Added {
                            mask: Tensor::from_vec(mask, shape, dev)?,
                            window: mask_w
                                .map(|m| Tensor::from_vec(m, shape, dev))
                                .transpose()?,
                        }
                    };
                    Keys::Gathered {
                        blocks: Tensor::from_vec(blocks, b * nb, dev)?,
                        mask,
                    }
                };
                groups.push(Group {
                    first,
                    b,
                    qr,
                    t,
                    keys,
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
