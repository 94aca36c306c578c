//! The UNet's and the VAE's leaf layers, each with one way to run on a CPU and one on a GPU.
//!
//! On a CPU (and on a GPU in f32) every layer is candle's own op, so the parity tests against
//! diffusers hold the arithmetic. On a GPU in f16/bf16 the heavy ones take Hearth's paths:
//! - [`Conv2d`]: cuDNN with tensor-op math, the algorithm found once per shape and one workspace
//!   kept per device (`cudnn.rs`, in the `cudnn` build);
//! - [`GroupNorm`]: statistics and the normalisation (with the SiLU after it, where one
//!   follows) in three kernels, where candle upcasts and runs a dozen (`cuda.rs`);
//! - [`attention`]: scores and probabilities kept in the activations' dtype (candle's fused
//!   softmax computes in f32 inside), where candle-transformers upcasts Q, K and V to f32;
//! - [`geglu`]: the feed-forward's `x * gelu(gate)` in one kernel, GELU exact as diffusers'.
//!
//! `HEARTH_IMAGE_CONV=candle`, `HEARTH_IMAGE_FUSED=off` and `HEARTH_IMAGE_ATTENTION=f32`, read by
//! the benchmarks' entry points ([`Tuning::from_vars`]), turn each back to candle's way on a GPU,
//! so that a benchmark can measure what each one brings.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cudnn")]
mod cudnn;

use std::sync::OnceLock;

use candle_core::{DType, Module, Tensor, D};
use candle_nn::{Conv2dConfig, VarBuilder};

/// Which of Hearth's GPU paths are on: all, unless an entry point (a benchmark) installs
/// another choice before any image model runs; the server always runs them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    pub cudnn: bool,
    pub fused: bool,
    pub attention_f16: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            cudnn: true,
            fused: true,
            attention_f16: true,
        }
    }
}

static TUNING: OnceLock<Tuning> = OnceLock::new();

impl Tuning {
    /// The tuning the variables named in the module's documentation ask for, read through
    /// `var` (an entry point hands in its process environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Tuning {
        let is = |key: &str, value: &str| var(key).as_deref() == Some(value);
        Tuning {
            cudnn: !is("HEARTH_IMAGE_CONV", "candle"),
            fused: !is("HEARTH_IMAGE_FUSED", "off"),
            attention_f16: !is("HEARTH_IMAGE_ATTENTION", "f32"),
        }
    }

    /// Makes this the process's tuning; `false` (and no change) once one is in use.
    pub fn install(self) -> bool {
        TUNING.set(self).is_ok()
    }

    /// The process's tuning.
    pub fn get() -> Tuning {
        *TUNING.get_or_init(Tuning::default)
    }
}

/// Whether `x` takes a GPU path: on a GPU, in a 16-bit dtype.
fn gpu_half(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.dtype(), DType::F16 | DType::BF16)
}

/// A 2D convolution with bias, as `candle_nn::Conv2d`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    inner: candle_nn::Conv2d,
}

impl Conv2d {
    pub fn new(
        vb: VarBuilder,
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> candle_core::Result<Self> {
        let cfg = Conv2dConfig {
            padding,
            stride,
            ..Default::default()
        };
        Ok(Conv2d {
            inner: candle_nn::conv2d(c_in, c_out, kernel, cfg, vb)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_plus(x, None)
    }

    /// The kernel, `(c_out, c_in, kh, kw)`.
    pub fn weight(&self) -> &Tensor {
        self.inner.weight()
    }

    /// `conv(x) + bias + extra`, `extra` `(n, c_out)` added to each sample's channels (a
    /// resnet's time embedding): on cuDNN in the convolution's own call.
    pub fn forward_plus(&self, x: &Tensor, extra: Option<&Tensor>) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cudnn")]
        if gpu_half(x) && Tuning::get().cudnn {
            let cfg = self.inner.config();
            let add = match (self.inner.bias(), extra) {
                (Some(b), Some(e)) => Some(e.broadcast_add(&b.unsqueeze(0)?)?),
                (Some(b), None) => Some(b.unsqueeze(0)?),
                (None, e) => e.cloned(),
            };
            return cudnn::conv2d(
                x,
                self.inner.weight(),
                add.as_ref(),
                cfg.stride,
                cfg.padding,
            );
        }
        let y = self.inner.forward(x)?;
        match extra {
            Some(e) => y.broadcast_add(&e.unsqueeze(2)?.unsqueeze(3)?),
            None => Ok(y),
        }
    }
}

/// Group normalisation with an affine transform, optionally followed by SiLU.
#[derive(Debug, Clone)]
pub struct GroupNorm {
    weight: Tensor,
    bias: Tensor,
    groups: usize,
    eps: f64,
}

impl GroupNorm {
    pub fn new(
        vb: VarBuilder,
        groups: usize,
        channels: usize,
        eps: f64,
    ) -> candle_core::Result<Self> {
        let weight = vb.get_with_hints(channels, "weight", candle_nn::Init::Const(1.))?;
        let bias = vb.get_with_hints(channels, "bias", candle_nn::Init::Const(0.))?;
        if groups == 0 || !channels.is_multiple_of(groups) {
            candle_core::bail!("{channels} channels do not split into {groups} groups")
        }
        Ok(GroupNorm {
            weight,
            bias,
            groups,
            eps,
        })
    }

    /// `norm(x)`, then `silu` of it when `silu`.
    pub fn forward(&self, x: &Tensor, silu: bool) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cuda")]
        if gpu_half(x) && Tuning::get().fused {
            return cuda::group_norm(x, &self.weight, &self.bias, self.groups, self.eps, silu);
        }
        let channels = self.weight.dim(0)?;
        let (w, b) = (self.weight.clone(), self.bias.clone());
        let y = candle_nn::GroupNorm::new(w, b, channels, self.groups, self.eps)?.forward(x)?;
        if silu {
            y.silu()
        } else {
            Ok(y)
        }
    }
}

/// `softmax(q kᵀ · scale) v` for `q` `(n, lq, d)`, `k` and `v` `(n, lk, d)`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    if gpu_half(q) && Tuning::get().attention_f16 {
        let scores = (q * scale)?.matmul(&k.t()?)?;
        return candle_nn::ops::softmax_last_dim(&scores)?.matmul(v);
    }
    let dtype = q.dtype();
    let (q, k, v) = (
        q.to_dtype(DType::F32)?,
        k.to_dtype(DType::F32)?,
        v.to_dtype(DType::F32)?,
    );
    let scores = q.matmul(&(k.t()? * scale)?)?;
    candle_nn::ops::softmax_last_dim(&scores)?
        .matmul(&v)?
        .to_dtype(dtype)
}

/// diffusers' GEGLU activation: `h * gelu(gate)` where `[h, gate]` halve the last dimension;
/// GELU is the exact (erf) one.
pub fn geglu(x: &Tensor) -> candle_core::Result<Tensor> {
    #[cfg(feature = "cuda")]
    if gpu_half(x) && Tuning::get().fused {
        return cuda::geglu(x);
    }
    let halves = x.chunk(2, D::Minus1)?;
    halves[0].mul(&halves[1].gelu_erf()?)
}
