//! The UNet's and the VAE decoder's blocks, as diffusers defines them and names their weights,
//! built on [`crate::layers`] so that each leaf runs Hearth's GPU path where it has one.
//!
//! diffusers' names: `ResnetBlock2D` (`norm1`, `conv1`, `time_emb_proj`, `norm2`, `conv2`,
//! `conv_shortcut`), `Transformer2DModel` (`norm`, `proj_in`, `transformer_blocks.N`,
//! `proj_out`), `BasicTransformerBlock` (`norm1..3`, `attn1`, `attn2`, `ff.net.0.proj`,
//! `ff.net.2`), `Attention` (`to_q`, `to_k`, `to_v`, `to_out.0`; the VAE's older files say
//! `query`, `key`, `value`, `proj_attn`), `downsamplers.0.conv`, `upsamplers.0.conv`.
//!
//! The projections and convolutions a LoRA may adapt are [`crate::lora`]'s adapter-capable
//! layers; each block hands their slots to its component's table (`visit_slots`).

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{LayerNorm, Linear, VarBuilder};

use crate::layers::{attention, geglu, GroupNorm};
use crate::lora::{AdaptedConv, AdaptedLinear, Slot};

/// A residual block: two 3x3 convolutions after group norm and SiLU, the time embedding added
/// between them, a 1x1 convolution on the shortcut when the channel count changes.
#[derive(Debug)]
pub struct Resnet {
    norm1: GroupNorm,
    conv1: AdaptedConv,
    time_emb_proj: Option<AdaptedLinear>,
    norm2: GroupNorm,
    conv2: AdaptedConv,
    shortcut: Option<AdaptedConv>,
    scale: f64,
}

impl Resnet {
    /// `temb`: the time embedding's width, `None` in the VAE.
    pub fn new(
        vb: VarBuilder,
        c_in: usize,
        c_out: usize,
        temb: Option<usize>,
        groups: usize,
        eps: f64,
        scale: f64,
    ) -> Result<Self> {
        Ok(Resnet {
            norm1: GroupNorm::new(vb.pp("norm1"), groups, c_in, eps)?,
            conv1: AdaptedConv::new(vb.pp("conv1"), c_in, c_out, 3, 1, 1)?,
            time_emb_proj: temb
                .map(|t| {
                    let vb = vb.pp("time_emb_proj");
                    AdaptedLinear::new(candle_nn::linear(t, c_out, vb.clone())?, &vb)
                })
                .transpose()?,
            norm2: GroupNorm::new(vb.pp("norm2"), groups, c_out, eps)?,
            conv2: AdaptedConv::new(vb.pp("conv2"), c_out, c_out, 3, 1, 1)?,
            shortcut: (c_in != c_out)
                .then(|| AdaptedConv::new(vb.pp("conv_shortcut"), c_in, c_out, 1, 1, 0))
                .transpose()?,
            scale,
        })
    }

    /// `temb`: the SiLU of the time embedding (the caller takes it once for every block).
    pub fn forward(&self, x: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        let t = match (temb, &self.time_emb_proj) {
            (Some(t), Some(p)) => Some(p.forward(t)?),
            _ => None,
        };
        let h = self
            .conv1
            .forward_plus(&self.norm1.forward(x, true)?, t.as_ref())?;
        let h = self.conv2.forward(&self.norm2.forward(&h, true)?)?;
        let shortcut = match &self.shortcut {
            Some(c) => c.forward(x)?,
            None => x.clone(),
        };
        let out = (shortcut + h)?;
        if self.scale == 1.0 {
            Ok(out)
        } else {
            out / self.scale
        }
    }

    /// Hands each adapter-capable layer's slot to `f`.
    pub(crate) fn visit_slots(&mut self, f: &mut dyn FnMut(&mut Slot)) {
        f(&mut self.conv1.slot);
        if let Some(p) = &mut self.time_emb_proj {
            f(&mut p.slot);
        }
        f(&mut self.conv2.slot);
        if let Some(c) = &mut self.shortcut {
            f(&mut c.slot);
        }
    }
}

/// Multi-head attention with separate Q, K, V projections (no bias) and an output projection.
#[derive(Debug)]
struct Attention {
    to_q: AdaptedLinear,
    to_k: AdaptedLinear,
    to_v: AdaptedLinear,
    to_out: AdaptedLinear,
    heads: usize,
}

/// A `dim_out x dim_in` projection stored as a linear layer or as a 1x1 convolution.
fn projection(vb: VarBuilder, dim_in: usize, dim_out: usize, bias: bool) -> Result<AdaptedLinear> {
    AdaptedLinear::new(projection_weights(vb.clone(), dim_in, dim_out, bias)?, &vb)
}

fn projection_weights(vb: VarBuilder, dim_in: usize, dim_out: usize, bias: bool) -> Result<Linear> {
    let linear = if bias {
        candle_nn::linear(dim_in, dim_out, vb.clone())
    } else {
        candle_nn::linear_no_bias(dim_in, dim_out, vb.clone())
    };
    linear.or_else(|e| {
        let Ok(weight) = vb.get((dim_out, dim_in, 1, 1), "weight") else {
            return Err(e);
        };
        let bias = bias.then(|| vb.get(dim_out, "bias")).transpose()?;
        Ok(Linear::new(weight.reshape((dim_out, dim_in))?, bias))
    })
}

impl Attention {
    fn new(
        vb: VarBuilder,
        dim: usize,
        context_dim: usize,
        heads: usize,
        qkv_bias: bool,
    ) -> Result<Self> {
        let (q, k, v, out) = if vb.contains_tensor("to_q.weight") {
            ("to_q", "to_k", "to_v", "to_out.0")
        } else {
            ("query", "key", "value", "proj_attn")
        };
        Ok(Attention {
            to_q: projection(vb.pp(q), dim, dim, qkv_bias)?,
            to_k: projection(vb.pp(k), context_dim, dim, qkv_bias)?,
            to_v: projection(vb.pp(v), context_dim, dim, qkv_bias)?,
            to_out: projection(vb.pp(out), dim, dim, true)?,
            heads,
        })
    }

    /// `(b, l, dim)` to `(b * heads, l, dim / heads)`.
    fn split(&self, x: &Tensor) -> Result<Tensor> {
        let (b, l, d) = x.dims3()?;
        x.reshape((b, l, self.heads, d / self.heads))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * self.heads, l, d / self.heads))
    }

    /// `x` `(b, l, dim)` attending to `context` `(b, lc, context_dim)` (itself when `None`).
    fn forward(&self, x: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        let (b, l, d) = x.dims3()?;
        let context = context.unwrap_or(x);
        let q = self.split(&self.to_q.forward(x)?)?;
        let k = self.split(&self.to_k.forward(context)?)?;
        let v = self.split(&self.to_v.forward(context)?)?;
        let scale = 1.0 / ((d / self.heads) as f64).sqrt();
        let o = attention(&q, &k, &v, scale)?
            .reshape((b, self.heads, l, d / self.heads))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, l, d))?;
        self.to_out.forward(&o)
    }

    fn visit_slots(&mut self, f: &mut dyn FnMut(&mut Slot)) {
        for p in [
            &mut self.to_q,
            &mut self.to_k,
            &mut self.to_v,
            &mut self.to_out,
        ] {
            f(&mut p.slot);
        }
    }
}

/// Self-attention, cross-attention to the prompt, and the GEGLU feed-forward, each after a
/// layer norm and added to the residual stream.
#[derive(Debug)]
struct TransformerBlock {
    norm1: LayerNorm,
    attn1: Attention,
    norm2: LayerNorm,
    attn2: Attention,
    norm3: LayerNorm,
    ff_in: AdaptedLinear,
    ff_out: AdaptedLinear,
}

impl TransformerBlock {
    fn new(vb: VarBuilder, dim: usize, heads: usize, context_dim: usize) -> Result<Self> {
        let inner = dim * 4;
        let ff = vb.pp("ff").pp("net");
        Ok(TransformerBlock {
            norm1: candle_nn::layer_norm(dim, 1e-5, vb.pp("norm1"))?,
            attn1: Attention::new(vb.pp("attn1"), dim, dim, heads, false)?,
            norm2: candle_nn::layer_norm(dim, 1e-5, vb.pp("norm2"))?,
            attn2: Attention::new(vb.pp("attn2"), dim, context_dim, heads, false)?,
            norm3: candle_nn::layer_norm(dim, 1e-5, vb.pp("norm3"))?,
            ff_in: adapted_linear(ff.pp("0").pp("proj"), dim, inner * 2)?,
            ff_out: adapted_linear(ff.pp("2"), inner, dim)?,
        })
    }

    fn forward(&self, x: &Tensor, context: &Tensor) -> Result<Tensor> {
        let x = (self.attn1.forward(&self.norm1.forward(x)?, None)? + x)?;
        let x = (self
            .attn2
            .forward(&self.norm2.forward(&x)?, Some(context))?
            + x)?;
        let ff = self
            .ff_out
            .forward(&geglu(&self.ff_in.forward(&self.norm3.forward(&x)?)?)?)?;
        ff + x
    }

    fn visit_slots(&mut self, f: &mut dyn FnMut(&mut Slot)) {
        self.attn1.visit_slots(f);
        self.attn2.visit_slots(f);
        f(&mut self.ff_in.slot);
        f(&mut self.ff_out.slot);
    }
}

/// A linear layer with bias that takes adapters.
fn adapted_linear(vb: VarBuilder, dim_in: usize, dim_out: usize) -> Result<AdaptedLinear> {
    AdaptedLinear::new(candle_nn::linear(dim_in, dim_out, vb.clone())?, &vb)
}

/// diffusers' `Transformer2DModel`: group norm, a projection in (linear or 1x1 convolution),
/// transformer blocks over the `h * w` positions, a projection out, plus the input.
#[derive(Debug)]
pub struct SpatialTransformer {
    norm: GroupNorm,
    proj_in: AdaptedLinear,
    blocks: Vec<TransformerBlock>,
    proj_out: AdaptedLinear,
}

impl SpatialTransformer {
    pub fn new(
        vb: VarBuilder,
        channels: usize,
        heads: usize,
        depth: usize,
        context_dim: usize,
        groups: usize,
    ) -> Result<Self> {
        let tb = vb.pp("transformer_blocks");
        Ok(SpatialTransformer {
            norm: GroupNorm::new(vb.pp("norm"), groups, channels, 1e-6)?,
            proj_in: projection(vb.pp("proj_in"), channels, channels, true)?,
            blocks: (0..depth)
                .map(|i| TransformerBlock::new(tb.pp(i), channels, heads, context_dim))
                .collect::<Result<_>>()?,
            proj_out: projection(vb.pp("proj_out"), channels, channels, true)?,
        })
    }

    pub fn forward(&self, x: &Tensor, context: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        let mut t = self
            .norm
            .forward(x, false)?
            .permute((0, 2, 3, 1))?
            .reshape((b, h * w, c))?
            .apply(&self.proj_in)?;
        for block in &self.blocks {
            t = block.forward(&t, context)?;
        }
        let t = self
            .proj_out
            .forward(&t)?
            .reshape((b, h, w, c))?
            .permute((0, 3, 1, 2))?;
        t + x
    }

    /// Hands each adapter-capable layer's slot to `f`.
    pub(crate) fn visit_slots(&mut self, f: &mut dyn FnMut(&mut Slot)) {
        f(&mut self.proj_in.slot);
        for b in &mut self.blocks {
            b.visit_slots(f);
        }
        f(&mut self.proj_out.slot);
    }
}

/// The VAE's single-head self-attention over all positions, with its own group norm.
#[derive(Debug)]
pub struct AttentionBlock {
    norm: GroupNorm,
    attn: Attention,
}

impl AttentionBlock {
    pub fn new(vb: VarBuilder, channels: usize, groups: usize, eps: f64) -> Result<Self> {
        Ok(AttentionBlock {
            norm: GroupNorm::new(vb.pp("group_norm"), groups, channels, eps)?,
            attn: Attention::new(vb, channels, channels, 1, true)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        let t = self
            .norm
            .forward(x, false)?
            .reshape((b, c, h * w))?
            .transpose(1, 2)?
            .contiguous()?;
        let t = self
            .attn
            .forward(&t, None)?
            .transpose(1, 2)?
            .reshape((b, c, h, w))?;
        t + x
    }
}

/// A 3x3 convolution of stride 2 (`downsamplers.0`), diffusers' `Downsample2D` with a conv.
#[derive(Debug)]
pub struct Downsample {
    conv: AdaptedConv,
    padding: usize,
}

impl Downsample {
    pub fn new(vb: VarBuilder, channels: usize, padding: usize) -> Result<Self> {
        Ok(Downsample {
            conv: AdaptedConv::new(vb.pp("conv"), channels, channels, 3, 2, padding)?,
            padding,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.padding == 0 {
            // diffusers pads right and bottom by one when the conv itself pads nothing.
            let x = x
                .pad_with_zeros(D::Minus1, 0, 1)?
                .pad_with_zeros(D::Minus2, 0, 1)?;
            return self.conv.forward(&x);
        }
        self.conv.forward(x)
    }

    pub(crate) fn slot(&mut self) -> &mut Slot {
        &mut self.conv.slot
    }
}

/// Nearest-neighbour upsampling (by 2, or to a given size) then a 3x3 convolution.
#[derive(Debug)]
pub struct Upsample {
    conv: AdaptedConv,
}

impl Upsample {
    pub fn new(vb: VarBuilder, channels: usize) -> Result<Self> {
        Ok(Upsample {
            conv: AdaptedConv::new(vb.pp("conv"), channels, channels, 3, 1, 1)?,
        })
    }

    pub fn forward(&self, x: &Tensor, size: Option<(usize, usize)>) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        let (h, w) = size.unwrap_or((2 * h, 2 * w));
        self.conv.forward(&x.upsample_nearest2d(h, w)?)
    }

    pub(crate) fn slot(&mut self) -> &mut Slot {
        &mut self.conv.slot
    }
}
