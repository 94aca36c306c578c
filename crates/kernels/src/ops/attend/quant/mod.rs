//! Attention over a quantized KV cache (`kv_precision = "q8_0"` or `"q4_0"`), computed as
//! llama.cpp's CPU flash attention computes it over its cache of that type (`-ctk q8_0 -ctv q8_0
//! -fa`, or `q4_0`):
//!
//! - each query head is quantized to q8_0 blocks (`quantize::q8_0_block`; q8_0 is the type
//!   llama.cpp multiplies both caches' keys by), and a key's score is the sum over its blocks of the integer dot
//!   of the two blocks' quants times the product of their f16 scales (llama.cpp's
//!   `vec_dot_q8_0_q8_0`, in its reference order: the dot exact, one fused multiply-add a
//!   block), scaled;
//! - the softmax is the one of [`super::attend`] (maximum subtracted, weights kept in f32, as
//!   llama.cpp's flash attention keeps them);
//! - each value row is widened (`q * d`, in f32; a q4_0 quant is its nibble less 8) and summed
//!   into every head of the group with one fused multiply-add a column, keys in order.
//!
//! Both types are blocks of 32 values with one f16 scale; only how a block's 32 signed quants
//! are unpacked differs ([`QuantKind`]), and every kernel here is written once for both.
//!
//! Only the order of the softmax differs from llama.cpp's (it normalises once at the end of an
//! online pass; this normalises the weights first): rounding, not arithmetic.

use super::{softmax_in_place, RowRun, SCORES};
use crate::ops::quantize::q8_0_block;

#[cfg(target_arch = "x86_64")]
mod rows;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
use simd::{key_scores_512, weighted_512};

/// Values of one block (one scale each).
const BLOCK: usize = 32;

/// The largest head this path takes (Gemma 3's is 256).
pub const MAX_QUANT_HEAD: usize = 512;

/// How a cache's blocks hold their 32 quants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantKind {
    /// 32 signed bytes.
    Q8_0,
    /// 16 bytes: value `i < 16` in byte `i`'s low nibble, value `16 + i` in its high one, each
    /// the nibble less 8.
    Q4_0,
}

impl QuantKind {
    /// The kind a kernel's `Q4` parameter names.
    pub(super) const fn of(q4: bool) -> QuantKind {
        if q4 {
            QuantKind::Q4_0
        } else {
            QuantKind::Q8_0
        }
    }

    /// Bytes of one block's quants.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantKind::Q8_0 => BLOCK,
            QuantKind::Q4_0 => BLOCK / 2,
        }
    }

    /// Bytes of the quants of `values` values (a whole number of blocks).
    pub const fn quant_bytes(self, values: usize) -> usize {
        values / BLOCK * self.block_bytes()
    }
}

/// One KV head's slice of a quantized cache: value `i` is quant `i` of block `i / 32` times
/// `d[i / 32]`. Start it at the head's offset with [`QuantValues::from`], a multiple of 32.
#[derive(Clone, Copy, Debug)]
pub struct QuantValues<'a> {
    pub kind: QuantKind,
    /// The blocks' quants, [`QuantKind::block_bytes`] each.
    pub q: &'a [u8],
    pub d: &'a [half::f16],
}

impl<'a> QuantValues<'a> {
    /// The values from `at` on (`at` a whole number of blocks).
    pub fn from(self, at: usize) -> QuantValues<'a> {
        assert_eq!(at % BLOCK, 0, "a quantized slice starts on a block");
        QuantValues {
            q: &self.q[self.kind.quant_bytes(at)..],
            d: &self.d[at / BLOCK..],
            ..self
        }
    }
}

/// Query heads (whole blocks) as llama.cpp multiplies them by either cache's keys: q8_0
/// quants into `q`, each block's scale rounded to f16 (and widened back) into `d`.
#[inline(always)]
fn quantize_query(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((xb, qb), d) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(d.iter_mut())
    {
        *d = half::f16::from_f32(q8_0_block(xb, qb)).to_f32();
    }
}

impl QuantValues<'_> {
    /// Value `i`, widened: its quant times its block's scale, in f32 (as the kernels widen it).
    pub fn value(&self, i: usize) -> f32 {
        let quants = match self.kind {
            QuantKind::Q8_0 => block_quants::<false>(self.q, i / BLOCK),
            QuantKind::Q4_0 => block_quants::<true>(self.q, i / BLOCK),
        };
        f32::from(quants[i % BLOCK]) * self.d[i / BLOCK].to_f32()
    }
}

/// Block `block`'s 32 signed quants.
#[inline(always)]
fn block_quants<const Q4: bool>(q: &[u8], block: usize) -> [i8; BLOCK] {
    if Q4 {
        let b = &q[block * BLOCK / 2..][..BLOCK / 2];
        std::array::from_fn(|i| (b[i % 16] >> (4 * (i / 16)) & 15) as i8 - 8)
    } else {
        let b = &q[block * BLOCK..][..BLOCK];
        std::array::from_fn(|i| b[i] as i8)
    }
}

/// [`super::attend`] over a quantized cache (K and V of one kind): for the `q.len() / hd` query heads side by side in `q`
/// (and in `out`) that share one KV head, `out = softmax(scale * q . K[j]) V[j]` over
/// `j in start..end`, key `j` being values `j * stride..` of `k` and value `j` likewise of `v`.
/// `hd` and `stride` are whole numbers of blocks, `hd` at most [`MAX_QUANT_HEAD`]. A head's result
/// does not depend on the heads beside it.
#[allow(clippy::too_many_arguments)]
pub fn attend_quant(
    q: &[f32],
    hd: usize,
    k: QuantValues<'_>,
    v: QuantValues<'_>,
    stride: usize,
    start: usize,
    end: usize,
    scale: f32,
    out: &mut [f32],
) {
    assert!(
        hd > 0 && hd.is_multiple_of(BLOCK) && stride.is_multiple_of(BLOCK) && hd <= MAX_QUANT_HEAD,
        "a quantized cache needs heads of whole blocks (head {hd}, stride {stride})"
    );
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        let need = end.saturating_sub(start) * (q.len() / hd);
        if scores.len() < need {
            scores.resize(need, 0.0);
        }
        let mut query = QUERY.with(|c| c.take());
        query.0.resize(q.len(), 0);
        query.1.resize(q.len() / BLOCK, 0.0);
        assert_eq!(k.kind, v.kind, "K and V of one cache type");
        attend_quant_mv(
            simd512(),
            k.kind == QuantKind::Q4_0,
            (&mut query.0, &mut query.1),
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
        );
        QUERY.with(|c| c.set(query));
    });
}

thread_local! {
    /// Per-thread scratch for the query heads as quantized (quants, scales): grows to the most
    /// heads seen, then is reused, so a step neither allocates nor clears it.
    static QUERY: std::cell::Cell<(Vec<i8>, Vec<f32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// The query heads' quants and scales, as [`attend_quant_body`] writes them.
type QueryScratch<'a> = (&'a mut [i8], &'a mut [f32]);

/// [`attend_quant`] for every row of `run` (its `f16_weights` does not apply: the weights stay
/// f32, as in llama.cpp's flash attention): row `r`'s heads go to
/// `out[r * out_stride..][..heads * hd]`. Rows are taken a tile at a time where this CPU has
/// the kernels (`rows`), with each row's bits as alone.
pub fn attend_rows_quant(
    run: &RowRun<'_>,
    k: QuantValues<'_>,
    v: QuantValues<'_>,
    stride: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if rows::takes(run, k, v, stride, out_stride) {
        return rows::tiles(run, k, v, stride, out, out_stride);
    }
    let width = run.heads * run.hd;
    for (r, &(start, end)) in run.ranges.iter().enumerate() {
        let q = &run.q[r * run.q_stride..r * run.q_stride + width];
        let o = &mut out[r * out_stride..r * out_stride + width];
        attend_quant(q, run.hd, k, v, stride, start, end, run.scale, o);
    }
}

multiversion! {
    fn attend_quant_mv(wide: bool, q4: bool, query: QueryScratch<'_>, q: &[f32], hd: usize, kq: &[u8], kd: &[half::f16], vq: &[u8], vd: &[half::f16], stride: usize, start: usize, end: usize, scale: f32, scores: &mut [f32], out: &mut [f32]) => attend_quant_body
}

/// Whether this CPU runs the AVX-512 halves ([`key_scores_512`], [`weighted_512`]).
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
fn attend_quant_body(
    wide: bool,
    q4: bool,
    (qq, qd): QueryScratch<'_>,
    q: &[f32],
    hd: usize,
    kq: &[u8],
    kd: &[half::f16],
    vq: &[u8],
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
    let kind = QuantKind::of(q4);
    // Every key and value read lies within the slices (the kernels below index unchecked).
    let last = (end - 1) * stride;
    assert!(
        kind.quant_bytes(last + hd) <= kq.len().min(vq.len()),
        "keys {start}..{end} past the cache"
    );
    assert!(
        last / BLOCK + blocks <= kd.len().min(vd.len()),
        "scales past the cache"
    );
    let scores = &mut scores[..heads * n];
    quantize_query(q, qq, qd);
    let queries = (&*qq, &*qd);
    let (k, v) = ((kq, kd), (vq, vd, stride, start, hd));
    if q4 {
        attend_blocks::<true>(wide, queries, hd, k, v, scale, scores, out);
    } else {
        attend_blocks::<false>(wide, queries, hd, k, v, scale, scores, out);
    }
}

/// [`attend_quant_body`] past its checks, for one kind of block (`Q4`: q4_0, else q8_0).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_blocks<const Q4: bool>(
    wide: bool,
    (qq, qd): (&[i8], &[f32]),
    hd: usize,
    (kq, kd): (&[u8], &[half::f16]),
    v: QuantRows<'_>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (stride, start) = (v.2, v.3);
    let heads = out.len() / hd;
    let n = scores.len() / heads;
    let blocks = hd / BLOCK;
    let mut h0 = 0;
    while h0 < heads {
        let count = (heads - h0).min(MAX_GROUP);
        let queries: [QuantQuery<'_>; MAX_GROUP] = std::array::from_fn(|h| {
            let h = (h0 + h).min(heads - 1);
            QuantQuery {
                q: &qq[h * hd..(h + 1) * hd],
                d: &qd[h * blocks..(h + 1) * blocks],
            }
        });
        let w = &mut scores[h0 * n..(h0 + count) * n];
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: the features were detected; every key read is inside `kq`/`kd` (asserted
            // by the caller), each query holds `blocks` whole blocks, `w` one row of `n` a query.
            unsafe { key_scores_512::<Q4>(&queries[..count], kq, kd, stride, start, scale, w) };
        } else {
            for (qh, w) in queries[..count].iter().zip(w.chunks_exact_mut(n)) {
                key_scores::<Q4>(qh, kq, kd, stride, start, scale, w);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (qh, w) in queries[..count].iter().zip(w.chunks_exact_mut(n)) {
            key_scores::<Q4>(qh, kq, kd, stride, start, scale, w);
        }
        h0 += count;
    }
    for w in scores.chunks_exact_mut(n) {
        softmax_in_place(w, false);
    }
    let mut h0 = 0;
    while h0 < heads {
        let (ws, o) = (&scores[h0 * n..], &mut out[h0 * hd..]);
        h0 += match (heads - h0).min(4) {
            1 => weighted::<1, Q4>(wide, ws, n, v, o),
            2 => weighted::<2, Q4>(wide, ws, n, v, o),
            3 => weighted::<3, Q4>(wide, ws, n, v, o),
            _ => weighted::<4, Q4>(wide, ws, n, v, o),
        };
    }
}

/// A query head quantized to q8_0: quants and widened f16 scales.
struct QuantQuery<'a> {
    q: &'a [i8],
    d: &'a [f32],
}

/// Scaled scores of one query head against keys `start..start + w.len()` (each `stride` apart):
/// per key, each block's integer dot of the two blocks' quants (exact in i32, and in f32: at
/// most 32 * 127² in size), times the product of the two blocks' scales, fused into the key's
/// sum in block order; then scaled. llama.cpp's reference `vec_dot_q8_0_q8_0` (and
/// `vec_dot_q4_0_q8_0`) order; the AVX-512 kernel ([`simd::KeyTile::score`]) gives the same bits.
#[inline(always)]
fn key_scores<const Q4: bool>(
    q: &QuantQuery<'_>,
    kq: &[u8],
    kd: &[half::f16],
    stride: usize,
    start: usize,
    scale: f32,
    w: &mut [f32],
) {
    for (s, j) in w.iter_mut().zip(start..) {
        let at = j * stride / BLOCK;
        let mut sum = 0f32;
        for (b, &dq) in q.d.iter().enumerate() {
            let d = kd[at + b].to_f32() * dq;
            let kb = block_quants::<Q4>(kq, at + b);
            let dot: i32 = kb
                .iter()
                .zip(&q.q[b * BLOCK..][..BLOCK])
                .map(|(&x, &y)| i32::from(x) * i32::from(y))
                .sum();
            sum = (dot as f32).mul_add(d, sum);
        }
        *s = sum * scale;
    }
}

/// Query heads scored together: a group's (up to this many) share each transposed key tile.
const MAX_GROUP: usize = 8;

/// The values: quants, scales, stride, first key, head width.
type QuantRows<'a> = (&'a [u8], &'a [half::f16], usize, usize, usize);

/// The weighted sum of V for `G` heads (head `g`'s weights at `ws[g * n..][..n]`, its output at
/// `out[g * hd..][..hd]`): each column sums its keys in order, one fused multiply-add each of
/// the widened value (`q * d`). Returns `G`.
#[inline(always)]
fn weighted<const G: usize, const Q4: bool>(
    wide: bool,
    ws: &[f32],
    n: usize,
    (vq, vd, stride, start, hd): QuantRows<'_>,
    out: &mut [f32],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: the features were detected; `attend_quant_body` checked every value read is
        // inside `vq`/`vd`, `ws` holds `G * n` weights and `out` `G * hd` columns.
        unsafe { weighted_512::<G, Q4>(ws, n, vq, vd, stride, start, hd, out) };
        return G;
    }
    let _ = wide;
    let mut row = [0f32; MAX_QUANT_HEAD];
    for idx in 0..n {
        let at = (start + idx) * stride / BLOCK;
        for (b, block) in row[..hd].chunks_exact_mut(BLOCK).enumerate() {
            let d = vd[at + b].to_f32();
            for (x, &qv) in block.iter_mut().zip(&block_quants::<Q4>(vq, at + b)) {
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
