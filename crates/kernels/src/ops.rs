//! Small f32 row operations of a transformer step (attention over a contiguous KV cache,
//! RMSNorm), compiled for AVX-512, AVX2+FMA and the baseline, picked at run time. The bodies
//! are plain Rust written with 16 independent accumulators so the compiler vectorizes them
//! for whichever target features the variant enables.

// Unsafe is needed here only to call the `#[target_feature]` variants, which happens after
// `is_x86_feature_detected!` confirmed the CPU has those features.
#![allow(unsafe_code)]

const LANES: usize = 16;

#[inline(always)]
fn exp_body(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (ties to even) in the
    // default rounding mode, branch-free.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.3);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    let mut p: f32 = 1.0 / 5040.0;
    p = p.mul_add(r, 1.0 / 720.0);
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    // `t`'s low mantissa bits hold `n` (an integer of at most 127 in magnitude, on the unit
    // grid of [2^23, 2^24)), so this is `n as i32` without the saturating cast, which LLVM
    // compiles to sixteen scalar conversions per vector; NaN gives a NaN result either way.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if x < -87.3 {
        0.0
    } else {
        p * scale
    }
}

#[inline(always)]
fn exp_in_place_body(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = exp_body(*v);
    }
}

#[inline(always)]
fn silu_mul_body(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
        *o = gv / (1.0 + exp_body(-gv)) * uv;
    }
}

#[inline(always)]
fn gelu_tanh_mul_body(g: &[f32], u: &[f32], out: &mut [f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    for ((o, &x), &uv) in out.iter_mut().zip(g).zip(u) {
        // tanh(y) = 1 - 2 / (e^(2y) + 1), exact at both saturated ends.
        let y = C * (x + 0.044_715 * x * x * x);
        let t = 1.0 - 2.0 / (exp_body(2.0 * y) + 1.0);
        *o = 0.5 * x * (1.0 + t) * uv;
    }
}

/// Sums 16 lanes pairwise (a fixed tree, so the result does not depend on the ISA).
#[inline(always)]
fn reduce16(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

/// [`dot_body`] on AVX-512 with the same arithmetic (per-lane fused multiply-adds in order,
/// then [`reduce16`]'s tree, then the tail), written out because LLVM compiled the portable
/// loop into 2-wide pieces, which made attention scores the slowest part of a batched step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[inline]
unsafe fn dot512(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let full = n / LANES * LANES;
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i < full {
        acc = _mm512_fmadd_ps(
            _mm512_loadu_ps(a.as_ptr().add(i)),
            _mm512_loadu_ps(b.as_ptr().add(i)),
            acc,
        );
        i += LANES;
    }
    let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    let h8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi8);
    let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
    let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    let mut s = _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
    for j in full..n {
        s = a[j].mul_add(b[j], s);
    }
    s
}

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { dot512(a, b) };
    }
    dot_portable(a, b)
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut s = reduce16(acc);
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = x.mul_add(*y, s);
    }
    s
}

#[inline(always)]
fn rms_norm_body(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot_body(x, x);
    let r = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * r * g;
    }
}

/// The largest element (16 running maxima, then folded), `-inf` for none.
#[inline(always)]
fn max_body(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc.iter().chain(chunks.remainder()) {
        m = if *v > m { *v } else { m };
    }
    m
}

/// The sum (16 running sums, then [`reduce16`], then the tail).
#[inline(always)]
fn sum_body(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    chunks.remainder().iter().fold(reduce16(acc), |s, v| s + v)
}

#[inline(always)]
fn softmax_body(x: &mut [f32]) {
    let max = max_body(x);
    for v in x.iter_mut() {
        *v = exp_body(*v - max);
    }
    let inv = 1.0 / sum_body(x);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[inline(always)]
fn layer_norm_body(x: &mut [f32], add: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    for (v, a) in x.iter_mut().zip(add) {
        *v += a;
    }
    let n = x.len() as f32;
    let mean = sum_body(x) / n;
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] += (c[l] - mean) * (c[l] - mean);
        }
    }
    let var = chunks
        .remainder()
        .iter()
        .fold(reduce16(acc), |s, v| s + (v - mean) * (v - mean))
        / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, g), b) in x.iter_mut().zip(gamma).zip(beta) {
        *v = (*v - mean) * inv * g + b;
    }
}

#[inline(always)]
fn gelu_erf_body(x: &mut [f32]) {
    // erf by Abramowitz and Stegun's 7.1.26 (within 1.5e-7), odd in its argument.
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152_1,
        1.061_405_4,
    ];
    for v in x.iter_mut() {
        let z = v.abs() * std::f32::consts::FRAC_1_SQRT_2;
        let t = 1.0 / (1.0 + P * z);
        let poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t;
        let erf = (1.0 - poly * exp_body(-z * z)).copysign(*v);
        *v = 0.5 * *v * (1.0 + erf);
    }
}

macro_rules! multiversion {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),*) $(-> $ret:ty)? => $body:ident) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v512($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v256($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl") && is_x86_feature_detected!("fma")
                {
                    // SAFETY: the features were just detected.
                    return unsafe { v512($($arg),*) };
                }
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    // SAFETY: as above.
                    return unsafe { v256($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

multiversion! {
    /// Dot product of the common prefix of `a` and `b`.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 => dot_body
}

mod attend;
pub use attend::{attend, attend_quant, attend_rows, attend_rows_quant, KvValue, RowRun};
pub use attend::{QuantKind, QuantValues, MAX_QUANT_HEAD};

multiversion! {
    /// `x[i] = e^x[i]`, vectorized (see `exp_body` for the accuracy: within one f32 ulp of
    /// the exact value in the normal range; 0 below -87.3).
    pub fn exp_in_place(x: &mut [f32]) => exp_in_place_body
}

multiversion! {
    /// GeGLU's gate (Gemma): `out[i] = gelu_tanh(g[i]) * u[i]`.
    pub fn gelu_tanh_mul(g: &[f32], u: &[f32], out: &mut [f32]) => gelu_tanh_mul_body
}

multiversion! {
    /// SwiGLU's gate: `out[i] = silu(g[i]) * u[i]` with `silu(x) = x / (1 + e^-x)`.
    pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) => silu_mul_body
}

multiversion! {
    /// `out = x / sqrt(mean(x^2) + eps) * w`.
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) => rms_norm_body
}

multiversion! {
    /// `x = softmax(x)`: the maximum subtracted, exponentials, divided by their sum.
    pub fn softmax(x: &mut [f32]) => softmax_body
}

multiversion! {
    /// `x = LayerNorm(x + add) * gamma + beta` (mean and variance over `x`, as BERT normalises).
    pub fn layer_norm(x: &mut [f32], add: &[f32], gamma: &[f32], beta: &[f32], eps: f32) => layer_norm_body
}

multiversion! {
    /// GELU with the error function, `x / 2 * (1 + erf(x / sqrt 2))` (BERT's `gelu`), in place.
    pub fn gelu_erf(x: &mut [f32]) => gelu_erf_body
}

mod quantize;
mod rotate;
pub use quantize::{quantize_q4_0, quantize_q8_0, quantize_row, QuantRow};
pub use rotate::hadamard;

/// Rounds every element to the nearest f16 value (what an f16 KV cache keeps), ties to even, as
/// `half::f16::from_f32` does: sixteen at a time through F16C on AVX-512.
pub fn round_to_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") {
        // SAFETY: the features were just detected.
        unsafe { round_to_f16_512(x) };
        return;
    }
    for v in x {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn round_to_f16_512(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        let v = _mm512_loadu_ps(c.as_ptr());
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(h));
    }
    let rest = chunks.into_remainder();
    let mask: __mmask16 = (1u16 << rest.len()).wrapping_sub(1);
    let v = _mm512_maskz_loadu_ps(mask, rest.as_ptr());
    let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, _mm512_cvtph_ps(h));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_matches_a_two_pass_softmax() {
        // Head sizes below, at and above the 64-column register block, with a remainder.
        for hd in [24, 64, 80, 256] {
            let stride = hd + 16;
            let n = 9;
            let k: Vec<f32> = (0..n * stride)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.3 / (hd as f32 / 24.0).sqrt())
                .collect();
            let v: Vec<f32> = (0..n * stride)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.2)
                .collect();
            let q: Vec<f32> = (0..hd).map(|i| ((i % 24) as f32 - 12.0) * 0.1).collect();
            let off = 8;
            let mut out = vec![0f32; hd];
            attend(
                &q,
                hd,
                &k[off..],
                &v[off..],
                stride,
                2,
                n,
                0.5,
                false,
                &mut out,
            );
            let scores: Vec<f32> = (2..n)
                .map(|j| (0..hd).map(|d| q[d] * k[off + j * stride + d]).sum::<f32>() * 0.5)
                .collect();
            let mx = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = scores.iter().map(|s| (s - mx).exp()).collect();
            let z: f32 = e.iter().sum();
            for d in 0..hd {
                let r: f32 = (2..n).map(|j| e[j - 2] / z * v[off + j * stride + d]).sum();
                assert!((out[d] - r).abs() < 1e-5, "hd {hd}, {d}: {} vs {r}", out[d]);
            }
        }
    }

    #[test]
    fn avx512_dot_is_bit_identical_to_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            for n in [1, 15, 16, 17, 64, 100, 257] {
                let a: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
                    .collect();
                let b: Vec<f32> = (0..n)
                    .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021)
                    .collect();
                // SAFETY: the features were just detected.
                let fast = unsafe { dot512(&a, &b) };
                assert_eq!(fast.to_bits(), dot_portable(&a, &b).to_bits(), "n = {n}");
            }
        }
    }

    #[test]
    fn f16_rounded_softmax_weights_stay_close_to_exact_ones() {
        let hd = 16;
        let k: Vec<f32> = (0..20 * hd)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let v: Vec<f32> = (0..20 * hd)
            .map(|i| ((i * 3 % 7) as f32 - 3.0) * 0.5)
            .collect();
        let q: Vec<f32> = (0..hd).map(|i| i as f32 * 0.05).collect();
        let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
        attend(&q, hd, &k, &v, hd, 0, 20, 0.25, false, &mut a);
        attend(&q, hd, &k, &v, hd, 0, 20, 0.25, true, &mut b);
        for d in 0..hd {
            assert!((a[d] - b[d]).abs() < 2e-3 && a[d] != 0.0);
        }
        let mut r = vec![1.0f32 / 3.0, 65504.0, 1e-8];
        round_to_f16(&mut r);
        assert_eq!(r[0], half::f16::from_f32(1.0 / 3.0).to_f32());
        assert_eq!(r[1], 65504.0);
    }

    #[test]
    fn vectorized_exp_is_within_two_ulp_of_the_exact_value() {
        let mut x: Vec<f32> = (0..20_000).map(|i| -87.0 + i as f32 * 0.00875).collect();
        x.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, 88.29, -87.29, 0.5, -0.5]);
        let mut y = x.clone();
        exp_in_place(&mut y);
        for (&xi, &yi) in x.iter().zip(&y) {
            let exact = (xi as f64).exp();
            let ulp = (exact as f32).abs() * f32::EPSILON;
            assert!(
                ((yi as f64) - exact).abs() <= 2.0 * ulp as f64,
                "exp({xi}) = {yi}, exact {exact}"
            );
        }
        let mut big = vec![88.5f32, 1000.0, f32::INFINITY];
        exp_in_place(&mut big);
        assert!(big.iter().all(|v| v.is_finite() && *v > 1e38));
        let mut edge = vec![f32::NEG_INFINITY, -1000.0, -87.4];
        exp_in_place(&mut edge);
        assert_eq!(edge, vec![0.0, 0.0, 0.0]);
    }

    #[test]
    fn exp_reads_its_exponent_from_the_rounding_bits_exactly_as_a_cast_would() {
        // `exp_body` as it was, with `n as i32` (a saturating cast) for the exponent.
        fn by_cast(x: f32) -> f32 {
            let xc = x.clamp(-87.3, 88.3);
            let n = (xc * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
            let r = n.mul_add(-1.428_606_8e-6, n.mul_add(-0.693_145_75, xc));
            let mut p: f32 = 1.0 / 5040.0;
            for c in [
                1.0 / 720.0,
                1.0 / 120.0,
                1.0 / 24.0,
                1.0 / 6.0,
                0.5,
                1.0,
                1.0,
            ] {
                p = p.mul_add(r, c);
            }
            let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
            if x < -87.3 {
                0.0
            } else {
                p * scale
            }
        }
        // Every 1,017th bit pattern (both signs, subnormals, infinities, NaNs) and the ends.
        let specials = [f32::MAX, f32::MIN, -87.3, 88.3, 88.72, -0.0, 0.0];
        let sweep = (0..u32::MAX / 1017).map(|i| f32::from_bits(i * 1017));
        for x in sweep.chain(specials) {
            let (got, want) = (exp_body(x), by_cast(x));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "exp({x}) = {got}, by the cast {want}"
            );
        }
    }

    #[test]
    fn rounding_to_f16_in_vectors_gives_the_scalar_conversion_bit_for_bit() {
        // Every 263rd bit pattern (normal, subnormal, overflowing to infinity, ties), NaNs
        // included, in a length that leaves a remainder.
        let mut x: Vec<f32> = (0..u32::MAX / 263)
            .map(|i| f32::from_bits(i * 263))
            .collect();
        x.extend([
            65_520.0,
            65_519.99,
            -65_520.0,
            2.0f32.powi(-25),
            2.0f32.powi(-24) * 1.5,
        ]);
        let want: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        round_to_f16(&mut x);
        for (i, (g, w)) in x.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "element {i}: {g:e} against {w:e}"
            );
        }
    }

    #[test]
    fn gelu_tanh_mul_matches_the_libm_formula() {
        let g: Vec<f32> = (0..400).map(|i| (i as f32 - 200.0) * 0.05).collect();
        let u: Vec<f32> = (0..400).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
        let mut out = vec![0f32; 400];
        gelu_tanh_mul(&g, &u, &mut out);
        for i in 0..400 {
            let x = g[i];
            let r = 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh()) * u[i];
            assert!(
                (out[i] - r).abs() <= 2e-6 * r.abs().max(1.0),
                "{i}: {} vs {r}",
                out[i]
            );
        }
    }

    #[test]
    fn silu_mul_matches_the_libm_formula() {
        let g: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.37).collect();
        let u: Vec<f32> = (0..300).map(|i| 1.0 + (i % 7) as f32 * 0.5).collect();
        let mut out = vec![0f32; 300];
        silu_mul(&g, &u, &mut out);
        for i in 0..300 {
            let r = g[i] / (1.0 + (-g[i]).exp()) * u[i];
            assert!(
                (out[i] - r).abs() <= 1e-6 * r.abs().max(1.0),
                "{i}: {} vs {r}",
                out[i]
            );
        }
    }

    #[test]
    fn attention_over_a_long_context_matches_the_exact_softmax() {
        let (hd, n) = (64, 1500);
        let k: Vec<f32> = (0..n * hd)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.02)
            .collect();
        let v: Vec<f32> = (0..n * hd)
            .map(|i| ((i * 17 % 89) as f32 - 44.0) * 0.03)
            .collect();
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 - 32.0) * 0.05).collect();
        let mut out = vec![0f32; hd];
        attend(&q, hd, &k, &v, hd, 0, n, 0.125, false, &mut out);
        let s: Vec<f64> = (0..n)
            .map(|j| {
                (0..hd)
                    .map(|d| q[d] as f64 * k[j * hd + d] as f64)
                    .sum::<f64>()
                    * 0.125
            })
            .collect();
        let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
        for d in 0..hd {
            let r: f64 = (0..n)
                .map(|j| (s[j] - mx).exp() / z * v[j * hd + d] as f64)
                .sum();
            assert!((out[d] as f64 - r).abs() < 1e-5, "{d}: {} vs {r}", out[d]);
        }
    }

    #[test]
    fn rms_norm_and_dot_match_plain_loops() {
        let x: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 3.0).collect();
        let w: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.01).collect();
        let mut out = vec![0f32; 37];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 37.0;
        for i in 0..37 {
            assert!((out[i] - x[i] / (ms + 1e-5).sqrt() * w[i]).abs() < 1e-5);
        }
        let d: f32 = x.iter().zip(&w).map(|(a, b)| a * b).sum();
        assert!((dot(&x, &w) - d).abs() < 1e-4);
    }
}
