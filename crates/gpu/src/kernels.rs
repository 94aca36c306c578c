//! What Hearth's own CUDA kernels share, text and image alike: the prelude every kernel source
//! starts with (loads and stores of f32, f16 and bf16 values as f32, with no headers, so that
//! NVRTC needs nothing but itself), compiling a source once per process, and reading a tensor's
//! place in its storage. The kernels: `hearth-infer`'s `decode_attn/`, `fused.rs`, `gemv.rs`
//! and `kv_write.rs` (raw copies between the KV pool and a step's tensors); `hearth-imagine`'s
//! `layers/cuda.rs`. The prelude also owns the rules two kernels of a step share: the gated
//! MLP's activation (`glu_act`) and RoPE's pairs and where they go (`rope_dims`, `rope_place`).

/// Conversions between the stored dtypes and f32: `C::load(x)` and `C::store(f)` for `C` one of
/// `F32`, `F16`, `BF16` (whose `C::T` is the stored type), and `C::load8(p, f)` for eight values
/// from one aligned vector load (16 bytes of f16/bf16, 32 of f32: the caller checks the alignment),
/// `C::store8(p, f)` for eight values in one aligned vector store. `load8` is `C::raw8(p)` (the
/// load, as bytes) then `C::cvt8` (the conversion), which a kernel may also call apart, to issue
/// a round of loads before it waits on any. f16 through PTX's `cvt`, bf16 by shifting (stores
/// round to nearest even).
#[cfg(feature = "cuda")]
pub const PRELUDE: &str = r#"
// Eight values' bytes as one aligned load brings them: 16 of f16/bf16 in `a`, 32 of f32 in `a`
// and `b`.
struct Raw8 {
    uint4 a, b;
};
struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float x) { return x; }
    // Eight values from a 32-byte aligned address.
    static __device__ __forceinline__ Raw8 raw8(const float *p) {
        Raw8 r;
        r.a = ((const uint4 *)p)[0];
        r.b = ((const uint4 *)p)[1];
        return r;
    }
    static __device__ __forceinline__ void cvt8(const Raw8 &r, float f[8]) {
        const unsigned int w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
        #pragma unroll
        for (int i = 0; i < 8; ++i) f[i] = __uint_as_float(w[i]);
    }
    static __device__ __forceinline__ void load8(const float *p, float f[8]) { cvt8(raw8(p), f); }
    static __device__ __forceinline__ void store8(float *p, const float f[8]) {
        ((float4 *)p)[0] = make_float4(f[0], f[1], f[2], f[3]);
        ((float4 *)p)[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
};
// Eight 16-bit values from one 16-byte aligned load.
__device__ __forceinline__ Raw8 raw8_u16(const unsigned short *p) {
    Raw8 r;
    r.a = *(const uint4 *)p;
    r.b = make_uint4(0, 0, 0, 0);
    return r;
}
// Eight 16-bit values, each through `C::load`.
template <typename C>
__device__ __forceinline__ void cvt8_u16(const Raw8 &r, float f[8]) {
    const unsigned int w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = C::load((unsigned short)(w[i] & 0xffffu));
        f[2 * i + 1] = C::load((unsigned short)(w[i] >> 16));
    }
}
// Eight values through `C::store` into one 16-byte aligned store of 16-bit values.
template <typename C>
__device__ __forceinline__ void store8_u16(unsigned short *p, const float f[8]) {
    unsigned int w[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        w[i] = (unsigned int)C::store(f[2 * i]) | ((unsigned int)C::store(f[2 * i + 1]) << 16);
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}
struct F16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(unsigned short h) {
        float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
    }
    static __device__ __forceinline__ Raw8 raw8(const unsigned short *p) { return raw8_u16(p); }
    static __device__ __forceinline__ void cvt8(const Raw8 &r, float f[8]) { cvt8_u16<F16>(r, f); }
    static __device__ __forceinline__ void load8(const unsigned short *p, float f[8]) {
        cvt8(raw8(p), f);
    }
    static __device__ __forceinline__ void store8(unsigned short *p, const float f[8]) {
        store8_u16<F16>(p, f);
    }
};
struct BF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(unsigned short b) {
        return __uint_as_float(((unsigned int)b) << 16);
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned int u = __float_as_uint(f);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (unsigned short)(u >> 16);
    }
    static __device__ __forceinline__ Raw8 raw8(const unsigned short *p) { return raw8_u16(p); }
    static __device__ __forceinline__ void cvt8(const Raw8 &r, float f[8]) { cvt8_u16<BF16>(r, f); }
    static __device__ __forceinline__ void load8(const unsigned short *p, float f[8]) {
        cvt8(raw8(p), f);
    }
    static __device__ __forceinline__ void store8(unsigned short *p, const float f[8]) {
        store8_u16<BF16>(p, f);
    }
};
// The gated MLP's activation of a gate value: GELU's tanh form, or SiLU.
__device__ __forceinline__ float glu_act(float g, bool gelu) {
    return gelu ? 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)))
                : g / (1.0f + __expf(-g));
}
// The dimensions of a head that RoPE's pair i rotates together: 2 i and 2 i + 1 (GGUF's llama
// layout, `interleaved`), else i and i + hd / 2.
struct RopeDims {
    unsigned int a, b;
};
__device__ __forceinline__ RopeDims rope_dims(unsigned int i, unsigned int hd,
                                              unsigned int interleaved) {
    RopeDims d;
    d.a = interleaved ? 2 * i : i;
    d.b = interleaved ? 2 * i + 1 : i + hd / 2;
    return d;
}
// RoPE's last step for one pair of head h of the fused [q; k; v] projection (`xa`, `xb` its
// values at dimensions `d`): Q heads rotated by the pair's angle (`cs`, `sn`: its cos and sin)
// into `q_row`, K heads rotated and V heads as they are into pool row `*row` (left out where
// that row is outside the pool's `pool_rows`).
template <typename C>
__device__ __forceinline__ void rope_place(typename C::T xa, typename C::T xb, RopeDims d,
                                           const typename C::T *cs, const typename C::T *sn,
                                           unsigned int h, typename C::T *q_row,
                                           typename C::T *pool_k, typename C::T *pool_v,
                                           const unsigned int *row, unsigned int n_head,
                                           unsigned int n_kv, unsigned int hd,
                                           unsigned int pool_rows) {
    const unsigned int kvd = n_kv * hd;
    if (h >= n_head + n_kv) {
        const unsigned int r = *row;
        if (r < pool_rows) {
            typename C::T *o = pool_v + (size_t)r * kvd + (size_t)(h - n_head - n_kv) * hd;
            o[d.a] = xa;
            o[d.b] = xb;
        }
        return;
    }
    const float x0 = C::load(xa), x1 = C::load(xb);
    const float c = C::load(*cs), s = C::load(*sn);
    const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
    typename C::T *o;
    if (h < n_head) {
        o = q_row + (size_t)h * hd;
    } else {
        const unsigned int r = *row;
        if (r >= pool_rows) return;
        o = pool_k + (size_t)r * kvd + (size_t)(h - n_head) * hd;
    }
    o[d.a] = C::store(y0);
    o[d.b] = C::store(y1);
}
"#;

/// `PRELUDE` + `source` compiled by NVRTC into `cell` on first use (an error is kept and
/// returned again: a GPU machine without NVRTC does not retry every step).
#[cfg(feature = "cuda")]
pub fn compile(
    cell: &'static std::sync::OnceLock<Result<String, String>>,
    what: &str,
    source: &str,
) -> candle_core::Result<&'static str> {
    cell.get_or_init(|| {
        candle_core::cuda_backend::cudarc::nvrtc::compile_ptx(format!("{PRELUDE}{source}"))
            .map(|p| p.to_src())
            .map_err(|e| format!("compiling the {what} kernel: {e}"))
    })
    .as_deref()
    .map_err(|e| candle_core::Error::Msg(e.clone()))
}

/// A custom op's CPU side where only its GPU side exists: the callers take another path on a
/// CPU and never reach it.
pub fn gpu_only(name: &str) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
    candle_core::bail!("{name} runs on a GPU; on a CPU the caller takes another path")
}

/// `l`'s element range in its storage; `what` names the operation that needs it contiguous.
pub fn contiguous(l: &candle_core::Layout, what: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{what} needs contiguous tensors")))
}

/// The device address of `t`'s first element and its element count, for a tensor a custom op
/// reads or writes besides its operands (a kernel argument). `t` must be contiguous, on a GPU and
/// of `dtype`; the op borrows `t` for the launch, which keeps the memory alive.
#[cfg(feature = "cuda")]
pub fn device_span(
    t: &candle_core::Tensor,
    dtype: candle_core::DType,
    what: &str,
) -> candle_core::Result<(u64, usize)> {
    span(t, dtype, what).map(|(at, len, _)| (at, len))
}

/// [`device_span`] and the stream of `t`'s device.
#[cfg(feature = "cuda")]
fn span(
    t: &candle_core::Tensor,
    dtype: candle_core::DType,
    what: &str,
) -> candle_core::Result<(
    u64,
    usize,
    std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
)> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::CudaStorageSlice as S;
    if t.dtype() != dtype {
        candle_core::bail!(
            "{what}: a tensor is {:?} where {dtype:?} was expected",
            t.dtype()
        )
    }
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(c) = &*storage else {
        candle_core::bail!("{what}: a tensor is not on the GPU")
    };
    let (a, b) = contiguous(layout, what)?;
    let stream = c.device.cuda_stream();
    let base = match &c.slice {
        S::U32(s) => s.device_ptr(&stream).0,
        S::F32(s) => s.device_ptr(&stream).0,
        S::F16(s) => s.device_ptr(&stream).0,
        S::BF16(s) => s.device_ptr(&stream).0,
        _ => candle_core::bail!("{what}: a tensor of an unexpected dtype"),
    };
    Ok((base + (a * dtype.size_in_bytes()) as u64, b - a, stream))
}

/// Writes `values` into `t`'s memory in place, on its device's stream (ordered after the work
/// queued before it): `t` contiguous, on a GPU, of `values`' dtype and length. For inputs that
/// a captured CUDA graph reads at a fixed address; nothing else may hold `t` at the same time.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // one copy into memory `t` owns
pub fn write_host<E: candle_core::WithDType>(
    t: &candle_core::Tensor,
    values: &[E],
) -> candle_core::Result<()> {
    use candle_core::cuda_backend::{cudarc::driver::result, WrapErr};
    let (at, len, stream) = span(t, E::DTYPE, "writing into a tensor")?;
    if len != values.len() {
        candle_core::bail!("writing {} values into a tensor of {len}", values.len())
    }
    // SAFETY: `at` addresses `len` elements of `E` that `t` owns (checked above); a copy from
    // pageable host memory is staged before the call returns, so `values` may go after it.
    unsafe { result::memcpy_htod_async(at, values, stream.cu_stream()) }.w()
}

/// Copies `src` into `dst` in place on the GPU (same dtype and element count, both contiguous),
/// on `dst`'s device's stream: the way into a captured CUDA graph's fixed input.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // one copy between memory the two tensors own
pub fn copy_into(dst: &candle_core::Tensor, src: &candle_core::Tensor) -> candle_core::Result<()> {
    use candle_core::cuda_backend::{cudarc::driver::result, WrapErr};
    let what = "copying between tensors";
    let (to, n, stream) = span(dst, dst.dtype(), what)?;
    let (from, m, _) = span(src, dst.dtype(), what)?;
    if n != m {
        candle_core::bail!("{what}: {m} elements into {n}")
    }
    // SAFETY: both addresses cover `n` elements of the one dtype (checked above), owned by the
    // tensors, which outlive the call; the copy is ordered on the destination's stream.
    unsafe {
        result::memcpy_dtod_async(
            to,
            from,
            n * dst.dtype().size_in_bytes(),
            stream.cu_stream(),
        )
    }
    .w()
}
