//! [`super::attend_rows_quant`]'s tiled kernel: the rows of a prefill chunk over a quantized
//! cache together, as `attend::rows` takes them over an f32 or f16 cache.
//!
//! Row by row, every row transposed every key tile again and widened every value row again.
//! Here a tile of rows walks the keys sixteen at a time: the key tile is built once and scored
//! against every query head of every row that attends any of its keys; then a block of value
//! rows is widened once and summed into every row's accumulators. Each score, softmax and
//! output column is the arithmetic of [`super::attend_quant`] for that row alone, in its order
//! (the scores lane for lane as [`KeyTile::score`] gives them, each column summed over its keys
//! in order with one fused multiply-add each of the same widened value), so a row's bits never
//! depend on the rows beside it (`tests`).

use super::simd::{block_quants, f16_512, query_pairs, widen_block, KeyTile};
use super::{quantize_query, QuantKind, QuantValues, BLOCK, MAX_QUANT_HEAD};
use crate::ops::attend::rows::{add_values, keys_of, softmax_tile, TileSums};
use crate::ops::attend::rows::{ROW_TILE, VALUE_BLOCK_BYTES};
use crate::ops::attend::RowRun;

/// Per-thread scratch: (scores, widened values and query scales; query pairs). Grows to the
/// largest tile seen, then is reused.
type Scratch = (Vec<f32>, Vec<i32>);

thread_local! {
    static TILE: std::cell::Cell<Scratch> = const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// Whether [`tiles`] takes `run`: this CPU has the kernels, heads are whole 64-column
/// pieces, rows do not overlap, and every key and value a row attends lies in the cache.
pub(super) fn takes(
    run: &RowRun<'_>,
    k: QuantValues<'_>,
    v: QuantValues<'_>,
    stride: usize,
    out_stride: usize,
) -> bool {
    let (hd, width) = (run.hd, run.heads * run.hd);
    let in_cache = |&(s, e): &(usize, usize)| {
        s >= e || {
            let last = (e - 1) * stride;
            k.kind.quant_bytes(last + hd) <= k.q.len().min(v.q.len())
                && last / BLOCK + hd / BLOCK <= k.d.len().min(v.d.len())
        }
    };
    run.ranges.len() > 1
        && k.kind == v.kind
        && hd > 0
        && hd.is_multiple_of(64)
        && hd <= MAX_QUANT_HEAD
        && stride.is_multiple_of(BLOCK)
        && run.q_stride >= width
        && out_stride >= width
        && super::simd512()
        && is_x86_feature_detected!("avx512vl")
        && run.ranges.iter().all(in_cache)
}

/// The tiled kernel, for a run [`takes`] accepted: row `r`'s heads to
/// `out[r * out_stride..][..heads * hd]`, as [`super::attend_rows_quant`] row by row.
pub(super) fn tiles(
    run: &RowRun<'_>,
    k: QuantValues<'_>,
    v: QuantValues<'_>,
    stride: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let rows = run.ranges.len();
    let width = run.heads * run.hd;
    // The last row's query and output, by slicing; the kernel reaches no further.
    let _ = (
        &run.q[(rows - 1) * run.q_stride..][..width],
        &out[(rows - 1) * out_stride..][..width],
    );
    let mut scratch = TILE.take();
    // SAFETY: `takes` checked the features, the head's shape and every key and value read;
    // the last row's query and output were sliced above.
    unsafe {
        match k.kind {
            QuantKind::Q4_0 => tiles_512::<true>(run, k, v, stride, out, out_stride, &mut scratch),
            QuantKind::Q8_0 => tiles_512::<false>(run, k, v, stride, out, out_stride, &mut scratch),
        }
    };
    TILE.set(scratch);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(unsafe_code)]
unsafe fn tiles_512<const Q4: bool>(
    run: &RowRun<'_>,
    k: QuantValues<'_>,
    v: QuantValues<'_>,
    stride: usize,
    out: &mut [f32],
    out_stride: usize,
    (floats, pairs): &mut Scratch,
) {
    use std::arch::x86_64::*;
    let RowRun {
        q,
        q_stride,
        ranges,
        heads,
        hd,
        scale,
        ..
    } = *run;
    let width = heads * hd;
    let blocks = hd / BLOCK;
    let nmax = ranges
        .iter()
        .map(|&(s, e)| e.saturating_sub(s))
        .max()
        .unwrap_or(0);
    let value_keys = (VALUE_BLOCK_BYTES / (4 * hd)).max(16);
    let (tile_scores, queries) = (ROW_TILE * heads * nmax, ROW_TILE * heads);
    let need = tile_scores + value_keys * hd + queries * blocks;
    if floats.len() < need {
        floats.resize(need, 0.0);
    }
    if pairs.len() < queries * blocks * 16 {
        pairs.resize(queries * blocks * 16, 0);
    }
    let (scores, rest) = floats.split_at_mut(tile_scores);
    let (vbuf, qd) = rest.split_at_mut(value_keys * hd);
    let outp = out.as_mut_ptr();
    let (vp, vdp) = (v.q.as_ptr(), v.d.as_ptr().cast::<u16>());
    let mut keys = KeyTile::new();
    let mut quants = [0i8; MAX_QUANT_HEAD];

    for t0 in (0..ranges.len()).step_by(ROW_TILE) {
        let tile = &ranges[t0..(t0 + ROW_TILE).min(ranges.len())];
        for r in 0..tile.len() {
            std::slice::from_raw_parts_mut(outp.add((t0 + r) * out_stride), width).fill(0.0);
        }
        let Some((lo, hi)) = keys_of(tile) else {
            continue;
        };
        // Every query head of the tile, as attend_quant quantizes it.
        for r in 0..tile.len() {
            for g in 0..heads {
                let i = r * heads + g;
                let x = &q[(t0 + r) * q_stride + g * hd..][..hd];
                quantize_query(x, &mut quants[..hd], &mut qd[i * blocks..][..blocks]);
                query_pairs(&quants[..hd], &mut pairs[i * blocks * 16..][..blocks * 16]);
            }
        }
        // Scores: sixteen keys' tile built once, scored against every head of every row that
        // attends any of them (the lanes outside a row's range masked out).
        let mut kb = lo;
        while kb < hi {
            let count = (hi - kb).min(16);
            keys.load::<Q4>(k.q, k.d, stride, kb, count, blocks);
            for (r, &(s, e)) in tile.iter().enumerate() {
                let (a, b) = (kb.max(s), (kb + count).min(e));
                if a >= b {
                    continue;
                }
                let mask = (((1u32 << (b - kb)) - 1) & !((1u32 << (a - kb)) - 1)) as u16;
                for g in 0..heads {
                    let i = r * heads + g;
                    let sc = keys.score(
                        &pairs[i * blocks * 16..],
                        &qd[i * blocks..][..blocks],
                        scale,
                    );
                    // Lane `l` is key `kb + l`, at `kb + l - s` in the row's scores.
                    let dst = scores
                        .as_mut_ptr()
                        .wrapping_add(i * nmax + kb)
                        .wrapping_sub(s);
                    _mm512_mask_storeu_ps(dst, mask, sc);
                }
            }
            kb += count;
        }
        softmax_tile(tile, heads, nmax, scores, false);
        // The sum over V: a block of value rows widened once, summed into every row.
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
            for j in 0..count {
                let at = (vb + j) * stride / BLOCK;
                let row = vbuf.as_mut_ptr().add(j * hd);
                for b in 0..blocks {
                    let d = _mm512_set1_ps(f16_512(*vdp.add(at + b)));
                    let [x0, x1] = widen_block(block_quants::<Q4>(vp, at + b), d);
                    _mm512_storeu_ps(row.add(b * BLOCK), x0);
                    _mm512_storeu_ps(row.add(b * BLOCK + 16), x1);
                }
            }
            (vbuf.as_ptr(), hd, vb)
        });
    }
}
