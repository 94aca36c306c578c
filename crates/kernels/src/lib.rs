//! Quantized matrix kernels and the CPU thread pool behind Hearth's fast decode path.
//!
//! This crate owns: the GGML/GGUF block formats the default models use (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, Q4_K, Q5_K, Q6_K, plus Q8_K and F32/F16/BF16) with a scalar reference dequantizer
//! ([`formats`]); a load-time repacking of weight rows into one SIMD-friendly layout
//! ([`QMatrix`]); activations quantized to 8-bit blocks per row ([`QActs`]); register-blocked
//! matrix x activation-rows products on a portable scalar path, AVX2+FMA, AVX-512 (F/BW/VL) and
//! AVX-512 VNNI and Intel AMX (for batches), picked at run time ([`KernelPath`]); and a persistent thread pool sized to the
//! physical cores ([`ThreadPool`]). It deliberately knows nothing of models, tokenizers, GGUF
//! files as a whole or candle: callers hand it the bytes of one tensor at a time.

pub mod acts;
pub mod bf16;
mod error;
pub mod formats;
mod lines;
mod matmul;
pub mod ops;
pub mod pack;
pub mod pool;
mod scalar;
mod scores;
#[cfg(target_arch = "x86_64")]
mod x86_amx;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx2_il;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

/// How far ahead in a weight matrix's packed quants the SIMD tiles prefetch. At decode every
/// weight streams from memory once per token, and without it the tiles stalled on their
/// weight loads (the hardware prefetcher alone ran ~2x behind); 8 KiB measured best among
/// 2-16 KiB on the 576-column SmolLM2 shapes.
pub(crate) const PREFETCH_BYTES: usize = 8192;

pub use acts::QActs;
pub use bf16::{bf16_simd, gemm_bf16, Bf16Matrix};
pub use error::Error;
pub use formats::{dequantize_row, GgmlType};
pub use matmul::{matmul, matmul_f32, KernelPath};
pub use pack::{Layout, QMatrix};
pub use pool::{physical_cores, ThreadPool};

// Layout ids as const-generic parameters of the SIMD tiles.
pub(crate) const L_U4: u8 = Layout::U4Min as u8;
pub(crate) const L_U5: u8 = Layout::U5 as u8;
pub(crate) const L_U5M: u8 = Layout::U5Min as u8;
pub(crate) const L_U6: u8 = Layout::U6 as u8;
pub(crate) const L_S8: u8 = Layout::S8 as u8;

/// Whether layout `l` has a fifth-bit plane (Q5_0; Q5_1 and Q5_K).
pub(crate) const fn fifth_bit(l: u8) -> bool {
    l == L_U5 || l == L_U5M
}

/// Whether layout `l` stores a min per group (Q4_0/Q4_1/Q4_K; Q5_1/Q5_K), rather than deriving
/// a zero point from the scale (Q5_0, Q6_K) or having none (8-bit).
pub(crate) const fn stored_min(l: u8) -> bool {
    l == L_U4 || l == L_U5M
}

#[cfg(test)]
mod tests;
