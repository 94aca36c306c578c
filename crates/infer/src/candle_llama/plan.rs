//! A step's plan: each row's position, pool row and RoPE angles, and the steps grouped by
//! length for attention. Built on the host ([`HostPlan`]), then sent to the device as tensors
//! ([`Plan`]). A captured decode step (`graphs.rs`) keeps the plan it was captured with and has
//! each later step's host plan written into those tensors ([`Plan::refill`]), so the graph
//! reads the new step's values at the addresses it was captured at.

use candle_core::{Device, Tensor};

use super::CandleModel;
use crate::decode_attn::DecodeAttention;
use crate::device_kv::{self, BLOCK};
use crate::model::Step;
use crate::sequence::Cache;
use crate::Error;

/// One attention call of a step: `b` sequences of `qr` query rows each, rows
/// `first..first + b * qr` of the step (in its row order).
pub(super) struct Group<T> {
    pub(super) first: usize,
    pub(super) b: usize,
    pub(super) qr: usize,
    /// Key positions per sequence after padding (`blocks per sequence * BLOCK`).
    pub(super) t: usize,
    pub(super) keys: Keys<T>,
}

/// How a group reaches its keys.
pub(super) enum Keys<T> {
    /// Gathered from the pool, padded and masked.
    Gathered {
        /// `[b * blocks per sequence]` pool blocks (u32).
        blocks: T,
        mask: Mask<T>,
    },
    /// One-token rows on a GPU: the decode attention kernel reads the pool in place, through
    /// the table of [`crate::decode_attn::DecodeAttention::meta`].
    Direct { meta: T },
}

/// Which positions each query row of a gathered group sees.
pub(super) enum Mask<T> {
    /// `[b, 1, 1, qr, t]` f32: 0 where a row may attend, -inf elsewhere; then the same for the
    /// sliding window (when a layer has one). Added to the scores on the general path.
    Added { mask: T, window: Option<T> },
    /// `[b * qr]` u32: how many positions each query row sees (its position + 1), for the
    /// masked softmax kernel (`masked_softmax.rs`) on a GPU.
    Visible(T),
}

/// What a step needs besides the weights: host values (`T` = [`Host`]) or the device tensors
/// made of them (`T` = [`Tensor`]).
pub(super) struct Steps<T> {
    /// Step and absolute position of each row, one-token steps first.
    pub(super) rows: Vec<(usize, usize)>,
    pub(super) ids: Vec<u32>,
    /// `[rows]` u32: each row's pool row.
    pub(super) write_at: T,
    /// The index (in row order) of each output row: each step's last `outputs[i]` rows, the
    /// steps in order.
    pub(super) last: T,
    pub(super) groups: Vec<Group<T>>,
    /// `(RoPE base as f32 bits, cos, sin)`, `[rows, 1, head_dim / 2]` f32 each (the forward
    /// casts them to the activation dtype once).
    pub(super) rope: Vec<(u32, T, T)>,
}

pub(super) type HostPlan = Steps<Host>;
pub(super) type Plan = Steps<Tensor>;

/// A tensor's values on the host and its shape.
pub(super) struct Host {
    values: Values,
    shape: Vec<usize>,
}

enum Values {
    U32(Vec<u32>),
    F32(Vec<f32>),
}

impl Host {
    fn u32(values: Vec<u32>, shape: &[usize]) -> Self {
        Host {
            values: Values::U32(values),
            shape: shape.to_vec(),
        }
    }

    fn f32(values: Vec<f32>, shape: &[usize]) -> Self {
        Host {
            values: Values::F32(values),
            shape: shape.to_vec(),
        }
    }

    fn upload(&self, dev: &Device) -> Result<Tensor, Error> {
        let shape = self.shape.as_slice();
        Ok(match &self.values {
            Values::U32(v) => Tensor::from_slice(v, shape, dev)?,
            Values::F32(v) => Tensor::from_slice(v, shape, dev)?,
        })
    }

    /// Writes the values into `t`, made by [`Host::upload`] of a host tensor of the same shape
    /// and dtype.
    #[cfg(feature = "cuda")]
    fn refill(&self, t: &Tensor) -> Result<(), Error> {
        if t.dims() != self.shape.as_slice() {
            return Err(fault(format!(
                "a step's plan has the shape {:?} where its captured one has {:?}",
                self.shape,
                t.dims()
            )));
        }
        match &self.values {
            Values::U32(v) => hearth_gpu::kernels::write_host(t, v)?,
            Values::F32(v) => hearth_gpu::kernels::write_host(t, v)?,
        }
        Ok(())
    }
}

impl<T> Steps<T> {
    /// Every tensor of the plan, in [`Steps::map`]'s order.
    #[cfg(feature = "cuda")]
    fn each(&self) -> Vec<&T> {
        let mut all = Vec::new();
        let _ = self.map(|t| {
            all.push(t);
            Ok(())
        });
        all
    }

    /// The same plan with every tensor through `f`, each once, in one fixed order.
    fn map<'a, U>(
        &'a self,
        mut f: impl FnMut(&'a T) -> Result<U, Error>,
    ) -> Result<Steps<U>, Error> {
        let groups = self
            .groups
            .iter()
            .map(|g| {
                let keys = match &g.keys {
                    Keys::Direct { meta } => Keys::Direct { meta: f(meta)? },
                    Keys::Gathered { blocks, mask } => Keys::Gathered {
                        blocks: f(blocks)?,
                        mask: match mask {
                            Mask::Added { mask, window } => Mask::Added {
                                mask: f(mask)?,
                                window: window.as_ref().map(&mut f).transpose()?,
                            },
                            Mask::Visible(v) => Mask::Visible(f(v)?),
                        },
                    },
                };
                Ok(Group {
                    first: g.first,
                    b: g.b,
                    qr: g.qr,
                    t: g.t,
                    keys,
                })
            })
            .collect::<Result<_, Error>>()?;
        let rope = self
            .rope
            .iter()
            .map(|(base, c, s)| Ok((*base, f(c)?, f(s)?)))
            .collect::<Result<_, Error>>()?;
        Ok(Steps {
            rows: self.rows.clone(),
            ids: self.ids.clone(),
            write_at: f(&self.write_at)?,
            last: f(&self.last)?,
            groups,
            rope,
        })
    }

    #[cfg(feature = "cuda")]
    /// The groups' shapes, which a captured step's plan keeps.
    fn layout(&self) -> Vec<(usize, usize, usize, usize, bool)> {
        self.groups
            .iter()
            .map(|g| {
                (
                    g.first,
                    g.b,
                    g.qr,
                    g.t,
                    matches!(g.keys, Keys::Direct { .. }),
                )
            })
            .collect()
    }
}

impl HostPlan {
    pub(super) fn upload(&self, dev: &Device) -> Result<Plan, Error> {
        self.map(|h| h.upload(dev))
    }

    #[cfg(feature = "cuda")]
    /// Whether every step is one token attending through the decode attention kernel (what a
    /// captured step runs).
    pub(super) fn decode_only(&self) -> bool {
        matches!(self.groups.as_slice(), [g] if g.qr == 1 && matches!(g.keys, Keys::Direct { .. }))
    }

    #[cfg(feature = "cuda")]
    /// The blocks per row that the decode group's table holds.
    pub(super) fn decode_blocks(&self) -> usize {
        self.groups.first().map_or(0, |g| g.t / BLOCK)
    }
}

impl Plan {
    /// Writes `host`'s values into this plan's tensors in place (see the module's
    /// documentation); `host` must have the same groups and shapes.
    #[cfg(feature = "cuda")]
    pub(super) fn refill(&mut self, host: HostPlan) -> Result<(), Error> {
        let (mine, theirs) = (self.each(), host.each());
        if self.layout() != host.layout() || mine.len() != theirs.len() {
            return Err(fault("a step's plan differs from its captured one"));
        }
        for (t, h) in mine.into_iter().zip(theirs) {
            h.refill(t)?;
        }
        self.rows = host.rows;
        self.ids = host.ids;
        Ok(())
    }
}

/// The blocks a one-token group's table holds for a longest row of `nb` blocks: rounded up
/// (a power of two up to 16, then a multiple of 16), so that a captured step serves every
/// context length up to the bucket's end; the kernel reads each row's own length.
fn decode_bucket(nb: usize) -> usize {
    if nb <= 16 {
        nb.next_power_of_two()
    } else {
        nb.next_multiple_of(16)
    }
}

impl CandleModel {
    /// The plan of `steps`, whose last `outputs[i]` rows give logits (one where `outputs` has
    /// no entry).
    pub(super) fn plan(&self, steps: &[Step<'_>], outputs: &[usize]) -> Result<HostPlan, Error> {
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
                let direct = self.direct_decode && qr == 1;
                let nb = members
                    .iter()
                    .map(|&si| (steps[si].seq.len + steps[si].tokens.len()).div_ceil(BLOCK))
                    .max()
                    .unwrap_or(1);
                let nb = if direct { decode_bucket(nb) } else { nb };
                let t = nb * BLOCK;
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
                    // The kernel's split tickets, at 0 (its merging blocks leave them so).
                    let len = DecodeAttention::meta_len(b, nb, self.hp.n_head_kv);
                    blocks.resize(len, 0);
                    Keys::Direct {
                        meta: Host::u32(blocks, &[len]),
                    }
                } else {
                    let shape = [b, 1, 1, qr, t];
                    let mask = if self.fused {
                        Mask::Visible(Host::u32(visible, &[b * qr]))
                    } else {
                        Mask::Added {
                            mask: Host::f32(mask, &shape),
                            window: mask_w.map(|m| Host::f32(m, &shape)),
                        }
                    };
                    Keys::Gathered {
                        blocks: Host::u32(blocks, &[b * nb]),
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
        let mut rope: Vec<(u32, Host, Host)> = Vec::new();
        let half = self.hp.head_dim / 2;
        let mut cs = Vec::with_capacity(half);
        for l in &self.m.layers {
            let base = l.rope_theta.to_bits();
            if rope.iter().any(|r| r.0 == base) {
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
            let shape = [rows.len(), 1, half];
            rope.push((base, Host::f32(cos, &shape), Host::f32(sin, &shape)));
        }
        let n = rows.len();
        let last: Vec<u32> = last
            .iter()
            .enumerate()
            .flat_map(|(si, &end)| {
                let wanted = crate::model::output_rows(outputs, si) as u32;
                end + 1 - wanted.min(end + 1)..=end
            })
            .collect();
        let outs = last.len();
        Ok(Steps {
            write_at: Host::u32(write_at, &[n]),
            last: Host::u32(last, &[outs]),
            rows,
            ids,
            groups,
            rope,
        })
    }
}

/// An error of the backend's own bookkeeping (no candle op failed).
pub(super) fn fault(what: impl Into<String>) -> Error {
    Error::Candle(candle_core::Error::Msg(what.into()))
}

#[cfg(test)]
mod tests {
    use super::decode_bucket;

    #[test]
    fn a_decode_table_is_rounded_up_to_its_bucket_and_never_down() {
        let got: Vec<usize> = [1, 2, 3, 5, 9, 16, 17, 32, 33, 250]
            .into_iter()
            .map(decode_bucket)
            .collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 16, 32, 32, 48, 256]);
        // Every length within a bucket shares its captured step; none is cut short.
        for nb in 1..600 {
            let b = decode_bucket(nb);
            assert!(b >= nb && decode_bucket(b) == b, "{nb} -> {b}");
        }
    }
}
