//! The SDXL UNet: diffusers' down, mid and up blocks ([`crate::blocks`]) with SDXL's added
//! conditioning: `emb = time_embedding(t) + add_embedding(concat(text_embeds, time_proj(time_ids)))`,
//! where `time_ids` are (original height, width, crop top, left, target height, width), each
//! sinusoidally embedded to `addition_time_embed_dim` values. Tensor names are diffusers'.

use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::embeddings::{TimestepEmbedding, Timesteps};

use crate::blocks::{Downsample, Resnet, SpatialTransformer, Upsample};
use crate::config::UNetConfig;
use crate::error::{Error, Result};
use crate::layers::GroupNorm;
use crate::lora::{AdaptedConv, Slot, Table, UNetNames};

/// A down block: resnets (each followed by a transformer in a cross-attention block), then a
/// downsampler except in the last; every output is kept for the up path.
#[derive(Debug)]
struct DownBlock {
    resnets: Vec<Resnet>,
    attentions: Vec<SpatialTransformer>,
    down: Option<Downsample>,
}

impl DownBlock {
    fn forward(
        &self,
        x: &Tensor,
        temb: &Tensor,
        ctx: &Tensor,
        skips: &mut Vec<Tensor>,
    ) -> Result<Tensor> {
        let mut x = x.clone();
        for (i, r) in self.resnets.iter().enumerate() {
            x = r.forward(&x, Some(temb))?;
            if let Some(a) = self.attentions.get(i) {
                x = a.forward(&x, ctx)?;
            }
            skips.push(x.clone());
        }
        if let Some(d) = &self.down {
            x = d.forward(&x)?;
            skips.push(x.clone());
        }
        Ok(x)
    }

    fn visit_slots(&mut self, f: &mut dyn FnMut(&mut Slot)) {
        visit_block(&mut self.resnets, &mut self.attentions, f);
        if let Some(d) = &mut self.down {
            f(d.slot());
        }
    }
}

/// A block's resnets and transformers, in diffusers' module order.
fn visit_block(
    resnets: &mut [Resnet],
    attentions: &mut [SpatialTransformer],
    f: &mut dyn FnMut(&mut Slot),
) {
    for r in resnets {
        r.visit_slots(f);
    }
    for a in attentions {
        a.visit_slots(f);
    }
}

/// An up block: each resnet takes the running state joined with the latest skip, then (in a
/// cross-attention block) a transformer; an upsampler except in the last.
#[derive(Debug)]
struct UpBlock {
    resnets: Vec<Resnet>,
    attentions: Vec<SpatialTransformer>,
    up: Option<Upsample>,
}

/// The middle: a resnet, then a transformer and a resnet per layer.
#[derive(Debug)]
struct MidBlock {
    first: Resnet,
    rest: Vec<(SpatialTransformer, Resnet)>,
}

/// The SDXL `UNet2DConditionModel`.
#[derive(Debug)]
pub struct SdxlUNet {
    conv_in: AdaptedConv,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    add_time_proj: Timesteps,
    add_embedding: TimestepEmbedding,
    down: Vec<DownBlock>,
    mid: MidBlock,
    up: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    conv_out: AdaptedConv,
    add_time_dim: usize,
    /// Its adapter-capable layers, and the LoRA updates in effect on them.
    pub(crate) adapters: Table,
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
            c.num_attention_heads
                .as_ref()
                .unwrap_or(&c.attention_head_dim)
                .get(i)
                .ok_or_else(|| bad("attention heads list too short"))
        };
        let depth_of = |i: usize| -> Result<usize> {
            c.transformer_layers_per_block
                .get(i)
                .ok_or_else(|| bad("transformer_layers_per_block list too short"))
        };
        let (groups, eps, ctx) = (c.norm_num_groups, c.norm_eps, c.cross_attention_dim);
        let ch0 = c.block_out_channels[0];
        let temb = ch0 * 4;
        let resnet = |vb: VarBuilder, c_in, c_out, scale| {
            Resnet::new(vb, c_in, c_out, Some(temb), groups, eps, scale)
        };
        // The transformers of block `i` (heads and depth from that index), when `kind` says so.
        let transformers =
            |vb: VarBuilder, kind: &str, i: usize, channels: usize, count: usize| match kind {
                "DownBlock2D" | "UpBlock2D" => Ok(Vec::new()),
                "CrossAttnDownBlock2D" | "CrossAttnUpBlock2D" => {
                    let heads = heads_of(i)?;
                    check_heads(channels, heads)?;
                    let depth = depth_of(i)?;
                    let vb = vb.pp("attentions");
                    (0..count)
                        .map(|j| {
                            SpatialTransformer::new(vb.pp(j), channels, heads, depth, ctx, groups)
                                .map_err(Error::from)
                        })
                        .collect()
                }
                other => Err(bad(format!("block type {other} is not supported"))),
            };

        let mut down = Vec::with_capacity(n);
        for i in 0..n {
            let out = c.block_out_channels[i];
            let inp = if i == 0 {
                ch0
            } else {
                c.block_out_channels[i - 1]
            };
            let vbi = vb.pp(format!("down_blocks.{i}"));
            let resnets = (0..c.layers_per_block)
                .map(|j| {
                    let c_in = if j == 0 { inp } else { out };
                    resnet(vbi.pp("resnets").pp(j), c_in, out, 1.0)
                })
                .collect::<candle_core::Result<_>>()?;
            let attentions = transformers(
                vbi.clone(),
                &c.down_block_types[i],
                i,
                out,
                c.layers_per_block,
            )?;
            let down_sampler = (i + 1 < n)
                .then(|| Downsample::new(vbi.pp("downsamplers.0"), out, c.downsample_padding))
                .transpose()?;
            down.push(DownBlock {
                resnets,
                attentions,
                down: down_sampler,
            });
        }

        let last = c.block_out_channels[n - 1];
        let vbm = vb.pp("mid_block");
        let mid_heads = heads_of(n - 1)?;
        check_heads(last, mid_heads)?;
        let scale = c.mid_block_scale_factor;
        let mid = MidBlock {
            first: resnet(vbm.pp("resnets.0"), last, last, scale)?,
            rest: vec![(
                SpatialTransformer::new(
                    vbm.pp("attentions.0"),
                    last,
                    mid_heads,
                    depth_of(n - 1)?,
                    ctx,
                    groups,
                )?,
                resnet(vbm.pp("resnets.1"), last, last, scale)?,
            )],
        };

        let mut up = Vec::with_capacity(n);
        for i in 0..n {
            let rev = n - 1 - i;
            let out = c.block_out_channels[rev];
            let prev = if i == 0 {
                last
            } else {
                c.block_out_channels[rev + 1]
            };
            let skip_in = c.block_out_channels[rev.saturating_sub(1)];
            let layers = c.layers_per_block + 1;
            let vbi = vb.pp(format!("up_blocks.{i}"));
            let resnets = (0..layers)
                .map(|j| {
                    let skip = if j + 1 == layers { skip_in } else { out };
                    let c_in = if j == 0 { prev } else { out };
                    resnet(vbi.pp("resnets").pp(j), c_in + skip, out, 1.0)
                })
                .collect::<candle_core::Result<_>>()?;
            let attentions = transformers(vbi.clone(), &c.up_block_types[i], rev, out, layers)?;
            let up_sampler = (i + 1 < n)
                .then(|| Upsample::new(vbi.pp("upsamplers.0"), out))
                .transpose()?;
            up.push(UpBlock {
                resnets,
                attentions,
                up: up_sampler,
            });
        }
        let mut unet = SdxlUNet {
            conv_in: AdaptedConv::new(vb.pp("conv_in"), c.in_channels, ch0, 3, 1, 1)?,
            time_proj: Timesteps::new(ch0, c.flip_sin_to_cos, c.freq_shift),
            time_embedding: TimestepEmbedding::new(vb.pp("time_embedding"), ch0, temb)?,
            add_time_proj: Timesteps::new(add_time_dim, c.flip_sin_to_cos, c.freq_shift),
            add_embedding: TimestepEmbedding::new(vb.pp("add_embedding"), add_in, temb)?,
            down,
            mid,
            up,
            conv_norm_out: GroupNorm::new(vb.pp("conv_norm_out"), groups, ch0, eps)?,
            conv_out: AdaptedConv::new(vb.pp("conv_out"), ch0, c.out_channels, 3, 1, 1)?,
            add_time_dim,
            adapters: Table::default(),
        };
        let names = UNetNames::new(c);
        let table = Table::build("unet", &|path| names.names(path), |f| unet.visit_slots(f));
        unet.adapters = table;
        Ok(unet)
    }

    /// Hands each adapter-capable layer's slot to `f`.
    fn visit_slots(&mut self, f: &mut dyn FnMut(&mut Slot)) {
        f(&mut self.conv_in.slot);
        for b in &mut self.down {
            b.visit_slots(f);
        }
        self.mid.first.visit_slots(f);
        for (a, r) in &mut self.mid.rest {
            a.visit_slots(f);
            r.visit_slots(f);
        }
        for b in &mut self.up {
            visit_block(&mut b.resnets, &mut b.attentions, f);
            if let Some(u) = &mut b.up {
                f(u.slot());
            }
        }
        f(&mut self.conv_out.slot);
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
        // Every resnet projects the SiLU of the embedding: taken once here.
        let temb = (emb + self.add_embedding.forward(&add)?)?.silu()?;

        // 2. down
        let n = self.down.len();
        let factor = 1usize << (n - 1);
        let odd_size = !h.is_multiple_of(factor) || !w.is_multiple_of(factor);
        let mut xs = self.conv_in.forward(xs)?;
        let mut skips = vec![xs.clone()];
        for block in &self.down {
            xs = block.forward(&xs, &temb, context, &mut skips)?;
        }
        // 3. mid
        xs = self.mid.first.forward(&xs, Some(&temb))?;
        for (attn, resnet) in &self.mid.rest {
            xs = resnet.forward(&attn.forward(&xs, context)?, Some(&temb))?;
        }
        // 4. up
        for block in &self.up {
            for (j, resnet) in block.resnets.iter().enumerate() {
                let skip = skips
                    .pop()
                    .ok_or_else(|| bad("skip connections exhausted"))?;
                xs = resnet.forward(&Tensor::cat(&[&xs, &skip], 1)?, Some(&temb))?;
                if let Some(a) = block.attentions.get(j) {
                    xs = a.forward(&xs, context)?;
                }
            }
            if let Some(u) = &block.up {
                // An odd latent size: upsample to the next skip's size rather than double.
                let size = match skips.last() {
                    Some(s) if odd_size => {
                        let (_, _, sh, sw) = s.dims4()?;
                        Some((sh, sw))
                    }
                    _ => None,
                };
                xs = u.forward(&xs, size)?;
            }
        }
        // 5. out
        let xs = self.conv_norm_out.forward(&xs, true)?;
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
