//! Attention of one-token rows (decode steps) straight over the KV block pool, on a GPU, where
//! the general path (`CandleModel::attention`) runs about a dozen kernels: a gather of every
//! row's blocks for K and for V, transposes into head order, two matrix products, the scale, the
//! mask, the softmax and the casts between them. This is flash decoding: a thread block takes
//! one (row, KV head, split of the row's positions), so that even one row at a short context
//! spreads over the GPU's multiprocessors; it reads each K and V row once for all the query
//! heads that share it and keeps a running maximum and sum (the online softmax), so no score
//! leaves the chip. Heads of 64 or 128 values with up to 8 query heads a KV head take the
//! register kernel: a position's slices go to 8 or 16 lanes, a round of K and V rows is loaded
//! before any is used, and each thread keeps its positions' softmax in registers; a row's
//! positions go to blocks `chunk` at a time, and the last block of a row's splits to finish
//! merges their partial sums (a ticket counted in the table's tail), so a short row spreads over
//! many multiprocessors with no second kernel. Other shapes take the first, tiled kernel (a thread
//! scores a position, a tile's scores in shared memory), whose splits a second small kernel
//! merges. Compiled by NVRTC at first use (the source is `source.rs`), like the KV write kernel.
//! The CPU keeps the general path.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use crate::Error;

#[cfg(feature = "cuda")]
mod source;

/// What one call needs besides Q and the layer's K and V pools.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct DecodeAttention {
    /// u32 on the device: each row's `nb` block ids (row-major), then each row's length
    /// (positions to attend, the new one included), then `n_head_kv` zeros a row: the register
    /// kernel's split tickets, which the merging block puts back to 0 ([`Self::meta_len`]).
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
    /// The tiled kernel (a thread a position, splits merged by a second kernel) even where the
    /// register kernel takes the shape ([`crate::GpuTuning::first_kernels`], to compare).
    pub tiled: bool,
    /// The fewest positions a split of the register kernel takes
    /// ([`crate::GpuTuning::decode_chunk`]); 0 = [`VEC_MIN_CHUNK`].
    pub min_chunk: usize,
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
/// The fewest positions a split of the register kernel takes by default: a row of 192
/// positions (a bucket of 256) is 4 splits, each one round of a block's loads.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
const VEC_MIN_CHUNK: usize = 64;
/// Blocks of the table the register kernel stages in shared memory at a time (its `VEC_PIECE`).
#[cfg(feature = "cuda")]
const VEC_PIECE: usize = 64;

/// The register kernel's variants: lanes a position (8 for heads of 64, 16 for 128), and the
/// most query heads a KV head whose state a thread keeps (4 or 8).
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
enum Variant {
    L8G4,
    L8G8,
    L16G4,
    L16G8,
}

impl DecodeAttention {
    /// The table's length for `rows` rows of `nb` blocks over `n_head_kv` KV heads: block ids,
    /// lengths, split tickets.
    pub(crate) fn meta_len(rows: usize, nb: usize, n_head_kv: usize) -> usize {
        rows * (nb + 1 + n_head_kv)
    }

    /// Whether the kernel takes this shape (heads read as vectors of 8 values).
    pub(crate) fn fits(n_head: usize, n_head_kv: usize, head_dim: usize) -> bool {
        head_dim > 0
            && head_dim <= MAX_HEAD_DIM
            && head_dim.is_multiple_of(8)
            && n_head_kv > 0
            && n_head.is_multiple_of(n_head_kv)
            && n_head / n_head_kv <= MAX_GROUP
    }

    /// The register kernel's variant for this shape, if it takes it: a head of 64 or 128
    /// (8 or 16 lanes a position), at most 8 query heads a KV head (4 or 8 kept in registers).
    #[cfg(feature = "cuda")]
    fn vector_kernel(&self) -> Option<Variant> {
        let group = self.n_head / self.n_head_kv.max(1);
        match (self.tiled, self.head_dim, group) {
            (false, 64, 1..=4) => Some(Variant::L8G4),
            (false, 64, 5..=8) => Some(Variant::L8G8),
            (false, 128, 1..=4) => Some(Variant::L16G4),
            (false, 128, 5..=8) => Some(Variant::L16G8),
            _ => None,
        }
    }

    /// How a call splits each row's `max_positions` positions: `(splits, chunk)`, chunk a whole
    /// number of blocks, so that `n_kv * rows * splits` blocks come near [`TARGET_BLOCKS`].
    /// Each chunk is at least `min_chunk` positions (rounded up to a block).
    #[cfg(feature = "cuda")]
    fn splits(&self, min_chunk: usize) -> (usize, usize) {
        let max_positions = self.nb * crate::device_kv::BLOCK;
        let base = (self.n_head_kv * self.rows).max(1);
        let most = max_positions.div_ceil(min_chunk.max(crate::device_kv::BLOCK));
        let want = TARGET_BLOCKS.div_ceil(base).clamp(1, most.max(1));
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
        if meta_len != Self::meta_len(self.rows, self.nb, self.n_head_kv) {
            candle_core::bail!("decode attention: the block table has the wrong length")
        }
        if k0 % 8 != 0 || v0 % 8 != 0 {
            candle_core::bail!("decode attention: the pools are not aligned for vector loads")
        }
        let dev = q.device.clone();
        let group = self.n_head / self.n_head_kv;
        // The register kernel where it takes the shape and Q is aligned for vector loads.
        let vector = self.vector_kernel().filter(|_| q0 % 8 == 0);
        let min_chunk = match (vector, self.min_chunk) {
            (None, _) => 0,
            (Some(_), 0) => VEC_MIN_CHUNK,
            (Some(_), n) => n,
        };
        let (splits, chunk) = self.splits(min_chunk);
        let shared = match vector {
            // Each warp's merged state (max, sum and the head's outputs for every query head of
            // the group), then a piece of the block table.
            Some(_) => {
                let warps = THREADS as usize / 32;
                (2 * warps * group + warps * group * hd) * 4 + VEC_PIECE * 4
            }
            None => (group * hd + group * TILE + 3 * group) * 4 + TILE * 4,
        };
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
                let name = match vector {
                    None => $kernel,
                    Some(Variant::L8G4) => concat!($kernel, "_vec_l8_g4"),
                    Some(Variant::L8G8) => concat!($kernel, "_vec_l8_g8"),
                    Some(Variant::L16G4) => concat!($kernel, "_vec_l16_g4"),
                    Some(Variant::L16G8) => concat!($kernel, "_vec_l16_g8"),
                };
                let func = dev.get_or_load_custom_func(name, "hearth_decode_attention", ptx)?;
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
                // `rows * n_head * splits` partial sums (several), and the register kernel the
                // `rows * n_head_kv` tickets after them, then `out`.
                unsafe { b.launch(cfg) }.w()?;
                if splits > 1 && vector.is_none() {
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

/// The kernels' PTX, compiled once per process.
#[cfg(feature = "cuda")]
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    hearth_gpu::kernels::compile(&PTX, "decode attention", source::SOURCE)
}
