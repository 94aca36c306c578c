//! The activation quantizer, [`quantize_row`]: a row of f32 into 8-bit blocks of 32 as llama.cpp
//! quantizes them, in a portable body (compiled per target by `ops`' `multiversion!`) and
//! written out for AVX-512 with F16C: the same arithmetic, bit for bit (`tests`), without the
//! portable body's per-block calls into the f16 conversions and its scalar lane sums. A prompt's
//! rows are quantized before every matrix product, so on the portable body this was a tenth of
//! a prefill.

// Unsafe is needed for the intrinsics and unaligned loads; `quantize_row` calls this only after
// detecting the features, and every index is inside the slices it was given (checked below).
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One activation row's quantized form (see `acts`): its padded quants, per-lane scales and
/// sums, per-block sums (f16-rounded and exact) and exact per-16 sums, each slice the row's own.
pub struct QuantRow<'a> {
    pub q: &'a mut [i8],
    pub lane_scale: &'a mut [f32],
    pub lane_sum: &'a mut [f32],
    pub block_sum: &'a mut [f32],
    pub block_isum: &'a mut [i32],
    pub half_isum: &'a mut [i32],
}

impl QuantRow<'_> {
    /// The part of the row from block `b` on.
    fn tail_from(&mut self, b: usize) -> QuantRow<'_> {
        QuantRow {
            q: &mut self.q[32 * b..],
            lane_scale: &mut self.lane_scale[8 * b..],
            lane_sum: &mut self.lane_sum[8 * b..],
            block_sum: &mut self.block_sum[b..],
            block_isum: &mut self.block_isum[b..],
            half_isum: &mut self.half_isum[2 * b..],
        }
    }
}

/// Quantizes up to 32 values into `qb` as llama.cpp's quantize_row_q8_0/q8_1 (x86) does, and
/// returns the block's scale `d = amax / 127` unrounded (stored as f16 by every user).
///
/// `q = round(x * 127 / amax)` (ties to even). Greedy parity with llama.cpp depends on this
/// arithmetic: at near-ties its choice follows these roundings (keeping `d` in f32 flipped
/// SmolLM2's 10th token). The one owner of that rule: activations (`quantize_row`) and a q8_0
/// KV cache (`quantize_q8_0`) both call it.
#[inline(always)]
pub(crate) fn q8_0_block(xb: &[f32], qb: &mut [i8]) -> f32 {
    // |x| with NaN read as 0 (so it cannot become the scale), then a max tree over the
    // 32 values (vectorizes; the max of NaN-free values does not depend on the order).
    let mut mx = [0f32; 32];
    for (m, v) in mx.iter_mut().zip(xb) {
        let a = v.abs();
        *m = if a > 0.0 { a } else { 0.0 };
    }
    let mut w = 16;
    while w > 0 {
        for l in 0..w {
            mx[l] = if mx[l + w] > mx[l] { mx[l + w] } else { mx[l] };
        }
        w /= 2;
    }
    let amax = mx[0];
    let d = amax / 127.0;
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (o, &v) in qb.iter_mut().zip(xb) {
        // `as` saturates and maps NaN to 0, so odd inputs cannot poison the integer dot.
        *o = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

#[inline(always)]
fn quantize_q8_0_body(x: &[f32], q: &mut [i8], d: &mut [half::f16]) {
    for ((xb, qb), db) in x
        .chunks_exact(32)
        .zip(q.chunks_exact_mut(32))
        .zip(d.iter_mut())
    {
        *db = half::f16::from_f32(q8_0_block(xb, qb));
    }
}

multiversion! {
    /// `x` (a whole number of blocks of 32) into q8_0 blocks: quants into `q` (as many), each
    /// block's scale as f16 into `d` (one per 32 values), as llama.cpp writes a q8_0 KV cache.
    /// Compiled per target: on the baseline, rounding ties to even is a library call a value.
    pub fn quantize_q8_0(x: &[f32], q: &mut [i8], d: &mut [half::f16]) => quantize_q8_0_body
}

/// Quantizes 32 values into `qb` (16 bytes) as llama.cpp's `quantize_row_q4_0_ref` does, which
/// its CPU backend uses to write a q4_0 KV cache, and returns the block's scale `d`, unrounded
/// (stored as f16). `d` is the value of largest magnitude (the first, on a tie), sign and all,
/// over -8, and value `x` becomes `min(15, trunc(x / d + 8.5))`: value `i < 16` in byte `i`'s
/// low nibble, value `16 + i` in its high one. A block of zeros (or NaNs) gets `d = 0` and every
/// nibble 8, which reads back as zeros.
#[inline(always)]
pub(crate) fn q4_0_block(xb: &[f32], qb: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in &xb[..32] {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let nibble = |x: f32| ((x * id + 8.5) as i8).clamp(0, 15) as u8;
    for (j, q) in qb[..16].iter_mut().enumerate() {
        *q = nibble(xb[j]) | nibble(xb[16 + j]) << 4;
    }
    d
}

#[inline(always)]
fn quantize_q4_0_body(x: &[f32], q: &mut [u8], d: &mut [half::f16]) {
    for ((xb, qb), db) in x
        .chunks_exact(32)
        .zip(q.chunks_exact_mut(16))
        .zip(d.iter_mut())
    {
        *db = half::f16::from_f32(q4_0_block(xb, qb));
    }
}

multiversion! {
    /// `x` (a whole number of blocks of 32) into q4_0 blocks: 16 bytes of nibbles a block into
    /// `q`, each block's scale as f16 into `d`, as llama.cpp writes a q4_0 KV cache.
    pub fn quantize_q4_0(x: &[f32], q: &mut [u8], d: &mut [half::f16]) => quantize_q4_0_body
}

#[inline(always)]
fn quantize_row_body(x: &[f32], out: QuantRow<'_>) {
    let QuantRow {
        q,
        lane_scale,
        lane_sum,
        block_sum,
        block_isum,
        half_isum,
    } = out;
    for (b, xb) in x.chunks(32).enumerate() {
        let qb = &mut q[32 * b..32 * b + 32];
        let d = q8_0_block(xb, qb);
        let sum: i32 = qb.iter().map(|&v| v as i32).sum();
        let d16 = half::f16::from_f32(d).to_f32();
        // Per-lane sums stay exact for formats whose zero points change every 16 elements
        // (Q6_K); the f16 rounding of the block total goes into the last lane, so a weight
        // block with one min (Q4_1, Q4_K) sees llama.cpp's `s`.
        let mut lanes = 0f32;
        for l in 0..8 {
            let s = qb[4 * l] as i32
                + qb[4 * l + 1] as i32
                + qb[4 * l + 2] as i32
                + qb[4 * l + 3] as i32;
            lane_scale[8 * b + l] = d16;
            lane_sum[8 * b + l] = d * s as f32;
            if l < 7 {
                lanes += d * s as f32;
            }
        }
        let total = half::f16::from_f32(d * sum as f32).to_f32();
        lane_sum[8 * b + 7] = total - lanes;
        block_sum[b] = total;
        block_isum[b] = sum;
        let lo: i32 = qb[..16].iter().map(|&v| v as i32).sum();
        half_isum[2 * b] = lo;
        half_isum[2 * b + 1] = sum - lo;
    }
}

multiversion! {
    fn quantize_row_any(x: &[f32], out: QuantRow<'_>) => quantize_row_body
}

/// Quantizes one activation row into 8-bit blocks of 32 (see `acts`) into `out`, pre-zeroed by
/// the caller.
pub fn quantize_row(x: &[f32], mut out: QuantRow<'_>) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        let whole = x.len() / 32;
        // SAFETY: the features were just detected; the output slices hold a row's padded
        // blocks (at least `whole` of each), as `acts` allocates them.
        unsafe { quantize_row_avx512(x, &mut out) };
        if whole * 32 < x.len() {
            quantize_row_any(&x[32 * whole..], out.tail_from(whole));
        }
        return;
    }
    quantize_row_any(x, out)
}

/// Whether this CPU can run [`quantize_row_avx512`].
#[cfg(target_arch = "x86_64")]
fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("f16c")
}

/// The whole blocks of 32 of `x` (the tail block, if any, is the caller's), into the outputs
/// as `quantize_row_body` writes them.
///
/// # Safety
/// [`available`] returned true; `out.q` holds `32 * blocks`, `lane_scale` and `lane_sum`
/// `8 * blocks`, `block_sum` and `block_isum` `blocks`, `half_isum` `2 * blocks` elements,
/// `blocks = x.len() / 32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn quantize_row_avx512(x: &[f32], out: &mut QuantRow<'_>) {
    let blocks = x.len() / 32;
    let q = &mut *out.q;
    let (lane_scale, lane_sum) = (&mut *out.lane_scale, &mut *out.lane_sum);
    let (block_sum, block_isum, half_isum) = (
        &mut *out.block_sum,
        &mut *out.block_isum,
        &mut *out.half_isum,
    );
    assert!(
        q.len() >= 32 * blocks
            && lane_scale.len() >= 8 * blocks
            && lane_sum.len() >= 8 * blocks
            && block_sum.len() >= blocks
            && block_isum.len() >= blocks
            && half_isum.len() >= 2 * blocks
    );
    let zero = _mm512_setzero_ps();
    let sign = _mm512_set1_epi32(0x7FFF_FFFF);
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    for b in 0..blocks {
        let v0 = _mm512_loadu_ps(x.as_ptr().add(32 * b));
        let v1 = _mm512_loadu_ps(x.as_ptr().add(32 * b + 16));
        // |x| with NaN read as 0: vmaxps returns its second operand when either is NaN.
        let a0 = _mm512_max_ps(
            _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), sign)),
            zero,
        );
        let a1 = _mm512_max_ps(
            _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), sign)),
            zero,
        );
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        let d = amax / 127.0;
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let idv = _mm512_set1_ps(id);
        let (p0, p1) = (_mm512_mul_ps(v0, idv), _mm512_mul_ps(v1, idv));
        // Round to nearest, ties to even (the default rounding mode), NaN to 0 as `as i8` does.
        // The clamp comes first here (the conversion cannot represent an infinite product, which
        // a subnormal block's scale gives): clamping to +-127 before or after rounding to an
        // integer gives the same integer.
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        let c0 = _mm512_min_ps(_mm512_max_ps(p0, lo), hi);
        let c1 = _mm512_min_ps(_mm512_max_ps(p1, lo), hi);
        let q0 = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(p0, p0), c0);
        let q1 = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(p1, p1), c1);
        let qb = _mm256_set_m128i(_mm512_cvtepi32_epi8(q1), _mm512_cvtepi32_epi8(q0));
        _mm256_storeu_si256(q.as_mut_ptr().add(32 * b) as *mut __m256i, qb);
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        // The 8 lane sums of 4 quants: byte pairs, then pairs of pairs.
        let lanes_i = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qb), ones16);
        let lane_f = _mm256_mul_ps(_mm256_cvtepi32_ps(lanes_i), _mm256_set1_ps(d));
        let mut ls = [0f32; 8];
        _mm256_storeu_ps(ls.as_mut_ptr(), lane_f);
        let mut lanes = 0f32;
        for v in &ls[..7] {
            lanes += v;
        }
        let d16 = f16_round(d);
        let total = f16_round(d * sum as f32);
        ls[7] = total - lanes;
        _mm256_storeu_ps(lane_scale.as_mut_ptr().add(8 * b), _mm256_set1_ps(d16));
        _mm256_storeu_ps(
            lane_sum.as_mut_ptr().add(8 * b),
            _mm256_loadu_ps(ls.as_ptr()),
        );
        block_sum[b] = total;
        block_isum[b] = sum;
        let lo = _mm512_reduce_add_epi32(q0);
        half_isum[2 * b] = lo;
        half_isum[2 * b + 1] = sum - lo;
    }
}

/// `x` rounded to the nearest f16 (ties to even) and back, as `half::f16::from_f32` does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
#[inline]
unsafe fn f16_round(x: f32) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
        _mm_set_ss(x),
    )))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn q4_0_takes_the_signed_largest_over_minus_eight_and_truncates() {
        // The largest magnitude is -1 (before 0.9): d = 1/8, and x / d + 8.5 truncated, at
        // most 15. So -1 -> 0, 0.5 -> 12, 0.9 -> 15 (15.7), -0.3 -> 6 (6.1), 0 -> 8.
        let mut x = [0f32; 32];
        (x[0], x[1], x[2], x[17]) = (0.5, -1.0, 0.9, -0.3);
        let mut q = [0u8; 16];
        assert_eq!(q4_0_block(&x, &mut q), 0.125);
        let nib = |i: usize| if i < 16 { q[i] & 15 } else { q[i - 16] >> 4 };
        assert_eq!(
            [nib(0), nib(1), nib(2), nib(17), nib(3), nib(31)],
            [12, 0, 15, 6, 8, 8]
        );
        // A block of zeros reads back as zeros: d = 0, every nibble 8.
        assert_eq!(q4_0_block(&[0.0; 32], &mut q), 0.0);
        assert!(q.iter().all(|&b| b == 0x88));
    }

    #[test]
    fn the_avx512_quantizer_is_bit_identical_to_the_portable_one() {
        if !available() {
            eprintln!("skipped: no AVX-512 with F16C");
            return;
        }
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let specials = [
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-40,
            65504.0,
            1e9,
            0.5,
            -0.5,
            1.5,
        ];
        for case in 0..400 {
            let blocks = 1 + case % 7;
            let scale = [1e-3f32, 1.0, 100.0, 1e5][case % 4];
            let x: Vec<f32> = (0..32 * blocks)
                .map(|i| {
                    let r = next();
                    if case % 5 == 0 && r % 17 == 0 {
                        specials[(r >> 8) as usize % specials.len()]
                    } else if case % 7 == 1 {
                        // exact halves of the step: ties for the rounding
                        ((r >> 40) % 255) as f32 - 127.0 + if i % 2 == 0 { 0.5 } else { 0.0 }
                    } else if case % 11 == 3 {
                        0.0
                    } else {
                        ((r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
                    }
                })
                .collect();
            let n = 32 * blocks;
            let mut want = (vec![0i8; n], vec![0f32; n / 4], vec![0f32; n / 4]);
            let mut want_b = (
                vec![0f32; blocks],
                vec![0i32; blocks],
                vec![0i32; 2 * blocks],
            );
            super::quantize_row_body(
                &x,
                QuantRow {
                    q: &mut want.0,
                    lane_scale: &mut want.1,
                    lane_sum: &mut want.2,
                    block_sum: &mut want_b.0,
                    block_isum: &mut want_b.1,
                    half_isum: &mut want_b.2,
                },
            );
            let mut got = (vec![0i8; n], vec![0f32; n / 4], vec![0f32; n / 4]);
            let mut got_b = (
                vec![0f32; blocks],
                vec![0i32; blocks],
                vec![0i32; 2 * blocks],
            );
            // SAFETY: checked available; the buffers have the documented sizes.
            unsafe {
                quantize_row_avx512(
                    &x,
                    &mut QuantRow {
                        q: &mut got.0,
                        lane_scale: &mut got.1,
                        lane_sum: &mut got.2,
                        block_sum: &mut got_b.0,
                        block_isum: &mut got_b.1,
                        half_isum: &mut got_b.2,
                    },
                )
            };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(want.0, got.0, "quants, case {case}");
            assert_eq!(bits(&want.1), bits(&got.1), "lane scales, case {case}");
            assert_eq!(bits(&want.2), bits(&got.2), "lane sums, case {case}");
            assert_eq!(bits(&want_b.0), bits(&got_b.0), "block sums, case {case}");
            assert_eq!(want_b.1, got_b.1, "block int sums, case {case}");
            assert_eq!(want_b.2, got_b.2, "half-block int sums, case {case}");
            let halves: Vec<i32> = want
                .0
                .chunks(16)
                .map(|h| h.iter().map(|&q| q as i32).sum())
                .collect();
            assert_eq!(
                want_b.2, halves,
                "half-block int sums are the quants' sums, case {case}"
            );
        }
    }
}
