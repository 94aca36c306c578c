//! Attention over an f16 KV cache (`kv_precision = "f16"`: half the bytes of an f32 cache, as
//! llama.cpp's default). The kernels read f32 rows, so one KV head's keys and values are widened
//! into a per-thread f32 copy first, exactly (every f16 is an f32), and kept for the next query
//! rows of the same sequence, layer and head in the same step: a prefill chunk's rows, or the
//! query heads of a group, widen the cache once, not once each. The result is bit-identical to
//! the f32 cache holding the same f16-rounded values.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use half::slice::HalfFloatSliceExt;
use hearth_kernels::ops;

/// Bumped once per layer of every forward call: widened copies from before are stale (a
/// sequence may have been truncated and rewritten since).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A new generation: call before the attention of each layer.
pub(super) fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::Relaxed) + 1
}

#[derive(Default)]
struct Widened {
    /// (generation, sequence address, KV head) the copy is of.
    key: (u64, usize, usize),
    /// Positions `from..upto` are widened, position `j` at row `j - from` (a sliding-window
    /// layer's keys before its window are never read, so never widened).
    from: usize,
    upto: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

thread_local! {
    static WIDE: RefCell<Widened> = RefCell::new(Widened::default());
}

/// One KV head of one layer of an f16 cache.
pub(super) struct Head<'a> {
    pub k: &'a [half::f16],
    pub v: &'a [half::f16],
    /// Values per position (all KV heads), and this head's offset among them.
    pub kv_dim: usize,
    pub offset: usize,
    /// Identifies the sequence within the generation.
    pub seq: usize,
    pub kvh: usize,
    pub generation: u64,
}

/// [`ops::attend`] for query heads `q` of one KV head over positions `start..end` of `head`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    q: &[f32],
    hd: usize,
    head: &Head<'_>,
    start: usize,
    end: usize,
    scale: f32,
    f16_weights: bool,
    out: &mut [f32],
) {
    WIDE.with(|cell| {
        let mut w = cell.borrow_mut();
        let key = (head.generation, head.seq, head.kvh);
        if w.key != key || start < w.from {
            w.key = key;
            w.from = start;
            w.upto = start;
        }
        if w.upto < end {
            let (first, base) = (w.upto, w.from);
            w.k.resize((end - base) * hd, 0.0);
            w.v.resize((end - base) * hd, 0.0);
            let Widened { k, v, .. } = &mut *w;
            for j in first..end {
                let src = j * head.kv_dim + head.offset;
                let dst = (j - base) * hd..(j - base + 1) * hd;
                head.k[src..src + hd].convert_to_f32_slice(&mut k[dst.clone()]);
                head.v[src..src + hd].convert_to_f32_slice(&mut v[dst]);
            }
            w.upto = end;
        }
        let base = w.from;
        let (k, v) = (&w.k[..], &w.v[..]);
        ops::attend(q, hd, k, v, hd, start - base, end - base, scale, f16_weights, out);
    });
}
