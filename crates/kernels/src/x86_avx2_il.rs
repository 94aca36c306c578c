//! The AVX2 tile for interleaved matrices (the arrangement `pack` documents, shared with the
//! AVX-512 VNNI tile): a 16-row group is read as two 8-row halves, the first 32 bytes of each
//! 64-byte unit holding rows 0-7 and the last 32 rows 8-15, so one 256-bit load holds 4
//! consecutive quants of 8 rows (32-bit lane = row).
//!
//! The 4 activation bytes a load meets are broadcast; `pmaddubsw` multiplies unsigned weights by
//! signed activations into pairs of i16, and a lane sums its row's whole 32-element block before
//! one `pmaddwd` turns it into i32. The i16 sums cannot overflow: a 4-bit block totals at most
//! `8 * 2 * 15 * 127 = 30480`, and 5-bit quants are summed 16 elements at a time
//! (`4 * 2 * 31 * 127 = 31496`). 8-bit weights (stored as `q + 128`) take the sign trick: `|q|` on
//! the unsigned side, the sign moved onto the activations, one `pmaddwd` per product (a pair
//! reaches `2 * 128 * 127 = 32512`). Then, per block, one scale `d_w * d_a` and one min term
//! `min * d_a * sum(q_a)` (Q5_0's min is `-16 d_w`), and each 8-lane result is 8 consecutive
//! outputs: no horizontal sums.

// Unsafe is needed here because SIMD intrinsics and raw-pointer loads are unsafe fns. The tile is
// only reached through `matmul::matmul_il`, which checked the CPU features, that the matrix is
// interleaved and every group and activation row index.
#![allow(unsafe_code)]

use crate::acts::QActs;
use crate::pack::QMatrix;
use crate::{fifth_bit, stored_min, L_S8, L_U5};
use std::arch::x86_64::*;

/// Activation rows per AVX2 interleaved tile. At 8 the i16 sums of a 4-bit block still fit the
/// 16 ymm registers beside the unpacked weights (the f32 accumulators, touched once per block,
/// go to the stack); kbench measured 8 faster than 4 or 6 on every format (PERF.md).
pub(crate) const NR_MAX: usize = 8;

/// The fifth bits of one 32-bit half of an interleaved fifth-bit word (`pack`: bit `4 r + t` is
/// the fifth bit of quant `t` of row `r`), each moved to bit 4 of its quant's byte.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let x = _mm256_set1_epi32((p as *const i32).read_unaligned());
    // Byte i takes the source byte holding bit i, then tests bit i % 8 of it.
    let idx = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let sel = _mm256_and_si256(_mm256_shuffle_epi8(x, idx), bit);
    _mm256_and_si256(_mm256_cmpeq_epi8(sel, bit), _mm256_set1_epi8(0x10))
}

/// Sixteen weight rows of an interleaved matrix (group `g16`) times activation rows
/// `a0..a0 + NR`, written to `out[(a0 + j) * m + 16 * g16 ..][..16]`, one 8-row half at a time
/// (the second half reads the group's bytes the first one brought into cache).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` must be interleaved with layout `L` (any but
/// `L_U6`), `g16 < w.rows / 16`, `NR <= NR_MAX`, rows `a0..a0 + NR` must exist in `a` with
/// `a.kp == w.kp`, and `out` must hold `(a0 + NR) * m` floats with `m == w.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_il<const L: u8, const NR: usize>(
    w: &QMatrix,
    g16: usize,
    a: &QActs,
    a0: usize,
    out: *mut f32,
    m: usize,
) {
    let blocks = w.kp / 32;
    let base = g16 * blocks;
    let bpb = if L == L_S8 { 512 } else { 256 };
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let aq = a.qs.as_ptr();
    for half in 0..2 {
        let mut facc = [_mm256_setzero_ps(); NR];
        for b in 0..blocks {
            let p = w.qs.as_ptr().add((base + b) * bpb + 32 * half);
            // Activation bytes 4k..4k + 4 of block b of row a0 + j, broadcast.
            let act = |j: usize, k: usize| {
                let at = aq.add((a0 + j) * w.kp + 32 * b + 4 * k) as *const i32;
                _mm256_set1_epi32(at.read_unaligned())
            };
            let mut dot = [_mm256_setzero_si256(); NR];
            if L == L_S8 {
                for k in 0..8 {
                    if half == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(
                            p.wrapping_add(64 * k + crate::PREFETCH_BYTES) as *const i8
                        );
                    }
                    let q = _mm256_xor_si256(
                        _mm256_loadu_si256(p.add(64 * k) as *const __m256i),
                        _mm256_set1_epi8(-128),
                    );
                    let u = _mm256_abs_epi8(q);
                    for (j, d) in dot.iter_mut().enumerate() {
                        let prod = _mm256_maddubs_epi16(u, _mm256_sign_epi8(act(j, k), q));
                        *d = _mm256_add_epi32(*d, _mm256_madd_epi16(prod, ones));
                    }
                }
            } else {
                let mut s16 = [_mm256_setzero_si256(); NR];
                for h in 0..4 {
                    if half == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(
                            p.wrapping_add(64 * h + crate::PREFETCH_BYTES) as *const i8
                        );
                    }
                    let v = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
                    let mut lo = _mm256_and_si256(v, low);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    if fifth_bit(L) {
                        // Word k of the block's fifth bits, this half's 32 bits.
                        let hp = w.hi.as_ptr().add((base + b) * 64 + 16 * h + 4 * half);
                        lo = _mm256_or_si256(lo, fifth_bits(hp));
                        hi = _mm256_or_si256(hi, fifth_bits(hp.add(8)));
                    }
                    for (j, s) in s16.iter_mut().enumerate() {
                        let x = _mm256_maddubs_epi16(lo, act(j, 2 * h));
                        let y = _mm256_maddubs_epi16(hi, act(j, 2 * h + 1));
                        *s = _mm256_add_epi16(*s, _mm256_add_epi16(x, y));
                    }
                    if (fifth_bit(L) && h == 1) || h == 3 {
                        for (d, s) in dot.iter_mut().zip(s16.iter_mut()) {
                            *d = _mm256_add_epi32(*d, _mm256_madd_epi16(*s, ones));
                            *s = _mm256_setzero_si256();
                        }
                    }
                }
            }
            let si = (base + b) * 16 + 8 * half;
            let wd = _mm256_cvtph_ps(_mm_loadu_si128(w.scales.as_ptr().add(si) as *const __m128i));
            let wm = if stored_min(L) {
                _mm256_cvtph_ps(_mm_loadu_si128(w.mins.as_ptr().add(si) as *const __m128i))
            } else if L == L_U5 {
                _mm256_mul_ps(wd, _mm256_set1_ps(-16.0))
            } else {
                _mm256_setzero_ps()
            };
            for (j, (f, d)) in facc.iter_mut().zip(&dot).enumerate() {
                let row = a0 + j;
                let da = *a.lane_scale.get_unchecked((row * w.kp + 32 * b) / 4);
                *f = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(*d),
                    _mm256_mul_ps(wd, _mm256_set1_ps(da)),
                    *f,
                );
                if L != L_S8 {
                    let bs = *a.block_sum.get_unchecked(row * blocks + b);
                    *f = _mm256_fmadd_ps(wm, _mm256_set1_ps(bs), *f);
                }
            }
        }
        for (j, f) in facc.iter().enumerate() {
            _mm256_storeu_ps(out.add((a0 + j) * m + 16 * g16 + 8 * half), *f);
        }
    }
}
