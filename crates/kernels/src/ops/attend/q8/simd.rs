//! The AVX-512 halves of the q8_0 attention: the same arithmetic as the portable bodies in
//! `mod.rs`, lane for lane (`tests`).

use super::{Q8Query, BLOCK, MAX_GROUP, MAX_Q8_HEAD};
use crate::scores::transpose16x16;

/// [`super::key_scores`] for several query heads on AVX-512 (BW for the 16-bit products, F16C for the
/// scales), sixteen keys at a time: the same bits. A tile's keys are widened to 16-bit quants and
/// transposed once for all the heads, so that lane `i` of vector `l` of block `b` holds key
/// `i`'s quants `2l` and `2l + 1`: one `madd` against a broadcast pair of the query's quants
/// then gives lane `l`'s pair product of block `b` for all sixteen keys, fused into vector `l`
/// with the keys' scales times the query's, in block order; and the sixteen vectors meet in
/// `reduce16`'s tree (`l` and `l + 8`, then `+ 4`, `+ 2`, `+ 1`) as whole vectors. That is
/// [`super::key_scores`]'s arithmetic lane for lane, without a horizontal sum per key.
#[target_feature(enable = "avx512f,avx512bw,fma,f16c")]
#[allow(unsafe_code)]
pub(super) unsafe fn key_scores_512(
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
    // Each query's quants widened to 16 bits: i32 `16 b + l` of query `h` holds quants 2l and
    // 2l + 1 of block b, the pair `madd` multiplies, to broadcast. Only the written part is read.
    let mut pairs = MaybeUninit::<[[i32; MAX_Q8_HEAD / 2]; MAX_GROUP]>::uninit();
    let pairs = pairs.as_mut_ptr().cast::<i32>();
    for (h, qh) in queries.iter().enumerate() {
        for b in 0..blocks {
            let q16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(qh.q.as_ptr().add(b * BLOCK).cast()));
            _mm512_storeu_si512(pairs.add(h * MAX_Q8_HEAD / 2 + 16 * b).cast(), q16);
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
        let mut scales = [MaybeUninit::<__m512>::uninit(); MAX_Q8_HEAD / BLOCK];
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
            scales[b].write(_mm512_cvtph_ps(_mm256_loadu_si256(bits.as_ptr().cast())));
        }
        for (h, qh) in queries.iter().enumerate() {
            let mut acc = [_mm512_setzero_ps(); 16];
            for (b, &dq) in qh.d.iter().enumerate() {
                let d = _mm512_mul_ps(scales[b].assume_init(), _mm512_set1_ps(dq));
                for (l, a) in acc.iter_mut().enumerate() {
                    let q = _mm512_set1_epi32(*pairs.add(h * MAX_Q8_HEAD / 2 + 16 * b + l));
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

/// Keys ahead whose quants are fetched into L1 while this one is summed: one head's rows are a
/// stride apart, and the hardware prefetcher followed them too late (as in `attend::prefetch`).
const PREFETCH_KEYS: usize = 8;

/// Hints the `len` bytes at `p` into L1 (a prefetch never faults).
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn prefetch(p: *const i8, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in (0..len).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.add(line));
    }
}

/// One f16 scale (its bits) widened by F16C.
#[target_feature(enable = "f16c")]
#[inline]
#[allow(unsafe_code)]
unsafe fn f16_512(bits: u16) -> f32 {
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// [`super::weighted_q8`] on AVX-512, a block of 32 columns at a time for all `G` heads: the same bits.
#[target_feature(enable = "avx512f,fma,f16c")]
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(super) unsafe fn weighted_q8_512<const G: usize>(
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
