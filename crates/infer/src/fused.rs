//! Three fused steps of the candle backend's layer on a GPU, each one kernel where candle runs
//! several:
//! - [`RopeKv`]: from the fused `[q; k; v]` projection of a step's rows, Q rotated into a tensor
//!   of its own, K rotated and V copied straight into their pool rows (where candle runs a rope
//!   for Q and one for K, three copies out of the projection and two KV writes);
//! - [`Glu`]: the gated MLP's `act(gate) * up` from the fused `[gate; up]` projection (where
//!   candle runs two copies, the activation and the product);
//! - [`AddNorm`]: the residual add and the RMSNorm that follows it (the next sublayer's input),
//!   where candle runs the add and then the norm, which reads the sum back.
//!
//! Arithmetic is in f32 between f16/bf16 loads and stores. Compiled by NVRTC at first use. The
//! CPU keeps the general path (`candle_llama`), against which `device_check` holds these.

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Shape, Tensor};

use crate::Error;

/// RoPE of Q and K and the KV write of one layer, from `[rows, (n_head + 2 n_kv) * head_dim]`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct RopeKv<'a> {
    /// `[rows, 1, head_dim / 2]` each, the activations' dtype.
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    /// `[rows]` u32: each row's pool row.
    pub write_at: &'a Tensor,
    /// The layer's K and V pools, `[pool rows, n_kv * head_dim]`, the activations' dtype.
    pub pool_k: &'a Tensor,
    pub pool_v: &'a Tensor,
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    /// Pairs `(2i, 2i + 1)` rotate (GGUF llama layout) rather than `(i, i + head_dim / 2)`.
    pub interleaved: bool,
}

impl RopeKv<'_> {
    /// Rotated Q, `[rows, n_head, head_dim]`; K and V are in the pools afterwards.
    pub(crate) fn run(&self, qkv: &Tensor) -> Result<Tensor, Error> {
        Ok(qkv.contiguous()?.apply_op1_no_bwd(self)?)
    }

    /// For a kernel that does this for `rows` rows: the addresses of cos, sin, the pool rows and
    /// the K and V pools, and the shape arguments (rows, n_head, n_kv, head_dim, pool rows,
    /// interleaved), the tensors checked against `rows`. The other tensors go in as addresses.
    /// The pools are written through them: the model holds the pool's lock for the whole step,
    /// and nothing reads a pool but this stream's later launches.
    #[cfg(feature = "cuda")]
    pub(crate) fn launch_args(&self, rows: usize) -> candle_core::Result<([u64; 5], [u32; 6])> {
        use candle_core::DType;
        let act = self.cos.dtype();
        let mut ptrs = [0u64; 5];
        let mut lens = [0usize; 5];
        for (i, (t, dtype)) in [
            (self.cos, act),
            (self.sin, act),
            (self.write_at, DType::U32),
            (self.pool_k, act),
            (self.pool_v, act),
        ]
        .into_iter()
        .enumerate()
        {
            (ptrs[i], lens[i]) = hearth_gpu::kernels::device_span(t, dtype, "rope-kv")?;
        }
        let (hd, kvd) = (self.head_dim, self.n_kv * self.head_dim);
        if lens[0] != rows * hd / 2
            || lens[1] != rows * hd / 2
            || lens[2] != rows
            || !lens[3].is_multiple_of(kvd)
            || lens[3] != lens[4]
        {
            candle_core::bail!("rope-kv: shapes do not match")
        }
        let args = [
            rows as u32,
            self.n_head as u32,
            self.n_kv as u32,
            hd as u32,
            (lens[3] / kvd) as u32,
            self.interleaved as u32,
        ];
        Ok((ptrs, args))
    }
}

/// The gated MLP's activation of its gate (the prelude's `glu_act`); as a kernel argument, its
/// value (the one-row products' `glu`, where 0 is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GluAct {
    Silu = 1,
    /// GELU's tanh approximation.
    Gelu = 2,
}

/// `act(gate) * up` of `[rows, 2 ff]` (`gate` the first half of each row): `[rows, ff]`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct Glu {
    pub act: GluAct,
}

impl Glu {
    pub(crate) fn run(&self, gate_up: &Tensor) -> Result<Tensor, Error> {
        Ok(gate_up.contiguous()?.apply_op1_no_bwd(self)?)
    }
}

/// The residual stream `x + y` and its RMSNorm times `weight`, as `[2, rows, d]`: `[0]` the sum
/// (rounded to the activations' dtype, as candle's add leaves it), `[1]` the norm of that
/// rounded sum.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct AddNorm {
    pub eps: f32,
    /// The scalar kernel (a value a thread at a time, the sums read back), not the one that keeps
    /// a row in registers ([`crate::GpuTuning::first_kernels`], to compare).
    pub scalar: bool,
}

/// Threads of the register add-norm kernel for a row of `d`, when it takes the row: `d` a whole
/// number of 8-value chunks, at most 4 a thread.
#[cfg(feature = "cuda")]
fn add_norm_threads(d: usize) -> Option<u32> {
    let chunks = d / 8;
    let threads = chunks.next_multiple_of(32).clamp(32, 256);
    (d.is_multiple_of(8) && chunks > 0 && chunks <= 4 * threads).then_some(threads as u32)
}

impl AddNorm {
    /// `(x + y, rms_norm(x + y) * weight)` for `x`, `y` `[rows, d]` and `weight` `[d]`.
    pub(crate) fn run(
        &self,
        x: &Tensor,
        y: &Tensor,
        weight: &Tensor,
    ) -> Result<(Tensor, Tensor), Error> {
        let both =
            x.contiguous()?
                .apply_op3_no_bwd(&y.contiguous()?, &weight.contiguous()?, self)?;
        Ok((both.get(0)?, both.get(1)?))
    }
}

impl CustomOp1 for RopeKv<'_> {
    fn name(&self) -> &'static str {
        "hearth-rope-kv"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        hearth_gpu::kernels::gpu_only(self.name())
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(
        &self,
        qkv: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};
        use candle_core::DType;

        let what = "rope-kv";
        let (hd, nh, nkv) = (self.head_dim, self.n_head, self.n_kv);
        let width = (nh + 2 * nkv) * hd;
        let (x0, x1) = hearth_gpu::kernels::contiguous(l, what)?;
        if !(x1 - x0).is_multiple_of(width) || !hd.is_multiple_of(2) {
            candle_core::bail!(
                "rope-kv: the projection is not [rows, (n_head + 2 n_kv) * head_dim]"
            )
        }
        let rows = (x1 - x0) / width;
        let dev = qkv.device.clone();
        let act = self.cos.dtype();
        let (ptrs, args) = self.launch_args(rows)?;
        let slots = rows * (nh + 2 * nkv) * hd / 2;
        let cfg = LaunchConfig::for_num_elems(slots.max(1) as u32);
        let n = rows * nh * hd;
        macro_rules! launch {
            ($x:expr, $ty:ty, $kernel:literal) => {{
                let func = dev.get_or_load_custom_func($kernel, "hearth_fused", ptx()?)?;
                // SAFETY: every element of `out` is written by the kernel.
                let mut out = unsafe { dev.alloc::<$ty>(n)? };
                let x = $x.slice(x0..x1);
                let mut b = func.builder();
                b.arg(&x);
                for p in &ptrs {
                    b.arg(p);
                }
                b.arg(&mut out);
                for a in &args {
                    b.arg(a);
                }
                // SAFETY: the kernel reads `rows * width` projection values, `rows * hd / 2`
                // cos and sin values and `rows` pool rows (each checked below `pool_rows`),
                // writes `n` values of `out` and pool rows below `pool_rows`.
                unsafe { b.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match &qkv.slice {
            S::F32(x) if act == DType::F32 => launch!(x, f32, "rope_kv_f32"),
            S::F16(x) if act == DType::F16 => launch!(x, half::f16, "rope_kv_f16"),
            S::BF16(x) if act == DType::BF16 => launch!(x, half::bf16, "rope_kv_bf16"),
            _ => candle_core::bail!("rope-kv: the projection and the cache differ in dtype"),
        };
        Ok((out, Shape::from((rows, nh, hd))))
    }
}

impl CustomOp1 for Glu {
    fn name(&self) -> &'static str {
        "hearth-glu"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        hearth_gpu::kernels::gpu_only(self.name())
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let (rows, two_ff) = l.shape().dims2()?;
        let (x0, x1) = hearth_gpu::kernels::contiguous(l, "glu")?;
        if !two_ff.is_multiple_of(2) || x1 - x0 != rows * two_ff {
            candle_core::bail!("glu: the projection is not [rows, 2 ff]")
        }
        let ff = two_ff / 2;
        let n = rows * ff;
        let dev = x.device.clone();
        let cfg = LaunchConfig::for_num_elems(n.max(1) as u32);
        let (n32, ff32, gelu) = (n as u32, ff as u32, u32::from(self.act == GluAct::Gelu));
        macro_rules! launch {
            ($x:expr, $ty:ty, $kernel:literal) => {{
                let func = dev.get_or_load_custom_func($kernel, "hearth_fused", ptx()?)?;
                // SAFETY: every element of `out` is written by the kernel.
                let mut out = unsafe { dev.alloc::<$ty>(n)? };
                let x = $x.slice(x0..x1);
                let mut b = func.builder();
                b.arg(&x);
                b.arg(&mut out);
                b.arg(&n32);
                b.arg(&ff32);
                b.arg(&gelu);
                // SAFETY: reads `2 n` values of `x`, writes `n` of `out`.
                unsafe { b.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match &x.slice {
            S::F32(x) => launch!(x, f32, "glu_f32"),
            S::F16(x) => launch!(x, half::f16, "glu_f16"),
            S::BF16(x) => launch!(x, half::bf16, "glu_bf16"),
            _ => candle_core::bail!("glu: the projection is not f32, f16 or bf16"),
        };
        Ok((out, Shape::from((rows, ff))))
    }
}

impl CustomOp3 for AddNorm {
    fn name(&self) -> &'static str {
        "hearth-add-norm"
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

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        l_x: &Layout,
        y: &candle_core::CudaStorage,
        l_y: &Layout,
        w: &candle_core::CudaStorage,
        l_w: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let what = "add-norm";
        let range = |l| hearth_gpu::kernels::contiguous(l, what);
        let ((x0, x1), (y0, y1), (w0, w1)) = (range(l_x)?, range(l_y)?, range(l_w)?);
        let (rows, d) = l_x.shape().dims2()?;
        if l_y.shape() != l_x.shape() || w1 - w0 != d || x1 - x0 != rows * d || y1 - y0 != rows * d
        {
            candle_core::bail!("add-norm: x and y must be [rows, d] and the weight [d]")
        }
        let dev = x.device.clone();
        // The register kernel where the row fits it and every operand is aligned for vectors.
        let vector = add_norm_threads(d)
            .filter(|_| !self.scalar && x0 % 8 == 0 && y0 % 8 == 0 && w0 % 8 == 0);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (vector.unwrap_or(256), 1, 1),
            shared_mem_bytes: 0,
        };
        macro_rules! launch {
            ($x:expr, $y:expr, $w:expr, $ty:ty, $kernel:literal) => {{
                let name = if vector.is_some() {
                    concat!($kernel, "_vec")
                } else {
                    $kernel
                };
                let func = dev.get_or_load_custom_func(name, "hearth_fused", ptx()?)?;
                // SAFETY: every element of `out` is written by the kernel.
                let mut out = unsafe { dev.alloc::<$ty>(2 * rows * d)? };
                let (xs, ys, ws) = ($x.slice(x0..x1), $y.slice(y0..y1), $w.slice(w0..w1));
                let mut b = func.builder();
                b.arg(&xs);
                b.arg(&ys);
                b.arg(&ws);
                b.arg(&mut out);
                let (rows, d) = (rows as u32, d as u32);
                b.arg(&rows);
                b.arg(&d);
                b.arg(&self.eps);
                // SAFETY: reads `rows * d` values of x and y and `d` of the weight, writes
                // `2 * rows * d` of out.
                unsafe { b.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match (&x.slice, &y.slice, &w.slice) {
            (S::F32(x), S::F32(y), S::F32(w)) => launch!(x, y, w, f32, "add_norm_f32"),
            (S::F16(x), S::F16(y), S::F16(w)) => launch!(x, y, w, half::f16, "add_norm_f16"),
            (S::BF16(x), S::BF16(y), S::BF16(w)) => {
                launch!(x, y, w, half::bf16, "add_norm_bf16")
            }
            _ => candle_core::bail!("add-norm needs x, y and the weight of one dtype"),
        };
        Ok((out, Shape::from((2, rows, d))))
    }
}

/// The kernels' source (after [`hearth_gpu::kernels::PRELUDE`]).
#[cfg(feature = "cuda")]
const SOURCE: &str = r#"
// One thread per rotated pair: row r, head h of n_head Q heads, n_kv K heads, n_kv V heads.
template <typename C>
__device__ void rope_kv(const typename C::T *x, const typename C::T *cos_,
                        const typename C::T *sin_, const unsigned int *at,
                        typename C::T *pool_k, typename C::T *pool_v, typename C::T *q,
                        unsigned int rows, unsigned int n_head, unsigned int n_kv,
                        unsigned int hd, unsigned int pool_rows, unsigned int interleaved) {
    const unsigned int half = hd / 2, heads = n_head + 2 * n_kv;
    const size_t width = (size_t)heads * hd;
    const size_t total = (size_t)rows * heads * half;
    for (size_t s = blockIdx.x * (size_t)blockDim.x + threadIdx.x; s < total;
         s += (size_t)blockDim.x * gridDim.x) {
        const unsigned int i = s % half;
        const size_t t = s / half;
        const unsigned int h = t % heads;
        const unsigned int r = t / heads;
        const typename C::T *xh = x + r * width + (size_t)h * hd;
        const RopeDims d = rope_dims(i, hd, interleaved);
        rope_place<C>(xh[d.a], xh[d.b], d, cos_ + (size_t)r * half + i,
                      sin_ + (size_t)r * half + i, h, q + (size_t)r * n_head * hd, pool_k,
                      pool_v, at + r, n_head, n_kv, hd, pool_rows);
    }
}

template <typename C>
__device__ void glu(const typename C::T *x, typename C::T *out, unsigned int n,
                    unsigned int ff, unsigned int gelu) {
    for (unsigned int s = blockIdx.x * blockDim.x + threadIdx.x; s < n;
         s += blockDim.x * gridDim.x) {
        const size_t r = s / ff, j = s % ff;
        const float g = C::load(x[r * 2 * ff + j]), u = C::load(x[r * 2 * ff + ff + j]);
        out[s] = C::store(glu_act(g, gelu) * u);
    }
}

// The sum of each thread's `v` over the block, for every thread (blockDim a multiple of 32).
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0.f;
    for (unsigned int i = 0; i < blockDim.x / 32; ++i) v += part[i];
    return v;
}

// Grid (rows), 256 threads: row r of out[0] = x + y (rounded), of out[1] = its RMSNorm * w.
template <typename C>
__device__ void add_norm(const typename C::T *__restrict__ x, const typename C::T *__restrict__ y,
                         const typename C::T *__restrict__ w, typename C::T *__restrict__ out,
                         unsigned int rows, unsigned int d, float eps) {
    const size_t r = blockIdx.x;
    const typename C::T *xr = x + r * d, *yr = y + r * d;
    typename C::T *sum = out + r * d, *h = out + ((size_t)rows + r) * d;
    float sq = 0.f;
    // Unrolled, with no pointer aliasing another, so a thread's loads are all in flight at once.
    #pragma unroll 8
    for (unsigned int j = threadIdx.x; j < d; j += blockDim.x) {
        const typename C::T s = C::store(C::load(xr[j]) + C::load(yr[j]));
        sum[j] = s;
        const float f = C::load(s);
        sq += f * f;
    }
    const float scale = rsqrtf(block_sum(sq) / d + eps);
    // Each thread reads back the sums it wrote itself.
    #pragma unroll 8
    for (unsigned int j = threadIdx.x; j < d; j += blockDim.x)
        h[j] = C::store(scale * C::load(sum[j]) * C::load(w[j]));
}

// The same in registers, for d a multiple of 8 up to 8 * 4 * blockDim: thread t holds the
// 8-value chunks t, t + blockDim, .. (at most 4) of the row, loaded with its weights in one
// round of vector loads; the sums are stored, reduced over the block, and the norm written
// from the registers, where the scalar kernel above has a load, a store and a load back each
// value. The arithmetic and its rounding are the scalar kernel's.
template <typename C>
__device__ void add_norm_vec(const typename C::T *__restrict__ x,
                             const typename C::T *__restrict__ y,
                             const typename C::T *__restrict__ w,
                             typename C::T *__restrict__ out, unsigned int rows, unsigned int d,
                             float eps) {
    const size_t r = blockIdx.x;
    const unsigned int chunks = d / 8;
    const typename C::T *xr = x + r * d, *yr = y + r * d;
    typename C::T *sum = out + r * d, *h = out + ((size_t)rows + r) * d;
    float s[4][8], wf[4][8];
    float sq = 0.f;
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int c = threadIdx.x + blockDim.x * i;
        if (c < chunks) {
            float a[8];
            C::load8(xr + c * 8, a);
            C::load8(yr + c * 8, s[i]);
            C::load8(w + c * 8, wf[i]);
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                s[i][j] = C::load(C::store(a[j] + s[i][j]));
                sq += s[i][j] * s[i][j];
            }
            C::store8(sum + c * 8, s[i]);
        }
    }
    const float scale = rsqrtf(block_sum(sq) / d + eps);
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int c = threadIdx.x + blockDim.x * i;
        if (c < chunks) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) s[i][j] = scale * s[i][j] * wf[i][j];
            C::store8(h + c * 8, s[i]);
        }
    }
}

#define ROPE_KV(NAME, C)                                                                      \
extern "C" __global__ void NAME(const C::T *x, unsigned long long cos_,                      \
    unsigned long long sin_, unsigned long long at, unsigned long long pool_k,               \
    unsigned long long pool_v, C::T *q, unsigned int rows, unsigned int n_head,              \
    unsigned int n_kv, unsigned int hd, unsigned int pool_rows, unsigned int interleaved) {  \
    rope_kv<C>(x, (const C::T *)cos_, (const C::T *)sin_, (const unsigned int *)at,          \
               (C::T *)pool_k, (C::T *)pool_v, q, rows, n_head, n_kv, hd, pool_rows,         \
               interleaved);                                                                  \
}
#define GLU(NAME, C)                                                                          \
extern "C" __global__ void NAME(const C::T *x, C::T *out, unsigned int n, unsigned int ff,   \
                                unsigned int gelu) {                                          \
    glu<C>(x, out, n, ff, gelu);                                                              \
}
ROPE_KV(rope_kv_f32, F32)
ROPE_KV(rope_kv_f16, F16)
ROPE_KV(rope_kv_bf16, BF16)
#define ADD_NORM(NAME, C)                                                                     \
extern "C" __global__ void NAME(const C::T *x, const C::T *y, const C::T *w, C::T *out,      \
                                unsigned int rows, unsigned int d, float eps) {               \
    add_norm<C>(x, y, w, out, rows, d, eps);                                                  \
}                                                                                             \
extern "C" __global__ void NAME##_vec(const C::T *x, const C::T *y, const C::T *w, C::T *out,\
                                      unsigned int rows, unsigned int d, float eps) {         \
    add_norm_vec<C>(x, y, w, out, rows, d, eps);                                              \
}
GLU(glu_f32, F32)
GLU(glu_f16, F16)
GLU(glu_bf16, BF16)
ADD_NORM(add_norm_f32, F32)
ADD_NORM(add_norm_f16, F16)
ADD_NORM(add_norm_bf16, BF16)
"#;

/// The kernels' PTX, compiled once per process.
#[cfg(feature = "cuda")]
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    hearth_gpu::kernels::compile(&PTX, "fused layer", SOURCE)
}
