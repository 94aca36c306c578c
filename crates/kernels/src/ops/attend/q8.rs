//! Attention over a q8_0 KV cache (`kv_precision = "q8_0"`), computed as llama.cpp's CPU flash
//! attention computes it over its q8_0 cache (`-ctk q8_0 -ctv q8_0 -fa`):
//!
//! - each query head is quantized to q8_0 blocks, exactly as the cache's keys were
//!   (`quantize::q8_0_block`), and a key's score is the sum over its blocks of the integer dot
//!   of the two blocks' quants times the product of their f16 scales (llama.cpp's
//!   `vec_dot_q8_0_q8_0`, in its reference order), scaled;
//! - the softmax is the one of [`super::attend`] (maximum subtracted, weights kept in f32, as
//!   llama.cpp's flash attention keeps them);
//! - each value row is widened (`q * d`, in f32) and summed into every head of the group with
//!   one fused multiply-add a column, keys in order.
//!
//! Only the order of the softmax differs from llama.cpp's (it normalises once at the end of an
//! online pass; this normalises the weights first): rounding, not arithmetic.

use super::{softmax_in_place, RowRun, SCORES};
use crate::ops::quantize::q8_0_block;

/// Values of one q8_0 block.
const BLOCK: usize = 32;

/// The largest head this path takes (Gemma 3's is 256).
pub const MAX_Q8_HEAD: usize = 512;

/// One KV head's slice of a q8_0 cache: value `i` is `q[i] * d[i / 32]`. Start it at the head's
/// offset with [`Q8Values::from`], a multiple of 32.
#[derive(Clone, Copy, Debug)]
pub struct Q8Values<'a> {
    pub q: &'a [i8],
    pub d: &'a [half::f16],
}

impl<'a> Q8Values<'a> {
    /// The values from `at` on (`at` a whole number of blocks).
    pub fn from(self, at: usize) -> Q8Values<'a> {
        assert_eq!(at % BLOCK, 0, "a q8_0 slice starts on a block");
        Q8Values {
            q: &self.q[at..],
            d: &self.d[at / BLOCK..],
        }
    }
}

/// [`super::attend`] over a q8_0 cache: for the `q.len() / hd` query heads side by side in `q`
/// (and in `out`) that share one KV head, `out = softmax(scale * q . K[j]) V[j]` over
/// `j in start..end`, key `j` being values `j * stride..` of `k` and value `j` likewise of `v`.
/// `hd` and `stride` are whole numbers of blocks, `hd` at most [`MAX_Q8_HEAD`]. A head's result
/// does not depend on the heads beside it.
#[allow(clippy::too_many_arguments)]
pub fn attend_q8(
    q: &[f32],
    hd: usize,
    k: Q8Values<'_>,
    v: Q8Values<'_>,
    stride: usize,
    start: usize,
    end: usize,
    scale: f32,
    out: &mut [f32],
) {
    assert!(
        hd > 0 && hd.is_multiple_of(BLOCK) && stride.is_multiple_of(BLOCK) && hd <= MAX_Q8_HEAD,
        "a q8_0 cache needs heads of whole blocks (head {hd}, stride {stride})"
    );
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        let need = end.saturating_sub(start) * (q.len() / hd);
        if scores.len() < need {
            scores.resize(need, 0.0);
        }
        attend_q8_mv(
            q,
            hd,
            k.q,
            k.d,
            v.q,
            v.d,
            stride,
            start,
            end,
            scale,
            &mut scores,
            out,
        )
    });
}

/// [`attend_q8`] for every row of `run` (its `f16_weights` does not apply: the weights stay
/// f32, as in llama.cpp's flash attention): row `r`'s heads go to
/// `out[r * out_stride..][..heads * hd]`.
pub fn attend_rows_q8(
    run: &RowRun<'_>,
    k: Q8Values<'_>,
    v: Q8Values<'_>,
    stride: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let width = run.heads * run.hd;
    for (r, &(start, end)) in run.ranges.iter().enumerate() {
        let q = &run.q[r * run.q_stride..r * run.q_stride + width];
        let o = &mut out[r * out_stride..r * out_stride + width];
        attend_q8(q, run.hd, k, v, stride, start, end, run.scale, o);
    }
}

multiversion! {
    fn attend_q8_mv(q: &[f32], hd: usize, kq: &[i8], kd: &[half::f16], vq: &[i8], vd: &[half::f16], stride: usize, start: usize, end: usize, scale: f32, scores: &mut [f32], out: &mut [f32]) => attend_q8_body
}

/// The integer dot of two blocks: exact (32 products of at most 127² fit an i32 many times).
#[inline(always)]
fn block_dot(a: &[i8], b: &[i8]) -> i32 {
    let mut s = 0i32;
    for (&x, &y) in a[..BLOCK].iter().zip(&b[..BLOCK]) {
        s += i32::from(i16::from(x) * i16::from(y));
    }
    s
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_q8_body(
    q: &[f32],
    hd: usize,
    kq: &[i8],
    kd: &[half::f16],
    vq: &[i8],
    vd: &[half::f16],
    stride: usize,
    start: usize,
    end: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let heads = q.len() / hd;
    let out = &mut out[..heads * hd];
    out.fill(0.0);
    if start >= end {
        return;
    }
    let n = end - start;
    let blocks = hd / BLOCK;
    let scores = &mut scores[..heads * n];
    for (qh, w) in q.chunks_exact(hd).zip(scores.chunks_exact_mut(n)) {
        // The query head as the cache's keys are kept: quants and f16-rounded scales.
        let mut qq = [0i8; MAX_Q8_HEAD];
        let mut qd = [0f32; MAX_Q8_HEAD / BLOCK];
        for (b, d) in qd[..blocks].iter_mut().enumerate() {
            let at = b * BLOCK;
            let raw = q8_0_block(&qh[at..at + BLOCK], &mut qq[at..at + BLOCK]);
            *d = half::f16::from_f32(raw).to_f32();
        }
        for (s, j) in w.iter_mut().zip(start..) {
            let at = j * stride;
            let (row, ds) = (&kq[at..at + hd], &kd[at / BLOCK..at / BLOCK + blocks]);
            let mut sum = 0f32;
            for b in 0..blocks {
                let isum = block_dot(&qq[b * BLOCK..], &row[b * BLOCK..]);
                sum += isum as f32 * (ds[b].to_f32() * qd[b]);
            }
            *s = sum * scale;
        }
        softmax_in_place(w, false);
    }
    let mut row = [0f32; MAX_Q8_HEAD];
    for (idx, j) in (start..end).enumerate() {
        let at = j * stride;
        let (quants, ds) = (&vq[at..at + hd], &vd[at / BLOCK..at / BLOCK + blocks]);
        for (b, d) in ds.iter().enumerate() {
            let d = d.to_f32();
            let block = b * BLOCK..(b + 1) * BLOCK;
            for (x, &qv) in row[block.clone()].iter_mut().zip(&quants[block]) {
                *x = f32::from(qv) * d;
            }
        }
        for (g, o) in out.chunks_exact_mut(hd).enumerate() {
            let wj = scores[g * n + idx];
            for (a, &x) in o.iter_mut().zip(&row[..hd]) {
                *a = x.mul_add(wj, *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quantize_q8_0;

    /// The cache's values widened, for an f32 attention over exactly what q8_0 kept.
    fn widen(q: &[i8], d: &[half::f16]) -> Vec<f32> {
        q.iter()
            .enumerate()
            .map(|(i, &x)| f32::from(x) * d[i / BLOCK].to_f32())
            .collect()
    }

    fn cache(values: usize, seed: usize) -> (Vec<f32>, Vec<i8>, Vec<half::f16>) {
        let x: Vec<f32> = (0..values)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0)
            .collect();
        let (mut q, mut d) = (vec![0i8; values], vec![half::f16::ZERO; values / BLOCK]);
        quantize_q8_0(&x, &mut q, &mut d);
        (x, q, d)
    }

    /// With a query already on the q8_0 grid the scores are exact, so the result is the f32
    /// attention over the widened cache up to the order of its sums.
    #[test]
    fn a_q8_cache_attends_as_its_widened_values_do_in_f32() {
        for hd in [32, 64, 128, 256] {
            let (heads, keys) = (3, 70);
            let stride = 2 * hd;
            let (_, kq, kd) = cache(keys * stride, 1);
            let (_, vq, vd) = cache(keys * stride, 2);
            let (k32, v32) = (widen(&kq, &kd), widen(&vq, &vd));
            // Query blocks of integers times a power of two: quantized without loss.
            // (each block's largest is 127/64, so its scale is 1/64 and every quant exact).
            let q: Vec<f32> = (0..heads * hd)
                .map(|i| match i % BLOCK {
                    0 => 127.0 / 64.0,
                    _ => ((i * 31 % 255) as f32 - 127.0) / 64.0,
                })
                .collect();
            for (start, end) in [(0, 1), (5, 40), (0, keys)] {
                let (k8, v8) = (Q8Values { q: &kq, d: &kd }, Q8Values { q: &vq, d: &vd });
                let mut got = vec![f32::NAN; heads * hd];
                attend_q8(
                    &q,
                    hd,
                    k8.from(hd),
                    v8.from(hd),
                    stride,
                    start,
                    end,
                    0.1,
                    &mut got,
                );
                let mut want = vec![f32::NAN; heads * hd];
                let (k, v) = (&k32[hd..], &v32[hd..]);
                super::super::attend(&q, hd, k, v, stride, start, end, 0.1, false, &mut want);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5,
                        "hd {hd} keys {start}..{end} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn rows_together_give_each_row_alone_and_empty_ranges_give_zero() {
        let (hd, keys, heads) = (64, 40, 2);
        let stride = hd;
        let (_, kq, kd) = cache(keys * stride, 3);
        let (_, vq, vd) = cache(keys * stride, 4);
        let (k, v) = (Q8Values { q: &kq, d: &kd }, Q8Values { q: &vq, d: &vd });
        let q: Vec<f32> = (0..3 * heads * hd)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let ranges = [(0, 10), (3, 3), (0, keys)];
        let run = RowRun {
            q: &q,
            q_stride: heads * hd,
            ranges: &ranges,
            heads,
            hd,
            scale: 0.125,
            f16_weights: true,
        };
        let mut together = vec![f32::NAN; 3 * heads * hd];
        attend_rows_q8(&run, k, v, stride, &mut together, heads * hd);
        for (r, &(start, end)) in ranges.iter().enumerate() {
            let mut alone = vec![f32::NAN; heads * hd];
            let qr = &q[r * heads * hd..(r + 1) * heads * hd];
            attend_q8(qr, hd, k, v, stride, start, end, 0.125, &mut alone);
            assert_eq!(&together[r * heads * hd..(r + 1) * heads * hd], &alone[..]);
        }
        assert!(together[heads * hd..2 * heads * hd]
            .iter()
            .all(|&x| x == 0.0));
    }

    #[test]
    #[should_panic(expected = "whole blocks")]
    fn heads_that_split_a_block_are_refused() {
        let (q, d) = ([0i8; 64], [half::f16::ZERO; 2]);
        let v = Q8Values { q: &q, d: &d };
        attend_q8(&[0.0; 16], 16, v, v, 16, 0, 1, 1.0, &mut [0.0; 16]);
    }
}
