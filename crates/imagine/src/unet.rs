//! The SDXL UNet: candle-transformers' down/mid/up blocks with SDXL's added conditioning.
//!
//! candle's `UNet2DConditionModel` has no `addition_embed_type = "text_time"` path, so this
//! module assembles the same blocks itself and adds SDXL's extra time embedding:
//! `emb = time_embedding(t) + add_embedding(concat(text_embeds, time_proj(time_ids)))`, where
//! `time_ids` are (original height, width, crop top, left, target height, width), each
//! sinusoidally embedded to `addition_time_embed_dim` values. Tensor names are diffusers'.
//!
//! Known difference from diffusers: candle's GEGLU feed-forward uses the tanh approximation of
//! GELU where diffusers uses the exact form (a relative difference around 1e-4 per activation),
//! which the parity tolerance accounts for.

use candle_core::{Module, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder};
use candle_transformers::models::stable_diffusion::embeddings::{TimestepEmbedding, Timesteps};
use candle_transformers::models::stable_diffusion::unet_2d_blocks::{
    CrossAttnDownBlock2D, CrossAttnDownBlock2DConfig, CrossAttnUpBlock2D, CrossAttnUpBlock2DConfig,
    DownBlock2D, DownBlock2DConfig, UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig,
    UpBlock2D, UpBlock2DConfig,
};

use crate::config::UNetConfig;
use crate::error::{Error, Result};

#[derive(Debug)]
enum Down {
    Basic(DownBlock2D),
    CrossAttn(CrossAttnDownBlock2D),
}

#[derive(Debug)]
enum Up {
    Basic(UpBlock2D),
    CrossAttn(CrossAttnUpBlock2D),
}

impl Up {
    fn resnets(&self) -> usize {
        match self {
            Up::Basic(b) => b.resnets.len(),
            Up::CrossAttn(b) => b.upblock.resnets.len(),
        }
    }
}

/// The SDXL `UNet2DConditionModel`.
#[derive(Debug)]
pub struct SdxlUNet {
    conv_in: candle_nn::Conv2d,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    add_time_proj: Timesteps,
    add_embedding: TimestepEmbedding,
    down: Vec<Down>,
    mid: UNetMidBlock2DCrossAttn,
    up: Vec<Up>,
    conv_norm_out: candle_nn::GroupNorm,
    conv_out: candle_nn::Conv2d,
    add_time_dim: usize,
}

fn bad(message: impl Into<String>) -> Error {
    Error::config("unet/config.json", message)
}

impl SdxlUNet {
    /// Builds the UNet from its config and weights.
    pub fn new(vb: VarBuilder, c: &UNetConfig) -> Result<Self> {
        let n = c.block_out_channels.len();
        if n == 0 || c.down_block_types.len() != n || c.up_block_types.len() != n {
            return Err(bad("block lists must be non-empty and of equal length"));
        }
        if c.addition_embed_type.as_deref() != Some("text_time") {
            return Err(bad("addition_embed_type must be text_time (an SDXL UNet)"));
        }
        let add_time_dim = c
            .addition_time_embed_dim
            .ok_or_else(|| bad("addition_time_embed_dim is missing"))?;
        let add_in = c
            .projection_class_embeddings_input_dim
            .ok_or_else(|| bad("projection_class_embeddings_input_dim is missing"))?;
        let heads_of = |i: usize| -> Result<usize> {
            let h = c
                .num_attention_heads
                .as_ref()
                .unwrap_or(&c.attention_head_dim);
            h.get(i)
                .ok_or_else(|| bad("attention heads list too short"))
        };
        let depth_of = |i: usize| -> Result<usize> {
            c.transformer_layers_per_block
                .get(i)
                .ok_or_else(|| bad("transformer_layers_per_block list too short"))
        };
        let ch0 = c.block_out_channels[0];
        let temb = ch0 * 4;
        let conv = Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        let conv_in = candle_nn::conv2d(c.in_channels, ch0, 3, conv, vb.pp("conv_in"))?;
        let time_proj = Timesteps::new(ch0, c.flip_sin_to_cos, c.freq_shift);
        let time_embedding = TimestepEmbedding::new(vb.pp("time_embedding"), ch0, temb)?;
        let add_time_proj = Timesteps::new(add_time_dim, c.flip_sin_to_cos, c.freq_shift);
        let add_embedding = TimestepEmbedding::new(vb.pp("add_embedding"), add_in, temb)?;

        let mut down = Vec::with_capacity(n);
        for i in 0..n {
            let out = c.block_out_channels[i];
            let inp = if i == 0 {
                ch0
            } else {
                c.block_out_channels[i - 1]
            };
            let cfg = DownBlock2DConfig {
                num_layers: c.layers_per_block,
                resnet_eps: c.norm_eps,
                resnet_groups: c.norm_num_groups,
                add_downsample: i + 1 < n,
                downsample_padding: c.downsample_padding,
                ..Default::default()
            };
            let vbi = vb.pp(format!("down_blocks.{i}"));
            down.push(match c.down_block_types[i].as_str() {
                "DownBlock2D" => Down::Basic(DownBlock2D::new(vbi, inp, out, Some(temb), cfg)?),
                "CrossAttnDownBlock2D" => {
                    let heads = heads_of(i)?;
                    check_heads(out, heads)?;
                    let xcfg = CrossAttnDownBlock2DConfig {
                        downblock: cfg,
                        attn_num_head_channels: heads,
                        cross_attention_dim: c.cross_attention_dim,
                        sliced_attention_size: None,
                        use_linear_projection: c.use_linear_projection,
                        transformer_layers_per_block: depth_of(i)?,
                    };
                    Down::CrossAttn(CrossAttnDownBlock2D::new(
                        vbi,
                        inp,
                        out,
                        Some(temb),
                        false,
                        xcfg,
                    )?)
                }
                other => return Err(bad(format!("down block type {other} is not supported"))),
            });
        }

        let last = c.block_out_channels[n - 1];
        let mid_heads = heads_of(n - 1)?;
        check_heads(last, mid_heads)?;
        let mid = UNetMidBlock2DCrossAttn::new(
            vb.pp("mid_block"),
            last,
            Some(temb),
            false,
            UNetMidBlock2DCrossAttnConfig {
                resnet_eps: c.norm_eps,
                output_scale_factor: c.mid_block_scale_factor,
                cross_attn_dim: c.cross_attention_dim,
                attn_num_head_channels: mid_heads,
                resnet_groups: Some(c.norm_num_groups),
                use_linear_projection: c.use_linear_projection,
                transformer_layers_per_block: depth_of(n - 1)?,
                ..Default::default()
            },
        )?;

        let mut up = Vec::with_capacity(n);
        for i in 0..n {
            let rev = n - 1 - i;
            let out = c.block_out_channels[rev];
            let prev = if i == 0 {
                last
            } else {
                c.block_out_channels[rev + 1]
            };
            let inp = c.block_out_channels[rev.saturating_sub(1)];
            let cfg = UpBlock2DConfig {
                num_layers: c.layers_per_block + 1,
                resnet_eps: c.norm_eps,
                resnet_groups: c.norm_num_groups,
                add_upsample: i + 1 < n,
                ..Default::default()
            };
            let vbi = vb.pp(format!("up_blocks.{i}"));
            up.push(match c.up_block_types[i].as_str() {
                "UpBlock2D" => Up::Basic(UpBlock2D::new(vbi, inp, prev, out, Some(temb), cfg)?),
                "CrossAttnUpBlock2D" => {
                    let heads = heads_of(rev)?;
                    check_heads(out, heads)?;
                    let xcfg = CrossAttnUpBlock2DConfig {
                        upblock: cfg,
                        attn_num_head_channels: heads,
                        cross_attention_dim: c.cross_attention_dim,
                        sliced_attention_size: None,
                        use_linear_projection: c.use_linear_projection,
                        transformer_layers_per_block: depth_of(rev)?,
                    };
                    Up::CrossAttn(CrossAttnUpBlock2D::new(
                        vbi,
                        inp,
                        prev,
                        out,
                        Some(temb),
                        false,
                        xcfg,
                    )?)
                }
                other => return Err(bad(format!("up block type {other} is not supported"))),
            });
        }
        let conv_norm_out =
            candle_nn::group_norm(c.norm_num_groups, ch0, c.norm_eps, vb.pp("conv_norm_out"))?;
        let conv_out = candle_nn::conv2d(ch0, c.out_channels, 3, conv, vb.pp("conv_out"))?;
        Ok(SdxlUNet {
            conv_in,
            time_proj,
            time_embedding,
            add_time_proj,
            add_embedding,
            down,
            mid,
            up,
            conv_norm_out,
            conv_out,
            add_time_dim,
        })
    }

    /// Predicts the noise in `xs` `(batch, 4, h/8, w/8)` at `timestep`, conditioned on
    /// `context` `(batch, 77, cross_attention_dim)`, `text_embeds` `(batch, proj)` and
    /// `time_ids` `(batch, 6)`.
    pub fn forward(
        &self,
        xs: &Tensor,
        timestep: f64,
        context: &Tensor,
        text_embeds: &Tensor,
        time_ids: &Tensor,
    ) -> Result<Tensor> {
        let (b, _, h, w) = xs.dims4()?;
        let dtype = xs.dtype();
        let dev = xs.device();
        // 1. time embeddings (the sinusoid in f32, then the model's dtype)
        let t = (Tensor::ones(b, candle_core::DType::F32, dev)? * timestep)?;
        let emb = self.time_proj.forward(&t)?.to_dtype(dtype)?;
        let emb = self.time_embedding.forward(&emb)?;
        let ids = time_ids.to_dtype(candle_core::DType::F32)?.flatten_all()?;
        let time_embeds = self
            .add_time_proj
            .forward(&ids)?
            .reshape((b, 6 * self.add_time_dim))?
            .to_dtype(dtype)?;
        let add = Tensor::cat(&[&text_embeds.to_dtype(dtype)?, &time_embeds], 1)?;
        let emb = (emb + self.add_embedding.forward(&add)?)?;

        // 2. down
        let n = self.down.len();
        let factor = 1usize << (n - 1);
        let odd_size = !h.is_multiple_of(factor) || !w.is_multiple_of(factor);
        let mut xs = self.conv_in.forward(xs)?;
        let mut skips = vec![xs.clone()];
        for block in &self.down {
            let (next, res) = match block {
                Down::Basic(b) => b.forward(&xs, Some(&emb))?,
                Down::CrossAttn(b) => b.forward(&xs, Some(&emb), Some(context))?,
            };
            skips.extend(res);
            xs = next;
        }
        // 3. mid
        xs = self.mid.forward(&xs, Some(&emb), Some(context))?;
        // 4. up
        for (i, block) in self.up.iter().enumerate() {
            let res = skips.split_off(skips.len() - block.resnets());
            let size = if i + 1 < n && odd_size {
                let (_, _, sh, sw) = skips
                    .last()
                    .ok_or_else(|| bad("skip connections exhausted"))?
                    .dims4()?;
                Some((sh, sw))
            } else {
                None
            };
            xs = match block {
                Up::Basic(b) => b.forward(&xs, &res, Some(&emb), size)?,
                Up::CrossAttn(b) => b.forward(&xs, &res, Some(&emb), size, Some(context))?,
            };
        }
        // 5. out
        let xs = candle_nn::ops::silu(&self.conv_norm_out.forward(&xs)?)?;
        Ok(self.conv_out.forward(&xs)?)
    }
}

fn check_heads(channels: usize, heads: usize) -> Result<()> {
    if heads == 0 || !channels.is_multiple_of(heads) {
        return Err(bad(format!(
            "{channels} channels are not divisible into {heads} attention heads"
        )));
    }
    Ok(())
}
