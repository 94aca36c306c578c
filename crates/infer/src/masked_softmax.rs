//! The causal softmax of prompt rows' attention scores in one kernel, on a GPU: scale, the
//! causal (and sliding-window) mask and the softmax, reading the scores in the activations'
//! dtype and writing the weights in it. The general path (`CandleModel::attention`) casts the
//! scores to f32, scales them, adds a mask built on the host and sent over, runs the softmax and
//! casts back: five passes over the largest tensor of a prefill. A row's visible positions are
//! worked out from its query's length (`visible`), so no mask is built. Arithmetic in f32,
//! compiled by NVRTC at first use; the CPU keeps the general path, against which `device_check`
//! holds this.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

use crate::Error;

/// The softmax of `scores` `[b, n_kv, group * qr, t]` (`b` sequences of `qr` query rows) over
/// the positions each query row sees.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct MaskedSoftmax {
    /// Query rows per sequence.
    pub qr: usize,
    /// Attend only the last `window` positions; 0 = all.
    pub window: usize,
    pub scale: f32,
}

impl MaskedSoftmax {
    /// `visible`: `[b * qr]` u32, the positions each query row sees (its position + 1).
    pub(crate) fn run(&self, scores: &Tensor, visible: &Tensor) -> Result<Tensor, Error> {
        Ok(scores
            .contiguous()?
            .apply_op2_no_bwd(&visible.contiguous()?, self)?)
    }
}

#[cfg(feature = "cuda")]
const SOURCE: &str = r#"
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// The block's (128 threads) maximum or sum of `v`, in every thread.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float *shared) {
    v = MAX ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = shared[0];
    for (int w = 1; w < 4; ++w) r = MAX ? fmaxf(r, shared[w]) : r + shared[w];
    __syncthreads();
    return r;
}

// Row `blockIdx.x` of `t` scores: its query is row `(r / per_b) * qr + r % qr` of `visible`.
template <typename C>
__device__ void masked_softmax(const typename C::T *s, typename C::T *p, const unsigned *visible,
                               unsigned t, unsigned per_b, unsigned qr, unsigned window,
                               float scale) {
    __shared__ float shared[4];
    const size_t r = blockIdx.x;
    const unsigned q = (unsigned)(r / per_b) * qr + (unsigned)(r % qr);
    const unsigned end = min(visible[q], t);
    const unsigned start = (window > 0 && end > window) ? end - window : 0;
    const typename C::T *row = s + r * t;
    typename C::T *out = p + r * t;
    float m = __int_as_float(0xff800000);
    for (unsigned j = start + threadIdx.x; j < end; j += blockDim.x)
        m = fmaxf(m, C::load(row[j]) * scale);
    m = block_reduce<true>(m, shared);
    float sum = 0.f;
    for (unsigned j = start + threadIdx.x; j < end; j += blockDim.x)
        sum += expf(C::load(row[j]) * scale - m);
    sum = block_reduce<false>(sum, shared);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (unsigned j = threadIdx.x; j < t; j += blockDim.x) {
        const float w = (j >= start && j < end) ? expf(C::load(row[j]) * scale - m) * inv : 0.f;
        out[j] = C::store(w);
    }
}

#define KERNEL(C, SUFFIX)                                                                       \
extern "C" __global__ void masked_softmax_##SUFFIX(const C::T *s, C::T *p,                      \
        const unsigned *visible, unsigned t, unsigned per_b, unsigned qr, unsigned window,       \
        float scale) {                                                                          \
    masked_softmax<C>(s, p, visible, t, per_b, qr, window, scale);                              \
}
KERNEL(F32, f32)
KERNEL(F16, f16)
KERNEL(BF16, bf16)
"#;

#[cfg(feature = "cuda")]
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    hearth_gpu::kernels::compile(&PTX, "masked softmax", SOURCE)
}

impl CustomOp2 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "hearth-masked-softmax"
    }

    fn cpu_fwd(
        &self,
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
        s: &candle_core::CudaStorage,
        sl: &Layout,
        v: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let what = "masked softmax";
        let (b, n_kv, gq, t) = sl.shape().dims4()?;
        let (s0, s1) = hearth_gpu::kernels::contiguous(sl, what)?;
        let (v0, v1) = hearth_gpu::kernels::contiguous(vl, what)?;
        let qr = self.qr;
        if qr == 0 || !gq.is_multiple_of(qr) || v1 - v0 != b * qr || t == 0 {
            candle_core::bail!("masked softmax: scores and query lengths do not match")
        }
        let rows = b * n_kv * gq;
        if rows > i32::MAX as usize || t > u32::MAX as usize {
            candle_core::bail!("masked softmax: too many scores for one launch")
        }
        let S::U32(visible) = &v.slice else {
            candle_core::bail!("masked softmax: the query lengths are not u32")
        };
        let visible = visible.slice(v0..v1);
        let dev = s.device.clone();
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [t as u32, (n_kv * gq) as u32, qr as u32, self.window as u32];
        macro_rules! launch {
            ($s:expr, $ty:ty, $kernel:literal) => {{
                let func = dev.get_or_load_custom_func($kernel, "hearth_masked_softmax", ptx()?)?;
                // SAFETY: every value of `out` is written by the kernel.
                let mut out = unsafe { dev.alloc::<$ty>(rows * t)? };
                let s = $s.slice(s0..s1);
                let mut l = func.builder();
                l.arg(&s);
                l.arg(&mut out);
                l.arg(&visible);
                for a in &args {
                    l.arg(a);
                }
                l.arg(&self.scale);
                // SAFETY: reads `rows * t` scores and `b * qr` lengths (each row's index into
                // them is below `b * qr`: `r / per_b < b`, `r % qr < qr`), writes `rows * t`.
                unsafe { l.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match &s.slice {
            S::F32(x) => launch!(x, f32, "masked_softmax_f32"),
            S::F16(x) => launch!(x, half::f16, "masked_softmax_f16"),
            S::BF16(x) => launch!(x, half::bf16, "masked_softmax_bf16"),
            _ => candle_core::bail!("masked softmax: the scores are not f32, f16 or bf16"),
        };
        Ok((out, sl.shape().clone()))
    }
}
