//! The VAE's decoder (diffusers' `AutoencoderKL.decode`): `post_quant_conv`, then the decoder's
//! `conv_in`, a middle of resnet, attention, resnet, up blocks of resnets and an upsampler, and
//! group norm, SiLU and `conv_out`; and its encoder (`AutoencoderKL.encode`), the mirror image
//! with downsamplers, ending in `quant_conv` and the latent distribution's mean and log-variance,
//! which image-to-image and inpainting need.

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

use crate::blocks::{AttentionBlock, Downsample, Resnet, Upsample};
use crate::config::VaeConfig;
use crate::layers::{Conv2d, GroupNorm};

#[derive(Debug)]
struct UpBlock {
    resnets: Vec<Resnet>,
    up: Option<Upsample>,
}

/// The decoder half of an `AutoencoderKL`.
#[derive(Debug)]
pub struct VaeDecoder {
    post_quant_conv: Option<Conv2d>,
    conv_in: Conv2d,
    mid: (Resnet, AttentionBlock, Resnet),
    up: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl VaeDecoder {
    /// `vb` at the VAE's root (the decoder's weights are under `decoder.`).
    pub fn new(vb: VarBuilder, c: &VaeConfig) -> Result<Self> {
        let (groups, eps) = (c.norm_num_groups, 1e-6);
        let latent = c.latent_channels;
        let Some(&top) = c.block_out_channels.last() else {
            candle_core::bail!("vae/config.json: block_out_channels is empty")
        };
        let d = vb.pp("decoder");
        let resnet =
            |vb: VarBuilder, c_in, c_out| Resnet::new(vb, c_in, c_out, None, groups, eps, 1.0);
        let m = d.pp("mid_block");
        let mid = (
            resnet(m.pp("resnets.0"), top, top)?,
            AttentionBlock::new(m.pp("attentions.0"), top, groups, eps)?,
            resnet(m.pp("resnets.1"), top, top)?,
        );
        let reversed: Vec<usize> = c.block_out_channels.iter().rev().copied().collect();
        let mut up = Vec::with_capacity(reversed.len());
        for (i, &out) in reversed.iter().enumerate() {
            let inp = if i == 0 { reversed[0] } else { reversed[i - 1] };
            let b = d.pp("up_blocks").pp(i);
            up.push(UpBlock {
                resnets: (0..c.layers_per_block + 1)
                    .map(|j| resnet(b.pp("resnets").pp(j), if j == 0 { inp } else { out }, out))
                    .collect::<Result<_>>()?,
                up: (i + 1 < reversed.len())
                    .then(|| Upsample::new(b.pp("upsamplers.0"), out))
                    .transpose()?,
            });
        }
        let bottom = c.block_out_channels[0];
        Ok(VaeDecoder {
            post_quant_conv: c
                .use_post_quant_conv
                .then(|| Conv2d::new(vb.pp("post_quant_conv"), latent, latent, 1, 1, 0))
                .transpose()?,
            conv_in: Conv2d::new(d.pp("conv_in"), latent, top, 3, 1, 1)?,
            mid,
            up,
            conv_norm_out: GroupNorm::new(d.pp("conv_norm_out"), groups, bottom, eps)?,
            conv_out: Conv2d::new(d.pp("conv_out"), bottom, c.out_channels, 3, 1, 1)?,
        })
    }

    /// Latents `(b, latent_channels, h, w)` (already divided by the scaling factor) to images
    /// `(b, out_channels, 8h, 8w)` in about [-1, 1].
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        let z = match &self.post_quant_conv {
            Some(c) => c.forward(z)?,
            None => z.clone(),
        };
        let x = self.conv_in.forward(&z)?;
        let x = self.mid.0.forward(&x, None)?;
        let x = self.mid.1.forward(&x)?;
        let mut x = self.mid.2.forward(&x, None)?;
        for block in &self.up {
            for r in &block.resnets {
                x = r.forward(&x, None)?;
            }
            if let Some(u) = &block.up {
                x = u.forward(&x, None)?;
            }
        }
        self.conv_out
            .forward(&self.conv_norm_out.forward(&x, true)?)
    }
}

#[derive(Debug)]
struct DownBlock {
    resnets: Vec<Resnet>,
    down: Option<Downsample>,
}

/// The encoder half of an `AutoencoderKL`: images to the latent distribution.
#[derive(Debug)]
pub struct VaeEncoder {
    conv_in: Conv2d,
    down: Vec<DownBlock>,
    mid: (Resnet, AttentionBlock, Resnet),
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
    quant_conv: Option<Conv2d>,
}

/// The diagonal Gaussian an image encodes to, `(b, latent_channels, h/8, w/8)` each.
#[derive(Debug, Clone)]
pub struct LatentDist {
    pub mean: Tensor,
    pub std: Tensor,
}

impl LatentDist {
    /// A sample `mean + std * noise` (diffusers' `latent_dist.sample`).
    pub fn sample(&self, noise: &Tensor) -> Result<Tensor> {
        &self.mean + (&self.std * noise)?
    }
}

impl VaeEncoder {
    /// `vb` at the VAE's root (the encoder's weights are under `encoder.`).
    pub fn new(vb: VarBuilder, c: &VaeConfig) -> Result<Self> {
        let (groups, eps) = (c.norm_num_groups, 1e-6);
        let latent = c.latent_channels;
        let Some(&top) = c.block_out_channels.last() else {
            candle_core::bail!("vae/config.json: block_out_channels is empty")
        };
        let bottom = c.block_out_channels[0];
        let e = vb.pp("encoder");
        let resnet =
            |vb: VarBuilder, c_in, c_out| Resnet::new(vb, c_in, c_out, None, groups, eps, 1.0);
        let mut down = Vec::with_capacity(c.block_out_channels.len());
        for (i, &out) in c.block_out_channels.iter().enumerate() {
            let inp = if i == 0 {
                bottom
            } else {
                c.block_out_channels[i - 1]
            };
            let b = e.pp("down_blocks").pp(i);
            down.push(DownBlock {
                resnets: (0..c.layers_per_block)
                    .map(|j| resnet(b.pp("resnets").pp(j), if j == 0 { inp } else { out }, out))
                    .collect::<Result<_>>()?,
                down: (i + 1 < c.block_out_channels.len())
                    .then(|| Downsample::new(b.pp("downsamplers.0"), out, 0))
                    .transpose()?,
            });
        }
        let m = e.pp("mid_block");
        Ok(VaeEncoder {
            conv_in: Conv2d::new(e.pp("conv_in"), c.in_channels, bottom, 3, 1, 1)?,
            down,
            mid: (
                resnet(m.pp("resnets.0"), top, top)?,
                AttentionBlock::new(m.pp("attentions.0"), top, groups, eps)?,
                resnet(m.pp("resnets.1"), top, top)?,
            ),
            conv_norm_out: GroupNorm::new(e.pp("conv_norm_out"), groups, top, eps)?,
            conv_out: Conv2d::new(e.pp("conv_out"), top, 2 * latent, 3, 1, 1)?,
            quant_conv: c
                .use_quant_conv
                .then(|| Conv2d::new(vb.pp("quant_conv"), 2 * latent, 2 * latent, 1, 1, 0))
                .transpose()?,
        })
    }

    /// Images `(b, in_channels, h, w)` in [-1, 1] to the latent distribution (not yet
    /// multiplied by the scaling factor); the log-variance is clamped to [-30, 20] as diffusers
    /// does.
    pub fn encode(&self, x: &Tensor) -> Result<LatentDist> {
        let mut x = self.conv_in.forward(x)?;
        for block in &self.down {
            for r in &block.resnets {
                x = r.forward(&x, None)?;
            }
            if let Some(d) = &block.down {
                x = d.forward(&x)?;
            }
        }
        let x = self.mid.0.forward(&x, None)?;
        let x = self.mid.1.forward(&x)?;
        let x = self.mid.2.forward(&x, None)?;
        let x = self
            .conv_out
            .forward(&self.conv_norm_out.forward(&x, true)?)?;
        let moments = match &self.quant_conv {
            Some(c) => c.forward(&x)?,
            None => x,
        };
        let half = moments.dim(1)? / 2;
        let mean = moments.narrow(1, 0, half)?;
        let logvar = moments.narrow(1, half, half)?.clamp(-30f32, 20f32)?;
        let std = (logvar * 0.5)?.exp()?;
        Ok(LatentDist { mean, std })
    }
}
