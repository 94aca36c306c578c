//! Dense matrix products in bfloat16 with f32 accumulation, for the encoder models (BERT-family
//! embedders): `out = x W^T (+ bias)` with `W` rounded to bf16 once at load and each row of `x`
//! rounded to bf16 as it is used, every product summed in f32. On AVX-512 BF16 (`vdpbf16ps`:
//! sixteen pairs of products a lane per instruction, twice the f32 FMA's work) the tiles hold
//! 4 rows x 64 columns of accumulators; elsewhere a scalar path computes the same sums.
//!
//! Each output element is its row's pairs summed in order over `k` (pairs summed first, as the
//! instruction does), so a row's result does not depend on the rows beside it: an input embedded
//! alone or in a batch gets the same bits.

// The SIMD tiles are `unsafe` intrinsics behind a run-time feature check.
#![allow(unsafe_code)]

use crate::pool::ThreadPool;

/// Output columns per packed block (one 512-bit register of f32).
const BLOCK: usize = 16;
/// Blocks per tile: 64 columns.
const BLOCKS: usize = 4;
/// Rows per tile.
const ROWS: usize = 4;
/// Rows per chunk of work.
const ROW_BLOCK: usize = 128;

/// A weight matrix (`rows` outputs x `cols` inputs) in bf16, packed for the tiles: blocks of 16
/// rows, and in each the pairs of consecutive inputs of the 16 rows side by side, as `u32`
/// (the first of the pair in the low half). Rows are padded to a whole block and columns to an
/// even count with zeros.
#[derive(Debug, Clone)]
pub struct Bf16Matrix {
    rows: usize,
    cols: usize,
    /// Pairs of columns.
    kp: usize,
    packed: Vec<u32>,
}

/// `x` rounded to the nearest bf16 (ties to even), as its 16 bits.
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 a bf16 stands for.
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

impl Bf16Matrix {
    /// `w` (`rows` x `cols`, row-major f32) rounded and packed.
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Bf16Matrix {
        assert_eq!(w.len(), rows * cols, "a {rows} x {cols} matrix");
        let kp = cols.div_ceil(2);
        let blocks = rows.div_ceil(BLOCK);
        let mut packed = vec![0u32; blocks * kp * BLOCK];
        let at = |r: usize, c: usize| {
            if r < rows && c < cols {
                u32::from(to_bf16(w[r * cols + c]))
            } else {
                0
            }
        };
        for b in 0..blocks {
            for p in 0..kp {
                for lane in 0..BLOCK {
                    let r = b * BLOCK + lane;
                    packed[(b * kp + p) * BLOCK + lane] = at(r, 2 * p) | (at(r, 2 * p + 1) << 16);
                }
            }
        }
        Bf16Matrix {
            rows,
            cols,
            kp,
            packed,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Weight `(r, c)` as stored.
    fn pair(&self, r: usize, p: usize) -> u32 {
        self.packed[((r / BLOCK) * self.kp + p) * BLOCK + r % BLOCK]
    }
}

/// Whether this CPU runs the bf16 tiles (AVX-512 with BF16): where it does not, the products
/// take the scalar path, at f32 speed or less.
pub fn bf16_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Each row of `x` (`n` rows of `w.cols()`) as bf16 pairs, `kp` a row.
fn pairs(x: &[f32], n: usize, cols: usize, kp: usize) -> Vec<u32> {
    let mut out = vec![0u32; n * kp];
    let simd = bf16_simd();
    for (row, dst) in x.chunks_exact(cols).zip(out.chunks_exact_mut(kp)) {
        #[cfg(target_arch = "x86_64")]
        let done = if simd {
            // SAFETY: the features were just detected; `row` holds `2 * done` floats and
            // `dst` `done` pairs at least.
            unsafe { x86::round_pairs(row, dst) }
        } else {
            0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = {
            let _ = simd;
            0
        };
        for (p, d) in dst.iter_mut().enumerate().skip(done) {
            let lo = u32::from(to_bf16(row[2 * p]));
            let hi = row.get(2 * p + 1).map_or(0, |&v| u32::from(to_bf16(v)));
            *d = lo | (hi << 16);
        }
    }
    out
}

/// `out[i][j] = sum_k x[i][k] w[j][k] (+ bias[j])` for the `n` rows of `x`, in bf16 with f32
/// sums, spread over `pool` by blocks of 64 output columns (or on this thread with `None`, as a
/// task of a pool's own run must).
pub fn gemm_bf16(
    w: &Bf16Matrix,
    x: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) {
    let (m, k) = (w.rows, w.cols);
    assert_eq!(x.len(), n * k, "{n} rows of {k}");
    assert_eq!(out.len(), n * m, "{n} rows of {m}");
    if let Some(b) = bias {
        assert_eq!(b.len(), m, "a bias a column");
    }
    if n == 0 || m == 0 {
        return;
    }
    let a = pairs(x, n, k, w.kp);
    let out_ptr = SendPtr(out.as_mut_ptr());
    // Chunks of up to ROW_BLOCK rows x 64 columns, the columns of one row block first: the
    // threads share that block's activations in cache instead of each streaming all of them.
    let tiles = m.div_ceil(BLOCK * BLOCKS);
    let row_blocks = n.div_ceil(ROW_BLOCK);
    #[cfg(target_arch = "x86_64")]
    let fast = bf16_simd();
    let tile = |chunk: usize| {
        let out_ptr = &out_ptr;
        let (rb, t) = (chunk / tiles, chunk % tiles);
        let rows = rb * ROW_BLOCK..((rb + 1) * ROW_BLOCK).min(n);
        let first = t * BLOCKS;
        let blocks = (m.div_ceil(BLOCK) - first).min(BLOCKS);
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: the features were just detected; every pointer stays inside `a`, the
            // packed weights and this tile's columns of `out` (checked by the asserts above),
            // and tiles write disjoint columns.
            unsafe { x86::columns(w, &a, rows, first, blocks, bias, out_ptr.0, m) };
            return;
        }
        scalar_columns(w, &a, rows, first, blocks, bias, out_ptr.0, m);
    };
    match pool {
        Some(pool) => pool.run(row_blocks * tiles, &tile),
        None => (0..row_blocks * tiles).for_each(tile),
    }
}

struct SendPtr(*mut f32);
// SAFETY: tiles write disjoint columns of the output.
unsafe impl Sync for SendPtr {}

/// The portable path: the same pairs summed in the same order.
#[allow(clippy::too_many_arguments)]
fn scalar_columns(
    w: &Bf16Matrix,
    a: &[u32],
    rows: std::ops::Range<usize>,
    first: usize,
    blocks: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
    m: usize,
) {
    let lo = |v: u32| f32::from_bits(v << 16);
    let hi = |v: u32| f32::from_bits(v & 0xFFFF_0000);
    for i in rows {
        let row = &a[i * w.kp..][..w.kp];
        for j in first * BLOCK..((first + blocks) * BLOCK).min(m) {
            let mut sum = 0.0f32;
            for (p, &x) in row.iter().enumerate() {
                let wv = w.pair(j, p);
                sum += lo(x) * lo(wv) + hi(x) * hi(wv);
            }
            // SAFETY: `i < n` and `j < m`: inside `out` (n x m).
            unsafe { *out.add(i * m + j) = sum + bias.map_or(0.0, |b| b[j]) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Bf16Matrix, BLOCK, ROWS};

    /// The leading 16-float groups of `row` rounded to bf16 into `dst` as pairs (the same
    /// rounding as `to_bf16`); returns the pairs done.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round_pairs(row: &[f32], dst: &mut [u32]) -> usize {
        let groups = (row.len() / 16).min(dst.len() / 8);
        for g in 0..groups {
            let v = _mm512_loadu_ps(row.as_ptr().add(16 * g));
            let h: __m256bh = _mm512_cvtneps_pbh(v);
            _mm256_storeu_si256(
                dst.as_mut_ptr().add(8 * g).cast(),
                std::mem::transmute::<__m256bh, __m256i>(h),
            );
        }
        groups * 8
    }

    /// Every row of `a` against blocks `first..first + blocks` of `w`, four rows at a time.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn columns(
        w: &Bf16Matrix,
        a: &[u32],
        span: std::ops::Range<usize>,
        first: usize,
        blocks: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
        m: usize,
    ) {
        let (mut i, n) = (span.start, span.end);
        while i < n {
            let rows = (n - i).min(ROWS);
            macro_rules! go {
                ($r:literal) => {
                    match blocks {
                        4 => tile::<$r, 4>(w, a, i, first, bias, out, m),
                        3 => tile::<$r, 3>(w, a, i, first, bias, out, m),
                        2 => tile::<$r, 2>(w, a, i, first, bias, out, m),
                        _ => tile::<$r, 1>(w, a, i, first, bias, out, m),
                    }
                };
            }
            match rows {
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
            i += rows;
        }
    }

    /// Rows `i..i + R` against blocks `first..first + C`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: &Bf16Matrix,
        a: &[u32],
        i: usize,
        first: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
        m: usize,
    ) {
        let kp = w.kp;
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let wp = w.packed.as_ptr().add(first * kp * BLOCK);
        let ap = a.as_ptr().add(i * kp);
        for p in 0..kp {
            let mut wv = [_mm512_setzero_si512(); C];
            for (c, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(wp.add((c * kp + p) * BLOCK).cast());
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_epi32(*ap.add(r * kp + p) as i32);
                for (c, sum) in row.iter_mut().enumerate() {
                    *sum = _mm512_dpbf16_ps(
                        *sum,
                        std::mem::transmute::<__m512i, __m512bh>(x),
                        std::mem::transmute::<__m512i, __m512bh>(wv[c]),
                    );
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (c, sum) in row.iter().enumerate() {
                let col = (first + c) * BLOCK;
                let live = (m - col).min(BLOCK);
                let mask: __mmask16 = if live == BLOCK {
                    0xFFFF
                } else {
                    (1u16 << live) - 1
                };
                let mut v = *sum;
                if let Some(b) = bias {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, b.as_ptr().add(col)));
                }
                _mm512_mask_storeu_ps(out.add((i + r) * m + col), mask, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeded(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// The product of the bf16-rounded values, summed in f64.
    fn reference(w: &[f32], x: &[f32], n: usize, m: usize, k: usize, bias: &[f32]) -> Vec<f32> {
        let r = |v: f32| f64::from(from_bf16(to_bf16(v)));
        let mut out = vec![0.0; n * m];
        for i in 0..n {
            for j in 0..m {
                let s: f64 = (0..k).map(|c| r(x[i * k + c]) * r(w[j * k + c])).sum();
                out[i * m + j] = (s + f64::from(bias[j])) as f32;
            }
        }
        out
    }

    #[test]
    fn products_match_the_rounded_reference_and_a_row_alone_matches_it_in_a_batch() {
        let pool = ThreadPool::new(2);
        for (n, m, k) in [(1, 16, 2), (7, 70, 33), (13, 200, 384), (4, 64, 1536)] {
            let w = seeded(m * k, 1);
            let x = seeded(n * k, 2);
            let bias = seeded(m, 3);
            let packed = Bf16Matrix::from_f32(&w, m, k);
            let mut out = vec![0.0; n * m];
            gemm_bf16(&packed, &x, n, Some(&bias), &mut out, Some(&pool));
            let want = reference(&w, &x, n, m, k, &bias);
            for (g, e) in out.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{n}x{m}x{k}: {g} vs {e}"
                );
            }
            let mut scalar = vec![0.0; n * m];
            scalar_columns(
                &packed,
                &pairs(&x, n, k, packed.kp),
                0..n,
                0,
                m.div_ceil(BLOCK),
                Some(&bias),
                scalar.as_mut_ptr(),
                m,
            );
            for (g, e) in out.iter().zip(&scalar) {
                assert!(
                    (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "{n}x{m}x{k}: simd {g}, scalar {e}"
                );
            }
            let last = n - 1;
            let mut alone = vec![0.0; m];
            gemm_bf16(&packed, &x[last * k..], 1, Some(&bias), &mut alone, None);
            assert_eq!(alone, out[last * m..], "{n}x{m}x{k}: the last row alone");
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is halfway between two bf16 values: to the even one.
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3F80);
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3F82);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
    }
}
