//! The q8_0 attention against an f32 one over the same values, its kernels against each other.

use super::*;
use crate::ops::quantize_q8_0;

/// The cache's values widened, for an f32 attention over exactly what q8_0 kept.
fn widen(q: &[i8], d: &[half::f16]) -> Vec<f32> {
    q.iter()
        .enumerate()
        .map(|(i, &x)| f32::from(x) * d[i / BLOCK].to_f32())
        .collect()
}

fn cache(values: usize, seed: usize) -> (Vec<f32>, Vec<i8>, Vec<half::f16>) {
    let x: Vec<f32> = (0..values)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let (mut q, mut d) = (vec![0i8; values], vec![half::f16::ZERO; values / BLOCK]);
    quantize_q8_0(&x, &mut q, &mut d);
    (x, q, d)
}

/// With a query already on the q8_0 grid the scores are exact, so the result is the f32
/// attention over the widened cache up to the order of its sums.
#[test]
fn a_q8_cache_attends_as_its_widened_values_do_in_f32() {
    for hd in [32, 64, 128, 256] {
        let (heads, keys) = (3, 70);
        let stride = 2 * hd;
        let (_, kq, kd) = cache(keys * stride, 1);
        let (_, vq, vd) = cache(keys * stride, 2);
        let (k32, v32) = (widen(&kq, &kd), widen(&vq, &vd));
        // Query blocks of integers times a power of two: quantized without loss.
        // (each block's largest is 127/64, so its scale is 1/64 and every quant exact).
        let q: Vec<f32> = (0..heads * hd)
            .map(|i| match i % BLOCK {
                0 => 127.0 / 64.0,
                _ => ((i * 31 % 255) as f32 - 127.0) / 64.0,
            })
            .collect();
        for (start, end) in [(0, 1), (5, 40), (0, keys)] {
            let (k8, v8) = (Q8Values { q: &kq, d: &kd }, Q8Values { q: &vq, d: &vd });
            let mut got = vec![f32::NAN; heads * hd];
            attend_q8(
                &q,
                hd,
                k8.from(hd),
                v8.from(hd),
                stride,
                start,
                end,
                0.1,
                &mut got,
            );
            let mut want = vec![f32::NAN; heads * hd];
            let (k, v) = (&k32[hd..], &v32[hd..]);
            super::super::attend(&q, hd, k, v, stride, start, end, 0.1, false, &mut want);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "hd {hd} keys {start}..{end} [{i}]: {a} vs {b}"
                );
            }
        }
    }
}

/// The AVX-512 kernels give the portable body's bits (where this CPU has them), for heads
/// of one to six blocks and groups of one to six heads.
#[test]
fn the_avx512_kernels_give_the_portable_bits() {
    if !simd512() {
        return;
    }
    for hd in [32, 64, 96, 128, 192] {
        let (keys, stride) = (37, 3 * hd);
        let (_, kq, kd) = cache(keys * stride, 5);
        let (_, vq, vd) = cache(keys * stride, 6);
        for heads in 1..=6 {
            let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.61).cos()).collect();
            let run = |wide: bool| {
                let mut scores = vec![0f32; heads * keys];
                let mut out = vec![f32::NAN; heads * hd];
                let (k, v) = (&kq[hd..], &vq[hd..]);
                let (kd, vd) = (&kd[hd / BLOCK..], &vd[hd / BLOCK..]);
                let (mut qq, mut qd) = (vec![0i8; q.len()], vec![0f32; q.len() / BLOCK]);
                attend_q8_body(
                    wide,
                    (&mut qq, &mut qd),
                    &q,
                    hd,
                    k,
                    kd,
                    v,
                    vd,
                    stride,
                    2,
                    30,
                    0.2,
                    &mut scores,
                    &mut out,
                );
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(run(true), run(false), "hd {hd} heads {heads}");
        }
    }
}

/// `attend_rows_q8` against `attend_q8` row by row, bit for bit, for one shape; past each
/// row's heads its output is untouched.
fn rows_check(hd: usize, heads: usize, ranges: &[(usize, usize)]) {
    let stride = 2 * hd;
    let keys = ranges.iter().map(|r| r.1).max().unwrap_or(0).max(1);
    let (_, kq, kd) = cache(keys * stride, 3);
    let (_, vq, vd) = cache(keys * stride, 4);
    // The second KV head, so offsets into the cache are exercised.
    let (k, v) = (Q8Values { q: &kq, d: &kd }, Q8Values { q: &vq, d: &vd });
    let (k, v) = (k.from(hd), v.from(hd));
    let width = heads * hd;
    let (q_stride, out_stride) = (width + 32, width + 8);
    let q: Vec<f32> = (0..ranges.len() * q_stride)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let run = RowRun {
        q: &q,
        q_stride,
        ranges,
        heads,
        hd,
        scale: 0.125,
        f16_weights: true,
    };
    let mut together = vec![f32::NAN; ranges.len() * out_stride];
    attend_rows_q8(&run, k, v, stride, &mut together, out_stride);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (r, &(start, end)) in ranges.iter().enumerate() {
        let mut alone = vec![f32::NAN; width];
        attend_q8(
            &q[r * q_stride..][..width],
            hd,
            k,
            v,
            stride,
            start,
            end,
            0.125,
            &mut alone,
        );
        let got = &together[r * out_stride..][..out_stride];
        assert_eq!(
            bits(&got[..width]),
            bits(&alone),
            "hd {hd} heads {heads} row {r} of {ranges:?}"
        );
        assert!(
            got[width..].iter().all(|x| x.is_nan()),
            "wrote past row {r}"
        );
        if start >= end {
            assert!(got[..width].iter().all(|&x| x == 0.0));
        }
    }
}

#[test]
fn rows_together_give_each_row_alone_bit_for_bit() {
    // A causal prefill chunk continuing a cache, across several row tiles.
    let causal: Vec<(usize, usize)> = (40..75).map(|p| (0, p + 1)).collect();
    // A sliding window of 24 keys (Gemma 3's local layers), and rows with nothing to attend.
    let window: Vec<(usize, usize)> = (30..45).map(|p| (p + 1 - 24, p + 1)).collect();
    let ragged = [(5, 5), (0, 1), (3, 40), (0, 0), (17, 18), (0, 70)];
    for hd in [64, 128, 256, 32, 96] {
        for heads in 1..=5 {
            for ranges in [&causal[..], &window[..], &ragged[..], &causal[..2]] {
                rows_check(hd, heads, ranges);
            }
        }
    }
}

#[test]
fn a_run_whose_keys_pass_the_cache_is_refused() {
    let (q, d) = (vec![1i8; 64 * 4], vec![half::f16::ONE; 2 * 4]);
    let kv = Q8Values { q: &q, d: &d };
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
        attend_rows_q8(&run, kv, kv, 64, &mut out, 64)
    }));
    assert!(caught.is_err(), "read a key past the cache");
}

#[test]
#[should_panic(expected = "whole blocks")]
fn heads_that_split_a_block_are_refused() {
    let (q, d) = ([0i8; 64], [half::f16::ZERO; 2]);
    let v = Q8Values { q: &q, d: &d };
    attend_q8(&[0.0; 16], 16, v, v, 16, 0, 1, 1.0, &mut [0.0; 16]);
}
