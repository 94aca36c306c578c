//! Attention over a contiguous KV cache: the query heads that share one KV head (grouped-query
//! attention) against that head's keys and values.
//!
//! Per head: the scores once into a scratch (sixteen keys at a time on AVX-512, see
//! [`crate::scores`]), the softmax over them, then the weighted sum of V. The heads of a group
//! are summed over V together, up to four at a time: each value row is loaded once for all of
//! them, and their 4 x 4 accumulator vectors are independent chains, where one head alone waits
//! on its four FMA chains' latency at every key. Each output column still sums its keys in
//! order with one fused multiply-add each, exactly as one head alone would, so the result of a
//! head does not depend on the heads beside it.

use half::slice::HalfFloatSliceExt;

use super::{dot_body, exp_in_place_body, reduce16, LANES};

mod quant;
mod rows;
pub use quant::{attend_quant, attend_rows_quant, QuantKind, QuantValues, MAX_QUANT_HEAD};
pub use rows::{attend_rows, RowRun};

thread_local! {
    /// Per-thread score scratch: grows to the most heads x the longest context seen, then is
    /// reused, so the decode step allocates nothing once warm.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Attention for the `q.len() / head_dim` query heads side by side in `q` (and in `out`) that
/// share one KV head: for each, `out = softmax(scale * q . K[j]) V[j]` over `j in start..end`,
/// where key `j` is `k[j * stride..][..head_dim]` and value `j` likewise in `v` (pass the cache
/// slices starting at the KV head's offset). The cache holds f32, or f16 (`kv_precision =
/// "f16"`, half the bytes to read) widened as it is loaded, so an f16 cache gives the bits an
/// f32 cache holding the same values gives. Numerically stable (max subtracted); each score is
/// computed once. With `f16_weights` the softmax weights are rounded to f16 before the sum over
/// V, as llama.cpp does with its default f16 KV cache. A head's result is the same, bit for bit,
/// whether it is passed alone or with others.
#[allow(clippy::too_many_arguments)]
pub fn attend<T: KvValue>(
    q: &[f32],
    head_dim: usize,
    k: &[T],
    v: &[T],
    stride: usize,
    start: usize,
    end: usize,
    scale: f32,
    f16_weights: bool,
    out: &mut [f32],
) {
    if head_dim == 0 {
        return;
    }
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        let need = end.saturating_sub(start) * (q.len() / head_dim);
        if scores.len() < need {
            scores.resize(need, 0.0);
        }
        (T::ATTEND_MV)(
            q,
            head_dim,
            k,
            v,
            stride,
            start,
            end,
            scale,
            f16_weights,
            &mut scores,
            out,
        )
    });
}

multiversion! {
    fn attend_mv(q: &[f32], hd: usize, k: &[f32], v: &[f32], stride: usize, start: usize, end: usize, scale: f32, f16_weights: bool, scores: &mut [f32], out: &mut [f32]) => attend_body
}

multiversion! {
    fn attend_f16_mv(q: &[f32], hd: usize, k: &[half::f16], v: &[half::f16], stride: usize, start: usize, end: usize, scale: f32, f16_weights: bool, scores: &mut [f32], out: &mut [f32]) => attend_body
}

/// [`attend`]'s body for one cache value type, with its score scratch.
#[doc(hidden)]
pub type AttendFn<T> =
    fn(&[f32], usize, &[T], &[T], usize, usize, usize, f32, bool, &mut [f32], &mut [f32]);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// What a KV cache holds: f32 values, or f16 ones widened as they are read. Implemented for
/// `f32` and `half::f16` only; the methods are the kernels' own.
pub trait KvValue: Copy + sealed::Sealed {
    /// Whether the cache holds f16 (widened as read).
    #[doc(hidden)]
    const F16: bool;
    /// [`attend`]'s body, compiled for this CPU's vector width.
    #[doc(hidden)]
    const ATTEND_MV: AttendFn<Self>;
    #[doc(hidden)]
    /// One key's score, unscaled.
    fn dot(q: &[f32], row: &[Self]) -> f32;
    #[doc(hidden)]
    fn widen(self) -> f32;
    #[doc(hidden)]
    /// The cache itself when it holds f32 (read in place), or `None` (widen before reading).
    fn as_f32(x: &[Self]) -> Option<&[f32]>;
    #[doc(hidden)]
    /// `src` as f32 into `dst` (the same length).
    fn widen_slice(src: &[Self], dst: &mut [f32]);
    #[doc(hidden)]
    /// Rows `first..first + count` (each `hd` values, `stride` apart in `x`) as f32 into `buf`,
    /// `hd` apart.
    #[inline(always)]
    fn widen_rows(
        x: &[Self],
        first: usize,
        count: usize,
        stride: usize,
        hd: usize,
        buf: &mut [f32],
    ) {
        for (i, row) in buf.chunks_exact_mut(hd).take(count).enumerate() {
            let at = (first + i) * stride;
            Self::widen_slice(&x[at..at + hd], row);
        }
    }
    #[doc(hidden)]
    /// Values `at..at + 64` as f32: themselves, or widened into `buf`.
    fn row64<'a>(v: &'a [Self], at: usize, buf: &'a mut [f32; 64]) -> &'a [f32];
    #[doc(hidden)]
    /// The leading 64-column blocks of [`weighted_sum`] done by a kernel of this element's own;
    /// returns the columns done.
    #[allow(clippy::too_many_arguments)]
    fn weighted_blocks<const G: usize>(
        _ws: &[f32],
        _n: usize,
        _v: &[Self],
        _stride: usize,
        _start: usize,
        _hd: usize,
        _out: &mut [f32],
    ) -> usize {
        0
    }
}

impl KvValue for f32 {
    const F16: bool = false;
    const ATTEND_MV: AttendFn<f32> = attend_mv;
    #[inline(always)]
    fn dot(q: &[f32], row: &[f32]) -> f32 {
        dot_body(q, row)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn as_f32(x: &[f32]) -> Option<&[f32]> {
        Some(x)
    }
    #[inline(always)]
    fn widen_slice(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn row64<'a>(v: &'a [f32], at: usize, _buf: &'a mut [f32; 64]) -> &'a [f32] {
        &v[at..at + 64]
    }
}

impl KvValue for half::f16 {
    const F16: bool = true;
    const ATTEND_MV: AttendFn<half::f16> = attend_f16_mv;
    #[inline(always)]
    fn dot(q: &[f32], row: &[half::f16]) -> f32 {
        let mut buf = [0f32; 64];
        let mut wide = Vec::new();
        let row32: &mut [f32] = if row.len() <= buf.len() {
            &mut buf[..row.len()]
        } else {
            wide.resize(row.len(), 0.0);
            &mut wide
        };
        Self::widen_slice(row, row32);
        dot_body(q, row32)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn as_f32(_: &[half::f16]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn widen_slice(src: &[half::f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn row64<'a>(v: &'a [half::f16], at: usize, buf: &'a mut [f32; 64]) -> &'a [f32] {
        Self::widen_slice(&v[at..at + 64], buf);
        buf
    }
    #[inline(always)]
    fn weighted_blocks<const G: usize>(
        ws: &[f32],
        n: usize,
        v: &[half::f16],
        stride: usize,
        start: usize,
        hd: usize,
        out: &mut [f32],
    ) -> usize {
        #[cfg(target_arch = "x86_64")]
        if hd >= 64
            && (start + n - 1) * stride + hd <= v.len()
            && ws.len() >= G * n
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were just detected; every value read lies within `v`
            // (checked above), every weight within `ws` and every write within `out`'s `G * hd`.
            unsafe { weighted_sum_f16_512::<G>(ws, n, v, stride, start, hd, out) };
            return hd / 64 * 64;
        }
        let _ = (ws, n, v, stride, start, hd, out);
        0
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body<T: KvValue>(
    q: &[f32],
    hd: usize,
    k: &[T],
    v: &[T],
    stride: usize,
    start: usize,
    end: usize,
    scale: f32,
    f16_weights: bool,
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
    let scores = &mut scores[..heads * n];
    for (qh, sc) in q.chunks_exact(hd).zip(scores.chunks_exact_mut(n)) {
        softmax_weights(qh, k, stride, start, scale, f16_weights, sc);
    }
    let mut h0 = 0;
    while h0 < heads {
        let ws = &scores[h0 * n..];
        let o = &mut out[h0 * hd..];
        h0 += match heads - h0 {
            1 => weighted_sum::<1, T>(ws, n, v, stride, start, hd, o),
            2 => weighted_sum::<2, T>(ws, n, v, stride, start, hd, o),
            3 => weighted_sum::<3, T>(ws, n, v, stride, start, hd, o),
            _ => weighted_sum::<4, T>(ws, n, v, stride, start, hd, o),
        };
    }
}

/// The softmax weights of one head over keys `start..start + w.len()`, into `w`.
#[inline(always)]
fn softmax_weights<T: KvValue>(
    q: &[f32],
    k: &[T],
    stride: usize,
    start: usize,
    scale: f32,
    f16_weights: bool,
    w: &mut [f32],
) {
    let hd = q.len();
    if !crate::scores::block_scores(q, k, stride, start, scale, w) {
        for (s, j) in w.iter_mut().zip(start..) {
            *s = T::dot(q, &k[j * stride..j * stride + hd]) * scale;
        }
    }
    softmax_in_place(w, f16_weights);
}

/// Turns scores into softmax weights in place (maximum subtracted, then normalized).
#[inline(always)]
fn softmax_in_place(w: &mut [f32], f16_weights: bool) {
    // The maximum over 16 lanes, then across them (the maximum does not depend on the order).
    let mut mx = [f32::NEG_INFINITY; LANES];
    let mut chunks = w.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &s in mx.iter().chain(chunks.remainder()) {
        m = if s > m { s } else { m };
    }
    for s in w.iter_mut() {
        *s -= m;
    }
    exp_in_place_body(w);
    let mut acc = [0f32; LANES];
    let mut chunks = w.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    let mut total = reduce16(acc);
    for &s in chunks.remainder() {
        total += s;
    }
    let inv = 1.0 / total;
    for s in w.iter_mut() {
        *s *= inv;
    }
    if f16_weights {
        super::round_to_f16(w);
    }
}

/// Keys ahead of the one being summed whose value rows are prefetched: a long context's rows
/// come from L2 (one head's rows are a stride apart, which the hardware prefetcher followed
/// too late).
const PREFETCH_KEYS: usize = 8;

/// Hints the 64 values of `x` from `at` (if inside `x`) into L1.
#[inline(always)]
fn prefetch<T>(x: &[T], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if at + 64 <= x.len() {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = x[at..].as_ptr() as *const i8;
        // SAFETY: a prefetch never faults and reads nothing architecturally; every address is
        // inside `x` anyway.
        unsafe {
            for line in 0..64 * std::mem::size_of::<T>() / 64 {
                _mm_prefetch::<_MM_HINT_T0>(p.add(64 * line));
            }
        }
    }
}

/// The weighted sum of V for `G` heads at once: head `g`'s weights are `ws[g * n..][..n]`, its
/// output `out[g * hd..][..hd]`. 64 output columns at a time held in registers (four 16-lane
/// accumulators per head); each column sums its keys in order, one fused multiply-add each, so
/// f16 values give the bits their f32 values would. Returns `G`.
#[inline(always)]
fn weighted_sum<const G: usize, T: KvValue>(
    ws: &[f32],
    n: usize,
    v: &[T],
    stride: usize,
    start: usize,
    hd: usize,
    out: &mut [f32],
) -> usize {
    let mut c0 = T::weighted_blocks::<G>(ws, n, v, stride, start, hd, out);
    if c0 == hd {
        // All done by the element's own kernel: skipping the setup below keeps an f16 prefill
        // as fast as a separate function was (it measured 15% slower without this).
        return G;
    }
    let w: [&[f32]; G] = std::array::from_fn(|g| &ws[g * n..(g + 1) * n]);
    let mut buf = [0f32; 64];
    while c0 + 64 <= hd {
        let mut acc = [[[0f32; LANES]; 4]; G];
        for (idx, j) in (start..start + n).enumerate() {
            prefetch(v, (j + PREFETCH_KEYS) * stride + c0);
            let vr = T::row64(v, j * stride + c0, &mut buf);
            for (acc_g, w_g) in acc.iter_mut().zip(&w) {
                let wj = w_g[idx];
                for (u, acc_u) in acc_g.iter_mut().enumerate() {
                    for (l, a) in acc_u.iter_mut().enumerate() {
                        *a = wj.mul_add(vr[LANES * u + l], *a);
                    }
                }
            }
        }
        for (g, acc_g) in acc.iter().enumerate() {
            for (u, acc_u) in acc_g.iter().enumerate() {
                let at = g * hd + c0 + LANES * u;
                out[at..at + LANES].copy_from_slice(acc_u);
            }
        }
        c0 += 64;
    }
    for (g, w_g) in w.iter().enumerate() {
        for d in c0..hd {
            let o = &mut out[g * hd + d];
            for (&wj, j) in w_g.iter().zip(start..) {
                *o = wj.mul_add(v[j * stride + d].widen(), *o);
            }
        }
    }
    G
}

/// The 64-column blocks of [`weighted_sum`] over f16 values on AVX-512 (it does the rest).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code)]
unsafe fn weighted_sum_f16_512<const G: usize>(
    ws: &[f32],
    n: usize,
    v: &[half::f16],
    stride: usize,
    start: usize,
    hd: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let vp = v.as_ptr() as *const u16;
    let mut c0 = 0;
    while c0 + 64 <= hd {
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        for idx in 0..n {
            let j = start + idx;
            let row = vp.add(j * stride + c0);
            let pre = (j + PREFETCH_KEYS) * stride + c0;
            if pre + 64 <= v.len() {
                _mm_prefetch::<_MM_HINT_T0>(vp.add(pre) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(vp.add(pre + 32) as *const i8);
            }
            let vr: [__m512; 4] = std::array::from_fn(|u| {
                _mm512_cvtph_ps(_mm256_loadu_si256(row.add(16 * u) as *const __m256i))
            });
            for (g, acc_g) in acc.iter_mut().enumerate() {
                let wj = _mm512_set1_ps(*ws.get_unchecked(g * n + idx));
                for (a, &x) in acc_g.iter_mut().zip(&vr) {
                    *a = _mm512_fmadd_ps(wj, x, *a);
                }
            }
        }
        for (g, acc_g) in acc.iter().enumerate() {
            for (u, a) in acc_g.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(g * hd + c0 + 16 * u), *a);
            }
        }
        c0 += 64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_f16_cache_attends_as_the_same_values_in_f32_bit_for_bit() {
        for hd in [24, 64, 96, 128] {
            let stride = 2 * hd + 16;
            let keys = 150;
            let k16: Vec<half::f16> = (0..keys * stride)
                .map(|i| {
                    half::f16::from_f32(
                        ((i * 7 % 13) as f32 - 6.0) * 0.3 / (hd as f32 / 24.0).sqrt(),
                    )
                })
                .collect();
            let v16: Vec<half::f16> = (0..keys * stride)
                .map(|i| half::f16::from_f32(((i * 5 % 11) as f32 - 5.0) * 0.2))
                .collect();
            let (k, v): (Vec<f32>, Vec<f32>) = (
                k16.iter().map(|x| x.to_f32()).collect(),
                v16.iter().map(|x| x.to_f32()).collect(),
            );
            for heads in 1..=5 {
                let q: Vec<f32> = (0..heads * hd)
                    .map(|i| ((i * 31 % 29) as f32 - 14.0) * 0.05)
                    .collect();
                for (start, end) in [(0, 1), (3, 20), (0, keys), (149, keys)] {
                    for f16w in [false, true] {
                        let mut a = vec![f32::NAN; heads * hd];
                        let mut b = vec![f32::NAN; heads * hd];
                        attend(
                            &q,
                            hd,
                            &k[8..],
                            &v[8..],
                            stride,
                            start,
                            end,
                            0.3,
                            f16w,
                            &mut a,
                        );
                        attend(
                            &q,
                            hd,
                            &k16[8..],
                            &v16[8..],
                            stride,
                            start,
                            end,
                            0.3,
                            f16w,
                            &mut b,
                        );
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&a),
                            bits(&b),
                            "hd {hd} heads {heads} keys {start}..{end}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn heads_together_give_each_head_what_it_gets_alone_bit_for_bit() {
        // Head sizes below, at and above the 64-column block, with a remainder; 1 to 7 heads
        // (so every group size 1..=4 of the sum over V runs); short and long contexts.
        for hd in [24, 64, 96, 128] {
            let stride = 2 * hd + 16;
            let keys = 150;
            let k: Vec<f32> = (0..keys * stride)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.3 / (hd as f32 / 24.0).sqrt())
                .collect();
            let v: Vec<f32> = (0..keys * stride)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.2)
                .collect();
            for heads in 1..=7 {
                let q: Vec<f32> = (0..heads * hd)
                    .map(|i| ((i * 31 % 29) as f32 - 14.0) * 0.05)
                    .collect();
                for (start, end) in [(0, 1), (3, 20), (0, keys), (149, keys)] {
                    for f16 in [false, true] {
                        let run = |q: &[f32], out: &mut [f32]| {
                            let (k, v) = (&k[8..], &v[8..]);
                            attend(q, hd, k, v, stride, start, end, 0.3, f16, out)
                        };
                        let mut together = vec![f32::NAN; heads * hd];
                        run(&q, &mut together);
                        for h in 0..heads {
                            let mut alone = vec![f32::NAN; hd];
                            run(&q[h * hd..(h + 1) * hd], &mut alone);
                            let got: Vec<u32> = together[h * hd..(h + 1) * hd]
                                .iter()
                                .map(|x| x.to_bits())
                                .collect();
                            let want: Vec<u32> = alone.iter().map(|x| x.to_bits()).collect();
                            assert_eq!(
                                got, want,
                                "hd {hd} heads {heads} head {h} keys {start}..{end}"
                            );
                        }
                    }
                }
            }
        }
    }
}
