//! The VAE's decoder (diffusers' `AutoencoderKL.decode`): `post_quant_conv`, then the decoder's
//! `conv_in`, a middle of resnet, attention, resnet, up blocks of resnets and an upsampler, and
//! group norm, SiLU and `conv_out`. Only the decoder is built: text-to-image never encodes.

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

use crate::blocks::{AttentionBlock, Resnet, Upsample};
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
