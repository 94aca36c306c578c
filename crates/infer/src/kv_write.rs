//! Copies between the KV pool and a step's tensors, raw words with no arithmetic.
//!
//! Writing rows into the pool in place: `pool[at[i]] = src[i]` for every row of `src`, one
//! kernel for the whole batch. candle's `scatter_set` would do it, but its CUDA kernel gives one
//! thread to each column and walks every source row in turn (2,048 dependent steps per thread
//! for a 2,048-row prefill, for K and V of every layer); this one gives a thread to every element.
//! On a GPU the kernel is compiled by NVRTC at the first write (the CUDA libraries a GPU machine
//! has carry NVRTC); on the CPU it is a copy per row.
//!
//! Gathering a group's keys or values out of the pool in head order, `[b, n_kv, t, head_dim]`,
//! on a GPU ([`gather_heads`]): one kernel where candle gathers the blocks and then copies them
//! into head order through its strided copy.

use candle_core::{CpuStorage, CustomOp2, InplaceOp3, Layout, Shape, Tensor};

use crate::Error;

/// `pool` (`[rows, width]`, contiguous) gets `src` (`[n, width]`, the pool's dtype) at rows `at`
/// (`[n]` u32, each below `rows`).
pub(crate) fn write_rows(pool: &Tensor, at: &Tensor, src: &Tensor) -> Result<(), Error> {
    let (rows, width) = pool.dims2()?;
    let (n, w) = src.dims2()?;
    if w != width || at.dims1()? != n || src.dtype() != pool.dtype() {
        return Err(Error::InvalidBatch(format!(
            "a KV write of {n}x{w} {:?} rows into a {rows}x{width} {:?} pool",
            src.dtype(),
            pool.dtype()
        )));
    }
    let src = src.contiguous()?;
    pool.inplace_op3(&src, at, &WriteRows { rows, width })?;
    Ok(())
}

struct WriteRows {
    rows: usize,
    width: usize,
}

/// The three tensors' element ranges in their storages; a KV write needs them contiguous.
fn offsets(layouts: [&Layout; 3]) -> candle_core::Result<[(usize, usize); 3]> {
    let range = |l| hearth_gpu::kernels::contiguous(l, "a KV write");
    Ok([range(layouts[0])?, range(layouts[1])?, range(layouts[2])?])
}

/// Checks the destinations against the pool, so a bad index is an error, not a stray write.
fn check(at: &[u32], rows: usize) -> candle_core::Result<()> {
    match at.iter().find(|&&r| r as usize >= rows) {
        Some(r) => candle_core::bail!("KV row {r} outside a pool of {rows} rows"),
        None => Ok(()),
    }
}

impl InplaceOp3 for WriteRows {
    fn name(&self) -> &'static str {
        "hearth-kv-write"
    }

    fn cpu_fwd(
        &self,
        pool: &mut CpuStorage,
        l_pool: &Layout,
        src: &CpuStorage,
        l_src: &Layout,
        at: &CpuStorage,
        l_at: &Layout,
    ) -> candle_core::Result<()> {
        fn copy<T: Copy>(
            pool: &mut [T],
            src: &[T],
            at: &[u32],
            width: usize,
        ) -> candle_core::Result<()> {
            for (row, &r) in src.chunks_exact(width).zip(at) {
                let r = r as usize * width;
                pool[r..r + width].copy_from_slice(row);
            }
            Ok(())
        }
        let [(p0, p1), (s0, s1), (a0, a1)] = offsets([l_pool, l_src, l_at])?;
        let CpuStorage::U32(at) = at else {
            candle_core::bail!("KV rows must be u32")
        };
        let at = &at[a0..a1];
        check(at, self.rows)?;
        let w = self.width;
        match (pool, src) {
            (CpuStorage::F32(p), CpuStorage::F32(s)) => copy(&mut p[p0..p1], &s[s0..s1], at, w),
            (CpuStorage::F16(p), CpuStorage::F16(s)) => copy(&mut p[p0..p1], &s[s0..s1], at, w),
            (CpuStorage::BF16(p), CpuStorage::BF16(s)) => copy(&mut p[p0..p1], &s[s0..s1], at, w),
            _ => candle_core::bail!("a KV write needs the pool's dtype (f32, f16 or bf16)"),
        }
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)] // the kernel launch
    fn cuda_fwd(
        &self,
        pool: &mut candle_core::CudaStorage,
        l_pool: &Layout,
        src: &candle_core::CudaStorage,
        l_src: &Layout,
        at: &candle_core::CudaStorage,
        l_at: &Layout,
    ) -> candle_core::Result<()> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let [(p0, p1), (s0, s1), (a0, a1)] = offsets([l_pool, l_src, l_at])?;
        let S::U32(at) = &at.slice else {
            candle_core::bail!("KV rows must be u32")
        };
        let n = a1 - a0;
        let at = at.slice(a0..a1);
        let dev = pool.device.clone();
        let elems = (n * self.width) as u32;
        let (width, rows) = (self.width as u32, self.rows as u32);
        let cfg = LaunchConfig::for_num_elems(elems.max(1));
        // f16 and bf16 rows are copied as 16-bit words, f32 as 32-bit ones: no arithmetic.
        macro_rules! launch {
            ($p:expr, $s:expr, $kernel:literal) => {{
                let func = dev.get_or_load_custom_func($kernel, "hearth_kv_write", ptx()?)?;
                let mut dst = $p.slice_mut(p0..p1);
                let src = $s.slice(s0..s1);
                let mut b = func.builder();
                b.arg(&at);
                b.arg(&src);
                b.arg(&mut dst);
                b.arg(&elems);
                b.arg(&width);
                b.arg(&rows);
                // SAFETY: the kernel reads `elems` source elements and `elems / width` indices,
                // each checked below `rows`, and writes inside the pool's `rows * width`.
                unsafe { b.launch(cfg) }.w()?;
            }};
        }
        match (&mut pool.slice, &src.slice) {
            (S::F32(p), S::F32(s)) => launch!(p, s, "kv_write_f32"),
            (S::F16(p), S::F16(s)) => launch!(p, s, "kv_write_f16"),
            (S::BF16(p), S::BF16(s)) => launch!(p, s, "kv_write_bf16"),
            _ => candle_core::bail!("a KV write needs the pool's dtype (f32, f16 or bf16)"),
        }
        Ok(())
    }
}

/// Layer `pool` (`[rows, n_kv * head_dim]`) at the `b * nb` blocks of `blocks` (u32, `nb` a
/// sequence) as `[b, n_kv, nb * block, head_dim]`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA path
pub(crate) fn gather_heads(
    pool: &Tensor,
    blocks: &Tensor,
    b: usize,
    n_kv: usize,
    block: usize,
) -> Result<Tensor, Error> {
    Ok(pool.apply_op2_no_bwd(blocks, &GatherHeads { b, n_kv, block })?)
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
struct GatherHeads {
    b: usize,
    n_kv: usize,
    block: usize,
}

impl CustomOp2 for GatherHeads {
    fn name(&self) -> &'static str {
        "hearth-kv-gather-heads"
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
        pool: &candle_core::CudaStorage,
        l_pool: &Layout,
        blocks: &candle_core::CudaStorage,
        l_blocks: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let what = "a head-order gather";
        let (rows, kv_dim) = l_pool.shape().dims2()?;
        let (p0, p1) = hearth_gpu::kernels::contiguous(l_pool, what)?;
        let (b0, b1) = hearth_gpu::kernels::contiguous(l_blocks, what)?;
        let (b, n_kv, block) = (self.b, self.n_kv, self.block);
        if b == 0 || n_kv == 0 || !kv_dim.is_multiple_of(n_kv) || !(b1 - b0).is_multiple_of(b) {
            candle_core::bail!("a head-order gather of a {rows}x{kv_dim} pool does not fit")
        }
        let (hd, nb) = (kv_dim / n_kv, (b1 - b0) / b);
        let t = nb * block;
        let elems = b * kv_dim * t;
        if elems > u32::MAX as usize {
            candle_core::bail!("a head-order gather too large for one launch")
        }
        let S::U32(table) = &blocks.slice else {
            candle_core::bail!("KV blocks must be u32")
        };
        let table = table.slice(b0..b1);
        let dev = pool.device.clone();
        let cfg = LaunchConfig::for_num_elems((elems as u32).max(1));
        let args = [elems, n_kv, hd, t, block, nb, rows].map(|v| v as u32);
        macro_rules! launch {
            ($p:expr, $ty:ty, $kernel:literal) => {{
                let func = dev.get_or_load_custom_func($kernel, "hearth_kv_write", ptx()?)?;
                // SAFETY: every element of `out` is written by the kernel.
                let mut out = unsafe { dev.alloc::<$ty>(elems)? };
                let src = $p.slice(p0..p1);
                let mut l = func.builder();
                l.arg(&table);
                l.arg(&src);
                l.arg(&mut out);
                for a in &args {
                    l.arg(a);
                }
                // SAFETY: reads `b * nb` block ids and pool rows below `rows` (a row past it
                // writes zeros instead), writes `elems` values of `out`.
                unsafe { l.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match &pool.slice {
            S::F32(p) => launch!(p, f32, "gather_heads_f32"),
            S::F16(p) => launch!(p, half::f16, "gather_heads_f16"),
            S::BF16(p) => launch!(p, half::bf16, "gather_heads_bf16"),
            _ => candle_core::bail!("a head-order gather of a pool not f32, f16 or bf16"),
        };
        Ok((out, Shape::from((b, n_kv, t, hd))))
    }
}

/// The kernels' source: one thread per element; a row whose index is out of range is skipped
/// (the host checks them on the CPU path; on the GPU the check costs nothing here).
#[cfg(feature = "cuda")]
const SOURCE: &str = r#"
template <typename T>
__device__ void kv_write(const unsigned int *at, const T *src, T *dst, unsigned int elems,
                         unsigned int width, unsigned int rows) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < elems;
         i += blockDim.x * gridDim.x) {
        unsigned int r = at[i / width];
        if (r < rows) {
            dst[(size_t)r * width + i % width] = src[i];
        }
    }
}
extern "C" __global__ void kv_write_f32(const unsigned int *at, const unsigned int *src,
    unsigned int *dst, unsigned int elems, unsigned int width, unsigned int rows) {
    kv_write(at, src, dst, elems, width, rows);
}
extern "C" __global__ void kv_write_f16(const unsigned int *at, const unsigned short *src,
    unsigned short *dst, unsigned int elems, unsigned int width, unsigned int rows) {
    kv_write(at, src, dst, elems, width, rows);
}
extern "C" __global__ void kv_write_bf16(const unsigned int *at, const unsigned short *src,
    unsigned short *dst, unsigned int elems, unsigned int width, unsigned int rows) {
    kv_write(at, src, dst, elems, width, rows);
}
// out[bi, kh, p, d] = pool[row of position p of sequence bi, kh * hd + d].
template <typename T>
__device__ void gather_heads(const unsigned int *table, const T *pool, T *out, unsigned int elems,
                             unsigned int n_kv, unsigned int hd, unsigned int t,
                             unsigned int block, unsigned int nb, unsigned int rows) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < elems;
         i += blockDim.x * gridDim.x) {
        const unsigned int d = i % hd, p = (i / hd) % t, kh = (i / hd / t) % n_kv;
        const unsigned int bi = i / hd / t / n_kv;
        const unsigned int r = table[bi * nb + p / block] * block + p % block;
        out[i] = r < rows ? pool[(size_t)r * n_kv * hd + kh * hd + d] : (T)0;
    }
}
#define GATHER(SUFFIX, T)                                                                       \
extern "C" __global__ void gather_heads_##SUFFIX(const unsigned int *table, const T *pool,       \
        T *out, unsigned int elems, unsigned int n_kv, unsigned int hd, unsigned int t,          \
        unsigned int block, unsigned int nb, unsigned int rows) {                                \
    gather_heads(table, pool, out, elems, n_kv, hd, t, block, nb, rows);                         \
}
GATHER(f32, unsigned int)
GATHER(f16, unsigned short)
GATHER(bf16, unsigned short)
"#;

/// The kernels' PTX, compiled once per process.
#[cfg(feature = "cuda")]
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    hearth_gpu::kernels::compile(&PTX, "KV copy", SOURCE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn rows_land_where_their_indices_say_and_a_bad_index_is_an_error() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let pool = Tensor::zeros((5, 3), dtype, &Device::Cpu).unwrap();
            let src = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let at = Tensor::new(&[4u32, 1], &Device::Cpu).unwrap();
            write_rows(&pool, &at, &src).unwrap();
            let got = pool.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(
                got,
                [
                    [0., 0., 0.],
                    [4., 5., 6.],
                    [0., 0., 0.],
                    [0., 0., 0.],
                    [1., 2., 3.]
                ]
            );
            let bad = Tensor::new(&[5u32, 0], &Device::Cpu).unwrap();
            assert!(write_rows(&pool, &bad, &src).is_err());
            let short = Tensor::new(&[0u32], &Device::Cpu).unwrap();
            assert!(write_rows(&pool, &short, &src).is_err());
        }
    }
}
