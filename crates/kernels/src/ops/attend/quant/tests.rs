//! The quantized caches' attention against an f32 one over the same values, its kernels
//! against each other, for both kinds of block.

use super::*;
use crate::ops::{quantize_q4_0, quantize_q8_0};

const KINDS: [QuantKind; 2] = [QuantKind::Q8_0, QuantKind::Q4_0];

/// The cache's values widened, for an f32 attention over exactly what the blocks kept.
fn widen(kind: QuantKind, q: &[u8], d: &[half::f16]) -> Vec<f32> {
    let values = QuantValues { kind, q, d };
    (0..d.len() * BLOCK).map(|i| values.value(i)).collect()
}

fn cache(kind: QuantKind, values: usize, seed: usize) -> (Vec<u8>, Vec<half::f16>) {
    let x: Vec<f32> = (0..values)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let mut d = vec![half::f16::ZERO; values / BLOCK];
    let mut q = vec![0u8; kind.quant_bytes(values)];
    match kind {
        QuantKind::Q8_0 => {
            let mut signed = vec![0i8; values];
            quantize_q8_0(&x, &mut signed, &mut d);
            q = signed.iter().map(|&v| v as u8).collect();
        }
        QuantKind::Q4_0 => quantize_q4_0(&x, &mut q, &mut d),
    }
    (q, d)
}

#[test]
fn q4_0_blocks_unpack_low_nibbles_first_less_eight() {
    // Byte i holds value i (low nibble) and value 16 + i (high).
    let q: Vec<u8> = (0..16u8).map(|i| i | (15 - i) << 4).collect();
    let got = block_quants::<true>(&q, 0);
    let want: Vec<i8> = (0..16)
        .map(|i| i - 8)
        .chain((0..16).map(|i| 7 - i))
        .collect();
    assert_eq!(got.to_vec(), want);
}

/// With a query already on the q8_0 grid the scores are exact, so the result is the f32
/// attention over the widened cache up to the order of its sums.
#[test]
fn a_quantized_cache_attends_as_its_widened_values_do_in_f32() {
    for (hd, kind) in [32, 64, 128, 256]
        .into_iter()
        .flat_map(|hd| KINDS.map(|k| (hd, k)))
    {
        let (heads, keys) = (3, 70);
        let stride = 2 * hd;
        let (kq, kd) = cache(kind, keys * stride, 1);
        let (vq, vd) = cache(kind, keys * stride, 2);
        let (k32, v32) = (widen(kind, &kq, &kd), widen(kind, &vq, &vd));
        // Query blocks of integers times a power of two: quantized without loss.
        // (each block's largest is 127/64, so its scale is 1/64 and every quant exact).
        let q: Vec<f32> = (0..heads * hd)
            .map(|i| match i % BLOCK {
                0 => 127.0 / 64.0,
                _ => ((i * 31 % 255) as f32 - 127.0) / 64.0,
            })
            .collect();
        for (start, end) in [(0, 1), (5, 40), (0, keys)] {
            let (k8, v8) = (
                QuantValues {
                    kind,
                    q: &kq,
                    d: &kd,
                },
                QuantValues {
                    kind,
                    q: &vq,
                    d: &vd,
                },
            );
            let mut got = vec![f32::NAN; heads * hd];
            attend_quant(
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
                    "{kind:?} hd {hd} keys {start}..{end} [{i}]: {a} vs {b}"
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
    for (hd, kind) in [32, 64, 96, 128, 192]
        .into_iter()
        .flat_map(|hd| KINDS.map(|k| (hd, k)))
    {
        let (keys, stride) = (37, 3 * hd);
        let (kq, kd) = cache(kind, keys * stride, 5);
        let (vq, vd) = cache(kind, keys * stride, 6);
        let bytes = kind.quant_bytes(hd);
        for heads in 1..=6 {
            let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.61).cos()).collect();
            let run = |wide: bool| {
                let mut scores = vec![0f32; heads * keys];
                let mut out = vec![f32::NAN; heads * hd];
                let (k, v) = (&kq[bytes..], &vq[bytes..]);
                let (kd, vd) = (&kd[hd / BLOCK..], &vd[hd / BLOCK..]);
                let (mut qq, mut qd) = (vec![0i8; q.len()], vec![0f32; q.len() / BLOCK]);
                attend_quant_body(
                    wide,
                    kind == QuantKind::Q4_0,
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
            assert_eq!(run(true), run(false), "{kind:?} hd {hd} heads {heads}");
        }
    }
}

/// `attend_rows_quant` against `attend_quant` row by row, bit for bit, for one shape; past each
/// row's heads its output is untouched.
fn rows_check(kind: QuantKind, hd: usize, heads: usize, ranges: &[(usize, usize)]) {
    let stride = 2 * hd;
    let keys = ranges.iter().map(|r| r.1).max().unwrap_or(0).max(1);
    let (kq, kd) = cache(kind, keys * stride, 3);
    let (vq, vd) = cache(kind, keys * stride, 4);
    // The second KV head, so offsets into the cache are exercised.
    let k = QuantValues {
        kind,
        q: &kq,
        d: &kd,
    };
    let v = QuantValues {
        kind,
        q: &vq,
        d: &vd,
    };
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
    // Where this CPU has the kernels, the tiles are what is tested, not the row-by-row path.
    #[cfg(target_arch = "x86_64")]
    if simd512()
        && is_x86_feature_detected!("avx512vl")
        && hd.is_multiple_of(64)
        && ranges.len() > 1
    {
        assert!(
            rows::takes(&run, k, v, stride, out_stride),
            "{kind:?} hd {hd}: the tiles refused a run they hold"
        );
    }
    let mut together = vec![f32::NAN; ranges.len() * out_stride];
    attend_rows_quant(&run, k, v, stride, &mut together, out_stride);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (r, &(start, end)) in ranges.iter().enumerate() {
        let mut alone = vec![f32::NAN; width];
        attend_quant(
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
            "{kind:?} hd {hd} heads {heads} row {r} of {ranges:?}"
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
    for (hd, kind) in [64, 128, 256, 32, 96]
        .into_iter()
        .flat_map(|hd| KINDS.map(|k| (hd, k)))
    {
        for heads in 1..=5 {
            for ranges in [&causal[..], &window[..], &ragged[..], &causal[..2]] {
                rows_check(kind, hd, heads, ranges);
            }
        }
    }
}

#[test]
fn a_run_whose_keys_pass_the_cache_is_refused() {
    let (q, d) = (vec![1u8; 64 * 4], vec![half::f16::ONE; 2 * 4]);
    let kv = QuantValues {
        kind: QuantKind::Q8_0,
        q: &q,
        d: &d,
    };
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
        attend_rows_quant(&run, kv, kv, 64, &mut out, 64)
    }));
    assert!(caught.is_err(), "read a key past the cache");
}

#[test]
#[should_panic(expected = "whole blocks")]
fn heads_that_split_a_block_are_refused() {
    let (q, d) = ([0u8; 64], [half::f16::ZERO; 2]);
    let v = QuantValues {
        kind: QuantKind::Q4_0,
        q: &q,
        d: &d,
    };
    attend_quant(&[0.0; 16], 16, v, v, 16, 0, 1, 1.0, &mut [0.0; 16]);
}
