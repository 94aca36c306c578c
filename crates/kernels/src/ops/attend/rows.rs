//! Attention for a run of query rows of one sequence against one KV head: the rows of a
//! prefill chunk.
//!
//! One row at a time ([`attend`]), every query head reads all of its KV head's keys and values
//! again: at 2,048 positions a head's keys are half a megabyte, so each row streams them from
//! L2, and long prompts were bound by that, not by arithmetic. Here a tile of rows walks the
//! keys in blocks: sixteen keys are scored against every query head of every row in the tile
//! while they sit in L1, and a block of value rows is summed into every row's accumulators the
//! same way. Every score, softmax and output column is computed with exactly the operations,
//! in exactly the order, that [`attend`] uses for that row alone (scores by
//! [`crate::scores::score_keys`], the softmax by the same function, each output column summed
//! over its keys in order with one fused multiply-add each), so a row's result is bit-identical
//! to [`attend`]'s and never depends on the rows beside it. An f16 cache is widened once per
//! block for the whole tile instead of once per row.

use super::{attend, KvValue};
#[cfg(target_arch = "x86_64")]
use crate::scores::{score_transposed, transpose16};

/// Rows whose scores are held at once: their scratch (rows x heads x keys) stays in L2 next to
/// the KV head's keys and values, and each key block is reused by rows x heads query heads.
pub(super) const ROW_TILE: usize = 16;

/// Bytes of value rows summed as one block (L1-sized).
pub(super) const VALUE_BLOCK_BYTES: usize = 16 << 10;

thread_local! {
    /// Per-thread scratch: the tile's scores, one widened key block and one value block.
    static TILE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A run of query rows of one sequence that share a KV head.
#[derive(Clone, Copy, Debug)]
pub struct RowRun<'a> {
    /// Row `r`'s query heads, side by side, at `q[r * q_stride..][..heads * hd]`.
    pub q: &'a [f32],
    pub q_stride: usize,
    /// Row `r` attends keys `ranges[r].0..ranges[r].1` (empty: its output is zero).
    pub ranges: &'a [(usize, usize)],
    /// Query heads per row that share the KV head.
    pub heads: usize,
    pub hd: usize,
    pub scale: f32,
    /// Softmax weights rounded to f16 before the sum over V (as in [`attend`]).
    pub f16_weights: bool,
}

/// [`attend`] for every row of `run`: row `r`'s output (its heads side by side) goes to
/// `out[r * out_stride..][..heads * hd]`; keys and values (f32, or f16 widened as loaded) are
/// `stride` apart in `k` and `v` (the cache slices starting at the KV head's offset).
/// Bit-identical to calling [`attend`] row by row.
pub fn attend_rows<T: KvValue>(
    run: &RowRun<'_>,
    k: &[T],
    v: &[T],
    stride: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let width = run.heads * run.hd;
    let rows = run.ranges.len();
    if rows == 0 || width == 0 {
        return;
    }
    // Slicing checks what the tiles read and write through pointers; a bad run panics here as
    // `attend` would.
    let last_q = &run.q[(rows - 1) * run.q_stride..][..width];
    let last_out = &out[(rows - 1) * out_stride..][..width];
    let _ = (last_q, last_out);
    let in_cache = |&(s, e): &(usize, usize)| {
        s >= e || ((e - 1) * stride + run.hd <= k.len() && (e - 1) * stride + run.hd <= v.len())
    };
    #[cfg(target_arch = "x86_64")]
    if rows > 1
        && run.hd.is_multiple_of(64)
        && run.q_stride >= width
        && out_stride >= width
        && run.ranges.iter().all(in_cache)
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        let mut scratch = TILE.take();
        // SAFETY: the features were just detected; every query, output, key and value the
        // tiles touch was bounds-checked above (the last row's slices, every row's last key).
        unsafe { tiles512(run, k, v, stride, out, out_stride, &mut scratch) };
        TILE.set(scratch);
        return;
    }
    let _ = in_cache;
    for (r, &(start, end)) in run.ranges.iter().enumerate() {
        let (q, o) = (
            &run.q[r * run.q_stride..][..width],
            &mut out[r * out_stride..][..width],
        );
        attend(
            q,
            run.hd,
            k,
            v,
            stride,
            start,
            end,
            run.scale,
            run.f16_weights,
            o,
        );
    }
}

/// The tiled kernel. The caller checked the features, that `hd` is a multiple of 64, that rows
/// do not overlap (`q_stride`, `out_stride` at least a row's width), and that every query,
/// output, key and value read or written lies inside its slice.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn tiles512<T: KvValue>(
    run: &RowRun<'_>,
    k: &[T],
    v: &[T],
    stride: usize,
    out: &mut [f32],
    out_stride: usize,
    scratch: &mut Vec<f32>,
) {
    use std::arch::x86_64::*;
    let RowRun {
        q,
        q_stride,
        ranges,
        heads,
        hd,
        scale,
        f16_weights,
    } = *run;
    let width = heads * hd;
    let nmax = ranges
        .iter()
        .map(|&(s, e)| e.saturating_sub(s))
        .max()
        .unwrap_or(0);
    let value_keys = (VALUE_BLOCK_BYTES / (4 * hd)).max(16);
    let tile_scores = ROW_TILE * heads * nmax;
    let need = tile_scores + 16 * hd + value_keys * hd;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (scores, rest) = scratch.split_at_mut(tile_scores);
    let (kbuf, vbuf) = rest.split_at_mut(16 * hd);
    let scale_v = _mm512_set1_ps(scale);
    let outp = out.as_mut_ptr();

    for t0 in (0..ranges.len()).step_by(ROW_TILE) {
        let tile = &ranges[t0..(t0 + ROW_TILE).min(ranges.len())];
        for r in 0..tile.len() {
            std::slice::from_raw_parts_mut(outp.add((t0 + r) * out_stride), width).fill(0.0);
        }
        let Some((lo, hi)) = keys_of(tile) else {
            continue;
        };
        // Scores: sixteen keys transposed once, then scored against every query head of every
        // row that attends any of them, four heads at a time.
        let mut kb = lo;
        while kb < hi {
            let count = (hi - kb).min(16);
            let kp = k.as_ptr() as *const u8;
            if T::F16 {
                transpose16::<true>(kp, stride, kb, count, hd, kbuf.as_mut_ptr());
            } else {
                transpose16::<false>(kp, stride, kb, count, hd, kbuf.as_mut_ptr());
            }
            let kt = kbuf.as_ptr();
            let mut qs = [std::ptr::null::<f32>(); 4];
            let mut dst = [std::ptr::null_mut::<f32>(); 4];
            let mut mask = [0u16; 4];
            let mut n = 0;
            for (r, &(s, e)) in tile.iter().enumerate() {
                let (a, b) = (kb.max(s), (kb + count).min(e));
                if a >= b {
                    continue;
                }
                let keys = (((1u32 << (b - kb)) - 1) & !((1u32 << (a - kb)) - 1)) as u16;
                for g in 0..heads {
                    qs[n] = q.as_ptr().add((t0 + r) * q_stride + g * hd);
                    // Lane `i` is key `kb + i`, at `kb + i - s` in the row's scores; the lanes
                    // before `a` (which that would put before the row) are masked out.
                    dst[n] = scores
                        .as_mut_ptr()
                        .wrapping_add((r * heads + g) * nmax + kb)
                        .wrapping_sub(s);
                    mask[n] = keys;
                    n += 1;
                    if n == 4 {
                        score4(qs, hd, kt, scale_v, dst, mask);
                        n = 0;
                    }
                }
            }
            for i in 0..n {
                score_transposed::<1, 0>([qs[i]], hd, kt, scale_v, [dst[i]], [mask[i]]);
            }
            kb += count;
        }
        softmax_tile(tile, heads, nmax, scores, f16_weights);
        // The sum over V, a block of value rows at a time into every row's accumulators.
        let sums = TileSums {
            ranges: tile,
            scores: scores.as_ptr(),
            nmax,
            heads,
            hd,
            out: outp.add(t0 * out_stride),
            out_stride,
        };
        add_values(&sums, (lo, hi), value_keys, |vb, count| {
            match T::as_f32(v) {
                Some(v32) => (v32.as_ptr(), stride, 0),
                None => {
                    T::widen_rows(v, vb, count, stride, hd, vbuf);
                    (vbuf.as_ptr(), hd, vb)
                }
            }
        });
    }
}

/// Adds the tile's weighted sums over value rows `lo..hi`, `block` rows at a time:
/// `values(vb, count)` readies rows `vb..vb + count` as f32 and says where they are
/// (`(base, stride, first)`: row `j` at `base + (j - first) * stride`). Inlined into the
/// calling kernel, which checked every pointer's reach.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn add_values(
    sums: &TileSums<'_>,
    (lo, hi): (usize, usize),
    block: usize,
    mut values: impl FnMut(usize, usize) -> (*const f32, usize, usize),
) {
    let mut vb = lo;
    while vb < hi {
        let count = (hi - vb).min(block);
        let (base, stride, first) = values(vb, count);
        add_value_block(sums, base, stride, first, vb, count);
        vb += count;
    }
}

/// The keys a tile of rows attends, first to last (`None` if none attends any).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn keys_of(tile: &[(usize, usize)]) -> Option<(usize, usize)> {
    let live = tile.iter().filter(|&&(s, e)| s < e);
    Some((live.clone().map(|r| r.0).min()?, live.map(|r| r.1).max()?))
}

/// The softmax of every head of every row of a tile, in place: row `r`'s head `g`'s scores at
/// `scores[(r * heads + g) * nmax..]`, as many as the row attends. Inlined, so that the
/// exponentials are compiled for the calling kernel's features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn softmax_tile(
    tile: &[(usize, usize)],
    heads: usize,
    nmax: usize,
    scores: &mut [f32],
    f16_weights: bool,
) {
    for (r, &(s, e)) in tile.iter().enumerate() {
        for g in 0..heads {
            let at = (r * heads + g) * nmax;
            super::softmax_in_place(&mut scores[at..at + e.saturating_sub(s)], f16_weights);
        }
    }
}

/// A tile of rows' softmax weights and outputs, as [`add_value_block`] reads and writes them.
#[cfg(target_arch = "x86_64")]
pub(super) struct TileSums<'a> {
    /// The tile's rows' key ranges.
    pub ranges: &'a [(usize, usize)],
    /// Row `r`'s head `g`'s weight of key `j` at `scores[(r * heads + g) * nmax + j - start]`.
    pub scores: *const f32,
    pub nmax: usize,
    pub heads: usize,
    pub hd: usize,
    /// Row `r`'s heads side by side at `out + r * out_stride`.
    pub out: *mut f32,
    pub out_stride: usize,
}

/// Adds to each row of the tile its weighted sum over value rows `vb..vb + count` that it
/// attends (value row `j` at `base + (j - first) * vstride`, f32), 64 columns and up to four
/// heads at a time: each column's keys in order, one fused multiply-add each, as [`attend`]
/// sums them. `hd` is a multiple of 64; the caller checked every pointer's reach.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn add_value_block(
    t: &TileSums<'_>,
    base: *const f32,
    vstride: usize,
    first: usize,
    vb: usize,
    count: usize,
) {
    let (heads, hd, nmax) = (t.heads, t.hd, t.nmax);
    for (r, &(s, e)) in t.ranges.iter().enumerate() {
        let (a, b) = (vb.max(s), (vb + count).min(e));
        if a >= b {
            continue;
        }
        let row_out = t.out.add(r * t.out_stride);
        let weights = t.scores.add(r * heads * nmax + (a - s));
        for c0 in (0..hd).step_by(64) {
            let values = base.add((a - first) * vstride + c0);
            let mut g0 = 0;
            while g0 < heads {
                let w = weights.add(g0 * nmax);
                let o = row_out.add(g0 * hd + c0);
                g0 += match heads - g0 {
                    1 => sum_values::<1>(w, nmax, values, vstride, b - a, o, hd),
                    2 => sum_values::<2>(w, nmax, values, vstride, b - a, o, hd),
                    3 => sum_values::<3>(w, nmax, values, vstride, b - a, o, hd),
                    _ => sum_values::<4>(w, nmax, values, vstride, b - a, o, hd),
                };
            }
        }
    }
}

/// Four query heads against a transposed key block, unrolled for the common head sizes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn score4(
    q: [*const f32; 4],
    hd: usize,
    kt: *const f32,
    scale_v: std::arch::x86_64::__m512,
    dst: [*mut f32; 4],
    mask: [u16; 4],
) {
    match hd {
        64 => score_transposed::<4, 4>(q, hd, kt, scale_v, dst, mask),
        128 => score_transposed::<4, 8>(q, hd, kt, scale_v, dst, mask),
        256 => score_transposed::<4, 16>(q, hd, kt, scale_v, dst, mask),
        _ => score_transposed::<4, 0>(q, hd, kt, scale_v, dst, mask),
    }
}

/// Adds `sum_j w_g[j] * values[j]` over `n` keys to 64 output columns of `G` heads: head `g`'s
/// weights at `w + g * w_stride`, its columns at `out + g * out_stride`; value row `j` at
/// `values + j * v_stride`. One fused multiply-add per key and column, keys in order, onto the
/// columns' running sums: what [`super::weighted_sum`] does over the same keys. Returns `G`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum_values<const G: usize>(
    w: *const f32,
    w_stride: usize,
    values: *const f32,
    v_stride: usize,
    n: usize,
    out: *mut f32,
    out_stride: usize,
) -> usize {
    use std::arch::x86_64::*;
    let mut acc: [[__m512; 4]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|u| _mm512_loadu_ps(out.add(g * out_stride + 16 * u)))
    });
    for j in 0..n {
        let row = values.add(j * v_stride);
        let x: [__m512; 4] = std::array::from_fn(|u| _mm512_loadu_ps(row.add(16 * u)));
        for (g, acc_g) in acc.iter_mut().enumerate() {
            let wj = _mm512_set1_ps(*w.add(g * w_stride + j));
            for (a, &xu) in acc_g.iter_mut().zip(&x) {
                *a = _mm512_fmadd_ps(wj, xu, *a);
            }
        }
    }
    for (g, acc_g) in acc.iter().enumerate() {
        for (u, a) in acc_g.iter().enumerate() {
            _mm512_storeu_ps(out.add(g * out_stride + 16 * u), *a);
        }
    }
    G
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 - 1001.0) / 700.0)
            .collect()
    }

    /// `attend_rows` against `attend` row by row, bit for bit, for one shape.
    fn check(hd: usize, heads: usize, ranges: &[(usize, usize)], f16: bool, f16_weights: bool) {
        let kv_heads = 2;
        let stride = kv_heads * hd;
        let keys = ranges.iter().map(|r| r.1).max().unwrap_or(0).max(1);
        let k = data(keys * stride, 1);
        let v = data(keys * stride, 2);
        let width = heads * hd;
        let q_stride = width + 8;
        let q = data(ranges.len() * q_stride, 3);
        let out_stride = width + 24;
        let run = RowRun {
            q: &q,
            q_stride,
            ranges,
            heads,
            hd,
            scale: 0.125,
            f16_weights,
        };
        // The second KV head, so offsets into the cache are exercised.
        let (k1, v1) = (&k[hd..], &v[hd..]);
        let mut tiled = vec![f32::NAN; ranges.len() * out_stride];
        let mut alone = tiled.clone();
        if f16 {
            let k16: Vec<half::f16> = k1.iter().map(|&x| half::f16::from_f32(x)).collect();
            let v16: Vec<half::f16> = v1.iter().map(|&x| half::f16::from_f32(x)).collect();
            attend_rows(&run, &k16, &v16, stride, &mut tiled, out_stride);
            for (r, &(s, e)) in ranges.iter().enumerate() {
                let qr = &q[r * q_stride..][..width];
                let o = &mut alone[r * out_stride..][..width];
                attend(qr, hd, &k16, &v16, stride, s, e, 0.125, f16_weights, o);
            }
        } else {
            attend_rows(&run, k1, v1, stride, &mut tiled, out_stride);
            for (r, &(s, e)) in ranges.iter().enumerate() {
                let qr = &q[r * q_stride..][..width];
                let o = &mut alone[r * out_stride..][..width];
                attend(qr, hd, k1, v1, stride, s, e, 0.125, f16_weights, o);
            }
        }
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for r in 0..ranges.len() {
            let (a, b) = (
                &tiled[r * out_stride..][..width],
                &alone[r * out_stride..][..width],
            );
            assert_eq!(
                bits(a),
                bits(b),
                "hd {hd} heads {heads} row {r} of {ranges:?} f16 {f16} f16_weights {f16_weights}"
            );
        }
        // Past each row's width the output is untouched.
        for r in 0..ranges.len() {
            assert!(tiled[r * out_stride + width..][..out_stride - width]
                .iter()
                .all(|x| x.is_nan()));
        }
    }

    #[test]
    fn rows_together_equal_rows_alone_bit_for_bit() {
        // A causal prefill chunk continuing a cache, across several row tiles.
        let causal: Vec<(usize, usize)> = (40..61).map(|p| (0, p + 1)).collect();
        // A sliding window of 24 keys, and rows with nothing to attend.
        let window: Vec<(usize, usize)> = (30..45).map(|p| ((p + 1 - 24), p + 1)).collect();
        let ragged = [(5, 5), (0, 1), (3, 40), (0, 0), (17, 18), (0, 70)];
        for hd in [64, 128, 256, 80] {
            for heads in 1..=5 {
                for ranges in [&causal[..], &window[..], &ragged[..], &causal[..2]] {
                    check(hd, heads, ranges, false, false);
                }
            }
        }
        for f16_weights in [false, true] {
            check(64, 3, &causal, true, f16_weights);
            check(256, 4, &window, true, f16_weights);
            check(64, 3, &ragged, false, f16_weights);
        }
    }

    #[test]
    fn a_run_whose_keys_pass_the_cache_is_refused() {
        let k = vec![0.5f32; 64 * 4];
        let run = RowRun {
            q: &[0.1; 128],
            q_stride: 64,
            ranges: &[(0, 4), (0, 5)],
            heads: 1,
            hd: 64,
            scale: 1.0,
            f16_weights: false,
        };
        let mut out = vec![0.0; 128];
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            attend_rows(&run, &k, &k, 64, &mut out, 64)
        }));
        assert!(caught.is_err(), "read a key past the cache");
    }
}
