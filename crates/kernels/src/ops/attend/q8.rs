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
            simd512(),
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
    fn attend_q8_mv(wide: bool, q: &[f32], hd: usize, kq: &[i8], kd: &[half::f16], vq: &[i8], vd: &[half::f16], stride: usize, start: usize, end: usize, scale: f32, scores: &mut [f32], out: &mut [f32]) => attend_q8_body
}

/// Whether this CPU runs the AVX-512 halves ([`key_scores_512`], [`weighted_q8_512`]).
#[inline(always)]
fn simd512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_q8_body(
    wide: bool,
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
    // Every key and value read lies within the slices (the kernels below index unchecked).
    let last = (end - 1) * stride;
    assert!(
        last + hd <= kq.len().min(vq.len()),
        "keys {start}..{end} past the cache"
    );
    assert!(
        last / BLOCK + blocks <= kd.len().min(vd.len()),
        "scales past the cache"
    );
    let scores = &mut scores[..heads * n];
    // Every query head as the cache's keys are kept: quants and f16-rounded scales.
    let mut qq = [0i8; MAX_GROUP * MAX_Q8_HEAD];
    let mut qd = [0f32; MAX_GROUP * MAX_Q8_HEAD / BLOCK];
    let mut h0 = 0;
    while h0 < heads {
        let count = (heads - h0).min(MAX_GROUP);
        for (h, qh) in q[h0 * hd..(h0 + count) * hd].chunks_exact(hd).enumerate() {
            for b in 0..blocks {
                let at = b * BLOCK;
                let raw = q8_0_block(&qh[at..at + BLOCK], &mut qq[h * hd + at..][..BLOCK]);
                qd[h * blocks + b] = half::f16::from_f32(raw).to_f32();
            }
        }
        let queries: [Q8Query<'_>; MAX_GROUP] = std::array::from_fn(|h| Q8Query {
            q: &qq[h * hd..(h + 1) * hd],
            d: &qd[h * blocks..(h + 1) * blocks],
        });
        let w = &mut scores[h0 * n..(h0 + count) * n];
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: the features were detected; every key read is inside `kq`/`kd` (asserted
            // above), each query holds `blocks` whole blocks, `w` one row of `n` per query.
            unsafe { key_scores_512(&queries[..count], kq, kd, stride, start, scale, w) };
        } else {
            for (qh, w) in queries[..count].iter().zip(w.chunks_exact_mut(n)) {
                key_scores(qh, kq, kd, stride, start, scale, w);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (qh, w) in queries[..count].iter().zip(w.chunks_exact_mut(n)) {
            key_scores(qh, kq, kd, stride, start, scale, w);
        }
        h0 += count;
    }
    for w in scores.chunks_exact_mut(n) {
        softmax_in_place(w, false);
    }
    let mut h0 = 0;
    while h0 < heads {
        let (ws, o) = (&scores[h0 * n..], &mut out[h0 * hd..]);
        let v = (vq, vd, stride, start, hd);
        h0 += match (heads - h0).min(4) {
            1 => weighted_q8::<1>(wide, ws, n, v, o),
            2 => weighted_q8::<2>(wide, ws, n, v, o),
            3 => weighted_q8::<3>(wide, ws, n, v, o),
            _ => weighted_q8::<4>(wide, ws, n, v, o),
        };
    }
}

/// A query head quantized as the cache's keys are: quants and widened f16 scales.
struct Q8Query<'a> {
    q: &'a [i8],
    d: &'a [f32],
}

/// Scaled scores of one query head against keys `start..start + w.len()` (each `stride` apart).
/// Per key, sixteen lanes each take the products of two neighbouring quants a block, times the
/// product of the two blocks' scales, fused into the lane's sum in block order; the lanes then
/// meet in `reduce16`'s tree. This is the AVX-512 kernel's arithmetic (one `madd` of the blocks'
/// 16-bit quants per block), so both give the same bits.
#[inline(always)]
fn key_scores(
    q: &Q8Query<'_>,
    kq: &[i8],
    kd: &[half::f16],
    stride: usize,
    start: usize,
    scale: f32,
    w: &mut [f32],
) {
    for (s, j) in w.iter_mut().zip(start..) {
        let at = j * stride;
        let mut acc = [0f32; 16];
        for (b, &dq) in q.d.iter().enumerate() {
            let d = kd[at / BLOCK + b].to_f32() * dq;
            let (kb, qb) = (&kq[at + b * BLOCK..][..BLOCK], &q.q[b * BLOCK..][..BLOCK]);
            for (l, a) in acc.iter_mut().enumerate() {
                let p = i32::from(kb[2 * l]) * i32::from(qb[2 * l])
                    + i32::from(kb[2 * l + 1]) * i32::from(qb[2 * l + 1]);
                *a = (p as f32).mul_add(d, *a);
            }
        }
        *s = super::reduce16(acc) * scale;
    }
}

/// Query heads scored together: a group's (up to this many) share each transposed key tile.
const MAX_GROUP: usize = 8;

/// [`key_scores`] for several query heads on AVX-512 (BW for the 16-bit products, F16C for the
/// scales), sixteen keys at a time: the same bits. A tile's keys are widened to 16-bit quants and
/// transposed once for all the heads, so that lane `i` of vector `l` of block `b` holds key
/// `i`'s quants `2l` and `2l + 1`: one `madd` against a broadcast pair of the query's quants
/// then gives lane `l`'s pair product of block `b` for all sixteen keys, fused into vector `l`
/// with the keys' scales times the query's, in block order; and the sixteen vectors meet in
/// `reduce16`'s tree (`l` and `l + 8`, then `+ 4`, `+ 2`, `+ 1`) as whole vectors. That is
/// [`key_scores`]'s arithmetic lane for lane, without a horizontal sum per key.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,fma,f16c")]
#[allow(unsafe_code)]
unsafe fn key_scores_512(
    queries: &[Q8Query<'_>],
    kq: &[i8],
    kd: &[half::f16],
    stride: usize,
    start: usize,
    scale: f32,
    w: &mut [f32],
) {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;
    let blocks = queries[0].d.len();
    let n = w.len() / queries.len();
    // Each query's quants as broadcastable pairs: `pairs[h][16 b + l]` = quants 2l, 2l + 1 of
    // block b as two 16-bit halves of one i32 (the layout `madd` reads).
    let mut pairs = [[0i32; MAX_Q8_HEAD / 2]; MAX_GROUP];
    for (qh, ph) in queries.iter().zip(pairs.iter_mut()) {
        for (u, p) in ph[..qh.q.len() / 2].iter_mut().enumerate() {
            let (lo, hi) = (qh.q[2 * u] as i16 as u16, qh.q[2 * u + 1] as i16 as u16);
            *p = (u32::from(lo) | u32::from(hi) << 16) as i32;
        }
    }
    let (kp, dp) = (kq.as_ptr(), kd.as_ptr().cast::<u16>());
    let mut tile: [MaybeUninit<__m512i>; MAX_Q8_HEAD / 2] =
        [MaybeUninit::uninit(); MAX_Q8_HEAD / 2];
    let mut done = 0;
    while done < n {
        let count = (n - done).min(16);
        let first = start + done;
        // The tile: per block, sixteen keys' 16-bit quants transposed, and the keys' scales.
        let mut scales = [_mm512_setzero_ps(); MAX_Q8_HEAD / BLOCK];
        for b in 0..blocks {
            let rows: [__m512; 16] = std::array::from_fn(|i| {
                if i >= count {
                    return _mm512_setzero_ps();
                }
                let at = (first + i) * stride + b * BLOCK;
                _mm512_castsi512_ps(_mm512_cvtepi8_epi16(_mm256_loadu_si256(kp.add(at).cast())))
            });
            for (l, v) in transpose16x16(&rows).into_iter().enumerate() {
                tile[16 * b + l].write(_mm512_castps_si512(v));
            }
            let mut bits = [0u16; 16];
            for (i, x) in bits[..count].iter_mut().enumerate() {
                *x = *dp.add((first + i) * stride / BLOCK + b);
            }
            scales[b] = _mm512_cvtph_ps(_mm256_loadu_si256(bits.as_ptr().cast()));
        }
        for (h, qh) in queries.iter().enumerate() {
            let mut acc = [_mm512_setzero_ps(); 16];
            for (b, &dq) in qh.d.iter().enumerate() {
                let d = _mm512_mul_ps(scales[b], _mm512_set1_ps(dq));
                for (l, a) in acc.iter_mut().enumerate() {
                    let q = _mm512_set1_epi32(pairs[h][16 * b + l]);
                    let p = _mm512_madd_epi16(tile[16 * b + l].assume_init(), q);
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, *a);
                }
            }
            let mut width = 8;
            while width > 0 {
                for l in 0..width {
                    acc[l] = _mm512_add_ps(acc[l], acc[l + width]);
                }
                width /= 2;
            }
            let out = _mm512_mul_ps(acc[0], _mm512_set1_ps(scale));
            let mask = if count == 16 {
                0xFFFF
            } else {
                (1u16 << count) - 1
            };
            _mm512_mask_storeu_ps(w.as_mut_ptr().add(h * n + done), mask, out);
        }
        done += count;
    }
}

/// Sixteen vectors of sixteen 32-bit lanes transposed: lane `i` of result `c` is lane `c` of
/// row `i` (bits moved, never computed on).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(unsafe_code)]
unsafe fn transpose16x16(r: &[std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then quads: `u[4 g + j]` holds, in 128-bit lane `k`, element
    // `4 k + j` of rows `4 g..4 g + 4`.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (g, j) = (i / 4, i % 4);
        let (a, b) = (
            _mm512_castps_pd(t[4 * g + j / 2]),
            _mm512_castps_pd(t[4 * g + j / 2 + 2]),
        );
        _mm512_castpd_ps(if j % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let (h, sel, j) = (i / 8, (i / 4) % 2, i % 4);
        let (a, b) = (u[8 * h + j], u[8 * h + 4 + j]);
        if sel == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    std::array::from_fn(|c| {
        let (hi, s4, j) = (c / 8, (c / 4) % 2, c % 4);
        let (a, b) = (v[4 * s4 + j], v[8 + 4 * s4 + j]);
        if hi == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    })
}

/// Keys ahead whose quants are fetched into L1 while this one is summed: one head's rows are a
/// stride apart, and the hardware prefetcher followed them too late (as in `super::prefetch`).
const PREFETCH_KEYS: usize = 8;

/// Hints the `len` bytes at `p` into L1 (a prefetch never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn prefetch(p: *const i8, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in (0..len).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.add(line));
    }
}

/// One f16 scale (its bits) widened by F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
#[inline]
#[allow(unsafe_code)]
unsafe fn f16_512(bits: u16) -> f32 {
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The values: quants, scales, stride, first key, head width.
type Q8Rows<'a> = (&'a [i8], &'a [half::f16], usize, usize, usize);

/// The weighted sum of V for `G` heads (head `g`'s weights at `ws[g * n..][..n]`, its output at
/// `out[g * hd..][..hd]`): each column sums its keys in order, one fused multiply-add each of
/// the widened value (`q * d`). Returns `G`.
#[inline(always)]
fn weighted_q8<const G: usize>(
    wide: bool,
    ws: &[f32],
    n: usize,
    (vq, vd, stride, start, hd): Q8Rows<'_>,
    out: &mut [f32],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: the features were detected; `attend_q8_body` checked every value read is
        // inside `vq`/`vd`, `ws` holds `G * n` weights and `out` `G * hd` columns.
        unsafe { weighted_q8_512::<G>(ws, n, vq, vd, stride, start, hd, out) };
        return G;
    }
    let _ = wide;
    let mut row = [0f32; MAX_Q8_HEAD];
    for idx in 0..n {
        let at = (start + idx) * stride;
        for (b, block) in row[..hd].chunks_exact_mut(BLOCK).enumerate() {
            let d = vd[at / BLOCK + b].to_f32();
            for (x, &qv) in block.iter_mut().zip(&vq[at + b * BLOCK..][..BLOCK]) {
                *x = f32::from(qv) * d;
            }
        }
        for (g, o) in out[..G * hd].chunks_exact_mut(hd).enumerate() {
            let wj = ws[g * n + idx];
            for (a, &x) in o.iter_mut().zip(&row[..hd]) {
                *a = x.mul_add(wj, *a);
            }
        }
    }
    G
}

/// [`weighted_q8`] on AVX-512, a block of 32 columns at a time for all `G` heads: the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn weighted_q8_512<const G: usize>(
    ws: &[f32],
    n: usize,
    vq: &[i8],
    vd: &[half::f16],
    stride: usize,
    start: usize,
    hd: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (vp, dp) = (vq.as_ptr(), vd.as_ptr().cast::<u16>());
    for c0 in (0..hd).step_by(BLOCK) {
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        for idx in 0..n {
            let at = (start + idx) * stride + c0;
            if at + PREFETCH_KEYS * stride + BLOCK <= vq.len() {
                prefetch(vp.add(at + PREFETCH_KEYS * stride), BLOCK);
            }
            let d = _mm512_set1_ps(f16_512(*dp.add(at / BLOCK)));
            let widen = |p: *const i8| {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()));
                _mm512_mul_ps(_mm512_cvtepi32_ps(q), d)
            };
            let (x0, x1) = (widen(vp.add(at)), widen(vp.add(at + 16)));
            for (g, acc_g) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*ws.get_unchecked(g * n + idx));
                acc_g[0] = _mm512_fmadd_ps(x0, w, acc_g[0]);
                acc_g[1] = _mm512_fmadd_ps(x1, w, acc_g[1]);
            }
        }
        for (g, acc_g) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(g * hd + c0);
            _mm512_storeu_ps(o, acc_g[0]);
            _mm512_storeu_ps(o.add(16), acc_g[1]);
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

    /// The AVX-512 kernels give the portable body's bits (where this CPU has them), for heads
    /// of one to six blocks and groups of one to six heads.
    #[test]
    fn the_avx512_kernels_give_the_portable_bits() {
        if !simd512() {
            return;
        }
        for hd in [32, 64, 96, 128, 192] {
            let (keys, stride) = (37, 3 * hd);
            let (_, kq, kd) = cache(keys * stride, 5);
            let (_, vq, vd) = cache(keys * stride, 6);
            for heads in 1..=6 {
                let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.61).cos()).collect();
                let run = |wide: bool| {
                    let mut scores = vec![0f32; heads * keys];
                    let mut out = vec![f32::NAN; heads * hd];
                    let (k, v) = (&kq[hd..], &vq[hd..]);
                    let (kd, vd) = (&kd[hd / BLOCK..], &vd[hd / BLOCK..]);
                    attend_q8_body(
                        wide,
                        &q,
                        hd,
                        k,
                        kd,
                        v,
                        vd,
                        stride,
                        2,
                        30,
                        0.2,
                        &mut scores,
                        &mut out,
                    );
                    out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                assert_eq!(run(true), run(false), "hd {hd} heads {heads}");
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
