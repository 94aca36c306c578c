//! RoPE's angles as ggml computes them, shared by both backends, and (in tests) a plain host
//! reference of causal, optionally sliding-window attention over one cache per sequence, which
//! the candle backend's device attention is checked against.

#[cfg(test)]
use rayon::prelude::*;

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeStyle {
    /// Pairs (2i, 2i+1): GGUF llama (its converter permutes Q/K for this).
    Interleaved,
    /// Pairs (i, i + d/2): Hugging Face llama checkpoints, Gemma.
    Neox,
}

/// What turns a position into angles beyond the base frequency, as ggml applies it: one divisor
/// per rotated pair (Llama 3's `rope_freqs`, Phi-3's LongRoPE factors), linear scaling of the
/// angle, and a magnitude factor on cos and sin (LongRoPE's attention factor).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RopeScaling {
    pub factors: Option<Vec<f32>>,
    pub freq_scale: f32,
    pub mscale: f32,
}

impl RopeScaling {
    pub const NONE: RopeScaling = RopeScaling {
        factors: None,
        freq_scale: 1.0,
        mscale: 1.0,
    };
}

/// Appends the `head_dim / 2` (cos, sin) pairs of position `pos`, computing the angles as ggml
/// does: `theta_i = pos * base^(-2i/d)` by repeated f32 multiplication, divided by pair `i`'s
/// factor, then scaled.
pub(crate) fn rope_angles(
    head_dim: usize,
    pos: usize,
    base: f32,
    scaling: &RopeScaling,
    cs: &mut Vec<(f32, f32)>,
) {
    let scale = base.powf(-2.0 / head_dim as f32);
    let mut theta = pos as f32;
    for i in 0..head_dim / 2 {
        let mut t = match &scaling.factors {
            Some(f) => theta / f[i],
            None => theta,
        };
        if scaling.freq_scale != 1.0 {
            t *= scaling.freq_scale;
        }
        if scaling.mscale == 1.0 {
            cs.push((t.cos(), t.sin()));
        } else {
            cs.push((t.cos() * scaling.mscale, t.sin() * scaling.mscale));
        }
        theta *= scale;
    }
}

#[cfg(test)]
/// Rotates `x` (`n_heads` heads of `head_dim` each, one position) in place (angles as
/// [`rope_angles`]).
pub(crate) fn rope_row(
    x: &mut [f32],
    head_dim: usize,
    pos: usize,
    base: f32,
    style: RopeStyle,
    scaling: &RopeScaling,
    cs: &mut Vec<(f32, f32)>,
) {
    let half = head_dim / 2;
    cs.clear();
    rope_angles(head_dim, pos, base, scaling, cs);
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

#[cfg(test)]
/// Rounds to the nearest f16 value, as llama.cpp's default f16 KV cache and its f16 attention
/// products do; matching that rounding keeps greedy tokens equal to llama.cpp's.
#[inline]
pub(crate) fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[cfg(test)]
/// One query row of a batch: which sequence cache it reads and at which absolute position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowRef {
    /// Index into the batch's steps.
    pub step: usize,
    /// Absolute position of the row in its sequence.
    pub pos: usize,
}

#[cfg(test)]
/// Attention shape for one layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Positions attended including the current one; `None` = the whole prefix.
    pub window: Option<usize>,
    /// Round the softmax weights to f16 before the sum over V (llama.cpp's f16 KV cache).
    pub f16_kv: bool,
}

#[cfg(test)]
/// Causal attention for every row: `q` is `[rows, n_head*head_dim]`, `caches[step]` is the
/// step's (K, V) layer cache `[capacity, n_head_kv*head_dim]` already holding this row's own
/// K/V. Writes `out` `[rows, n_head*head_dim]`. With `f16_kv`, as llama.cpp with an f16 cache
/// and no flash attention, the softmax weights are rounded to f16 for the sum over V (the caller
/// rounds Q, K and V).
pub(crate) fn attention(
    q: &[f32],
    rows: &[RowRef],
    caches: &[(&[f32], &[f32])],
    shape: AttnShape,
    out: &mut [f32],
) {
    let AttnShape {
        n_head,
        n_head_kv,
        head_dim,
        scale,
        window,
        f16_kv,
    } = shape;
    let q_dim = n_head * head_dim;
    let kv_dim = n_head_kv * head_dim;
    let group = n_head / n_head_kv;
    out.par_chunks_mut(q_dim)
        .zip(q.par_chunks(q_dim))
        .zip(rows.par_iter())
        .for_each_init(
            Vec::new,
            |scores: &mut Vec<f32>, ((out_row, q_row), row)| {
                let (kc, vc) = caches[row.step];
                let start = match window {
                    Some(w) => (row.pos + 1).saturating_sub(w),
                    None => 0,
                };
                let n = row.pos + 1 - start;
                for h in 0..n_head {
                    let kvh = h / group;
                    let qh = &q_row[h * head_dim..(h + 1) * head_dim];
                    scores.clear();
                    let mut max = f32::NEG_INFINITY;
                    for j in start..=row.pos {
                        let kr =
                            &kc[j * kv_dim + kvh * head_dim..j * kv_dim + (kvh + 1) * head_dim];
                        let s = qh.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale;
                        max = max.max(s);
                        scores.push(s);
                    }
                    let mut sum = 0.0f32;
                    for s in scores.iter_mut() {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    let inv = 1.0 / sum;
                    let oh = &mut out_row[h * head_dim..(h + 1) * head_dim];
                    oh.fill(0.0);
                    for (idx, &p) in scores.iter().enumerate().take(n) {
                        let j = start + idx;
                        let vr =
                            &vc[j * kv_dim + kvh * head_dim..j * kv_dim + (kvh + 1) * head_dim];
                        let w = if f16_kv { round_f16(p * inv) } else { p * inv };
                        for (o, &v) in oh.iter_mut().zip(vr) {
                            *o += w * v;
                        }
                    }
                }
            },
        );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm_elsewhere() {
        let mut cs = Vec::new();
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let mut x = orig.clone();
            rope_row(&mut x, 8, 0, 10000.0, style, &RopeScaling::NONE, &mut cs);
            assert_eq!(x, orig);
            rope_row(&mut x, 8, 17, 10000.0, style, &RopeScaling::NONE, &mut cs);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn attention_of_a_single_position_returns_its_value() {
        let shape = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 2,
            scale: 1.0,
            window: None,
            f16_kv: true,
        };
        let k = [1.0, 0.0];
        let v = [3.0, -2.0];
        let q = [0.3, 0.1, -5.0, 2.0];
        let mut out = [0.0; 4];
        attention(
            &q,
            &[RowRef { step: 0, pos: 0 }],
            &[(&k, &v)],
            shape,
            &mut out,
        );
        assert_eq!(out, [3.0, -2.0, 3.0, -2.0]);
    }

    #[test]
    fn sliding_window_ignores_positions_before_the_window() {
        // Position 2 with window 1 sees only itself.
        let shape = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 1,
            scale: 1.0,
            window: Some(1),
            f16_kv: true,
        };
        let k = [1.0, 1.0, 1.0];
        let v = [10.0, 20.0, 30.0];
        let mut out = [0.0];
        attention(
            &[1.0],
            &[RowRef { step: 0, pos: 2 }],
            &[(&k, &v)],
            shape,
            &mut out,
        );
        assert_eq!(out, [30.0]);
        let shape = AttnShape {
            window: None,
            ..shape
        };
        attention(
            &[1.0],
            &[RowRef { step: 0, pos: 2 }],
            &[(&k, &v)],
            shape,
            &mut out,
        );
        // Three equal weights of 1/3, each rounded to f16 (0.33325) as llama.cpp's f16 path does.
        let w = half::f16::from_f32(1.0 / 3.0).to_f32();
        assert!((out[0] - w * 60.0).abs() < 1e-5, "{}", out[0]);
        // At f32 precision the weights stay exactly 1/3 (to f32).
        let shape = AttnShape {
            f16_kv: false,
            ..shape
        };
        attention(
            &[1.0],
            &[RowRef { step: 0, pos: 2 }],
            &[(&k, &v)],
            shape,
            &mut out,
        );
        assert!((out[0] - 20.0).abs() < 1e-5, "{}", out[0]);
    }
}
