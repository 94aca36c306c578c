//! Attention of one-token rows (decode steps) straight over the KV block pool, on a GPU, where
//! the general path (`CandleModel::attention`) runs about a dozen kernels: a gather of every
//! row's blocks for K and for V, transposes into head order, two matrix products, the scale, the
//! mask, the softmax and the casts between them. This is flash decoding: a thread block takes
//! one (row, KV head, split of the row's positions), so that even one row at a short context
//! spreads over the GPU's multiprocessors; it reads each K and V row once for all the query
//! heads that share it, scores positions a thread each (all of a tile's loads in flight at
//! once, none waiting on another), and keeps a running maximum and sum (the online softmax), so
//! no score leaves the chip. When a row's positions were split, a second small kernel merges the
//! splits' partial sums. Compiled by NVRTC at first use, like the KV write kernel. The CPU keeps
//! the general path.

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

/// The widest head the kernel takes (a thread keeps `group * head_dim / THREADS` outputs).
const MAX_HEAD_DIM: usize = 256;
/// The most query heads sharing one KV head (the kernel's `MAX_GROUP`).
const MAX_GROUP: usize = 16;
/// Threads of a block, and positions a block scores at a time (the kernel's `TILE`).
#[cfg(feature = "cuda")]
const THREADS: u32 = 256;
#[cfg(feature = "cuda")]
const TILE: usize = 128;
/// Blocks a call aims for: enough to cover a large GPU's multiprocessors (132 on an H100)
/// about twice, so a short context is split into more pieces rather than leaving most idle.
#[cfg(feature = "cuda")]
const TARGET_BLOCKS: usize = 264;

impl DecodeAttention {
    /// Whether the kernel takes this shape (heads read as vectors of 8 values).
    pub(crate) fn fits(n_head: usize, n_head_kv: usize, head_dim: usize) -> bool {
        head_dim > 0
            && head_dim <= MAX_HEAD_DIM
            && head_dim.is_multiple_of(8)
            && n_head_kv > 0
            && n_head.is_multiple_of(n_head_kv)
            && n_head / n_head_kv <= MAX_GROUP
    }

    /// How a call splits each row's `max_positions` positions: `(splits, chunk)`, chunk a whole
    /// number of blocks, so that `n_kv * rows * splits` blocks come near [`TARGET_BLOCKS`].
    #[cfg(feature = "cuda")]
    fn splits(&self) -> (usize, usize) {
        let max_positions = self.nb * crate::device_kv::BLOCK;
        let base = (self.n_head_kv * self.rows).max(1);
        let want = TARGET_BLOCKS.div_ceil(base).clamp(1, self.nb.max(1));
        let chunk = max_positions
            .div_ceil(want)
            .next_multiple_of(crate::device_kv::BLOCK)
            .max(crate::device_kv::BLOCK);
        (max_positions.div_ceil(chunk).max(1), chunk)
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
        let range = |l| hearth_gpu::kernels::contiguous(l, what);
        let ((q0, q1), (k0, k1), (v0, v1)) = (range(l_q)?, range(l_k)?, range(l_v)?);
        let (hd, kv_dim) = (self.head_dim, self.n_head_kv * self.head_dim);
        if q1 - q0 != self.rows * self.n_head * hd
            || !(k1 - k0).is_multiple_of(kv_dim * crate::device_kv::BLOCK)
            || k1 - k0 != v1 - v0
            || !Self::fits(self.n_head, self.n_head_kv, hd)
        {
            candle_core::bail!("decode attention: shapes do not match")
        }
        let pool_rows = ((k1 - k0) / kv_dim) as u32;
        let (meta, meta_len) =
            hearth_gpu::kernels::device_span(&self.meta, candle_core::DType::U32, what)?;
        if meta_len != self.rows * (self.nb + 1) {
            candle_core::bail!("decode attention: the block table has the wrong length")
        }
        if k0 % 8 != 0 || v0 % 8 != 0 {
            candle_core::bail!("decode attention: the pools are not aligned for vector loads")
        }
        let dev = q.device.clone();
        let group = self.n_head / self.n_head_kv;
        let (splits, chunk) = self.splits();
        let shared = (group * hd + group * TILE + 3 * group) * 4 + TILE * 4;
        let cfg = LaunchConfig {
            grid_dim: (self.n_head_kv as u32, self.rows as u32, splits as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let combine_cfg = LaunchConfig {
            grid_dim: ((self.rows * self.n_head) as u32, 1, 1),
            block_dim: ((hd as u32).next_multiple_of(32).min(THREADS), 1, 1),
            shared_mem_bytes: (2 * splits * 4) as u32,
        };
        let args = [
            self.nb as u32,
            self.n_head as u32,
            group as u32,
            hd as u32,
            kv_dim as u32,
            pool_rows,
            self.window as u32,
            chunk as u32,
        ];
        let n = self.rows * self.n_head * hd;
        // With one split the kernel writes `out` itself; the partial buffers are then unused
        // (one element each, so that every argument is a valid allocation).
        let parts = if splits > 1 {
            self.rows * self.n_head * splits
        } else {
            1
        };
        // SAFETY (both): written by the attention kernel before the merge reads them.
        let mut part_o = unsafe { dev.alloc::<f32>(parts * if splits > 1 { hd } else { 1 })? };
        let mut part_ml = unsafe { dev.alloc::<f32>(parts * 2)? };
        macro_rules! launch {
            ($q:expr, $k:expr, $v:expr, $ty:ty, $kernel:literal) => {{
                let ptx = ptx()?;
                let func = dev.get_or_load_custom_func($kernel, "hearth_decode_attention", ptx)?;
                // SAFETY: every element is written by the kernels before it is read.
                let mut out = unsafe { dev.alloc::<$ty>(n)? };
                let (qs, ks, vs) = ($q.slice(q0..q1), $k.slice(k0..k1), $v.slice(v0..v1));
                let mut b = func.builder();
                b.arg(&qs);
                b.arg(&ks);
                b.arg(&vs);
                b.arg(&meta);
                b.arg(&mut out);
                b.arg(&mut part_o);
                b.arg(&mut part_ml);
                for a in &args {
                    b.arg(a);
                }
                b.arg(&self.scale);
                // SAFETY: the kernel reads `rows * n_head * head_dim` values of q, pool rows
                // below `pool_rows` (block ids are checked against it) and `rows * (nb + 1)`
                // table entries; it writes `n` values of `out` (one split) or the
                // `rows * n_head * splits` partial sums (several).
                unsafe { b.launch(cfg) }.w()?;
                if splits > 1 {
                    let merge = dev.get_or_load_custom_func(
                        concat!($kernel, "_combine"),
                        "hearth_decode_attention",
                        ptx,
                    )?;
                    let mut b = merge.builder();
                    b.arg(&part_o);
                    b.arg(&part_ml);
                    b.arg(&mut out);
                    let (splits, hd) = (splits as u32, hd as u32);
                    b.arg(&splits);
                    b.arg(&hd);
                    // SAFETY: reads the partials written above, writes `n` values of `out`.
                    unsafe { b.launch(combine_cfg) }.w()?;
                }
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

/// The kernels' source (after [`hearth_gpu::kernels::PRELUDE`]).
#[cfg(feature = "cuda")]
const SOURCE: &str = r#"
#define NONE 0xffffffffu
#define TILE 128u
#define MAX_GROUP 16
// Grid (n_kv, rows, splits), 256 threads. Block (kvh, r, s) attends row r's query heads
// kvh * group .. + group to the positions [s * chunk, (s + 1) * chunk) (within the row's length
// and window), TILE at a time: a thread per position for the scores (one K row read for all the
// group's heads), a warp per head for the online softmax, a thread per (head, dim) for the
// weighted V sum. One split writes `out`; several write their unnormalised sums, maxima and
// sums to `part_o`/`part_ml`, which `decode_attn_combine` merges.
// Shared: q scaled (group * hd), scores (group * TILE), each head's running max, sum and
// correction (3 * group), the tile's pool rows (TILE).
template <typename C>
__device__ void decode_attn(const typename C::T *q, const typename C::T *k,
                            const typename C::T *v, const unsigned int *meta,
                            typename C::T *out, float *part_o, float *part_ml, unsigned int nb,
                            unsigned int n_head, unsigned int group, unsigned int hd,
                            unsigned int kv_dim, unsigned int pool_rows, unsigned int window,
                            unsigned int chunk, float scale) {
    const unsigned int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const unsigned int rows = gridDim.y, splits = gridDim.z;
    const unsigned int tid = threadIdx.x, bd = blockDim.x, lane = tid % 32, warp = tid / 32;
    const unsigned int *blocks = meta + (size_t)r * nb;
    const unsigned int len = meta[(size_t)rows * nb + r];
    const unsigned int start = (window > 0 && len > window) ? len - window : 0;
    const unsigned int lo = max(start, s * chunk), hi = min(len, (s + 1) * chunk);
    const size_t head0 = (size_t)r * n_head + (size_t)kvh * group;
    const unsigned int kv_off = kvh * hd;
    const float neg_inf = __int_as_float(0xff800000);
    extern __shared__ float sh[];
    float *qs = sh;
    float *sc = qs + group * hd;
    float *run_m = sc + group * TILE;
    float *run_l = run_m + group;
    float *corr = run_l + group;
    unsigned int *at = (unsigned int *)(corr + group);
    for (unsigned int i = tid; i < group * hd; i += bd) qs[i] = C::load(q[head0 * hd + i]) * scale;
    for (unsigned int g = tid; g < group; g += bd) { run_m[g] = neg_inf; run_l[g] = 0.f; }
    // Each thread's (head, dim) pairs: j = tid + bd * t.
    float o[MAX_GROUP];
    #pragma unroll
    for (int t = 0; t < MAX_GROUP; ++t) o[t] = 0.f;
    const unsigned int pairs = group * hd;
    for (unsigned int t0 = lo; t0 < hi; t0 += TILE) {
        const unsigned int n = min(TILE, hi - t0);
        __syncthreads();  // the previous tile's readers are done (and qs is written)
        for (unsigned int i = tid; i < n; i += bd) {
            const unsigned int p = t0 + i, block = blocks[p / 16];
            // A bad id is never followed out of the pool: the position is left out.
            at[i] = block < pool_rows / 16 ? block * 16 + p % 16 : NONE;
        }
        __syncthreads();
        for (unsigned int i = tid; i < n; i += bd) {
            float acc[MAX_GROUP];
            #pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) acc[g] = 0.f;
            const unsigned int row = at[i];
            if (row != NONE) {
                const typename C::T *krow = k + (size_t)row * kv_dim + kv_off;
                // Unrolled so that a row's loads are in flight together (8 cover hd 64).
                #pragma unroll 8
                for (unsigned int d0 = 0; d0 < hd; d0 += 8) {
                    float kf[8];
                    C::load8(krow + d0, kf);
                    #pragma unroll
                    for (int g = 0; g < MAX_GROUP; ++g) {
                        if (g < (int)group) {
                            const float *qg = qs + g * hd + d0;
                            float x = 0.f;
                            #pragma unroll
                            for (int j = 0; j < 8; ++j) x += qg[j] * kf[j];
                            acc[g] += x;
                        }
                    }
                }
            }
            #pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g)
                if (g < (int)group) sc[g * TILE + i] = row != NONE ? acc[g] : neg_inf;
        }
        __syncthreads();
        for (unsigned int g = warp; g < group; g += bd / 32) {
            float *e = sc + g * TILE;
            float m = neg_inf;
            for (unsigned int i = lane; i < n; i += 32) m = fmaxf(m, e[i]);
            #pragma unroll
            for (int x = 16; x > 0; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
            const float m_new = fmaxf(run_m[g], m);
            float l = 0.f;
            for (unsigned int i = lane; i < n; i += 32) {
                const float ei = e[i] == neg_inf ? 0.f : __expf(e[i] - m_new);
                e[i] = ei;
                l += ei;
            }
            #pragma unroll
            for (int x = 16; x > 0; x >>= 1) l += __shfl_xor_sync(0xffffffffu, l, x);
            __syncwarp();
            if (lane == 0) {
                const float c = run_m[g] == neg_inf ? 0.f : __expf(run_m[g] - m_new);
                corr[g] = c;
                run_l[g] = run_l[g] * c + l;
                run_m[g] = m_new;
            }
        }
        __syncthreads();
        #pragma unroll
        for (int t = 0; t < MAX_GROUP; ++t) {
            const unsigned int j = tid + bd * t;
            if (j < pairs) {
                const unsigned int g = j / hd, d = j % hd;
                const float *e = sc + g * TILE;
                const typename C::T *vcol = v + kv_off + d;
                float x = o[t] * corr[g];
                // 16 positions' loads in flight at a time (a split of one block at once).
                #pragma unroll 16
                for (unsigned int i = 0; i < n; ++i) {
                    const unsigned int row = at[i];
                    if (row != NONE) x += e[i] * C::load(vcol[(size_t)row * kv_dim]);
                }
                o[t] = x;
            }
        }
    }
    __syncthreads();
    #pragma unroll
    for (int t = 0; t < MAX_GROUP; ++t) {
        const unsigned int j = tid + bd * t;
        if (j < pairs) {
            const unsigned int g = j / hd, d = j % hd;
            // An empty range (lo >= hi) leaves run_l at 0: the merge skips it.
            if (splits == 1) {
                const float l = run_l[g];
                out[(head0 + g) * hd + d] = C::store(l > 0.f ? o[t] / l : 0.f);
            } else {
                part_o[((head0 + g) * splits + s) * hd + d] = o[t];
            }
        }
    }
    if (splits > 1)
        for (unsigned int g = tid; g < group; g += bd) {
            part_ml[((head0 + g) * splits + s) * 2] = run_m[g];
            part_ml[((head0 + g) * splits + s) * 2 + 1] = run_l[g];
        }
}

// Grid (rows * n_head): merges one head's splits into `out`. Shared: each split's maximum and
// sum (2 * splits), read in parallel.
template <typename C>
__device__ void decode_attn_combine(const float *__restrict__ part_o,
                                    const float *__restrict__ part_ml,
                                    typename C::T *__restrict__ out, unsigned int splits,
                                    unsigned int hd) {
    const size_t head = blockIdx.x;
    const float *ml = part_ml + head * splits * 2;
    const float neg_inf = __int_as_float(0xff800000);
    extern __shared__ float sh[];
    float *sm = sh, *sl = sh + splits;
    for (unsigned int s = threadIdx.x; s < splits; s += blockDim.x) {
        sm[s] = ml[2 * s];
        sl[s] = ml[2 * s + 1];
    }
    __syncthreads();
    float mx = neg_inf;
    for (unsigned int s = 0; s < splits; ++s)
        if (sl[s] > 0.f) mx = fmaxf(mx, sm[s]);
    float total = 0.f;
    for (unsigned int s = 0; s < splits; ++s)
        if (sl[s] > 0.f) total += sl[s] * __expf(sm[s] - mx);
    for (unsigned int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        #pragma unroll 8
        for (unsigned int s = 0; s < splits; ++s)
            if (sl[s] > 0.f) o += part_o[(head * splits + s) * hd + d] * __expf(sm[s] - mx);
        out[head * hd + d] = C::store(total > 0.f ? o / total : 0.f);
    }
}

#define DECODE_ATTN(NAME, C)                                                                  \
extern "C" __global__ void NAME(const C::T *q, const C::T *k, const C::T *v,                 \
    const unsigned int *meta, C::T *out, float *part_o, float *part_ml, unsigned int nb,      \
    unsigned int n_head, unsigned int group, unsigned int hd, unsigned int kv_dim,            \
    unsigned int pool_rows, unsigned int window, unsigned int chunk, float scale) {           \
    decode_attn<C>(q, k, v, meta, out, part_o, part_ml, nb, n_head, group, hd, kv_dim,        \
                   pool_rows, window, chunk, scale);                                          \
}                                                                                             \
extern "C" __global__ void NAME##_combine(const float *part_o, const float *part_ml,         \
    C::T *out, unsigned int splits, unsigned int hd) {                                        \
    decode_attn_combine<C>(part_o, part_ml, out, splits, hd);                                 \
}
DECODE_ATTN(decode_attn_f32, F32)
DECODE_ATTN(decode_attn_f16, F16)
DECODE_ATTN(decode_attn_bf16, BF16)
"#;

/// The kernels' PTX, compiled once per process.
#[cfg(feature = "cuda")]
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    hearth_gpu::kernels::compile(&PTX, "decode attention", SOURCE)
}
