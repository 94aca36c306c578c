//! The fused `[q; k; v]` product of one row (a decode step of one stream) on a GPU, with RoPE
//! and the KV write as its last step: what [`crate::fused::RopeKv`] does after the product, one
//! launch a layer saved. The two rows of a rotated pair are two warps of one block, which meet
//! in shared memory (the kernel is `gemv_rope`, in [`crate::gemv`]'s source, beside the product
//! it shares). The CPU keeps the general path.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

use crate::fused::RopeKv;
use crate::gemv::Gemv;
use crate::Error;

/// `x @ w.T` for `x` `[1, k]` and the dense fused `w` `[(n_head + 2 n_kv) * head_dim, k]`, then
/// `rope`'s rotation and KV write.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA launch
pub(crate) struct GemvRope<'a> {
    /// A round of loads before their uses ([`Gemv::rounds`]).
    pub rounds: bool,
    pub rope: &'a RopeKv<'a>,
}

impl GemvRope<'_> {
    /// Whether the kernel takes `x` against `w`: what [`Gemv`] takes, `w` the fused projection
    /// of `rope`'s heads, in `rope`'s dtype.
    pub(crate) fn fits(&self, x: &Tensor, w: &Tensor) -> bool {
        let r = self.rope;
        Gemv::fits(x, w)
            && x.dtype() == r.cos.dtype()
            && r.head_dim.is_multiple_of(2)
            && w.dim(0).ok() == Some((r.n_head + 2 * r.n_kv) * r.head_dim)
    }

    /// Rotated Q, `[1, n_head, head_dim]`; K and V are in the pools afterwards.
    pub(crate) fn run(&self, x: &Tensor, w: &Tensor) -> Result<Tensor, Error> {
        Ok(x.contiguous()?.apply_op2_no_bwd(w, self)?)
    }
}

impl CustomOp2 for GemvRope<'_> {
    fn name(&self) -> &'static str {
        "hearth-gemv-rope"
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
        x: &candle_core::CudaStorage,
        l_x: &Layout,
        w: &candle_core::CudaStorage,
        l_w: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
        use candle_core::cuda_backend::{CudaStorageSlice as S, WrapErr};

        let what = "one-row Q/K/V product with RoPE";
        let (x0, x1, w0, w1, n, k) = crate::gemv::dense_spans(l_x, l_w, what)?;
        let (nh, nkv, hd) = (self.rope.n_head, self.rope.n_kv, self.rope.head_dim);
        if n != (nh + 2 * nkv) * hd || !hd.is_multiple_of(2) {
            candle_core::bail!("{what}: the matrix is not the heads' fused [q; k; v]")
        }
        let (ptrs, args) = self.rope.launch_args(1)?;
        let dev = x.device.clone();
        let (k32, rounds) = (k as u32, u32::from(self.rounds));
        // Two rows (one rotated pair) a warp pair: the plain product's grid for `n` rows.
        let cfg = crate::gemv::config(n);
        macro_rules! launch {
            ($x:expr, $w:expr, $ty:ty, $kernel:literal) => {{
                let func =
                    dev.get_or_load_custom_func($kernel, "hearth_gemv", crate::gemv::ptx()?)?;
                // SAFETY: every element of `out` is written by the kernel.
                let mut out = unsafe { dev.alloc::<$ty>(nh * hd)? };
                let (xs, ws) = ($x.slice(x0..x1), $w.slice(w0..w1));
                let mut b = func.builder();
                b.arg(&xs);
                b.arg(&ws);
                b.arg(&mut out);
                b.arg(&k32);
                b.arg(&rounds);
                for p in &ptrs {
                    b.arg(p);
                }
                for a in &args {
                    b.arg(a);
                }
                // SAFETY: the kernel reads `k` values of x, the `n` rows of w, `hd / 2` cos and
                // sin values and one pool row (checked below the pool's rows), and writes the
                // `n_head * hd` values of out and that pool row of each pool.
                unsafe { b.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match (&x.slice, &w.slice) {
            (S::F32(x), S::F32(w)) => launch!(x, w, f32, "gemv_rope_f32"),
            (S::F16(x), S::F16(w)) => launch!(x, w, half::f16, "gemv_rope_f16"),
            (S::BF16(x), S::BF16(w)) => launch!(x, w, half::bf16, "gemv_rope_bf16"),
            _ => candle_core::bail!("{what}: x and w of one dtype"),
        };
        Ok((out, Shape::from((1, nh, hd))))
    }
}
