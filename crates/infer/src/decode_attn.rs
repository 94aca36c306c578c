//! Attention of one-token rows (decode steps) straight over the KV block pool, on a GPU: one
//! kernel per layer where the general path (`CandleModel::attention`) runs about a dozen: a
//! gather of every row's blocks for K and for V, transposes into head order, two matrix products,
//! the scale, the mask, the softmax and the casts between them. Each thread block takes one
//! (row, query head): it walks that row's positions through its block table, keeps a running
//! maximum and sum (the online softmax of flash attention), so no score is ever stored, and
//! accumulates the weighted V rows in f32; the warps' partial results are merged at the end.
//! Compiled by NVRTC at first use, like the KV write kernel. The CPU keeps the general path.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use crate::Error;

/// What one call needs besides Q and the layer's K and V pools.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct DecodeAttention {
    /// u32 on the device: each row's `nb` block ids (row-major), then each row's length
    /// (positions to attend, the new one included).
    pub meta: Tensor,
    pub rows: usize,
    /// Blocks per row in `meta`.
    pub nb: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Attend only the last `window` positions (a sliding-window layer); 0 = all.
    pub window: usize,
}

/// Most head dimensions a lane handles (8 values of 32 lanes: head_dim up to 256).
const MAX_HEAD_DIM: usize = 256;

impl DecodeAttention {
    /// Whether the kernel takes this shape.
    pub(crate) fn fits(head_dim: usize) -> bool {
        head_dim > 0 && head_dim <= MAX_HEAD_DIM
    }

    /// `q` `[rows, n_head, head_dim]` (contiguous) over the pools `k`, `v` (`[pool rows,
    /// n_head_kv * head_dim]`, q's dtype): `[rows, n_head * head_dim]`.
    pub(crate) fn run(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor, Error> {
        let q = q.contiguous()?;
        Ok(q.apply_op3_no_bwd(k, v, self)?
            .reshape((self.rows, self.n_head * self.head_dim))?)
    }
}

impl CustomOp3 for DecodeAttention {
    fn name(&self) -> &'static str {
        "hearth-decode-attention"
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
        candle_core::bail!(
            "the decode attention kernel runs on a GPU; the CPU takes the general path"
        )
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        l_q: &Layout,
        k: &candle_core::CudaStorage,
        l_k: &Layout,
        v: &candle_core::CudaStorage,
        l_v: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let what = "decode attention";
        let range = |l| crate::cuda_kernels::contiguous(l, what);
        let ((q0, q1), (k0, k1), (v0, v1)) = (range(l_q)?, range(l_k)?, range(l_v)?);
        let (hd, kv_dim) = (self.head_dim, self.n_head_kv * self.head_dim);
        if q1 - q0 != self.rows * self.n_head * hd
            || !(k1 - k0).is_multiple_of(kv_dim * crate::device_kv::BLOCK)
            || k1 - k0 != v1 - v0
            || !Self::fits(hd)
            || !self.n_head.is_multiple_of(self.n_head_kv)
        {
            candle_core::bail!("decode attention: shapes do not match")
        }
        let pool_rows = ((k1 - k0) / kv_dim) as u32;
        let (meta, meta_len) =
            crate::cuda_kernels::device_span(&self.meta, candle_core::DType::U32, what)?;
        if meta_len != self.rows * (self.nb + 1) {
            candle_core::bail!("decode attention: the block table has the wrong length")
        }
        let dev = q.device.clone();
        let warps = 4u32;
        let cfg = LaunchConfig {
            grid_dim: (self.n_head as u32, self.rows as u32, 1),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: ((hd as u32) * (1 + warps) + 2 * warps) * 4,
        };
        let args = [
            self.nb as u32,
            self.n_head as u32,
            (self.n_head / self.n_head_kv) as u32,
            hd as u32,
            kv_dim as u32,
            pool_rows,
            self.window as u32,
        ];
        let n = self.rows * self.n_head * hd;
        macro_rules! launch {
            ($q:expr, $k:expr, $v:expr, $ty:ty, $kernel:literal) => {{
                let func =
                    dev.get_or_load_custom_func($kernel, "hearth_decode_attention", ptx()?)?;
                // SAFETY: every element is written by the kernel before it is read.
                let mut out = unsafe { dev.alloc::<$ty>(n)? };
                let (qs, ks, vs) = ($q.slice(q0..q1), $k.slice(k0..k1), $v.slice(v0..v1));
                let mut b = func.builder();
                b.arg(&qs);
                b.arg(&ks);
                b.arg(&vs);
                b.arg(&meta);
                b.arg(&mut out);
                for a in &args {
                    b.arg(a);
                }
                b.arg(&self.scale);
                // SAFETY: the kernel reads `rows * n_head * head_dim` values of q, pool rows
                // below `pool_rows` (block ids are checked against it) and `rows * (nb + 1)`
                // table entries; it writes `n` values of `out`.
                unsafe { b.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match (&q.slice, &k.slice, &v.slice) {
            (S::F32(q), S::F32(k), S::F32(v)) => launch!(q, k, v, f32, "decode_attn_f32"),
            (S::F16(q), S::F16(k), S::F16(v)) => {
                launch!(q, k, v, half::f16, "decode_attn_f16")
            }
            (S::BF16(q), S::BF16(k), S::BF16(v)) => {
                launch!(q, k, v, half::bf16, "decode_attn_bf16")
            }
            _ => candle_core::bail!("decode attention needs q, k and v of one dtype"),
        };
        Ok((out, Shape::from((self.rows, self.n_head, hd))))
    }
}

/// The kernel's source (after [`crate::cuda_kernels::PRELUDE`]).
#[cfg(feature = "cuda")]
const SOURCE: &str = r#"
// Grid (n_head, rows), 32 * warps threads. Shared: q scaled (hd), each warp's accumulator
// (warps * hd), maximum and sum (2 * warps).
template <typename C>
__device__ void decode_attn(const typename C::T *q, const typename C::T *k,
                            const typename C::T *v, const unsigned int *meta,
                            typename C::T *out, unsigned int nb, unsigned int n_head,
                            unsigned int group, unsigned int hd, unsigned int kv_dim,
                            unsigned int pool_rows, unsigned int window, float scale) {
    const unsigned int h = blockIdx.x, r = blockIdx.y;
    const unsigned int kv_off = (h / group) * hd;
    const unsigned int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned int rows = gridDim.y;
    const unsigned int *blocks = meta + (size_t)r * nb;
    const unsigned int len = meta[(size_t)rows * nb + r];
    const unsigned int start = (window > 0 && len > window) ? len - window : 0;
    extern __shared__ float sh[];
    float *qs = sh;
    float *wacc = sh + hd;
    float *wmax = wacc + warps * hd;
    float *wsum = wmax + warps;
    const typename C::T *qrow = q + ((size_t)r * n_head + h) * hd;
    for (unsigned int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = C::load(qrow[d]) * scale;
    __syncthreads();
    const float neg_inf = __int_as_float(0xff800000);
    float m = neg_inf, l = 0.f;
    float acc[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    for (unsigned int p = start + warp; p < len; p += warps) {
        unsigned int block = blocks[p / 16];
        if (block * 16u >= pool_rows) break;  // a bad id is never followed out of the pool
        const size_t row = (size_t)block * 16 + p % 16;
        const typename C::T *krow = k + row * kv_dim + kv_off;
        const typename C::T *vrow = v + row * kv_dim + kv_off;
        float s = 0.f;
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            unsigned int d = lane + 32 * i;
            if (d < hd) s += qs[d] * C::load(krow[d]);
        }
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float m_new = fmaxf(m, s);
        const float corr = __expf(m - m_new);
        const float e = __expf(s - m_new);
        l = l * corr + e;
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            unsigned int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * corr + e * C::load(vrow[d]);
        }
        m = m_new;
    }
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        unsigned int d = lane + 32 * i;
        if (d < hd) wacc[warp * hd + d] = acc[i];
    }
    if (lane == 0) { wmax[warp] = m; wsum[warp] = l; }
    __syncthreads();
    float mx = neg_inf;
    for (unsigned int w = 0; w < warps; ++w) mx = fmaxf(mx, wmax[w]);
    float total = 0.f;
    for (unsigned int w = 0; w < warps; ++w)
        if (wsum[w] > 0.f) total += wsum[w] * __expf(wmax[w] - mx);
    typename C::T *orow = out + ((size_t)r * n_head + h) * hd;
    for (unsigned int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (unsigned int w = 0; w < warps; ++w)
            if (wsum[w] > 0.f) o += wacc[w * hd + d] * __expf(wmax[w] - mx);
        orow[d] = C::store(total > 0.f ? o / total : 0.f);
    }
}

#define DECODE_ATTN(NAME, C)                                                                  \
extern "C" __global__ void NAME(const C::T *q, const C::T *k, const C::T *v,                 \
    const unsigned int *meta, C::T *out, unsigned int nb, unsigned int n_head,               \
    unsigned int group, unsigned int hd, unsigned int kv_dim, unsigned int pool_rows,        \
    unsigned int window, float scale) {                                                      \
    decode_attn<C>(q, k, v, meta, out, nb, n_head, group, hd, kv_dim, pool_rows, window,     \
                   scale);                                                                    \
}
DECODE_ATTN(decode_attn_f32, F32)
DECODE_ATTN(decode_attn_f16, F16)
DECODE_ATTN(decode_attn_bf16, BF16)
"#;

/// The kernels' PTX, compiled once per process.
#[cfg(feature = "cuda")]
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    crate::cuda_kernels::compile(&PTX, "decode attention", SOURCE)
}
