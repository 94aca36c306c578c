//! Hearth's own CUDA kernels for the image models, compiled by NVRTC at first use:
//! - group normalisation (+ SiLU) in two launches: each block sums a slice of one group (shifted
//!   by the group's first value, so that a large mean does not cancel the variance away), then
//!   each block of the second launch merges its group's partial sums and normalises its slice;
//! - GEGLU, `h * gelu(gate)` with the exact GELU, in one pass.
//!
//! Arithmetic is in f32 between f16/bf16 loads and stores (`hearth_gpu::kernels::PRELUDE`). On a CPU these layers are candle's
//! ops (`layers/mod.rs`), which the parity tests hold against diffusers.

use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, CustomOp3, Layout, Shape, Tensor};

const SOURCE: &str = r#"
// Sums of a block's 256 threads' (a, b) into thread 0.
__device__ __forceinline__ void block_sum2(float &a, float &b) {
    __shared__ float sa[8], sb[8];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sa[warp] = a; sb[warp] = b; }
    __syncthreads();
    if (warp == 0) {
        a = lane < 8 ? sa[lane] : 0.f;
        b = lane < 8 ? sb[lane] : 0.f;
        for (int o = 4; o > 0; o >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, o);
            b += __shfl_xor_sync(0xffffffffu, b, o);
        }
    }
    __syncthreads();
}

// Group `blockIdx.y` is `len` values from `x + blockIdx.y * len`; this block sums values
// [blockIdx.x * chunk, +chunk) minus the group's first value, and their squares.
template <typename C>
__device__ void gn_partial(const typename C::T *x, float *part, unsigned len, unsigned chunk) {
    const typename C::T *g = x + (size_t)blockIdx.y * len;
    const float shift = C::load(g[0]);
    const unsigned start = blockIdx.x * chunk;
    const unsigned end = min(start + chunk, len);
    float s = 0.f, s2 = 0.f;
    for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float v = C::load(g[i]) - shift;
        s += v;
        s2 += v * v;
    }
    block_sum2(s, s2);
    if (threadIdx.x == 0) {
        float *p = part + 2 * ((size_t)blockIdx.y * gridDim.x + blockIdx.x);
        p[0] = s;
        p[1] = s2;
    }
}

// Normalises values [blockIdx.x * chunk, +chunk) of group `blockIdx.y`: its statistics from
// the `chunks` partial sums, channel `c` of value `i` is `(blockIdx.y % groups) * cpg + i / hw`.
template <typename C>
__device__ void gn_apply(const typename C::T *x, const float *part, const typename C::T *w,
                         const typename C::T *b, typename C::T *y, unsigned len, unsigned chunk,
                         unsigned chunks, unsigned groups, unsigned cpg, unsigned hw, float eps,
                         unsigned silu) {
    __shared__ float stats[2];
    const size_t off = (size_t)blockIdx.y * len;
    float s = 0.f, s2 = 0.f;
    for (unsigned i = threadIdx.x; i < chunks; i += blockDim.x) {
        const float *p = part + 2 * ((size_t)blockIdx.y * chunks + i);
        s += p[0];
        s2 += p[1];
    }
    block_sum2(s, s2);
    if (threadIdx.x == 0) {
        const float n = (float)len;
        const float m = s / n;
        const float var = fmaxf(s2 / n - m * m, 0.f);
        stats[0] = m + C::load(x[off]);
        stats[1] = rsqrtf(var + eps);
    }
    __syncthreads();
    const float mean = stats[0], rstd = stats[1];
    const unsigned c0 = (blockIdx.y % groups) * cpg;
    const unsigned start = blockIdx.x * chunk;
    const unsigned end = min(start + chunk, len);
    for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned c = c0 + i / hw;
        float v = (C::load(x[off + i]) - mean) * rstd * C::load(w[c]) + C::load(b[c]);
        if (silu) v = v / (1.f + __expf(-v));
        y[off + i] = C::store(v);
    }
}

// out[r, j] = x[r, j] * gelu(x[r, n + j]) for rows of 2n values.
template <typename C>
__device__ void geglu(const typename C::T *x, typename C::T *out, unsigned rows, unsigned n) {
    const size_t total = (size_t)rows * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / n, j = i % n;
        const float h = C::load(x[r * 2 * n + j]);
        const float g = C::load(x[r * 2 * n + n + j]);
        out[i] = C::store(h * 0.5f * g * (1.f + erff(g * 0.70710678118654752f)));
    }
}

#define KERNELS(C, SUFFIX)                                                                      \
extern "C" __global__ void gn_partial_##SUFFIX(const C::T *x, float *part, unsigned len,       \
                                                unsigned chunk) {                              \
    gn_partial<C>(x, part, len, chunk);                                                         \
}                                                                                               \
extern "C" __global__ void gn_apply_##SUFFIX(const C::T *x, const float *part, const C::T *w,  \
        const C::T *b, C::T *y, unsigned len, unsigned chunk, unsigned chunks, unsigned groups, \
        unsigned cpg, unsigned hw, float eps, unsigned silu) {                                  \
    gn_apply<C>(x, part, w, b, y, len, chunk, chunks, groups, cpg, hw, eps, silu);              \
}                                                                                               \
extern "C" __global__ void geglu_##SUFFIX(const C::T *x, C::T *out, unsigned rows, unsigned n) { \
    geglu<C>(x, out, rows, n);                                                                  \
}
KERNELS(F16, f16)
KERNELS(BF16, bf16)
"#;

const MODULE: &str = "hearth_imagine";

fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    hearth_gpu::kernels::compile(&PTX, "image", SOURCE)
}

/// Threads a block, for both kernels (`block_sum2` assumes 256).
const THREADS: u32 = 256;
/// Values a block of the group-norm kernels handles, at most.
const CHUNK: usize = 16 * 1024;

struct GroupNormOp {
    groups: usize,
    eps: f32,
    silu: bool,
}

/// Group normalisation of `x` `(n, c, ...)` with per-channel `weight` and `bias`, then SiLU
/// when `silu`.
pub fn group_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f64,
    silu: bool,
) -> candle_core::Result<Tensor> {
    let op = GroupNormOp {
        groups,
        eps: eps as f32,
        silu,
    };
    x.contiguous()?.apply_op3_no_bwd(
        &weight.to_dtype(x.dtype())?.contiguous()?,
        &bias.to_dtype(x.dtype())?.contiguous()?,
        &op,
    )
}

impl CustomOp3 for GroupNormOp {
    fn name(&self) -> &'static str {
        "hearth-group-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        hearth_gpu::kernels::gpu_only(self.name())
    }

    #[allow(unsafe_code)] // the kernel launches
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let what = "group-norm";
        let dims = xl.dims();
        if dims.len() < 2 {
            candle_core::bail!("group-norm: the input is not (n, c, ...)")
        }
        let (n, c) = (dims[0], dims[1]);
        let hw: usize = dims[2..].iter().product();
        let g = self.groups;
        if g == 0 || !c.is_multiple_of(g) || hw == 0 {
            candle_core::bail!("group-norm: {c} channels do not split into {g} groups")
        }
        let (x0, x1) = hearth_gpu::kernels::contiguous(xl, what)?;
        let (w0, w1) = hearth_gpu::kernels::contiguous(wl, what)?;
        let (b0, b1) = hearth_gpu::kernels::contiguous(bl, what)?;
        if w1 - w0 != c || b1 - b0 != c {
            candle_core::bail!("group-norm: weight and bias are not one value a channel")
        }
        let cpg = c / g;
        let len = cpg * hw;
        let chunks = len.div_ceil(CHUNK).clamp(1, 1024);
        let chunk = len.div_ceil(chunks);
        let rows = n * g;
        if x1 - x0 != rows * len || len > u32::MAX as usize || rows > 65_535 {
            candle_core::bail!("group-norm: the input is too large for one launch")
        }
        let dev = x.device.clone();
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, rows as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (len32, chunk32, chunks32) = (len as u32, chunk as u32, chunks as u32);
        let (g32, cpg32, hw32, silu) = (g as u32, cpg as u32, hw as u32, self.silu as u32);
        // SAFETY: every value is written by the partial-sum kernel before the apply kernel
        // reads it, on the same stream.
        let mut part = unsafe { dev.alloc::<f32>(2 * rows * chunks)? };
        macro_rules! launch {
            ($x:expr, $w:expr, $b:expr, $ty:ty, $suffix:literal) => {{
                let x = $x.slice(x0..x1);
                let (w, b) = ($w.slice(w0..w1), $b.slice(b0..b1));
                let f =
                    dev.get_or_load_custom_func(concat!("gn_partial_", $suffix), MODULE, ptx()?)?;
                let mut l = f.builder();
                l.arg(&x);
                l.arg(&mut part);
                l.arg(&len32);
                l.arg(&chunk32);
                // SAFETY: reads `rows * len` values of `x`, writes `2 * rows * chunks` of `part`.
                unsafe { l.launch(cfg) }.w()?;
                // SAFETY: every value of `y` is written by the apply kernel.
                let mut y = unsafe { dev.alloc::<$ty>(rows * len)? };
                let f =
                    dev.get_or_load_custom_func(concat!("gn_apply_", $suffix), MODULE, ptx()?)?;
                let mut l = f.builder();
                l.arg(&x);
                l.arg(&part);
                l.arg(&w);
                l.arg(&b);
                l.arg(&mut y);
                l.arg(&len32);
                l.arg(&chunk32);
                l.arg(&chunks32);
                l.arg(&g32);
                l.arg(&cpg32);
                l.arg(&hw32);
                l.arg(&self.eps);
                l.arg(&silu);
                // SAFETY: reads what the first launch read and wrote and `c` values of `w` and
                // `b` (channel indices stay below `g * cpg`), writes `rows * len` values of `y`.
                unsafe { l.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(y, dev.clone())
            }};
        }
        let y = match (&x.slice, &w.slice, &b.slice) {
            (S::F16(x), S::F16(w), S::F16(b)) => launch!(x, w, b, half::f16, "f16"),
            (S::BF16(x), S::BF16(w), S::BF16(b)) => launch!(x, w, b, half::bf16, "bf16"),
            _ => candle_core::bail!("group-norm: the kernel takes f16 or bf16, all alike"),
        };
        Ok((y, xl.shape().clone()))
    }
}

struct GegluOp;

/// `h * gelu(gate)` of `x` `(..., 2n)` whose last dimension is `[h, gate]`: `(..., n)`.
pub fn geglu(x: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&GegluOp)
}

impl CustomOp1 for GegluOp {
    fn name(&self) -> &'static str {
        "hearth-geglu"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        hearth_gpu::kernels::gpu_only(self.name())
    }

    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let dims = l.dims();
        let last = *dims.last().unwrap_or(&0);
        if last == 0 || !last.is_multiple_of(2) {
            candle_core::bail!("geglu: the last dimension is not [h, gate]")
        }
        let (x0, x1) = hearth_gpu::kernels::contiguous(l, "geglu")?;
        let n = last / 2;
        let rows = (x1 - x0) / last;
        if rows * n > u32::MAX as usize {
            candle_core::bail!("geglu: the input is too large for one launch")
        }
        let dev = x.device.clone();
        let blocks = (rows * n).div_ceil(THREADS as usize).clamp(1, 65_535) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rows32, n32) = (rows as u32, n as u32);
        macro_rules! launch {
            ($x:expr, $ty:ty, $kernel:literal) => {{
                let f = dev.get_or_load_custom_func($kernel, MODULE, ptx()?)?;
                // SAFETY: every value of `out` is written by the kernel.
                let mut out = unsafe { dev.alloc::<$ty>(rows * n)? };
                let x = $x.slice(x0..x1);
                let mut b = f.builder();
                b.arg(&x);
                b.arg(&mut out);
                b.arg(&rows32);
                b.arg(&n32);
                // SAFETY: reads `rows * 2n` values of `x`, writes `rows * n` of `out`.
                unsafe { b.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match &x.slice {
            S::F16(x) => launch!(x, half::f16, "geglu_f16"),
            S::BF16(x) => launch!(x, half::bf16, "geglu_bf16"),
            _ => candle_core::bail!("geglu: the kernel takes f16 or bf16"),
        };
        let mut shape = dims.to_vec();
        *shape.last_mut().expect("checked non-empty") = n;
        Ok((out, Shape::from(shape)))
    }
}
