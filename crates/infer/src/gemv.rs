//! The matrix product of one row (a decode step of one stream) against a dense or Q8_0 weight
//! matrix, on a GPU. Such a step reads every weight once and does two flops a weight: it is bound
//! by memory. A warp takes one output column: its lanes stream the weight row in 16-byte loads,
//! all in flight at once for a row of 2,048, multiply them by the input row (read through the
//! cache, where it stays), and reduce across the warp. Q8_0 weights are read as the GGUF stores
//! them (half the bytes of f16; a warp first stages 32 of its row's 34-byte blocks in shared
//! memory, since a block is only 2-byte aligned), with no cast of the input to f32 and back as
//! candle's quantized product needs. Two or more rows go to cuBLAS (dense) or candle's quantized
//! product: measured on an H200, this kernel at 8 rows was half cuBLAS's speed (the input rows'
//! reads through the cache outgrow the weights'), and at one row it is as fast as cuBLAS's own
//! kernels and spares the host cuBLAS's per-call work. The fused `[gate; up]` product can end in
//! the gated MLP's activation ([`GluAct`]): the warps of a gate row and its up row meet in
//! shared memory, and the activation kernel's launch is saved. Compiled by NVRTC at first use,
//! like the other kernels of `hearth_gpu::kernels`. The CPU keeps candle's matmul.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use crate::fused::GluAct;
use crate::Error;

/// A warp per output column, 4 warps a block (the Q8_0 kernel's shared staging assumes 4).
#[cfg(feature = "cuda")]
pub(crate) fn config(n: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    let warps = 4u32;
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: ((n as u32).div_ceil(warps), 1, 1),
        block_dim: (32 * warps, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The outputs of a product of `n` weight rows, with the activation `glu` or none.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
fn outputs(n: usize, glu: Option<GluAct>) -> usize {
    if glu.is_some() {
        n / 2
    } else {
        n
    }
}

/// Launches one of the kernels below on `$dev` for the input row `$x` (a device slice view)
/// and the weights `$w` (a slice view, or a device address as a `u64`) of `$n` rows, allocating
/// and returning the outputs of type `$ty` ([`outputs`]); `$flag` is the dense kernel's rounds,
/// `$glu` the activation. The caller has checked the shapes and alignments its kernel needs.
#[cfg(feature = "cuda")]
macro_rules! launch_row {
    ($dev:expr, $kernel:expr, $ty:ty, $x:expr, $w:expr, $n:expr, $k:expr, $flag:expr, $glu:expr) => {{
        let func = $dev.get_or_load_custom_func($kernel, "hearth_gemv", ptx()?)?;
        // SAFETY: every element is written by the kernel before it is read.
        let mut out = unsafe { $dev.alloc::<$ty>(outputs($n, $glu))? };
        let (n, k) = ($n as u32, $k as u32);
        let (x_arg, w_arg) = ($x, $w);
        let mut b = func.builder();
        b.arg(&x_arg);
        b.arg(&w_arg);
        b.arg(&mut out);
        b.arg(&n);
        b.arg(&k);
        let flag: u32 = $flag;
        b.arg(&flag);
        let glu: u32 = $glu.map_or(0, |a: GluAct| a as u32);
        b.arg(&glu);
        // SAFETY: the kernel reads `k` values of x and the `n` rows of w (their storage holds
        // them, as the caller checked) and writes the `outputs(n, glu)` values of out.
        unsafe { b.launch(config($n)) }.w()?;
        candle_core::CudaStorage::wrap_cuda_slice(out, $dev.clone())
    }};
}

/// The element ranges of `x` `[1, k]` and a dense `w` `[n, k]` for the dense one-row kernels,
/// checked (contiguous, one row, widths of whole 8-value vectors aligned for 16-byte loads):
/// `(x0, x1, w0, w1, n, k)`.
#[cfg(feature = "cuda")]
pub(crate) fn dense_spans(
    l_x: &Layout,
    l_w: &Layout,
    what: &str,
) -> candle_core::Result<(usize, usize, usize, usize, usize, usize)> {
    let ((x0, x1), (w0, w1)) = (
        hearth_gpu::kernels::contiguous(l_x, what)?,
        hearth_gpu::kernels::contiguous(l_w, what)?,
    );
    let (rows, k) = l_x.shape().dims2()?;
    let (n, wk) = l_w.shape().dims2()?;
    if wk != k
        || !k.is_multiple_of(8)
        || rows != 1
        || x1 - x0 != k
        || w1 - w0 != n * k
        || x0 % 8 != 0
        || w0 % 8 != 0
    {
        candle_core::bail!("{what}: shapes or alignment do not fit the kernel")
    }
    Ok((x0, x1, w0, w1, n, k))
}

/// `x @ w.T` for `x` `[1, k]` and a dense `w` `[n, k]`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct Gemv {
    /// A round of loads before their uses (else the first loop: each load used at once, to
    /// compare; [`crate::GpuTuning::first_kernels`]).
    pub rounds: bool,
    /// `w` is `[gate; up]` and the output `act(gate) * up`, half as wide, as
    /// [`crate::fused::Glu`] makes it from the product.
    pub glu: Option<GluAct>,
}

impl Gemv {
    /// Whether the kernel takes `x` against `w`: on a GPU, one dtype (f16, bf16 or f32), one
    /// row, a width that is a whole number of 8-value vectors.
    pub(crate) fn fits(x: &Tensor, w: &Tensor) -> bool {
        use candle_core::DType;
        let (Ok((rows, k)), Ok((_, wk))) = (x.dims2(), w.dims2()) else {
            return false;
        };
        x.device().is_cuda()
            && x.dtype() == w.dtype()
            && matches!(x.dtype(), DType::F16 | DType::BF16 | DType::F32)
            && rows == 1
            && k == wk
            && k.is_multiple_of(8)
    }

    /// `x @ w.T`, `[1, n]` (`[1, n / 2]` with `glu`).
    pub(crate) fn run(&self, x: &Tensor, w: &Tensor) -> Result<Tensor, Error> {
        Ok(x.contiguous()?.apply_op2_no_bwd(w, self)?)
    }
}

impl CustomOp2 for Gemv {
    fn name(&self) -> &'static str {
        "hearth-gemv"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the one-row matrix kernel runs on a GPU; the CPU takes candle's matmul")
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        l_x: &Layout,
        w: &candle_core::CudaStorage,
        l_w: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let what = "one-row matrix product";
        let (x0, x1, w0, w1, n, k) = dense_spans(l_x, l_w, what)?;
        if self.glu.is_some() && !n.is_multiple_of(2) {
            candle_core::bail!("{what}: [gate; up] has an odd number of rows")
        }
        let dev = x.device.clone();
        let rounds = u32::from(self.rounds);
        macro_rules! dense {
            ($x:expr, $w:expr, $ty:ty, $kernel:literal) => {
                launch_row!(
                    dev,
                    $kernel,
                    $ty,
                    $x.slice(x0..x1),
                    $w.slice(w0..w1),
                    n,
                    k,
                    rounds,
                    self.glu
                )
            };
        }
        let out = match (&x.slice, &w.slice) {
            (S::F32(x), S::F32(w)) => dense!(x, w, f32, "gemv_f32"),
            (S::F16(x), S::F16(w)) => dense!(x, w, half::f16, "gemv_f16"),
            (S::BF16(x), S::BF16(w)) => dense!(x, w, half::bf16, "gemv_bf16"),
            _ => candle_core::bail!("{what}: x and w of one dtype"),
        };
        Ok((out, Shape::from((1, outputs(n, self.glu)))))
    }
}

/// `x @ w.T` for `x` `[1, k]` (f16, bf16 or f32) and `w` a Q8_0 matrix `[n, k]` on the GPU
/// (blocks of 32 weights: an f16 scale and 32 int8).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct GemvQ8<'a> {
    pub w: &'a QTensor,
    /// `w` is `[gate; up]` and the output `act(gate) * up`.
    pub glu: Option<GluAct>,
}

impl GemvQ8<'_> {
    /// Whether the kernel takes `x` against `w`: one row, and rows of `w` a whole number of
    /// 8 blocks (16-byte aligned, staged in whole loads).
    pub(crate) fn fits(x: &Tensor, w: &QTensor) -> bool {
        use candle_core::DType;
        let (Ok((rows, k)), Ok((_, wk))) = (x.dims2(), w.shape().dims2()) else {
            return false;
        };
        x.device().is_cuda()
            && w.device().is_cuda()
            && w.dtype() == GgmlDType::Q8_0
            && matches!(x.dtype(), DType::F16 | DType::BF16 | DType::F32)
            && rows == 1
            && k == wk
            && k.is_multiple_of(256)
    }

    /// `x @ w.T`, `[1, n]` (`[1, n / 2]` with `glu`) in `x`'s dtype.
    pub(crate) fn run(&self, x: &Tensor) -> Result<Tensor, Error> {
        Ok(x.contiguous()?.apply_op1_no_bwd(self)?)
    }
}

impl CustomOp1 for GemvQ8<'_> {
    fn name(&self) -> &'static str {
        "hearth-gemv-q8_0"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the one-row Q8_0 kernel runs on a GPU")
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        l_x: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let what = "one-row Q8_0 product";
        let (x0, x1) = hearth_gpu::kernels::contiguous(l_x, what)?;
        let (rows, k) = l_x.shape().dims2()?;
        let (n, wk) = self.w.shape().dims2()?;
        if wk != k
            || !k.is_multiple_of(256)
            || rows != 1
            || x1 - x0 != k
            || x0 % 8 != 0
            || self.w.dtype() != GgmlDType::Q8_0
            || self.w.storage_size_in_bytes() < n * k / 32 * 34
            || (self.glu.is_some() && !n.is_multiple_of(2))
        {
            candle_core::bail!("{what}: shapes or alignment do not fit the kernel")
        }
        // The weights go in as an address: `self.w` is borrowed for the launch.
        let w = self.w.device_ptr()? as u64;
        let dev = x.device.clone();
        macro_rules! q8 {
            ($x:expr, $ty:ty, $kernel:literal) => {
                launch_row!(dev, $kernel, $ty, $x.slice(x0..x1), w, n, k, 0, self.glu)
            };
        }
        let out = match &x.slice {
            S::F32(x) => q8!(x, f32, "gemv_q8_0_f32"),
            S::F16(x) => q8!(x, half::f16, "gemv_q8_0_f16"),
            S::BF16(x) => q8!(x, half::bf16, "gemv_q8_0_bf16"),
            _ => candle_core::bail!("{what}: x of f32, f16 or bf16"),
        };
        Ok((out, Shape::from((1, outputs(n, self.glu)))))
    }
}

/// The kernels' source (after [`hearth_gpu::kernels::PRELUDE`]).
#[cfg(feature = "cuda")]
const SOURCE: &str = r#"
// The row a warp takes, and the end of a product. Plainly (`glu` 0), warp w of block b takes row
// 4 b + w and writes y[row]. With `glu` (1 SiLU, 2 GELU), w is the gated MLP's [gate; up]
// (n_out = 2 ff rows): warps 2 i and 2 i + 1 of block b take gate row j = 2 b + i and up row
// ff + j, and y[j] = act(gate) * up, ff wide, each product rounded to T first, as the separate
// activation kernel reads them (`hearth-glu`), so the two paths give the same values.
struct RowOf {
    unsigned int n, j;
    bool valid;
};
__device__ __forceinline__ RowOf row_of(unsigned int n_out, unsigned int glu) {
    const unsigned int warp = threadIdx.x / 32;
    RowOf r;
    if (glu) {
        r.j = blockIdx.x * 2 + warp / 2;
        r.n = r.j + (warp % 2) * (n_out / 2);
        r.valid = r.j < n_out / 2;
    } else {
        r.n = r.j = blockIdx.x * (blockDim.x / 32) + warp;
        r.valid = r.n < n_out;
    }
    return r;
}
// A warp's sum of its lanes' parts, in every lane.
__device__ __forceinline__ float warp_sum(float acc) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}
// The block's four warp sums as a product stores them (rounded to T), in shared memory, where
// the two warps of a pair (2 i, 2 i + 1) meet. Every thread of the block calls it (it
// synchronises the block) with its warp's sum.
template <typename C>
__device__ __forceinline__ const typename C::T *pair_sums(float sum) {
    __shared__ typename C::T sums[4];
    if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = C::store(sum);
    __syncthreads();
    return sums;
}
// `acc` is the lane's part of row `at`'s sum; every thread of the block calls this (it may
// synchronise the block).
template <typename C>
__device__ __forceinline__ void row_end(float acc, typename C::T *__restrict__ y, RowOf at,
                                        unsigned int glu) {
    acc = warp_sum(acc);
    const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (!glu) {
        if (lane == 0 && at.valid) y[at.n] = C::store(acc);
        return;
    }
    const typename C::T *two = pair_sums<C>(acc);
    if (lane == 0 && warp % 2 == 0 && at.valid)
        y[at.j] = C::store(glu_act(C::load(two[warp]), glu == 2) * C::load(two[warp + 1]));
}

// Grid (ceil(n / 4)), 128 threads, a warp a row (`row_of`): y[n] = sum_k x[k] * w[n, k]. A lane
// takes 8 values every 256: rounds of ROUND of them (all of a 2,048-wide row) are loaded into
// registers first (`C::raw8`), weights and inputs, and only then converted and multiplied, so
// that they are in flight together (a load followed at once by its use waits out the memory's
// latency before the next is issued); a row's tail that is not a whole round goes 8 values at a
// time. The sum's order is a lane's values in order, whatever the rounds.
#define ROUND 8u
// A lane's part of the sum of row `wrow` against x (k values).
template <typename C>
__device__ __forceinline__ float gemv_sum(const typename C::T *__restrict__ x,
                                          const typename C::T *__restrict__ wrow,
                                          unsigned int k, unsigned int batched) {
    const unsigned int lane = threadIdx.x % 32;
    float acc = 0.f;
    // Without `batched` the whole row goes the tail's way (the first kernel's loop, to
    // compare).
    const unsigned int rounds = batched ? k / (256 * ROUND) : 0;
    for (unsigned int r = 0; r < rounds; ++r) {
        const unsigned int base = r * 256 * ROUND + lane * 8;
        Raw8 wr[ROUND], xr[ROUND];
        #pragma unroll
        for (unsigned int u = 0; u < ROUND; ++u) {
            wr[u] = C::raw8(wrow + base + u * 256);
            xr[u] = C::raw8(x + base + u * 256);
        }
        #pragma unroll
        for (unsigned int u = 0; u < ROUND; ++u) {
            float wf[8], xf[8];
            C::cvt8(wr[u], wf);
            C::cvt8(xr[u], xf);
            float s = 0.f;
            #pragma unroll
            for (int j = 0; j < 8; ++j) s += wf[j] * xf[j];
            acc += s;
        }
    }
    for (unsigned int k0 = rounds * 256 * ROUND + lane * 8; k0 < k; k0 += 256) {
        float wf[8], xf[8];
        C::load8(wrow + k0, wf);
        C::load8(x + k0, xf);
        float s = 0.f;
        #pragma unroll
        for (int j = 0; j < 8; ++j) s += wf[j] * xf[j];
        acc += s;
    }
    return acc;
}

template <typename C>
__device__ void gemv(const typename C::T *__restrict__ x, const typename C::T *__restrict__ w,
                     typename C::T *__restrict__ y, unsigned int n_out, unsigned int k,
                     unsigned int batched, unsigned int glu) {
    const RowOf at = row_of(n_out, glu);
    const float acc = at.valid ? gemv_sum<C>(x, w + (size_t)at.n * k, k, batched) : 0.f;
    row_end<C>(acc, y, at, glu);
}

// The fused [q; k; v] product of one row with RoPE and the KV write as its last step (what
// `hearth-rope-kv` does after the product, a launch saved): warps 2 i and 2 i + 1 of block b
// take the two rows of rotated pair P = 2 b + i (head h = P / (hd / 2); rows 2 p and 2 p + 1 of
// the head interleaved, p and p + hd / 2 otherwise), each product rounded to T first, as that
// kernel reads them. Q goes to `q` (n_head * hd), K rotated and V as it is to pool row `at[0]`
// (left out where that row is outside the pool).
template <typename C>
__device__ void gemv_rope(const typename C::T *__restrict__ x,
                          const typename C::T *__restrict__ w, typename C::T *__restrict__ q,
                          unsigned int k, unsigned int batched, const typename C::T *cos_,
                          const typename C::T *sin_, const unsigned int *at,
                          typename C::T *pool_k, typename C::T *pool_v, unsigned int n_head,
                          unsigned int n_kv, unsigned int hd, unsigned int pool_rows,
                          unsigned int interleaved) {
    const unsigned int warp = threadIdx.x / 32, half = hd / 2;
    const unsigned int pair = blockIdx.x * 2 + warp / 2;
    const unsigned int h = pair / half, i = pair % half;
    const RopeDims d = rope_dims(i, hd, interleaved);
    const bool valid = pair < (n_head + 2 * n_kv) * half;
    float acc = 0.f;
    if (valid)
        acc = gemv_sum<C>(x, w + ((size_t)h * hd + (warp % 2 ? d.b : d.a)) * k, k, batched);
    const typename C::T *two = pair_sums<C>(warp_sum(acc));
    if (threadIdx.x % 32 != 0 || warp % 2 != 0 || !valid) return;
    rope_place<C>(two[warp], two[warp + 1], d, cos_ + i, sin_ + i, h, q, pool_k, pool_v, at,
                  n_head, n_kv, hd, pool_rows);
}

// The same for Q8_0 weights (blocks of 34 bytes: an f16 scale, then 32 int8). A warp copies 32
// blocks of its row (1,088 bytes) into shared memory in coalesced 16-byte loads, then each lane
// takes one block from there. Needs k % 256 == 0 (16-byte aligned rows, whole loads). (Stages of
// 64 blocks with the inputs loaded beside the weights, under `__launch_bounds__(128, 1)`, were
// slower on an H200: 733 tok/s against 794 at one stream on the 1.1B Q8_0 file.)
template <typename C>
__device__ void gemv_q8_0(const typename C::T *__restrict__ x,
                          const unsigned char *__restrict__ w, typename C::T *__restrict__ y,
                          unsigned int n_out, unsigned int k, unsigned int glu) {
    __shared__ uint4 stage[4][68];
    const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const RowOf at = row_of(n_out, glu);
    float acc = 0.f;
    if (at.valid) {
        const unsigned int nblk = k / 32;
        const uint4 *row = (const uint4 *)(w + (size_t)at.n * nblk * 34);
        const unsigned short *blk =
            (const unsigned short *)((const unsigned char *)stage[warp] + lane * 34);
        for (unsigned int c0 = 0; c0 < nblk; c0 += 32) {
            const unsigned int nb = min(32u, nblk - c0);
            const unsigned int words = nb * 34 / 16;
            const uint4 *src = row + (size_t)c0 * 34 / 16;
            #pragma unroll
            for (unsigned int i = 0; i < 3; ++i) {
                const unsigned int wd = lane + 32 * i;
                if (wd < words) stage[warp][wd] = src[wd];
            }
            __syncwarp();
            if (lane < nb) {
                const float d = F16::load(blk[0]);
                const typename C::T *xb = x + (c0 + lane) * 32;
                float s = 0.f;
                #pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float xf[8];
                    C::load8(xb + c * 8, xf);
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const unsigned short u = blk[1 + c * 4 + i];
                        s += (float)(signed char)(u & 0xffu) * xf[2 * i];
                        s += (float)(signed char)(u >> 8) * xf[2 * i + 1];
                    }
                }
                acc += d * s;
            }
            __syncwarp();
        }
    }
    row_end<C>(acc, y, at, glu);
}

// `__launch_bounds__(128, 1)` lets ptxas spend the registers a round's loads need (it otherwise
// keeps a few in flight and waits on each, to save registers for occupancy).
#define GEMV(NAME, C)                                                                         \
extern "C" __global__ void __launch_bounds__(128, 1) NAME(const C::T *x, const C::T *w,      \
                                                          C::T *y, unsigned int n_out,       \
                                                          unsigned int k,                    \
                                                          unsigned int batched,              \
                                                          unsigned int glu) {                \
    gemv<C>(x, w, y, n_out, k, batched, glu);                                                 \
}
#define GEMV_Q8(NAME, C)                                                                      \
extern "C" __global__ void NAME(const C::T *x, unsigned long long w, C::T *y,                \
                                unsigned int n_out, unsigned int k, unsigned int,             \
                                unsigned int glu) {                                           \
    gemv_q8_0<C>(x, (const unsigned char *)w, y, n_out, k, glu);                              \
}
#define GEMV_ROPE(NAME, C)                                                                    \
extern "C" __global__ void __launch_bounds__(128, 1) NAME(const C::T *x, const C::T *w,      \
    C::T *q, unsigned int k, unsigned int batched, unsigned long long cos_,                   \
    unsigned long long sin_, unsigned long long at, unsigned long long pool_k,               \
    unsigned long long pool_v, unsigned int rows, unsigned int n_head, unsigned int n_kv,    \
    unsigned int hd, unsigned int pool_rows, unsigned int interleaved) {                     \
    gemv_rope<C>(x, w, q, k, batched, (const C::T *)cos_, (const C::T *)sin_,                \
                 (const unsigned int *)at, (C::T *)pool_k, (C::T *)pool_v, n_head, n_kv, hd,  \
                 pool_rows, interleaved);                                                     \
}
GEMV_ROPE(gemv_rope_f32, F32)
GEMV_ROPE(gemv_rope_f16, F16)
GEMV_ROPE(gemv_rope_bf16, BF16)
GEMV(gemv_f32, F32)
GEMV(gemv_f16, F16)
GEMV(gemv_bf16, BF16)
GEMV_Q8(gemv_q8_0_f32, F32)
GEMV_Q8(gemv_q8_0_f16, F16)
GEMV_Q8(gemv_q8_0_bf16, BF16)
"#;

/// The kernels' PTX, compiled once per process.
#[cfg(feature = "cuda")]
pub(crate) fn ptx() -> candle_core::Result<&'static str> {
    static PTX: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    hearth_gpu::kernels::compile(&PTX, "one-row matrix", SOURCE)
}
