//! Every kernel path this CPU has against the scalar reference (dequantize, f32 dot).
//!
//! Tolerances, stated:
//! - vs the reference: the error that quantizing activations to 8 bits may add,
//!   `sum_i |w_i| * amax(x's block) / 254`, plus for K-quants the f16 rounding of the composite
//!   scales (`2^-10 * sum_i |w_i x_i|`), plus `1e-4 * sum_i |w_i x_i| + 1e-6` for f32 summation;
//! - SIMD paths vs the portable scalar path on the same quantized activations:
//!   `1e-5 * sum_i |w_i a_i| + 1e-6` (only the summation order differs).

use crate::*;
use half::f16;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn f16(&mut self, scale: f32) -> [u8; 2] {
        f16::from_f32(self.unit() * scale).to_bits().to_le_bytes()
    }
}

#[derive(Clone, Copy, Debug)]
enum Fill {
    Random,
    Zeros,
    ZeroScale,
    MaxBytes,
    NegativeScales,
}

fn make_block(ty: GgmlType, rng: &mut Rng, fill: Fill) -> Vec<u8> {
    let mut b: Vec<u8> = (0..ty.block_bytes()).map(|_| rng.byte()).collect();
    if let Fill::Zeros = fill {
        b.fill(0);
        return b;
    }
    if let Fill::MaxBytes = fill {
        b.fill(0xFF);
    }
    // Scale fields: keep them finite (random bytes could be NaN/inf f16).
    let scale = |rng: &mut Rng| -> [u8; 2] {
        match fill {
            Fill::ZeroScale => [0, 0],
            Fill::NegativeScales => f16::from_f32(-(rng.unit().abs() * 0.05 + 0.001))
                .to_bits()
                .to_le_bytes(),
            Fill::MaxBytes => f16::from_f32(0.031).to_bits().to_le_bytes(),
            _ => rng.f16(0.05),
        }
    };
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            let s = scale(rng);
            b[0..2].copy_from_slice(&s);
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
            let s = scale(rng);
            b[0..2].copy_from_slice(&s);
            let s = scale(rng);
            b[2..4].copy_from_slice(&s);
        }
        GgmlType::Q6_K => {
            let s = scale(rng);
            b[208..210].copy_from_slice(&s);
        }
        _ => unreachable!(),
    }
    b
}

fn make_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng, fill: Fill) -> Vec<u8> {
    let blocks = rows * cols / ty.block_elems();
    let mut out = Vec::new();
    for i in 0..blocks {
        // Mix a few special blocks into random matrices too.
        let f = match (fill, i % 7) {
            (Fill::Random, 3) => Fill::Zeros,
            (Fill::Random, 5) => Fill::NegativeScales,
            (f, _) => f,
        };
        out.extend(make_block(ty, rng, f));
    }
    out
}

fn make_acts(rows: usize, cols: usize, rng: &mut Rng) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| match i % 97 {
            0 => 0.0,
            1 => 40.0, // an outlier dominating its block
            _ => rng.unit() * 2.0,
        })
        .collect()
}

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_1,
    GgmlType::Q5_K,
];

/// K-quants: composite scales rounded to f16 when packed.
fn k_quant(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

fn check(ty: GgmlType, rows: usize, cols: usize, n: usize, fill: Fill, seed: u64) {
    let mut rng = Rng(seed);
    let bytes = make_matrix(ty, rows, cols, &mut rng, fill);
    let x = make_acts(n, cols, &mut rng);
    check_matrix(ty, rows, cols, n, fill, &bytes, &x, KernelPath::Scalar);
    // The interleaved arrangement (the AVX2 and VNNI paths' one; where the shape allows it),
    // run by every path: the AVX2 tile on the AVX2 and AVX-512 paths, the VNNI tile on VNNI.
    check_matrix(ty, rows, cols, n, fill, &bytes, &x, KernelPath::Avx512Vnni);
}

#[allow(clippy::too_many_arguments)]
fn check_matrix(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
    fill: Fill,
    bytes: &[u8],
    x: &[f32],
    layout_for: KernelPath,
) {
    let mut w = QMatrix::for_ggml_on(ty, rows, cols, layout_for).unwrap();
    w.pack_ggml_rows(0, bytes).unwrap();
    if layout_for == KernelPath::Avx512Vnni && !w.interleaved() {
        return; // same arrangement as the plain check
    }
    let il = w.interleaved();
    let mut acts = QActs::new();
    acts.quantize(x, n, cols).unwrap();
    let row_bytes = ty.row_bytes(cols).unwrap();
    let mut wf = vec![0f32; rows * cols];
    for r in 0..rows {
        dequantize_row(
            ty,
            &bytes[r * row_bytes..(r + 1) * row_bytes],
            &mut wf[r * cols..(r + 1) * cols],
        )
        .unwrap();
    }
    let pool = ThreadPool::new(2);
    let mut scalar = vec![0f32; n * rows];
    matmul(KernelPath::Scalar, &w, &acts, &mut scalar, &pool).unwrap();
    for path in KernelPath::available() {
        let mut out = vec![f32::NAN; n * rows];
        matmul(path, &w, &acts, &mut out, &pool).unwrap();
        for j in 0..n {
            for i in 0..rows {
                let (wr, xr) = (&wf[i * cols..(i + 1) * cols], &x[j * cols..(j + 1) * cols]);
                let reference: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let mut act_err = 0f64;
                for (b, xb) in xr.chunks(32).enumerate() {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                    let wsum: f64 = wr[32 * b..32 * b + xb.len()]
                        .iter()
                        .map(|v| v.abs() as f64)
                        .sum();
                    act_err += wsum * amax / 254.0;
                }
                let tol = act_err * 1.001
                    + if k_quant(ty) { mag / 1024.0 } else { 0.0 }
                    + 1e-4 * mag
                    + 1e-6;
                let got = out[j * rows + i] as f64;
                assert!(
                    (got - reference).abs() <= tol,
                    "{ty:?} {path:?} {fill:?} il={il} rows={rows} cols={cols} n={n} at ({j},{i}): got {got}, reference {reference}, tol {tol}"
                );
                let amag: f64 = (0..cols)
                    .map(|k| (wr[k] as f64 * acts.value(j, k) as f64).abs())
                    .sum();
                let s = scalar[j * rows + i] as f64;
                // Interleaved Q6_K on VNNI/AMX takes its zero point off the integer dot with
                // exact activation sums (as llama.cpp's Q6_K x Q8_K dot does with its bsums);
                // the portable path adds it per lane in f32 with the block total rounded to
                // f16 (Q8_1's `s`): they differ by that rounding of the zero-point term.
                let zp = if il && ty == GgmlType::Q6_K && path != KernelPath::Scalar {
                    (0..cols)
                        .map(|k| {
                            (32.0 * w.scale_min_at(i, k).0 as f64 * acts.value(j, k) as f64).abs()
                        })
                        .sum::<f64>()
                        / 1024.0
                } else {
                    0.0
                };
                assert!(
                    (got - s).abs() <= 1e-5 * amag + 1e-6 + zp,
                    "{ty:?} {path:?} il={il} vs scalar at ({j},{i}): {got} vs {s}"
                );
            }
        }
    }
}

#[test]
fn every_path_matches_the_reference_on_random_blocks() {
    for (t, ty) in TYPES.into_iter().enumerate() {
        let be = ty.block_elems();
        // Column counts that are and are not multiples of the 64-element chunk.
        let cols_set = if be == 32 {
            vec![32, 96, 576]
        } else {
            vec![256, 768]
        };
        for (ci, &cols) in cols_set.iter().enumerate() {
            for (rows, n) in [
                (1, 1),
                (4, 1),
                (7, 3),
                (13, 5),
                (9, 8),
                (16, 1),
                (32, 8),
                (48, 13),
            ] {
                check(
                    ty,
                    rows,
                    cols,
                    n,
                    Fill::Random,
                    1 + 100 * t as u64 + 10 * ci as u64 + rows as u64,
                );
            }
        }
    }
}

#[test]
fn interleaved_tiles_match_the_reference_for_every_activation_row_count() {
    // Every tile width and remainder (1..=9 activation rows; the interleaved tiles take up to 8
    // at a time), one to three 16-row groups and a row count that is not a multiple of 16 (plain
    // arrangement), several blocks with a padded chunk for the 32-element formats.
    for (t, ty) in TYPES.into_iter().enumerate() {
        let be = ty.block_elems();
        let cols = if be == 32 { 5 * be } else { 2 * be };
        for rows in [16, 32, 48, 40] {
            for n in 1..=9 {
                check(
                    ty,
                    rows,
                    cols,
                    n,
                    Fill::Random,
                    7 + 1000 * t as u64 + 10 * rows as u64 + n as u64,
                );
            }
        }
    }
}

#[test]
fn every_path_matches_the_reference_on_edge_case_blocks() {
    for ty in TYPES {
        let cols = ty.block_elems() * 2;
        for fill in [
            Fill::Zeros,
            Fill::ZeroScale,
            Fill::MaxBytes,
            Fill::NegativeScales,
        ] {
            check(ty, 5, cols, 3, fill, 77);
            check(ty, 16, cols, 9, fill, 78);
        }
    }
}

#[test]
fn integer_block_sums_do_not_saturate_on_extreme_blocks() {
    // The largest quants (all bits set; Q8_0's -128) against activations that all quantize to
    // +127 or -127: the AVX2 tiles' i16 pair and block sums reach their bounds here.
    for ty in TYPES {
        let cols = ty.block_elems() * 2;
        let mut bytes = make_matrix(ty, 16, cols, &mut Rng(3), Fill::MaxBytes);
        if ty == GgmlType::Q8_0 {
            for blk in bytes.chunks_exact_mut(ty.block_bytes()) {
                blk[2..].fill(0x80);
            }
        }
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; 3 * cols];
            for layout_for in [KernelPath::Scalar, KernelPath::Avx512Vnni] {
                check_matrix(ty, 16, cols, 3, Fill::MaxBytes, &bytes, &x, layout_for);
            }
        }
    }
}

#[test]
fn float_weights_are_quantized_to_eight_bits_per_32() {
    let mut rng = Rng(9);
    let (rows, cols) = (6, 80);
    let wf: Vec<f32> = (0..rows * cols).map(|_| rng.unit()).collect();
    let w = QMatrix::from_f32(rows, cols, &wf).unwrap();
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        w.row_to_f32(r, &mut row).unwrap();
        for (c, &v) in row.iter().enumerate() {
            let blk = &wf[r * cols + c / 32 * 32..r * cols + ((c / 32 + 1) * 32).min(cols)];
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((v - wf[r * cols + c]).abs() <= amax / 254.0 * 1.01 + 1e-6);
        }
    }
    let x = make_acts(2, cols, &mut rng);
    let pool = ThreadPool::new(1);
    let mut out = vec![0f32; 2 * rows];
    let mut scratch = QActs::new();
    matmul_f32(
        KernelPath::detect(),
        &w,
        &x,
        2,
        &mut out,
        &mut scratch,
        &pool,
    )
    .unwrap();
    for j in 0..2 {
        for i in 0..rows {
            let r: f32 = (0..cols).map(|k| wf[i * cols + k] * x[j * cols + k]).sum();
            let mag: f32 = (0..cols)
                .map(|k| (wf[i * cols + k] * x[j * cols + k]).abs())
                .sum();
            assert!(
                (out[j * rows + i] - r).abs() <= 0.02 * mag + 1e-4,
                "{} vs {r}",
                out[j * rows + i]
            );
        }
    }
}

#[test]
fn packed_rows_dequantize_like_the_reference() {
    let mut rng = Rng(5);
    for (ty, rows, layout_for) in TYPES
        .into_iter()
        .flat_map(|t| [(t, 3, KernelPath::Scalar), (t, 32, KernelPath::Avx512Vnni)])
    {
        let cols = ty.block_elems() * 3;
        let bytes = make_matrix(ty, rows, cols, &mut rng, Fill::Random);
        let mut w = QMatrix::for_ggml_on(ty, rows, cols, layout_for).unwrap();
        w.pack_ggml_rows(0, &bytes).unwrap();
        let rb = ty.row_bytes(cols).unwrap();
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            dequantize_row(ty, &bytes[r * rb..(r + 1) * rb], &mut a).unwrap();
            w.row_to_f32(r, &mut b).unwrap();
            assert_packed_row_eq(ty, &a, &b, &format!("{ty:?} r{r}"));
        }
    }
}

/// A packed row against reference values: exact for f16-scaled formats; K-quant composite
/// scales/mins are rounded to f16, so allow 2^-11 of (|scale * q| + |min|), bounded by the
/// group's largest values.
fn assert_packed_row_eq(ty: GgmlType, reference: &[f32], packed: &[f32], what: &str) {
    for (k, (&a, &b)) in reference.iter().zip(packed).enumerate() {
        let g = &reference[k / 16 * 16..k / 16 * 16 + 16];
        let gmax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
        let tol = if k_quant(ty) {
            3.0 * gmax / 2048.0 + 1e-6
        } else {
            0.0
        };
        assert!((a - b).abs() <= tol, "{what} k{k}: {a} vs {b}");
    }
}

/// Blocks and their values as the `gguf` Python package dequantizes them
/// (`scripts/kernels-reference.py`; random Q5_K bytes, Q5_1 quantized by gguf): the scalar
/// reference gives the same f32 bits, the packed rows the same values.
#[test]
fn five_bit_blocks_dequantize_as_the_gguf_package_does() {
    let mut data: &[u8] = include_bytes!("../testdata/gguf_q5.bin");
    let u32_at = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut seen = Vec::new();
    while !data.is_empty() {
        let ty = GgmlType::from_id(u32_at(data)).unwrap();
        let n = u32_at(&data[4..]) as usize;
        let (blocks, rest) = data[8..].split_at(n * ty.block_bytes());
        let (values, rest) = rest.split_at(n * ty.block_elems() * 4);
        data = rest;
        let want: Vec<f32> = values
            .chunks_exact(4)
            .map(|v| f32::from_le_bytes([v[0], v[1], v[2], v[3]]))
            .collect();
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, blocks, &mut got).unwrap();
        for (e, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty:?} element {e}: {g} vs gguf's {w}"
            );
        }
        // Each block a row of the packed matrix.
        let be = ty.block_elems();
        let m = QMatrix::from_ggml(ty, n, be, blocks).unwrap();
        let mut row = vec![0f32; be];
        for (r, w) in want.chunks_exact(be).enumerate() {
            m.row_to_f32(r, &mut row).unwrap();
            assert_packed_row_eq(ty, w, &row, &format!("{ty:?} gguf block {r}"));
        }
        seen.push(ty);
    }
    assert_eq!(seen, [GgmlType::Q5_1, GgmlType::Q5_K]);
}

#[test]
fn shape_errors_are_typed_not_panics() {
    let w = QMatrix::from_f32(4, 64, &[0.5; 256]).unwrap();
    let mut acts = QActs::new();
    acts.quantize(&[1.0; 128], 1, 128).unwrap();
    let pool = ThreadPool::new(1);
    let mut out = vec![0f32; 4];
    assert!(matches!(
        matmul(KernelPath::Scalar, &w, &acts, &mut out, &pool),
        Err(Error::ShapeMismatch { .. })
    ));
    acts.quantize(&[1.0; 64], 1, 64).unwrap();
    let mut short = vec![0f32; 3];
    assert!(matmul(KernelPath::Scalar, &w, &acts, &mut short, &pool).is_err());
    assert!(QMatrix::from_ggml(GgmlType::Q4_0, 2, 32, &[0u8; 35]).is_err());
    assert!(w.row_to_f32(4, &mut [0f32; 64]).is_err());
}

#[test]
fn paths_that_the_cpu_lacks_are_refused() {
    for p in KernelPath::ALL {
        if !p.is_available() {
            let w = QMatrix::from_f32(1, 32, &[0.0; 32]).unwrap();
            let mut a = QActs::new();
            a.quantize(&[0.0; 32], 1, 32).unwrap();
            let r = matmul(p, &w, &a, &mut [0.0], &ThreadPool::new(1));
            assert!(matches!(r, Err(Error::PathUnavailable(_))));
        }
    }
    assert!(KernelPath::detect().is_available());
    assert_eq!(KernelPath::from_name("avx2"), Some(KernelPath::Avx2));
}

/// The AMX path gives the VNNI path's results bit for bit (same exact integer dots, same float
/// steps in the same order) for every interleaved layout (Q6_K's included), at activation row counts with and
/// without a remainder past the 16-row tiles, odd and even block pairs, one to three groups.
#[test]
fn amx_tiles_equal_the_vnni_tiles_bit_for_bit() {
    if !KernelPath::Amx.is_available() {
        eprintln!("skipped: this CPU (or OS) has no AMX-INT8");
        return;
    }
    let pool = ThreadPool::new(2);
    for (t, ty) in TYPES.into_iter().enumerate() {
        let be = ty.block_elems();
        let cols_set = if be == 32 {
            vec![64, 5 * 32, 576]
        } else {
            vec![256, 3 * 256]
        };
        for (ci, &cols) in cols_set.iter().enumerate() {
            for (rows, n) in [(16, 16), (32, 17), (48, 40), (16, 64), (32, 33)] {
                let mut rng = Rng(5 + 1000 * t as u64 + 100 * ci as u64 + n as u64);
                let bytes = make_matrix(ty, rows, cols, &mut rng, Fill::Random);
                let x = make_acts(n, cols, &mut rng);
                let mut w = QMatrix::for_ggml_on(ty, rows, cols, KernelPath::Amx).unwrap();
                w.pack_ggml_rows(0, &bytes).unwrap();
                assert!(w.interleaved(), "{ty:?} {rows}x{cols}");
                let mut acts = QActs::new();
                acts.quantize(&x, n, cols).unwrap();
                let mut vnni = vec![f32::NAN; n * rows];
                let mut amx = vec![f32::NAN; n * rows];
                matmul(KernelPath::Avx512Vnni, &w, &acts, &mut vnni, &pool).unwrap();
                matmul(KernelPath::Amx, &w, &acts, &mut amx, &pool).unwrap();
                for (i, (v, a)) in vnni.iter().zip(&amx).enumerate() {
                    assert_eq!(
                        v.to_bits(),
                        a.to_bits(),
                        "{ty:?} rows={rows} cols={cols} n={n} at {i}: vnni {v}, amx {a}"
                    );
                }
            }
        }
    }
}
