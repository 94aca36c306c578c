//! Microbenchmark: the attention of a prefill chunk's rows (one KV head, its query heads
//! together) over a q8_0 and a q4_0 cache against an f16 cache holding the same values, in the
//! same run.
//!
//! `cargo run --release -p hearth-kernels --example attend_bench [-- HEAD_DIM HEADS KEYS ROWS]`
//! (defaults 64 3 2048 32: SmolLM2's heads at a 2,048-token prompt). Row `r` of `ROWS` attends
//! the first `KEYS - ROWS + r + 1` keys, as the last rows of a causal prefill do. Each figure is
//! the best of 15 calls on one thread; each ratio is the anchor's time over the cache's.

use hearth_kernels::ops::{
    attend_rows, attend_rows_quant, quantize_q4_0, quantize_q8_0, QuantKind, QuantValues, RowRun,
};
use std::time::Instant;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args().nth(i).map_or(default, |s| {
            s.parse().expect("HEAD_DIM HEADS KEYS ROWS are numbers")
        })
    };
    let (hd, heads, keys, rows) = (arg(1, 64), arg(2, 3), arg(3, 2048), arg(4, 32));
    assert!(
        rows >= 1 && keys >= rows && hd.is_multiple_of(32),
        "need KEYS >= ROWS >= 1, HEAD_DIM a multiple of 32"
    );
    // Three KV heads side by side, as a cache holds them; the first is attended.
    let stride = 3 * hd;
    let x: Vec<f32> = (0..keys * stride)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let mut d8 = vec![half::f16::ZERO; x.len() / 32];
    let mut q8 = vec![0i8; x.len()];
    quantize_q8_0(&x, &mut q8, &mut d8);
    let q8: Vec<u8> = q8.iter().map(|&v| v as u8).collect();
    let (mut q4, mut d4) = (vec![0u8; x.len() / 2], vec![half::f16::ZERO; x.len() / 32]);
    quantize_q4_0(&x, &mut q4, &mut d4);
    let x16: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
    let q: Vec<f32> = (0..rows * heads * hd)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let ranges: Vec<(usize, usize)> = (0..rows).map(|r| (0, keys - rows + r + 1)).collect();
    let run = RowRun {
        q: &q,
        q_stride: heads * hd,
        ranges: &ranges,
        heads,
        hd,
        scale: 0.125,
        f16_weights: false,
    };
    let mut out = vec![0f32; rows * heads * hd];
    let caches = [
        (QuantKind::Q8_0, &q8[..], &d8[..]),
        (QuantKind::Q4_0, &q4[..], &d4[..]),
    ];
    let mut best = [f64::MAX; 3];
    for _ in 0..15 {
        for (b, &(kind, q, d)) in best.iter_mut().zip(&caches) {
            let kv = QuantValues { kind, q, d };
            let t = Instant::now();
            attend_rows_quant(&run, kv, kv, stride, &mut out, heads * hd);
            *b = b.min(t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        attend_rows(&run, &x16, &x16, stride, &mut out, heads * hd);
        best[2] = best[2].min(t.elapsed().as_secs_f64());
    }
    let [q8_s, q4_s, f16_s] = best;
    println!(
        "head {hd}, {heads} query heads, {keys} keys, {rows} rows: q8_0 {:.3} ms, q4_0 {:.3} ms, \
         f16 {:.3} ms; f16 / q8_0 {:.2}, f16 / q4_0 {:.2}",
        q8_s * 1e3,
        q4_s * 1e3,
        f16_s * 1e3,
        f16_s / q8_s,
        f16_s / q4_s
    );
}
