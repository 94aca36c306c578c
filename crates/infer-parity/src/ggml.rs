//! [`GgmlModel`]: a scalar forward that reproduces, bit for bit,
//! the arithmetic of llama.cpp's CPU backend (ggml-cpu built with GCC for x86-64 with AVX-512,
//! as scripts/build-llama-cpp.sh builds it) for llama-family GGUF files whose layer matrices are
//! Q4_1 and for Gemma 3 files whose layer matrices are Q5_0, Q8_0, Q4_K and Q6_K, run with an f32
//! K/V cache, no flash attention, n_ubatch 512 and only the last token's logits, as the parity
//! reference is (scripts/parity/README.md). It is a reference mode: slow (scalar code, rows
//! spread over the kernel pool), for checking greedy ids against llama.cpp's.
//!
//! What ggml computes for such a model, op by op (each emulated below):
//! - activations entering a Q4_1 product are quantized by `quantize_row_q8_1` (per block of 32:
//!   `d = amax / 127`, `q = round_half_even(x * (127 / amax))`, `d` and `s = d * sum(q)` stored
//!   as f16) and the product is `ggml_vec_dot_q4_1_q8_1` (8 f32 lanes, each one 4-byte group of
//!   the block, fused multiply-add of `d_w * d_a` over blocks, then the 8-lane horizontal sum,
//!   plus `m * s` summed with a fused multiply-add in a scalar);
//! - the Q8_0 output head is `quantize_row_q8_0` + `ggml_vec_dot_q8_0_q8_0` (one row: llamafile's
//!   sgemm only takes two or more);
//! - RMSNorm sums squares in f64; the norm weight multiplies after the scale;
//! - RoPE (normal mode): angles `theta *= powf(base, -2 / n_dims)` from the position, `cosf`,
//!   `sinf`; each pair rotated with the product by `x0` fused (`fma(x0, c, -(x1 * s))`,
//!   `fma(x0, s, x1 * c)`: GCC contracts the C expressions);
//! - K·Q: `ggml_vec_dot_f32` (4 x 16 lanes, fused multiply-add, AVX-512 reduction order);
//!   softmax scale and mask, `ggml_v_expf` (the vectorised exp), the sum in f64 of 16-lane
//!   partial sums, scaled by `1 / sum`;
//! - V·softmax over the padded KV length: llamafile's tinyBLAS (one 16-lane accumulator per
//!   output) when the ubatch has two or more tokens, `ggml_vec_dot_f32` for a single token;
//! - SwiGLU: `x / (1 + ggml_v_expf(-x)) * up`.
//!
//! Gemma 3 (`llm_build_gemma3`) adds, each emulated below:
//! - the embeddings times `sqrtf(n_embd)`; RMSNorm of each Q and K head (as above), then RoPE in
//!   NeoX mode (element `i` with `i + n_dims / 2`, same fused products) with the local base on
//!   sliding-window layers; Q times `1 / sqrt(head_dim)` before K·Q, softmax scale 1; positions
//!   `n_swa` or more behind masked on sliding-window layers; norms after attention and after the
//!   MLP; after the last layer's attention only the last token goes on (so its MLP products
//!   see one row);
//! - Q5_0 and Q8_0 products: `quantize_row_q8_0`, then `ggml_vec_dot_q{5,8}_0_q8_0` for one
//!   token and llamafile's tinyBLAS_Q0 for more, which share the lanes of the Q8_0 dot above;
//! - Q4_K products go through the repacked 8x8 layout (`repack_q4_K_to_q4_K_8_bl`): groups of
//!   four tokens take `ggml_gemm_q4_K_8x8_q8_K` (activations by `ggml_quantize_mat_q8_K_4x8`,
//!   the reference rounding), the rest `ggml_gemv_q4_K_8x8_q8_K` (`quantize_row_q8_K`); both sum
//!   the integer `scale·q·a` and `min·bsum` exactly and accumulate them with fused multiply-adds
//!   by `d·d_a` and `dmin·d_a`, the gemm once per pair of sub-blocks, the gemv once per
//!   super-block;
//! - Q6_K products: ggml-cpu's tiled kernel for 8 or more tokens (per super-block the exact
//!   integer sum, times `d_w`, then fused with `d_a` into the running sum), and
//!   `ggml_vec_dot_q6_K_q8_K` (8 integer lanes, fused multiply-add, 8-lane sum) for fewer;
//! - GEGLU: `gelu(gate) * up` with ggml's f16 GELU table (`GGML_GELU_FP16`: the tanh formula in
//!   f32 at every f16 input, rounded to f16; 0 at or below -10, the identity at or above 10).
//!
//! Each step (sequence) runs on its own, in ubatches of up to 512 tokens, as llama.cpp decodes
//! one sequence; the arithmetic of a row never depends on the thread count.

use std::fs::File;
use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::GgmlDType;
use half::f16;
use hearth_infer::{Arch, Error, Hparams};
use hearth_kernels::ThreadPool;

/// llama.cpp's n_ubatch in the reference settings: a longer step is decoded in pieces.
const UBATCH: usize = 512;
/// The KV length is padded to this for the attention sums (llama.cpp pads it to 256; positions
/// past the last one get softmax weight 0, which changes no lane of either product, so any
/// multiple of 64 gives the same bits).
const KV_PAD: usize = 64;

// ---------------------------------------------------------------------------------------------
// Primitives (each mirrors one ggml-cpu function, see the module doc).
// ---------------------------------------------------------------------------------------------

/// Bytes of one Q4_1 block (f16 d, f16 m, 16 bytes of nibbles).
const Q4_1_BYTES: usize = 20;
/// Bytes of one Q8_0 block (f16 d, 32 i8).
const Q8_0_BYTES: usize = 34;

fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// `x` rounded to f16 and back (round to nearest even, as F16C's `vcvtps2ph`).
fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// One quantized block of 32 activations (`block_q8_1`; `s` is unused for Q8_0).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Q8Block {
    d: f32,
    s: f32,
    q: [i8; 32],
}

const Q8_ZERO: Q8Block = Q8Block {
    d: 0.0,
    s: 0.0,
    q: [0; 32],
};

/// `quantize_row_q8_1` (x86 AVX2 branch) of one row into `out` (`x.len() / 32` blocks); with
/// `with_sum` false it is `quantize_row_q8_0` (the same rounding, no `s`).
fn quantize_row_q8(x: &[f32], with_sum: bool, out: &mut [Q8Block]) {
    for (xb, y) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in y.q.iter_mut().zip(xb) {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sum += r;
        }
        y.d = round_f16(d);
        y.s = if with_sum {
            round_f16(d * sum as f32)
        } else {
            0.0
        };
    }
}

/// `hsum_float_8`: (lanes 0-3 + lanes 4-7), then (0 + 2) + (1 + 3).
fn hsum8(v: &[f32; 8]) -> f32 {
    let r = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// `_mm512_reduce_add_ps` as GCC expands it: halves added down to one lane.
fn reduce16(v: &[f32; 16]) -> f32 {
    let mut h = [0f32; 8];
    for i in 0..8 {
        h[i] = v[i] + v[i + 8];
    }
    hsum8(&h)
}

/// `ggml_vec_dot_q4_1_q8_1`: one Q4_1 row (raw GGUF blocks) against quantized activations.
fn dot_q4_1_q8_1(row: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(a) {
        let (d, m) = (f16_at(&b[0..2]), f16_at(&b[2..4]));
        summs = m.mul_add(y.s, summs);
        let dd = d * y.d;
        let qs = &b[4..Q4_1_BYTES];
        for (lane, acc) in acc.iter_mut().enumerate() {
            // Byte k holds element k (low nibble) and element k + 16 (high nibble).
            let (bytes, shift) = if lane < 4 {
                (&qs[4 * lane..4 * lane + 4], 0)
            } else {
                (&qs[4 * lane - 16..4 * lane - 12], 4)
            };
            let s: i32 = bytes
                .iter()
                .zip(&y.q[4 * lane..4 * lane + 4])
                .map(|(&b, &a)| i32::from((b >> shift) & 15) * i32::from(a))
                .sum();
            *acc = dd.mul_add(s as f32, *acc);
        }
    }
    hsum8(&acc) + summs
}

/// `ggml_vec_dot_q8_0_q8_0`: one Q8_0 row (raw GGUF blocks) against quantized activations.
fn dot_q8_0_q8_0(row: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = [0f32; 8];
    for (b, y) in row.chunks_exact(Q8_0_BYTES).zip(a) {
        let dd = f16_at(&b[0..2]) * y.d;
        let qs = &b[2..Q8_0_BYTES];
        for (lane, acc) in acc.iter_mut().enumerate() {
            let s: i32 = qs[4 * lane..4 * lane + 4]
                .iter()
                .zip(&y.q[4 * lane..4 * lane + 4])
                .map(|(&w, &a)| i32::from(w as i8) * i32::from(a))
                .sum();
            *acc = dd.mul_add(s as f32, *acc);
        }
    }
    hsum8(&acc)
}

/// Bytes of one Q5_0 block (f16 d, 32 high bits, 16 bytes of nibbles).
const Q5_0_BYTES: usize = 22;
/// Bytes of one Q4_K super-block of 256 (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins,
/// 128 bytes of nibbles).
const Q4_K_BYTES: usize = 144;
/// Bytes of one Q6_K super-block of 256 (128 bytes of low nibbles, 64 of high bit pairs, 16
/// i8 scales, f16 d).
const Q6_K_BYTES: usize = 210;

/// The 32 signed weights of one Q5_0 block (`q - 16`; element `j` in the low nibble of byte
/// `j`, element `j + 16` in its high nibble, fifth bits in `qh`).
fn decode_q5_0(b: &[u8]) -> [i8; 32] {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..Q5_0_BYTES];
    let mut w = [0i8; 32];
    for j in 0..16 {
        let lo = (qs[j] & 15) | ((((qh >> j) & 1) as u8) << 4);
        let hi = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        w[j] = lo as i8 - 16;
        w[j + 16] = hi as i8 - 16;
    }
    w
}

/// `ggml_vec_dot_q5_0_q8_0` (and llamafile's tinyBLAS_Q0 for Q5_0, the same lanes): 8 lanes of
/// 4-element integer sums, each scaled by `d_w * d_a` with a fused multiply-add, then summed.
fn dot_q5_0_q8_0(row: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = [0f32; 8];
    for (b, y) in row.chunks_exact(Q5_0_BYTES).zip(a) {
        let dd = f16_at(&b[0..2]) * y.d;
        let w = decode_q5_0(b);
        for (lane, acc) in acc.iter_mut().enumerate() {
            let s: i32 = w[4 * lane..4 * lane + 4]
                .iter()
                .zip(&y.q[4 * lane..4 * lane + 4])
                .map(|(&w, &a)| i32::from(w) * i32::from(a))
                .sum();
            *acc = dd.mul_add(s as f32, *acc);
        }
    }
    hsum8(&acc)
}

/// One super-block of 256 quantized activations (`block_q8_K`).
#[derive(Clone, Copy, Debug)]
struct Q8KBlock {
    d: f32,
    q: [i8; 256],
    /// Sums of each 16 consecutive `q`.
    bsums: [i32; 16],
}

const Q8K_ZERO: Q8KBlock = Q8KBlock {
    d: 0.0,
    q: [0; 256],
    bsums: [0; 16],
};

/// `quantize_row_q8_K_ref` (x86 takes the reference code): the element of largest magnitude
/// (the first one) maps to -127, `q = round_half_even(x * (-127 / max))`, `d = 1 / iscale`.
fn quantize_row_q8_k(x: &[f32], out: &mut [Q8KBlock]) {
    for (xb, y) in x.chunks_exact(256).zip(out.iter_mut()) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *y = Q8K_ZERO;
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in y.q.iter_mut().zip(xb) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (s, c) in y.bsums.iter_mut().zip(y.q.chunks_exact(16)) {
            *s = c.iter().map(|&q| i32::from(q)).sum();
        }
        y.d = 1.0 / iscale;
    }
}

/// `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K super-block.
fn q4_k_scale_min(j: usize, s: &[u8]) -> (i32, i32) {
    if j < 4 {
        (i32::from(s[j] & 63), i32::from(s[j + 4] & 63))
    } else {
        (
            i32::from((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4)),
            i32::from((s[j + 4] >> 4) | ((s[j] >> 6) << 4)),
        )
    }
}

/// Q4_K against Q8_K as the repacked 8x8 kernels compute one output: the exact integer sums
/// `Σ scale·q·a` and `Σ min·bsum`, each converted and accumulated with a fused multiply-add by
/// `d_w * d_a` (resp. `dmin_w * d_a`), the two accumulators subtracted at the end.
/// `ggml_gemv_q4_K_8x8_q8_K` (tokens past the last group of four) accumulates once per
/// super-block; `ggml_gemm_q4_K_8x8_q8_K` (groups of four tokens) once per pair of sub-blocks.
fn dot_q4_k_q8_k(row: &[u8], a: &[Q8KBlock], gemm: bool) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (b, y) in row.chunks_exact(Q4_K_BYTES).zip(a) {
        let (d, dmin) = (f16_at(&b[0..2]), f16_at(&b[2..4]));
        let (dd, ddmin) = (d * y.d, dmin * y.d);
        let scales = &b[4..16];
        let qs = &b[16..Q4_K_BYTES];
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = q4_k_scale_min(j, scales);
            let bytes = &qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            let s: i32 = bytes
                .iter()
                .zip(&y.q[32 * j..32 * j + 32])
                .map(|(&w, &a)| i32::from((w >> shift) & 15) * i32::from(a))
                .sum();
            isum += sc * s;
            msum += m * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
            if gemm && j % 2 == 1 {
                acc = (isum as f32).mul_add(dd, acc);
                acc_min = (msum as f32).mul_add(ddmin, acc_min);
                (isum, msum) = (0, 0);
            }
        }
        if !gemm {
            acc = (isum as f32).mul_add(dd, acc);
            acc_min = (msum as f32).mul_add(ddmin, acc_min);
        }
    }
    acc - acc_min
}

/// The unsigned 6-bit weights (0..64) of one Q6_K super-block, in element order.
fn decode_q6_k(b: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    let mut q = [0u8; 256];
    for n in 0..2 {
        let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
        let q = &mut q[128 * n..];
        for l in 0..32 {
            q[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// `ggml_vec_dot_q6_K_q8_K` (AVX2 branch): 8 i32 lanes per super-block, lane `l` holding
/// `Σ scale·q·a` over the elements at `4l..4l + 4` of every 32, minus `32 · (scale·bsum)` of
/// sub-blocks `2l` and `2l + 1`; each lane converted and accumulated by a fused multiply-add with
/// `d_a * d_w`, then the 8-lane sum.
fn dot_q6_k_q8_k(row: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = [0f32; 8];
    for (b, y) in row.chunks_exact(Q6_K_BYTES).zip(a) {
        let q = decode_q6_k(b);
        let sc = &b[192..208];
        let d = y.d * f16_at(&b[208..210]);
        let mut lanes = [0i32; 8];
        for (e, (&w, &x)) in q.iter().zip(&y.q).enumerate() {
            lanes[(e % 32) / 4] += i32::from(sc[e / 16] as i8) * i32::from(w) * i32::from(x);
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            let s0 = i32::from(sc[2 * l] as i8) * y.bsums[2 * l];
            let s1 = i32::from(sc[2 * l + 1] as i8) * y.bsums[2 * l + 1];
            *lane -= (s0 + s1) << 5;
            acc[l] = d.mul_add(*lane as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

/// Whether the tiled kernel's `buf + result * d_a` is contracted into one fused multiply-add.
const TILED_FMA: bool = true;

/// Q6_K against Q8_K as ggml-cpu's tiled K-quant kernel computes one output (8 or more tokens):
/// per super-block the exact integer `Σ scale·(q·a - 32·bsum)`, converted, times `d_w`, then
/// times `d_a` added to the running sum.
fn dot_q6_k_tiled(row: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in row.chunks_exact(Q6_K_BYTES).zip(a) {
        let q = decode_q6_k(b);
        let sc = &b[192..208];
        let mut s = 0i32;
        for (e, (&w, &x)) in q.iter().zip(&y.q).enumerate() {
            s += i32::from(sc[e / 16] as i8) * i32::from(w) * i32::from(x);
        }
        for (j, &bs) in y.bsums.iter().enumerate() {
            s -= 32 * i32::from(sc[j] as i8) * bs;
        }
        let r = s as f32 * f16_at(&b[208..210]);
        acc = if TILED_FMA {
            r.mul_add(y.d, acc)
        } else {
            acc + r * y.d
        };
    }
    acc
}

/// The GELU of ggml-cpu (`GGML_GELU_FP16`): a table over all f16 inputs of the tanh formula in
/// f32, rounded to f16.
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        const GELU_COEF_A: f32 = 0.044715;
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        (0..=u16::MAX)
            .map(|i| {
                let x = f16::from_bits(i).to_f32();
                // GCC fuses `1 + GELU_COEF_A * x * x` into fma(GELU_COEF_A * x, x, 1).
                let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
                let g = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh());
                round_f16(g)
            })
            .collect()
    })
}

/// `ggml_vec_geglu_f32`, one element: `gelu(x) * g`, GELU from the f16 table.
fn geglu(x: f32, g: f32, table: &[f32]) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x * g
    } else {
        table[usize::from(f16::from_f32(x).to_bits())] * g
    }
}

/// `ggml_vec_dot_f32` (AVX-512) for `x.len()` a multiple of 64: four 16-lane accumulators
/// (element `i` in accumulator `(i / 16) % 4`, lane `i % 16`), fused multiply-add, then
/// `(a0 + a2) + (a1 + a3)` lane-wise and the 16-lane reduction.
fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    debug_assert!(x.len().is_multiple_of(64) && x.len() == y.len());
    let mut acc = [[0f32; 16]; 4];
    for (xc, yc) in x.chunks_exact(64).zip(y.chunks_exact(64)) {
        for (j, acc) in acc.iter_mut().enumerate() {
            for t in 0..16 {
                acc[t] = xc[j * 16 + t].mul_add(yc[j * 16 + t], acc[t]);
            }
        }
    }
    let mut s = [0f32; 16];
    for t in 0..16 {
        s[t] = (acc[0][t] + acc[2][t]) + (acc[1][t] + acc[3][t]);
    }
    reduce16(&s)
}

/// One output of llamafile's tinyBLAS f32 kernel (AVX-512, `k` a multiple of 16): a single
/// 16-lane accumulator over the whole row, then the 16-lane reduction.
fn dot_f32_tinyblas(x: &[f32], y: &[f32]) -> f32 {
    debug_assert!(x.len().is_multiple_of(16) && x.len() == y.len());
    let mut acc = [0f32; 16];
    for (xc, yc) in x.chunks_exact(16).zip(y.chunks_exact(16)) {
        for t in 0..16 {
            acc[t] = xc[t].mul_add(yc[t], acc[t]);
        }
    }
    reduce16(&acc)
}

/// `ggml_v_expf` (AVX-512 variant), one lane.
fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    // _mm512_scalef_ps(j, n) = j * 2^n, rounded once; the f64 product is exact.
    (f64::from(j) * 2f64.powi(n as i32)) as f32
}

/// `ggml_v_silu`, one lane: `x / (1 + exp(0 - x))`.
fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// `ggml_compute_forward_rms_norm_f32` followed by the multiplication by the weight.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let mut sum = 0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, &v), &wv) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * wv;
    }
}

/// `ggml_rope_cache_init` for one position (no scaling, no frequency factors): `(cos, sin)`
/// per pair.
fn rope_cache(pos: usize, theta_scale: f32, out: &mut [(f32, f32)]) {
    let mut theta = pos as f32;
    for cs in out.iter_mut() {
        *cs = (theta.cos(), theta.sin());
        theta *= theta_scale;
    }
}

/// RoPE, normal (interleaved pairs) mode, as GCC compiles `rotate_pairs` (it contracts each
/// `a * b ± c * d` into one fused multiply-add, the product with `x0` fused; checked against
/// llama.cpp's Qcur/Kcur).
fn rope_normal(x: &mut [f32], cache: &[(f32, f32)]) {
    for (pair, &(c, s)) in x.chunks_exact_mut(2).zip(cache) {
        let (x0, x1) = (pair[0], pair[1]);
        pair[0] = x0.mul_add(c, -(x1 * s));
        pair[1] = x0.mul_add(s, x1 * c);
    }
}

/// RoPE, NeoX mode (element `i` paired with `i + n_dims / 2`), with the same fused products as
/// [`rope_normal`].
fn rope_neox(x: &mut [f32], cache: &[(f32, f32)]) {
    let half = x.len() / 2;
    let (lo, hi) = x.split_at_mut(half);
    for ((a, b), &(c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(cache) {
        let (x0, x1) = (*a, *b);
        *a = x0.mul_add(c, -(x1 * s));
        *b = x0.mul_add(s, x1 * c);
    }
}

/// One softmax row of the attention (`ggml_compute_forward_soft_max_f32` with scale `scale`
/// and a causal mask): `kq[..live]` are the K·Q products of the unmasked positions; `w` (a
/// multiple of 16 long) receives the weights, 0 past `live`.
fn soft_max(kq: &[f32], scale: f32, w: &mut [f32]) {
    let live = kq.len();
    let mut max = f32::NEG_INFINITY;
    for (wi, &v) in w.iter_mut().zip(kq) {
        // `wp[i] += slope * mask[i]` with slope 1 and mask 0 leaves the scaled value as is.
        *wi = v * scale;
        max = max.max(*wi);
    }
    let mut sum = 0f64;
    for (c, chunk) in w.chunks_exact_mut(16).enumerate() {
        let mut e = [0f32; 16];
        for (t, e) in e.iter_mut().enumerate() {
            if c * 16 + t < live {
                *e = v_expf(chunk[t] - max);
            }
        }
        chunk.copy_from_slice(&e);
        sum += f64::from(reduce16(&e));
    }
    let inv = (1.0 / sum) as f32;
    for v in w.iter_mut() {
        *v *= inv;
    }
}

mod model;

pub use model::{Cache, GgmlModel};
