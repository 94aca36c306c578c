//! A layer's attention on the fast path: each row's K and V into its sequence's cache (at the
//! cache's precision), then every row's query heads against its cache on the kernel pool. The
//! one place that knows how each [`KvPrecision`] is written and read.

use half::slice::HalfFloatSliceExt;
use hearth_kernels::ops::{self, QuantKind};
use hearth_kernels::ThreadPool;

use super::{HOST_CHECKED, MAX_ROWS_PER_PIECE};
use crate::config::KvPrecision;
use crate::kv::{Layer, LayerMut};
use crate::model::Step;
use crate::sequence::HostKv;

/// The attention's shape for one layer.
pub(super) struct Shape {
    pub hd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Width of a row of the `[q | k | v]` projection.
    pub qkv_w: usize,
    pub scale: f32,
    /// The layer's sliding window, if it has one.
    pub window: Option<usize>,
    pub kv: KvPrecision,
}

impl Shape {
    fn qd(&self) -> usize {
        self.n_head * self.hd
    }
    fn kvd(&self) -> usize {
        self.n_head_kv * self.hd
    }
    fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }
    /// The Hadamard blocks llama.cpp rotates by around a quantized cache whose heads are a
    /// multiple of 64 wide (none otherwise): Q and K by the largest power of two that divides
    /// the head, V and the attention's output by 64 (`ops::hadamard`).
    fn rotation(&self) -> Option<(usize, usize)> {
        let quantized = self.kv.quant().is_some();
        (quantized && self.hd.is_multiple_of(64)).then(|| (1 << self.hd.trailing_zeros(), 64))
    }
    /// The keys a row at `pos` attends: all before it, or its sliding window's.
    fn keys(&self, pos: usize) -> (usize, usize) {
        let first = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        (first, pos + 1)
    }
}

/// Readies a row's Q, K and V (after RoPE) for the cache's precision before they are stored and
/// used. An f16 cache keeps K/V at f16 precision, and without flash attention llama.cpp converts
/// Q to f16 for the Q·K products (the f16 cache's vec-dot type). A quantized cache quantizes as
/// it stores and its attention quantizes Q itself; before that, as llama.cpp does, Q, K and V are
/// rotated ([`Shape::rotation`]), and [`finish_rows`] rotates the output back.
pub(super) fn prepare_row(sh: &Shape, q: &mut [f32], k: &mut [f32], v: &mut [f32]) {
    if sh.kv.rounds_to_f16() {
        ops::round_to_f16(k);
        ops::round_to_f16(v);
        ops::round_to_f16(q);
    }
    if let Some((qk, vo)) = sh.rotation() {
        ops::hadamard(q, qk);
        ops::hadamard(k, qk);
        ops::hadamard(v, vo);
    }
}

/// Undoes [`prepare_row`]'s rotation of V on the attention's output rows.
pub(super) fn finish_rows(sh: &Shape, att: &mut [f32]) {
    if let Some((_, vo)) = sh.rotation() {
        ops::hadamard(att, vo);
    }
}

/// Stores one position's K and V (`kvd` values each, after [`prepare_row`]) at `pos` in layer
/// `il` of `c`.
pub(super) fn store(c: &mut HostKv, il: usize, pos: usize, k: &[f32], v: &[f32]) {
    let kvd = k.len();
    let at = pos * kvd..(pos + 1) * kvd;
    for (cache, x) in [(&mut c.k, k), (&mut c.v, v)] {
        match cache.layer_mut(il) {
            LayerMut::F32(all) => all[at.clone()].copy_from_slice(x),
            // Exact: the values were rounded to f16 already.
            LayerMut::F16(all) => all[at.clone()].convert_from_f32_slice(x),
            LayerMut::Quant(kind, q, d) => {
                let block = KvPrecision::QUANT_BLOCK;
                let ds = at.start / block..at.end / block;
                let qs = &mut q[kind.quant_bytes(at.start)..kind.quant_bytes(at.end)];
                match kind {
                    QuantKind::Q8_0 => {
                        ops::quantize_q8_0(x, bytemuck::cast_slice_mut(qs), &mut d[ds])
                    }
                    QuantKind::Q4_0 => ops::quantize_q4_0(x, qs, &mut d[ds]),
                }
            }
        }
    }
}

/// Query heads `first..first + out.len() / hd` of the row with query `q` (those heads only), all
/// of one KV head, at `pos` of cache `c`.
fn attend_heads(
    sh: &Shape,
    c: &HostKv,
    il: usize,
    pos: usize,
    first: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let at = first / sh.group() * sh.hd;
    let keys = sh.keys(pos);
    match (c.k.layer(il), c.v.layer(il)) {
        (Layer::F32(k), Layer::F32(v)) => attend_plain(sh, q, &k[at..], &v[at..], keys, out),
        (Layer::F16(k), Layer::F16(v)) => attend_plain(sh, q, &k[at..], &v[at..], keys, out),
        (Layer::Quant(k), Layer::Quant(v)) => {
            let (start, end) = keys;
            let (k, v) = (k.from(at), v.from(at));
            ops::attend_quant(q, sh.hd, k, v, sh.kvd(), start, end, sh.scale, out)
        }
        _ => unreachable!("a sequence's K and V caches share one precision"),
    }
}

/// [`attend_heads`] over an f32 or f16 cache (the slices start at the KV head).
fn attend_plain<T: ops::KvValue>(
    sh: &Shape,
    q: &[f32],
    k: &[T],
    v: &[T],
    (start, end): (usize, usize),
    out: &mut [f32],
) {
    let f16w = sh.kv.rounds_to_f16();
    ops::attend(q, sh.hd, k, v, sh.kvd(), start, end, sh.scale, f16w, out)
}

/// Rows `first..first + out.len() / qd` (one sequence's, consecutive positions) for KV head
/// `kvh`: together, so each block of its keys and values is read once for all of them
/// (bit-identical to row by row).
#[allow(clippy::too_many_arguments)]
fn attend_run(
    sh: &Shape,
    steps: &[Step<'_>],
    rows: &[(usize, usize)],
    qkv: &[f32],
    il: usize,
    first: usize,
    kvh: usize,
    out: &mut [f32],
) {
    let (hd, qd, kvd, group) = (sh.hd, sh.qd(), sh.kvd(), sh.group());
    let count = out.len() / qd;
    let c = steps[rows[first].0].seq.host().expect(HOST_CHECKED);
    let mut ranges = [(0, 0); MAX_ROWS_PER_PIECE];
    for (range, &(_, pos)) in ranges.iter_mut().zip(&rows[first..first + count]) {
        *range = sh.keys(pos);
    }
    let run = ops::RowRun {
        q: &qkv[first * sh.qkv_w + kvh * group * hd..],
        q_stride: sh.qkv_w,
        ranges: &ranges[..count],
        heads: group,
        hd,
        scale: sh.scale,
        f16_weights: sh.kv.rounds_to_f16(),
    };
    let out = &mut out[kvh * group * hd..];
    let at = kvh * hd;
    match (c.k.layer(il), c.v.layer(il)) {
        (Layer::F32(k), Layer::F32(v)) => ops::attend_rows(&run, &k[at..], &v[at..], kvd, out, qd),
        (Layer::F16(k), Layer::F16(v)) => ops::attend_rows(&run, &k[at..], &v[at..], kvd, out, qd),
        (Layer::Quant(k), Layer::Quant(v)) => {
            ops::attend_rows_quant(&run, k.from(at), v.from(at), kvd, out, qd)
        }
        _ => unreachable!("a sequence's K and V caches share one precision"),
    }
}

/// Layer `il`'s attention for every row (`rows[r]` = (step, position)), whose `[q | k | v]`
/// rows are in `qkv` and whose K/V are already in the caches, into `att` (`rows × qd`).
pub(super) fn attend_layer(
    sh: &Shape,
    steps: &[Step<'_>],
    rows: &[(usize, usize)],
    qkv: &[f32],
    il: usize,
    pool: &ThreadPool,
    att: &mut [f32],
) {
    let (hd, nh, nkv, qd, group) = (sh.hd, sh.n_head, sh.n_head_kv, sh.qd(), sh.group());
    let n = rows.len();
    let heads = |r: usize, first: usize, out: &mut [f32]| {
        let (si, pos) = rows[r];
        let c = steps[si].seq.host().expect(HOST_CHECKED);
        let q0 = r * sh.qkv_w + first * hd;
        attend_heads(sh, c, il, pos, first, &qkv[q0..q0 + out.len()], out);
    };
    let threads = pool.threads();
    if n * nkv >= 4 * threads {
        // Enough rows: one piece per few rows, and inside it one KV head at a time over all of
        // them (its query heads together), so that head's keys and values, read from memory for
        // the first row, come from the core's cache for the rest of a prefill chunk's rows
        // instead of being read again for each (the whole cache of a long prompt does not fit;
        // one head's does).
        let rows_per_piece = (n / (4 * threads)).clamp(1, MAX_ROWS_PER_PIECE);
        pool.for_each_piece_mut(att, rows_per_piece * qd, &|i, out| {
            let first = i * rows_per_piece;
            let count = out.len() / qd;
            for kvh in 0..nkv {
                // Runs of rows of one sequence (a prefill chunk's).
                let mut r0 = 0;
                while r0 < count {
                    let si = rows[first + r0].0;
                    let r1 = (r0 + 1..count)
                        .find(|&r| rows[first + r].0 != si)
                        .unwrap_or(count);
                    let out = &mut out[r0 * qd..r1 * qd];
                    attend_run(sh, steps, rows, qkv, il, first + r0, kvh, out);
                    r0 = r1;
                }
            }
        });
    } else if n * nkv >= threads {
        // Few rows (decode): one piece per row and KV head, its query heads together, so the
        // head's keys and values are read from memory once for all of them (decode after 2,048
        // tokens: +12% on SmolLM2, three query heads per KV head).
        pool.for_each_piece_mut(att, group * hd, &|i, out| {
            heads(i / nkv, (i % nkv) * group, out)
        });
    } else {
        // Fewer KV heads than threads: one piece per query head keeps them all busy.
        pool.for_each_piece_mut(att, hd, &|i, out| heads(i / nh, i % nh, out));
    }
}
