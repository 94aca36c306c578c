//! [`Numerics::Ggml`](crate::Numerics::Ggml): a scalar forward that reproduces, bit for bit,
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
use hearth_kernels::ThreadPool;

use super::Reader;
use crate::gguf::{Arch, Hparams};
use crate::model::{Backend, Step};
use crate::Error;

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

// ---------------------------------------------------------------------------------------------
// The model.
// ---------------------------------------------------------------------------------------------

/// A weight matrix as stored in the GGUF file (rows of raw blocks).
struct RawMatrix {
    ty: GgmlDType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl RawMatrix {
    /// (bytes, elements) of one block.
    fn block(&self) -> (usize, usize) {
        match self.ty {
            GgmlDType::Q4_1 => (Q4_1_BYTES, 32),
            GgmlDType::Q5_0 => (Q5_0_BYTES, 32),
            GgmlDType::Q4K => (Q4_K_BYTES, 256),
            GgmlDType::Q6K => (Q6_K_BYTES, 256),
            _ => (Q8_0_BYTES, 32),
        }
    }

    fn row_bytes(&self) -> usize {
        let (bytes, len) = self.block();
        self.cols / len * bytes
    }

    fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Whether activations are quantized to Q8_K (the K-quants) rather than Q8_0/Q8_1.
    fn k_quant(&self) -> bool {
        matches!(self.ty, GgmlDType::Q4K | GgmlDType::Q6K)
    }

    /// Whether activations are quantized with the block sum (Q8_1, for Q4_1) or not (Q8_0).
    fn wants_sum(&self) -> bool {
        self.ty == GgmlDType::Q4_1
    }

    fn dot(&self, r: usize, a: &[Q8Block]) -> f32 {
        match self.ty {
            GgmlDType::Q4_1 => dot_q4_1_q8_1(self.row(r), a),
            GgmlDType::Q5_0 => dot_q5_0_q8_0(self.row(r), a),
            _ => dot_q8_0_q8_0(self.row(r), a),
        }
    }

    /// A K-quant row against the Q8_K activations of token `t` of a product over `n` tokens.
    fn dot_k(&self, r: usize, a: &[Q8KBlock], t: usize, n: usize) -> f32 {
        match self.ty {
            GgmlDType::Q4K => dot_q4_k_q8_k(self.row(r), a, t < n - n % 4),
            _ if n >= 8 => dot_q6_k_tiled(self.row(r), a),
            _ => dot_q6_k_q8_k(self.row(r), a),
        }
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: RawMatrix,
    wk: RawMatrix,
    wv: RawMatrix,
    wo: RawMatrix,
    ffn_norm: Vec<f32>,
    gate: RawMatrix,
    up: RawMatrix,
    down: RawMatrix,
    /// Gemma 3's per-head Q and K norms and the norms after attention and after the MLP.
    gemma: Option<GemmaNorms>,
}

struct GemmaNorms {
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn: Vec<f32>,
    post_ffw: Vec<f32>,
}

pub(crate) struct GgmlModel {
    hp: Hparams,
    pool: ThreadPool,
    embd: RawMatrix,
    /// `None`: tied to the embeddings.
    output: Option<RawMatrix>,
    norm: Vec<f32>,
    layers: Vec<Layer>,
    theta_scale: f32,
    /// Gemma 3: theta scale of the sliding-window layers.
    theta_scale_local: f32,
    kq_scale: f32,
}

fn unsupported(name: &str, what: impl std::fmt::Display) -> Error {
    Error::metadata(name, format!("numerics = \"ggml\" does not support {what}"))
}

impl Reader<'_> {
    /// A 2-D tensor's raw blocks, which must be of one of `types`.
    fn raw(&mut self, name: &str, types: &[GgmlDType]) -> Result<RawMatrix, Error> {
        let info = self.info(name)?;
        let (rows, cols) = info.shape.dims2().map_err(|e| Error::metadata(name, e))?;
        if !types.contains(&info.ggml_dtype) {
            return Err(unsupported(
                name,
                format_args!("block type {:?} here (it takes {types:?})", info.ggml_dtype),
            ));
        }
        let mut m = RawMatrix {
            ty: info.ggml_dtype,
            rows,
            cols,
            data: Vec::new(),
        };
        if cols % m.block().1 != 0 {
            return Err(Error::metadata(name, "row length is not whole blocks"));
        }
        let len = rows * m.row_bytes();
        self.read_at(self.content.tensor_data_offset + info.offset, len)?;
        m.data = std::mem::take(&mut self.buf);
        Ok(m)
    }
}

/// Loads the emulation from an opened GGUF file (llama family with Q4_1 layer matrices, or Gemma
/// 3 with Q5_0/Q8_0/Q4_K/Q6_K ones).
pub(crate) fn from_gguf(
    path: &Path,
    content: &Content,
    hp: Hparams,
    threads: usize,
) -> Result<GgmlModel, Error> {
    let gemma = hp.arch == Arch::Gemma3;
    if !hp.head_dim.is_multiple_of(64)
        || !hp.n_embd.is_multiple_of(32)
        || !hp.n_ff.is_multiple_of(16)
    {
        return Err(unsupported(
            "attention.key_length",
            "head sizes other than multiples of 64 (or rows of partial blocks)",
        ));
    }
    let file = File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut rd = Reader {
        path,
        file,
        content,
        buf: Vec::new(),
        kernel: hearth_kernels::KernelPath::detect(),
    };
    let (e, hd) = (hp.n_embd, hp.head_dim);
    let layer_types: &[GgmlDType] = if gemma {
        &[
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ]
    } else {
        &[GgmlDType::Q4_1]
    };
    let head_types = [GgmlDType::Q8_0, GgmlDType::Q4_1];
    let embd = rd.raw("token_embd.weight", &[GgmlDType::Q8_0])?;
    if embd.rows != hp.vocab_size || embd.cols != e {
        return Err(Error::metadata(
            "token_embd.weight",
            "shape differs from vocab_size x embedding_length",
        ));
    }
    let output = if rd.has("output.weight") {
        Some(rd.raw("output.weight", &head_types)?)
    } else {
        None
    };
    for name in [
        "rope_freqs.weight",
        "blk.0.attn_q.bias",
        "blk.0.attn_output.bias",
        "rope_factors_long.weight",
    ] {
        if rd.has(name) {
            return Err(unsupported(name, "this tensor"));
        }
    }
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}.weight");
        let layer = Layer {
            attn_norm: rd.vector(&p("attn_norm"), e)?,
            wq: rd.raw(&p("attn_q"), layer_types)?,
            wk: rd.raw(&p("attn_k"), layer_types)?,
            wv: rd.raw(&p("attn_v"), layer_types)?,
            wo: rd.raw(&p("attn_output"), layer_types)?,
            ffn_norm: rd.vector(&p("ffn_norm"), e)?,
            gate: rd.raw(&p("ffn_gate"), layer_types)?,
            up: rd.raw(&p("ffn_up"), layer_types)?,
            down: rd.raw(&p("ffn_down"), layer_types)?,
            gemma: if gemma {
                Some(GemmaNorms {
                    q_norm: rd.vector(&p("attn_q_norm"), hd)?,
                    k_norm: rd.vector(&p("attn_k_norm"), hd)?,
                    post_attn: rd.vector(&p("post_attention_norm"), e)?,
                    post_ffw: rd.vector(&p("post_ffw_norm"), e)?,
                })
            } else {
                None
            },
        };
        let shapes = [
            (&layer.wq, hp.n_head * hd, e),
            (&layer.wk, hp.kv_dim(), e),
            (&layer.wv, hp.kv_dim(), e),
            (&layer.wo, e, hp.n_head * hd),
            (&layer.gate, hp.n_ff, e),
            (&layer.up, hp.n_ff, e),
            (&layer.down, e, hp.n_ff),
        ];
        if shapes.iter().any(|(m, r, c)| m.rows != *r || m.cols != *c) {
            return Err(Error::metadata(
                p("attn_q"),
                "layer shapes differ from the hyperparameters",
            ));
        }
        layers.push(layer);
    }
    let norm = rd.vector("output_norm.weight", e)?;
    Ok(GgmlModel {
        // llama.cpp: theta_scale = powf(freq_base, -2.0f / n_dims); kq_scale = 1 / sqrtf(n_embd_head).
        theta_scale: hp.rope_theta.powf(-2.0 / hd as f32),
        theta_scale_local: hp.rope_theta_local.powf(-2.0 / hd as f32),
        // Gemma 3 scales Q by 1 / sqrt(head_dim) itself and attends with scale 1.
        kq_scale: if gemma { 1.0 } else { 1.0 / (hd as f32).sqrt() },
        pool: ThreadPool::new(threads),
        hp,
        embd,
        output,
        norm,
        layers,
    })
}

/// Per-ubatch buffers.
#[derive(Default)]
struct Bufs {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    acts: Vec<Q8Block>,
    kacts: Vec<Q8KBlock>,
    tmp: Vec<f32>,
}

/// Something that looks at named intermediate tensors (tests compare them with llama.cpp's).
/// Names follow llama.cpp's graph (`name-il` for layer `il`, `name` alone for `None`).
trait Tap {
    fn tap(&mut self, name: &str, il: Option<usize>, data: &[f32]);
}

/// Looks at nothing.
struct NoTap;

impl Tap for NoTap {
    fn tap(&mut self, _: &str, _: Option<usize>, _: &[f32]) {}
}

/// ggml's RMSNorm of each `e`-wide row of `x` with weight `w`, into `out` (resized).
/// `v` emptied and refilled with `len` zeros (its allocation kept).
fn zeroed(v: &mut Vec<f32>, len: usize) {
    v.clear();
    v.resize(len, 0.0);
}

/// The buffer `v` holds, taken out of it and zeroed to `len` (the caller gives it back).
fn take_zeroed(v: &mut Vec<f32>, len: usize) -> Vec<f32> {
    let mut out = std::mem::take(v);
    zeroed(&mut out, len);
    out
}

/// The residual connection: `x += y`, element by element.
fn add_into(x: &mut [f32], y: &[f32]) {
    for (xv, &yv) in x.iter_mut().zip(y) {
        *xv += yv;
    }
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, e: usize, out: &mut Vec<f32>) {
    out.clear();
    out.resize(x.len(), 0.0);
    for (xr, hr) in x.chunks_exact(e).zip(out.chunks_exact_mut(e)) {
        rms_norm(xr, w, eps, hr);
    }
}

/// Attention shape: query heads, query heads per KV head, head size, K/V row width.
#[derive(Debug, Clone, Copy)]
struct AttnDims {
    nh: usize,
    group: usize,
    hd: usize,
    kvd: usize,
}

impl AttnDims {
    fn of(hp: &Hparams) -> AttnDims {
        AttnDims {
            nh: hp.n_head,
            group: hp.n_head / hp.n_head_kv,
            hd: hp.head_dim,
            kvd: hp.kv_dim(),
        }
    }
}

/// Attention of the tokens of `q` (positions `p0..`) over one layer's cache, per token and head,
/// in llama.cpp's orders: K·Q by `vec_dot_f32`, softmax over the live positions, V·softmax over
/// the KV length padded to `KV_PAD` (tinyBLAS for two or more tokens, `vec_dot_f32` for one).
/// Positions before `first(pos)` are masked (sliding windows). Writes `out` (tokens × heads × hd).
#[allow(clippy::too_many_arguments)]
fn attend(
    k_cache: &[f32],
    v_cache: &[f32],
    q: &[f32],
    p0: usize,
    d: AttnDims,
    kq_scale: f32,
    first: impl Fn(usize) -> usize,
    out: &mut Vec<f32>,
) {
    let AttnDims { nh, group, hd, kvd } = d;
    let qd = nh * hd;
    let n = q.len() / qd;
    let n_kv_max = (p0 + n).div_ceil(KV_PAD) * KV_PAD;
    let (mut kq, mut w, mut vt) = (
        vec![0f32; n_kv_max],
        vec![0f32; n_kv_max],
        vec![0f32; n_kv_max],
    );
    out.clear();
    out.resize(n * qd, 0.0);
    for t in 0..n {
        let pos = p0 + t;
        let live = pos + 1;
        let masked = first(pos);
        let padded = live.div_ceil(KV_PAD) * KV_PAD;
        for head in 0..nh {
            let kvh = head / group;
            let qh = &q[t * qd + head * hd..t * qd + (head + 1) * hd];
            for (i, o) in kq[..live].iter_mut().enumerate() {
                *o = if i < masked {
                    f32::NEG_INFINITY
                } else {
                    dot_f32(&k_cache[i * kvd + kvh * hd..i * kvd + (kvh + 1) * hd], qh)
                };
            }
            soft_max(&kq[..live], kq_scale, &mut w[..padded]);
            let o = &mut out[t * qd + head * hd..t * qd + (head + 1) * hd];
            for (dd, o) in o.iter_mut().enumerate() {
                for (i, x) in vt[..live].iter_mut().enumerate() {
                    *x = v_cache[i * kvd + kvh * hd + dd];
                }
                vt[live..padded].fill(0.0);
                *o = if n >= 2 {
                    dot_f32_tinyblas(&vt[..padded], &w[..padded])
                } else {
                    dot_f32(&vt[..padded], &w[..padded])
                };
            }
        }
    }
}

impl GgmlModel {
    /// `out[t * rows + r] = w.row(r) · x[t]` for the `n` rows of `x` (each `w.cols` long),
    /// quantized first as ggml does.
    fn matmul(&self, w: &RawMatrix, x: &[f32], n: usize, b: &mut Bufs, out: &mut [f32]) {
        let k_quant = w.k_quant();
        let nb = w.cols / if k_quant { 256 } else { 32 };
        b.acts.clear();
        b.kacts.clear();
        if k_quant {
            b.kacts.resize(n * nb, Q8K_ZERO);
            for (xr, ar) in x.chunks_exact(w.cols).zip(b.kacts.chunks_exact_mut(nb)) {
                quantize_row_q8_k(xr, ar);
            }
        } else {
            b.acts.resize(n * nb, Q8_ZERO);
            for (xr, ar) in x.chunks_exact(w.cols).zip(b.acts.chunks_exact_mut(nb)) {
                quantize_row_q8(xr, w.wants_sum(), ar);
            }
        }
        // Rows of the weight matrix in pieces over the pool, output transposed in `tmp`.
        b.tmp.clear();
        b.tmp.resize(w.rows * n, 0.0);
        let (acts, kacts) = (&b.acts, &b.kacts);
        const PIECE: usize = 64;
        self.pool
            .for_each_piece_mut(&mut b.tmp, PIECE * n, &|i, piece| {
                for (j, o) in piece.chunks_exact_mut(n).enumerate() {
                    let r = i * PIECE + j;
                    for (t, o) in o.iter_mut().enumerate() {
                        *o = if k_quant {
                            w.dot_k(r, &kacts[t * nb..(t + 1) * nb], t, n)
                        } else {
                            w.dot(r, &acts[t * nb..(t + 1) * nb])
                        };
                    }
                }
            });
        for r in 0..w.rows {
            for t in 0..n {
                out[t * w.rows + r] = b.tmp[r * n + t];
            }
        }
    }

    /// `get_rows` of the Q8_0 embeddings: d × q, exact.
    fn embed(&self, tokens: &[u32], x: &mut Vec<f32>) -> Result<(), Error> {
        let (e, vocab) = (self.hp.n_embd, self.hp.vocab_size);
        x.clear();
        x.resize(tokens.len() * e, 0.0);
        for (xr, &t) in x.chunks_exact_mut(e).zip(tokens) {
            if t as usize >= vocab {
                return Err(Error::InvalidToken {
                    id: t,
                    vocab_size: vocab,
                });
            }
            for (xb, blk) in xr
                .chunks_exact_mut(32)
                .zip(self.embd.row(t as usize).chunks_exact(Q8_0_BYTES))
            {
                let d = f16_at(blk);
                for (o, &q) in xb.iter_mut().zip(&blk[2..]) {
                    *o = d * f32::from(q as i8);
                }
            }
        }
        Ok(())
    }

    /// The attention norm of `b.x` (into `b.h`) and its Q, K and V projections, in buffers taken
    /// from `b` (the caller gives them back).
    fn attn_inputs<T: Tap>(
        &self,
        l: &Layer,
        il: usize,
        n: usize,
        b: &mut Bufs,
        tap: &mut T,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let hp = &self.hp;
        let e = hp.n_embd;
        norm_rows(&b.x, &l.attn_norm, hp.rms_eps, e, &mut b.h);
        tap.tap("attn_norm", Some(il), &b.h);
        let (mut q, mut k, mut v) = (
            take_zeroed(&mut b.q, n * hp.n_head * hp.head_dim),
            take_zeroed(&mut b.k, n * hp.kv_dim()),
            take_zeroed(&mut b.v, n * hp.kv_dim()),
        );
        let h = std::mem::take(&mut b.h);
        self.matmul(&l.wq, &h, n, b, &mut q);
        self.matmul(&l.wk, &h, n, b, &mut k);
        self.matmul(&l.wv, &h, n, b, &mut v);
        b.h = h;
        (q, k, v)
    }

    /// The attention output projection of `b.att` for `n` tokens, in a buffer taken from
    /// `b.proj` (the caller gives it back).
    fn attn_out(&self, l: &Layer, n: usize, b: &mut Bufs) -> Vec<f32> {
        let att = std::mem::take(&mut b.att);
        let mut proj = take_zeroed(&mut b.proj, n * self.hp.n_embd);
        self.matmul(&l.wo, &att, n, b, &mut proj);
        b.att = att;
        proj
    }

    /// The MLP's gate and up projections of `b.h` for `rows` tokens, in buffers taken from
    /// `b.gate` and `b.up` (the caller gives them back).
    fn gate_up(&self, l: &Layer, rows: usize, b: &mut Bufs) -> (Vec<f32>, Vec<f32>) {
        let ff = self.hp.n_ff;
        let h = std::mem::take(&mut b.h);
        let mut gate = take_zeroed(&mut b.gate, rows * ff);
        let mut up = take_zeroed(&mut b.up, rows * ff);
        self.matmul(&l.gate, &h, rows, b, &mut gate);
        self.matmul(&l.up, &h, rows, b, &mut up);
        b.h = h;
        (gate, up)
    }

    /// RoPE on the new tokens' Q and K (positions `p0..`, cos/sin from ggml's per-position
    /// cache), then their K and V rows stored in layer `il`'s cache.
    fn rope_and_cache(
        &self,
        seq: &mut crate::Sequence,
        (il, p0): (usize, usize),
        theta_scale: f32,
        rope: fn(&mut [f32], &[(f32, f32)]),
        (q, k, v): (&mut [f32], &mut [f32], &[f32]),
    ) {
        let (hd, kvd) = (self.hp.head_dim, self.hp.kv_dim());
        let n = v.len() / kvd;
        let qd = q.len() / n;
        let mut cache = vec![(0f32, 0f32); hd / 2];
        for t in 0..n {
            rope_cache(p0 + t, theta_scale, &mut cache);
            for head in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope(head, &cache);
            }
            for head in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                rope(head, &cache);
            }
            let pos = p0 + t;
            seq.k[il][pos * kvd..(pos + 1) * kvd].copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
            seq.v[il][pos * kvd..(pos + 1) * kvd].copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
        }
    }

    /// One ubatch of one sequence: `tokens` at positions `seq.len + start..`; returns the hidden
    /// state of the last token after the final norm in `b.h[..n_embd]`.
    fn ubatch<T: Tap>(
        &self,
        seq: &mut crate::Sequence,
        start: usize,
        tokens: &[u32],
        b: &mut Bufs,
        tap: &mut T,
    ) -> Result<(), Error> {
        let hp = &self.hp;
        let (e, eps, dims) = (hp.n_embd, hp.rms_eps, AttnDims::of(hp));
        let n = tokens.len();
        let p0 = seq.len + start;

        self.embed(tokens, &mut b.x)?;
        tap.tap("embd", None, &b.x);

        for (il, l) in self.layers.iter().enumerate() {
            let (mut q, mut k, v) = self.attn_inputs(l, il, n, b, tap);
            self.rope_and_cache(
                seq,
                (il, p0),
                self.theta_scale,
                rope_normal,
                (&mut q, &mut k, &v),
            );
            tap.tap("Qcur", Some(il), &q);
            tap.tap("Kcur", Some(il), &k);
            tap.tap("Vcur", Some(il), &v);

            // Attention, per token and head.
            attend(
                &seq.k[il],
                &seq.v[il],
                &q,
                p0,
                dims,
                self.kq_scale,
                |_| 0,
                &mut b.att,
            );
            tap.tap("kqv_out", Some(il), &b.att);
            let mut proj = self.attn_out(l, n, b);
            add_into(&mut b.x, &proj);
            tap.tap("ffn_inp", Some(il), &b.x);

            // MLP.
            norm_rows(&b.x, &l.ffn_norm, eps, e, &mut b.h);
            tap.tap("ffn_norm", Some(il), &b.h);
            let (mut gate, up) = self.gate_up(l, n, b);
            for (g, &u) in gate.iter_mut().zip(&up) {
                *g = v_silu(*g) * u;
            }
            tap.tap("ffn_swiglu", Some(il), &gate);
            self.matmul(&l.down, &gate, n, b, &mut proj);
            add_into(&mut b.x, &proj);
            tap.tap("l_out", Some(il), &b.x);
            (b.q, b.k, b.v, b.proj, b.gate, b.up) = (q, k, v, proj, gate, up);
        }
        norm_rows(&b.x[(n - 1) * e..], &self.norm, eps, e, &mut b.h);
        tap.tap("result_norm", None, &b.h);
        Ok(())
    }

    /// [`Self::ubatch`] for Gemma 3 (`llm_build_gemma3`): scaled embeddings, Q/K norms, NeoX
    /// RoPE with the local or global base, Q scaled by `1 / sqrt(head_dim)`, sliding-window
    /// layers, norms after attention and after the GELU-gated MLP; only the last token goes
    /// on after the last layer's attention (llama.cpp's `inp_out_ids`).
    fn ubatch_gemma<T: Tap>(
        &self,
        seq: &mut crate::Sequence,
        start: usize,
        tokens: &[u32],
        b: &mut Bufs,
        tap: &mut T,
    ) -> Result<(), Error> {
        let hp = &self.hp;
        let (e, eps, dims) = (hp.n_embd, hp.rms_eps, AttnDims::of(hp));
        let hd = dims.hd;
        let n = tokens.len();
        let p0 = seq.len + start;
        let gelu = gelu_table();

        self.embed(tokens, &mut b.x)?;
        tap.tap("embd", None, &b.x);
        let embd_scale = (e as f32).sqrt();
        for v in b.x.iter_mut() {
            *v *= embd_scale;
        }
        tap.tap("inp_scaled", None, &b.x);
        let q_scale = 1.0 / (hd as f32).sqrt();

        let mut nrm = vec![0f32; hd];
        // Tokens going on through the layer (all but in the last layer after attention).
        let mut rows = n;
        for (il, l) in self.layers.iter().enumerate() {
            let g = l.gemma.as_ref().expect("Gemma norms");
            let sliding = hp.is_sliding(il);
            let theta_scale = if sliding {
                self.theta_scale_local
            } else {
                self.theta_scale
            };
            let (mut q, mut k, v) = self.attn_inputs(l, il, n, b, tap);
            for head in q.chunks_exact_mut(hd) {
                rms_norm(head, &g.q_norm, eps, &mut nrm);
                head.copy_from_slice(&nrm);
            }
            tap.tap("Qcur_normed", Some(il), &q);
            for head in k.chunks_exact_mut(hd) {
                rms_norm(head, &g.k_norm, eps, &mut nrm);
                head.copy_from_slice(&nrm);
            }
            tap.tap("Kcur_normed", Some(il), &k);
            self.rope_and_cache(seq, (il, p0), theta_scale, rope_neox, (&mut q, &mut k, &v));
            tap.tap("Qcur", Some(il), &q);
            tap.tap("Kcur", Some(il), &k);
            tap.tap("Vcur", Some(il), &v);
            for x in q.iter_mut() {
                *x *= q_scale;
            }

            // LLAMA_SWA_TYPE_STANDARD: position p is masked when pos - p >= n_swa.
            let first = |pos: usize| match (sliding, hp.sliding_window) {
                (true, Some(win)) => (pos + 1).saturating_sub(win),
                _ => 0,
            };
            attend(
                &seq.k[il],
                &seq.v[il],
                &q,
                p0,
                dims,
                self.kq_scale,
                first,
                &mut b.att,
            );
            tap.tap("kqv_out", Some(il), &b.att);
            let mut proj = self.attn_out(l, n, b);
            if il + 1 == self.layers.len() && rows > 1 {
                // get_rows(inp_out_ids): only the last token's row goes on.
                b.x.drain(..(rows - 1) * e);
                proj.drain(..(rows - 1) * e);
                rows = 1;
            }
            norm_rows(&proj, &g.post_attn, eps, e, &mut b.h);
            tap.tap("attn_post_norm", Some(il), &b.h);
            add_into(&mut b.x, &b.h);
            tap.tap("sa_out", Some(il), &b.x);

            norm_rows(&b.x, &l.ffn_norm, eps, e, &mut b.h);
            tap.tap("ffn_norm", Some(il), &b.h);
            let (mut gate, up) = self.gate_up(l, rows, b);
            tap.tap("ffn_up", Some(il), &up);
            tap.tap("ffn_gate", Some(il), &gate);
            for (gv, &uv) in gate.iter_mut().zip(&up) {
                *gv = geglu(*gv, uv, gelu);
            }
            tap.tap("ffn_geglu", Some(il), &gate);
            zeroed(&mut proj, rows * e);
            self.matmul(&l.down, &gate, rows, b, &mut proj);
            tap.tap("ffn_out", Some(il), &proj);
            norm_rows(&proj, &g.post_ffw, eps, e, &mut b.h);
            tap.tap("ffn_post_norm", Some(il), &b.h);
            add_into(&mut b.x, &b.h);
            tap.tap("l_out", Some(il), &b.x);
            (b.q, b.k, b.v, b.proj, b.gate, b.up) = (q, k, v, proj, gate, up);
        }
        norm_rows(&b.x[(rows - 1) * e..], &self.norm, eps, e, &mut b.h);
        tap.tap("result_norm", None, &b.h);
        Ok(())
    }

    /// The forward of [`Backend::forward`] with a tap on the intermediate tensors.
    fn forward_tapped<T: Tap>(
        &mut self,
        steps: &mut [Step<'_>],
        logits: &mut Vec<f32>,
        tap: &mut T,
    ) -> Result<(), Error> {
        let vocab = self.hp.vocab_size;
        logits.clear();
        logits.resize(steps.len() * vocab, 0.0);
        let mut b = Bufs::default();
        for (st, out) in steps.iter_mut().zip(logits.chunks_exact_mut(vocab)) {
            if st.tokens.is_empty() {
                return Err(Error::InvalidBatch("a step without tokens".into()));
            }
            let mut start = 0;
            while start < st.tokens.len() {
                let end = (start + UBATCH).min(st.tokens.len());
                if self.layers[0].gemma.is_some() {
                    self.ubatch_gemma(st.seq, start, &st.tokens[start..end], &mut b, tap)?;
                } else {
                    self.ubatch(st.seq, start, &st.tokens[start..end], &mut b, tap)?;
                }
                start = end;
            }
            let head = self.output.as_ref().unwrap_or(&self.embd);
            let h = std::mem::take(&mut b.h);
            self.matmul(head, &h, 1, &mut b, out);
            tap.tap("result_output", None, out);
        }
        Ok(())
    }
}

impl Backend for GgmlModel {
    fn name(&self) -> &'static str {
        "fast (ggml numerics)"
    }

    fn forward(&mut self, steps: &mut [Step<'_>], logits: &mut Vec<f32>) -> Result<(), Error> {
        self.forward_tapped(steps, logits, &mut NoTap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizontal_sums_add_in_the_avx_order() {
        // 2^24 + 1 rounds to 2^24: the grouping decides whether the two ones survive.
        let big = 16_777_216f32;
        let seq = |v: &[f32]| v.iter().fold(0f32, |s, &x| s + x);
        let mut v = [0f32; 8];
        v[0] = big;
        v[1] = 1.0;
        v[5] = 1.0;
        // (0 + 4) + (2 + 6) = big, (1 + 5) + (3 + 7) = 2.
        assert_eq!(hsum8(&v), big + 2.0);
        assert_eq!(seq(&v), big);
        let mut w = [0f32; 16];
        w[0] = big;
        w[1] = 1.0;
        w[9] = 1.0;
        assert_eq!(reduce16(&w), big + 2.0);
        assert_eq!(seq(&w), big);
    }

    #[test]
    fn q8_quantization_rounds_half_to_even_and_stores_f16_scales() {
        let mut x = [0f32; 32];
        x[0] = 127.0; // amax 127: id = 1, d = 1
        x[1] = 2.5;
        x[2] = 3.5;
        x[3] = -2.5;
        x[4] = 0.1;
        let mut b = [Q8_ZERO];
        quantize_row_q8(&x, true, &mut b);
        assert_eq!(&b[0].q[..5], &[127, 2, 4, -2, 0]);
        assert_eq!(b[0].d, 1.0);
        assert_eq!(b[0].s, 131.0);
        // d = amax / 127 rounded to f16; the multiplier is 127 / amax, not 1 / d.
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.01).collect();
        quantize_row_q8(&x, false, &mut b);
        assert_eq!(b[0].d, round_f16(x[31] / 127.0));
        assert_eq!(b[0].q[31], 127);
        assert_eq!(b[0].s, 0.0);
        quantize_row_q8(&[0.0; 32], true, &mut b);
        assert_eq!((b[0].d, b[0].s, b[0].q), (0.0, 0.0, [0; 32]));
    }

    #[test]
    fn q4_1_dot_is_lanes_of_four_plus_the_min_term() {
        // One block: d = 2, m = 0.5, every nibble 3 (low and high); activations q = 1, d = 1,
        // s = 32.
        let mut blk = vec![0u8; Q4_1_BYTES];
        blk[0..2].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
        blk[2..4].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        blk[4..].fill(0x33);
        let a = [Q8Block {
            d: 1.0,
            s: 32.0,
            q: [1; 32],
        }];
        // 8 lanes of 2 * (4 * 3) = 24, summed: 192; plus 0.5 * 32.
        assert_eq!(dot_q4_1_q8_1(&blk, &a), 192.0 + 16.0);
        // Nibble order: byte k holds element k (low) and k + 16 (high).
        blk[4..].fill(0x01);
        let mut a2 = a;
        a2[0].q = [0; 32];
        a2[0].q[16] = 1;
        a2[0].s = 0.0;
        assert_eq!(dot_q4_1_q8_1(&blk, &a2), 0.0);
        a2[0].q[0] = 1;
        assert_eq!(dot_q4_1_q8_1(&blk, &a2), 2.0);
    }

    #[test]
    fn q8_0_dot_uses_signed_weights() {
        let mut blk = vec![0u8; Q8_0_BYTES];
        blk[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        for (i, q) in blk[2..].iter_mut().enumerate() {
            *q = if i % 2 == 0 { 2 } else { (-3i8) as u8 };
        }
        let a = [Q8Block {
            d: 2.0,
            s: 0.0,
            q: [1; 32],
        }];
        // 16 * (2 - 3) * 0.5 * 2
        assert_eq!(dot_q8_0_q8_0(&blk, &a), -16.0);
    }

    #[test]
    fn f32_dots_fuse_and_group_like_ggml() {
        let x: Vec<f32> = (0..128).map(|i| (i % 7) as f32 - 3.0).collect();
        let y: Vec<f32> = (0..128).map(|i| (i % 5) as f32 * 0.5).collect();
        let exact: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
        // Small integers and halves: every order is exact.
        assert_eq!(dot_f32(&x, &y), exact);
        assert_eq!(dot_f32_tinyblas(&x, &y), exact);
        // Element 0 and element 64 share a lane of the same accumulator in ggml_vec_dot_f32
        // (fused: 1 + 2^-30 survives before the -1), while tinyBLAS adds element 16 there too.
        let mut a = vec![0f32; 64 * 2];
        let mut b = vec![0f32; 64 * 2];
        a[0] = 1.0;
        b[0] = 1.0;
        a[64] = 1.0;
        b[64] = 2f32.powi(-30);
        a[16] = -1.0;
        b[16] = 1.0;
        // vec_dot: lane 0 of acc 0 = 1 + 2^-30 -> rounds to 1; acc 1 lane 0 = -1; sum 0.
        assert_eq!(dot_f32(&a, &b), 0.0);
        // tinyBLAS: one accumulator, lane 0: 1, then -1 -> 0, ..., then + 2^-30.
        assert_eq!(dot_f32_tinyblas(&a, &b), 2f32.powi(-30));
    }

    /// Deterministic bytes and activations for the block tests.
    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (*seed >> 33) as u32
    }

    fn activations(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| (lcg(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    #[test]
    fn q5_0_weights_take_the_fifth_bit_from_qh() {
        let mut b = [0u8; Q5_0_BYTES];
        b[2..6].copy_from_slice(&(1u32 | (1 << 17)).to_le_bytes());
        b[6] = 0x3f; // element 0: 15 | 16 = 31 -> 15; element 16: 3 -> -13
        b[7] = 0x21; // element 1: 1 -> -15; element 17: 2 | 16 = 18 -> 2
        let w = decode_q5_0(&b);
        assert_eq!((w[0], w[16], w[1], w[17], w[2]), (15, -13, -15, 2, -16));
    }

    /// The K-quant dots (each kernel's accumulation) agree with the plain f64 dot of the
    /// dequantized weights and activations.
    #[test]
    fn k_quant_dots_match_the_dequantized_dot() {
        let mut seed = 7;
        let x = activations(512, &mut seed);
        let mut a = [Q8K_ZERO; 2];
        quantize_row_q8_k(&x, &mut a);
        let deq_a: Vec<f64> = a
            .iter()
            .flat_map(|b| b.q.iter().map(move |&q| f64::from(b.d) * f64::from(q)))
            .collect();
        assert!(a.iter().all(|b| b.q.contains(&-127)));
        for (bi, b) in a.iter().enumerate() {
            for (j, s) in b.bsums.iter().enumerate() {
                let want: i32 = b.q[16 * j..16 * j + 16].iter().map(|&q| i32::from(q)).sum();
                assert_eq!(*s, want, "block {bi} bsum {j}");
            }
        }
        let close =
            |got: f32, want: f64| (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0);

        // Q4_K: d, dmin, scales/mins < 32 in the simple 6-bit layout, random nibbles.
        let mut row = vec![0u8; 2 * Q4_K_BYTES];
        for blk in row.chunks_exact_mut(Q4_K_BYTES) {
            blk[0..2].copy_from_slice(&f16::from_f32(0.01).to_bits().to_le_bytes());
            blk[2..4].copy_from_slice(&f16::from_f32(0.02).to_bits().to_le_bytes());
            for v in blk[4..12].iter_mut() {
                *v = (lcg(&mut seed) % 32) as u8;
            }
            for v in blk[12..16].iter_mut() {
                *v = (lcg(&mut seed) % 16) as u8 | ((lcg(&mut seed) % 16) as u8) << 4;
            }
            for v in blk[16..].iter_mut() {
                *v = lcg(&mut seed) as u8;
            }
        }
        let mut want = 0f64;
        for (blk, ab) in row.chunks_exact(Q4_K_BYTES).zip(deq_a.chunks_exact(256)) {
            for (e, &av) in ab.iter().enumerate() {
                let j = e / 32;
                let (sc, m) = q4_k_scale_min(j, &blk[4..16]);
                let q = (blk[16 + 32 * (j / 2) + e % 32] >> (4 * (j % 2))) & 15;
                let w = f64::from(f16_at(&blk[0..2])) * f64::from(sc) * f64::from(q)
                    - f64::from(f16_at(&blk[2..4])) * f64::from(m);
                want += w * av;
            }
        }
        assert!(close(dot_q4_k_q8_k(&row, &a, false), want));
        assert!(close(dot_q4_k_q8_k(&row, &a, true), want));

        // Q6_K: random codes and scales.
        let mut row = vec![0u8; 2 * Q6_K_BYTES];
        for blk in row.chunks_exact_mut(Q6_K_BYTES) {
            for v in blk[..192].iter_mut() {
                *v = lcg(&mut seed) as u8;
            }
            for v in blk[192..208].iter_mut() {
                *v = (lcg(&mut seed) % 61) as u8;
            }
            blk[208..210].copy_from_slice(&f16::from_f32(0.003).to_bits().to_le_bytes());
        }
        let mut want = 0f64;
        for (blk, ab) in row.chunks_exact(Q6_K_BYTES).zip(deq_a.chunks_exact(256)) {
            let q = decode_q6_k(blk);
            for (e, &av) in ab.iter().enumerate() {
                let w = f64::from(f16_at(&blk[208..210]))
                    * f64::from(blk[192 + e / 16] as i8)
                    * (f64::from(q[e]) - 32.0);
                want += w * av;
            }
        }
        assert!(close(dot_q6_k_q8_k(&row, &a), want));
        assert!(close(dot_q6_k_tiled(&row, &a), want));
    }

    #[test]
    fn geglu_uses_the_f16_gelu_table_and_saturates() {
        let t = gelu_table();
        assert_eq!(geglu(0.0, 3.0, t), 0.0);
        assert_eq!(geglu(-10.0, 3.0, t), 0.0);
        assert_eq!(geglu(12.0, 0.5, t), 6.0);
        let g = geglu(1.0, 1.0, t);
        assert_eq!(g, round_f16(g));
        assert!((g - 0.841_192).abs() < 1e-3, "{g}");
    }

    #[test]
    fn vectorised_exp_is_close_to_exp_and_saturates() {
        assert_eq!(v_expf(0.0), 1.0);
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(200.0), f32::INFINITY);
        for i in -1000..=800 {
            let x = i as f32 * 0.1;
            let want = (x as f64).exp();
            let got = v_expf(x) as f64;
            assert!(
                (got - want).abs() <= 4.0 * want * f32::EPSILON as f64 || want < 1e-37,
                "exp({x}) = {got}, want {want}"
            );
        }
        // Subnormal results are rounded once.
        assert!(v_expf(-100.0) > 0.0 && v_expf(-100.0) < f32::MIN_POSITIVE);
        assert!((v_silu(1.0) - 0.731_058_6).abs() < 1e-6);
    }

    #[test]
    fn softmax_weights_sum_to_one_and_masked_positions_are_zero() {
        let kq = [1.0f32, 2.0, 3.0];
        let mut w = [9f32; 16];
        soft_max(&kq, 0.5, &mut w);
        assert!(w[3..].iter().all(|&v| v == 0.0));
        let s: f32 = w.iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!(w[2] > w[1] && w[1] > w[0]);
    }

    #[test]
    fn rms_norm_and_rope_basics() {
        let x = [3.0f32, 4.0];
        let mut out = [0f32; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let r = 1.0f32 / 12.5f32.sqrt();
        assert_eq!(out, [3.0 * r, 4.0 * r * 2.0]);
        let mut cache = [(0f32, 0f32); 2];
        rope_cache(0, 0.5, &mut cache);
        assert_eq!(cache, [(1.0, 0.0), (1.0, 0.0)]);
        rope_cache(2, 0.5, &mut cache);
        assert_eq!(cache[1], (1f32.cos(), 1f32.sin()));
        let mut v = [1.0f32, 0.0, 0.0, 1.0];
        let quarter = [(0.0f32, 1.0f32), (0.0, 1.0)];
        rope_normal(&mut v, &quarter);
        assert_eq!(v, [0.0, 1.0, -1.0, 0.0]);
    }

    fn read_f32(path: &Path) -> Option<Vec<f32>> {
        let bytes = std::fs::read(path).ok()?;
        Some(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )
    }

    /// (elements whose bits differ, largest difference) over the common tail of two tensors
    /// (llama.cpp keeps only the output row in the last layer after attention).
    fn compare(got: &[f32], want: &[f32]) -> (usize, f32) {
        let n = got.len().min(want.len());
        let (g, w) = (&got[got.len() - n..], &want[want.len() - n..]);
        g.iter().zip(w).fold((0, 0f32), |(c, m), (a, b)| {
            if a.to_bits() == b.to_bits() {
                (c, m)
            } else {
                (c + 1, m.max((a - b).abs()))
            }
        })
    }

    /// Prints each tapped tensor against llama.cpp's dump of the same name.
    struct DumpTap {
        dir: std::path::PathBuf,
        first_diff: Option<String>,
    }

    impl Tap for DumpTap {
        fn tap(&mut self, name: &str, il: Option<usize>, data: &[f32]) {
            let file = match il {
                Some(il) => format!("{name}-{il}.f32"),
                None => format!("{name}.f32"),
            };
            let Some(want) = read_f32(&self.dir.join(&file)) else {
                println!("{file}: not in the dump");
                return;
            };
            let (n, max) = compare(data, &want);
            println!(
                "{file}: {n} of {} differ (max {max:e})",
                data.len().min(want.len())
            );
            if n > 0 && self.first_diff.is_none() {
                self.first_diff = Some(file);
                if let Ok(w) = std::env::var("HEARTH_LCDUMP_ROW") {
                    let w: usize = w.parse().unwrap();
                    let per: Vec<usize> = data
                        .chunks(w)
                        .zip(want.chunks(w))
                        .map(|(a, b)| compare(a, b).0)
                        .collect();
                    println!("  per row: {per:?}");
                }
            }
        }
    }

    /// Steps along one SmolLM2 (or, with HEARTH_LCDUMP_MODEL=gemma3, Gemma 3) fixture case (prompt, then `N` of llama.cpp's ids) and compares
    /// the logits of every step, and the tensors of step `CALL`, with a dump made by
    /// `scripts/parity/lcdump.sh DIR CALL CASE N` (env HEARTH_LCDUMP=DIR, HEARTH_LCDUMP_CALL,
    /// HEARTH_LCDUMP_CASE, HEARTH_LCDUMP_N; run with --nocapture to see each tensor;
    /// HEARTH_LCDUMP_ROW=W also prints the differing count per W values of the first differing
    /// tensor, e.g. per token).
    #[test]
    #[ignore = "needs weights/ and a llama.cpp dump (scripts/parity/lcdump.sh)"]
    fn logits_and_tensors_match_a_llama_cpp_dump() {
        let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
        let dir = std::path::PathBuf::from(env("HEARTH_LCDUMP", "/tmp/lcdump"));
        let call: usize = env("HEARTH_LCDUMP_CALL", "0").parse().unwrap();
        let case: usize = env("HEARTH_LCDUMP_CASE", "0").parse().unwrap();
        let n_forced: usize = env("HEARTH_LCDUMP_N", "0").parse().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        // HEARTH_LCDUMP_MODEL=gemma3: Gemma 3 270M and its fixture instead of SmolLM2.
        let (weights, fixture) = if env("HEARTH_LCDUMP_MODEL", "smollm2") == "gemma3" {
            (
                "weights/gemma-3-270m-Q4_K_M.gguf",
                "tests/fixtures/text/gemma-3-270m-q4_k_m.json",
            )
        } else {
            (
                "weights/SmolLM2-135M-Instruct.Q4_1.gguf",
                "tests/fixtures/text/smollm2-135m-instruct-q4_1.json",
            )
        };
        let path = root.join(weights);
        let file = crate::gguf::GgufFile::open(&path).unwrap();
        let hp = Hparams::from_gguf(&file.content).unwrap();
        let mut m = from_gguf(&path, &file.content, hp.clone(), 2).unwrap();
        let fx: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(fixture)).unwrap()).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let prompt = ids(&fx["cases"][case]["prompt_ids"]);
        let forced = ids(&fx["cases"][case]["greedy_ids"]);
        let (cap, kvd) = (prompt.len() + n_forced, hp.kv_dim());
        let mut seq = crate::Sequence {
            k: vec![vec![0.0; cap * kvd]; hp.n_layer],
            v: vec![vec![0.0; cap * kvd]; hp.n_layer],
            len: 0,
            capacity: cap,
            kv_dim: kvd,
        };
        let mut logits = Vec::new();
        let mut bad = Vec::new();
        for k in 0..=n_forced {
            let tokens = if k == 0 {
                prompt.clone()
            } else {
                vec![forced[k - 1]]
            };
            let mut step = [Step {
                seq: &mut seq,
                tokens: &tokens,
            }];
            if k == call {
                let mut tap = DumpTap {
                    dir: dir.join("t"),
                    first_diff: None,
                };
                m.forward_tapped(&mut step, &mut logits, &mut tap).unwrap();
                println!("call {k}: first differing tensor {:?}", tap.first_diff);
            } else {
                m.forward(&mut step, &mut logits).unwrap();
            }
            seq.len += tokens.len();
            let want = read_f32(&dir.join(format!("logits_{k}.f32"))).expect("logits in the dump");
            let (n, max) = compare(&logits, &want);
            println!("call {k}: {n} logits differ (max {max:e})");
            if n > 0 {
                bad.push((k, n, max));
            }
        }
        assert!(
            bad.is_empty(),
            "(call, logits differing, max difference): {bad:?}"
        );
    }
}
