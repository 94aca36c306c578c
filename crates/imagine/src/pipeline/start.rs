//! Where sampling starts: the seeded draws of a generation, and the latents of step `first`
//! with what inpainting needs along the way.
//!
//! - Text-to-image: noise times the schedule's first sigma.
//! - Image-to-image (diffusers' `StableDiffusionXLImg2ImgPipeline`): the picture's latents (a
//!   sample of the VAE encoder's distribution, times the scaling factor) noised to the level of
//!   the first step that runs.
//! - Inpainting with the base UNet (`StableDiffusionXLInpaintPipeline`, 4 channels): the same
//!   start (pure noise at strength 1), and after every step the latents outside the mask are put
//!   back to the picture's own, noised to the next step's level ([`Keep`]).
//! - Inpainting with an inpainting UNet (9 channels): the UNet reads the mask and the latents of
//!   the picture with the masked part blanked beside the latents, every step; nothing is put
//!   back.

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{ImageParams, SdxlPipeline};
use crate::edit;
use crate::error::{Error, Result};
use crate::euler::EulerDiscrete;
use crate::vae::LatentDist;

/// The random draws of one generation, each unit normal `(1, 4, height/8, width/8)`: the
/// diffusion noise; for an edit, the sample of the picture's latent distribution; for an
/// inpainting UNet, the sample of the masked picture's.
#[derive(Debug, Clone)]
pub struct Noise {
    pub latents: Tensor,
    pub posterior: Option<Tensor>,
    pub masked_posterior: Option<Tensor>,
}

impl From<&Tensor> for Noise {
    fn from(latents: &Tensor) -> Self {
        Noise {
            latents: latents.clone(),
            posterior: None,
            masked_posterior: None,
        }
    }
}

/// The generator streams of a seed: each draw its own, so that adding one changes no other.
const DIFFUSION: u64 = 0;
const POSTERIOR: u64 = 1;
const MASKED_POSTERIOR: u64 = 2;

/// Inpainting's state with the base UNet: after every step the latents outside the mask are
/// replaced by the picture's latents noised to the next step's level (after the last: as they
/// are).
pub(super) struct Keep {
    image_latents: Tensor,
    noise: Tensor,
    /// `(1, 1, h/8, w/8)`, 1 repaints.
    mask: Tensor,
    /// `1 - mask`.
    outside: Tensor,
}

impl Keep {
    /// The latents after step `next - 1`, with the picture put back outside the mask, as
    /// diffusers computes it: `(1 - m) * proper + m * latents`.
    pub(super) fn blend(
        &self,
        latents: &Tensor,
        schedule: &EulerDiscrete,
        next: usize,
    ) -> Result<Tensor> {
        let proper = if next < schedule.timesteps().len() {
            (&self.image_latents + (&self.noise * schedule.sigmas()[next])?)?
        } else {
            self.image_latents.clone()
        };
        Ok((self.outside.broadcast_mul(&proper)? + self.mask.broadcast_mul(latents)?)?)
    }
}

/// The latents at the first step that runs, and what each step adds.
pub(super) struct Start {
    pub latents: Tensor,
    pub keep: Option<Keep>,
    /// An inpainting UNet's extra input channels: the mask and the masked picture's latents.
    pub extra: Option<Tensor>,
}

impl SdxlPipeline {
    /// The picture's latent distribution (f32), as diffusers' `vae.encode(image).latent_dist`,
    /// before the scaling factor.
    pub fn encode_image(&self, image: &crate::Image) -> Result<LatentDist> {
        let x = edit::image_tensor(image, &self.device)?;
        self.encode_pixels(&x)
    }

    fn encode_pixels(&self, x: &Tensor) -> Result<LatentDist> {
        let encoder = self
            .vae_encoder
            .as_ref()
            .ok_or_else(|| Error::InvalidParams {
                field: "image",
                message: "this model's VAE has no encoder: it cannot edit images".into(),
            })?;
        let d = encoder.encode(&x.to_dtype(self.vae_dtype)?)?;
        Ok(LatentDist {
            mean: d.mean.to_dtype(DType::F32)?,
            std: d.std.to_dtype(DType::F32)?,
        })
    }

    /// Whether the UNet is an inpainting one (9 input channels).
    pub fn is_inpainting(&self) -> bool {
        self.inpainting_unet
    }

    /// Every random draw `params` needs, from its seed.
    pub fn noise(&self, params: &ImageParams) -> Result<Noise> {
        let (w, h) = (params.width, params.height);
        let draw = |stream, wanted: bool| {
            wanted
                .then(|| self.seeded_normal(params.seed, stream, w, h))
                .transpose()
        };
        let edit = params.init.is_some();
        Ok(Noise {
            latents: self.seeded_normal(params.seed, DIFFUSION, w, h)?,
            posterior: draw(POSTERIOR, edit)?,
            masked_posterior: draw(MASKED_POSTERIOR, edit && self.inpainting_unet)?,
        })
    }

    /// Seeded standard-normal noise for the initial latents, `(1, 4, height/8, width/8)`.
    ///
    /// Generated on the CPU with ChaCha8 and Box-Muller, so the same seed gives the same noise on
    /// every device and platform.
    pub fn initial_noise(&self, seed: u64, width: usize, height: usize) -> Result<Tensor> {
        self.seeded_normal(seed, DIFFUSION, width, height)
    }

    /// [`Self::initial_noise`] from the generator's `stream`.
    fn seeded_normal(&self, seed: u64, stream: u64, width: usize, height: usize) -> Result<Tensor> {
        let shape = (1, self.latent_channels, height / 8, width / 8);
        let n = self.latent_channels * (height / 8) * (width / 8);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        let mut v = Vec::with_capacity(n + 1);
        while v.len() < n {
            // Box-Muller on (0, 1] uniforms.
            let u1: f64 = 1.0 - rng.gen::<f64>();
            let u2: f64 = rng.gen::<f64>();
            let r = (-2.0 * u1.ln()).sqrt();
            let th = std::f64::consts::TAU * u2;
            v.push((r * th.cos()) as f32);
            v.push((r * th.sin()) as f32);
        }
        v.truncate(n);
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?.to_device(&self.device)?)
    }

    /// A sample of the distribution `pixels` encode to, times the scaling factor.
    fn image_latents(&self, pixels: &Tensor, noise: Option<&Tensor>) -> Result<Tensor> {
        let noise = noise.ok_or_else(|| Error::InvalidParams {
            field: "noise",
            message: "an edit needs its posterior's noise".into(),
        })?;
        let dist = self.encode_pixels(pixels)?;
        Ok((dist.sample(&noise.to_dtype(DType::F32)?)? * self.vae_scale)?)
    }

    /// Where sampling starts at step `first` of `schedule` (module docs).
    pub(super) fn start(
        &self,
        params: &ImageParams,
        noise: &Noise,
        schedule: &EulerDiscrete,
        first: usize,
    ) -> Result<Start> {
        let pure = noise.latents.to_dtype(DType::F32)?;
        let from_noise = || &pure * schedule.init_noise_sigma();
        let Some(init) = &params.init else {
            if self.inpainting_unet {
                return Err(Error::InvalidParams {
                    field: "image",
                    message: "this is an inpainting model: send an image and a mask".into(),
                });
            }
            return Ok(Start {
                latents: from_noise()?,
                keep: None,
                extra: None,
            });
        };
        let (w, h) = (params.width, params.height);
        if (init.image.width, init.image.height) != (w, h) {
            return Err(Error::InvalidParams {
                field: "image",
                message: format!(
                    "the image is {}x{}, the output {w}x{h}",
                    init.image.width, init.image.height
                ),
            });
        }
        if let Some(mask) = &init.mask {
            if (mask.width, mask.height) != (w, h) {
                return Err(Error::InvalidParams {
                    field: "mask",
                    message: format!(
                        "the mask is {}x{}, the output {w}x{h}",
                        mask.width, mask.height
                    ),
                });
            }
        }
        let pixels = edit::image_tensor(&init.image, &self.device)?;
        // diffusers starts a full-strength inpainting from pure noise, not the noised picture,
        // and does not encode the picture for it unless it is put back every step.
        let full_inpaint = init.mask.is_some() && init.strength == 1.0;
        let image_latents = if full_inpaint && self.inpainting_unet {
            None
        } else {
            Some(self.image_latents(&pixels, noise.posterior.as_ref())?)
        };
        let latents = match &image_latents {
            Some(z) if !full_inpaint => (z + (&pure * schedule.sigmas()[first])?)?,
            _ => from_noise()?,
        };
        let Some(mask) = &init.mask else {
            if self.inpainting_unet {
                return Err(Error::InvalidParams {
                    field: "mask",
                    message: "this is an inpainting model: send a mask with the image".into(),
                });
            }
            return Ok(Start {
                latents,
                keep: None,
                extra: None,
            });
        };
        let mask_latent = edit::mask_latent(mask, 8, &self.device)?;
        if self.inpainting_unet {
            // The picture with the part to repaint blanked (0, mid-grey), encoded.
            let kept = edit::keep_pixels(mask, &self.device)?;
            let blanked = pixels.broadcast_mul(&kept)?;
            let masked = self.image_latents(&blanked, noise.masked_posterior.as_ref())?;
            return Ok(Start {
                latents,
                keep: None,
                extra: Some(Tensor::cat(&[&mask_latent, &masked], 1)?),
            });
        }
        let image_latents = image_latents.ok_or_else(|| Error::InvalidParams {
            field: "image",
            message: "the picture was not encoded".into(),
        })?;
        Ok(Start {
            latents,
            keep: Some(Keep {
                image_latents,
                noise: pure,
                outside: mask_latent.affine(-1.0, 1.0)?,
                mask: mask_latent,
            }),
            extra: None,
        })
    }
}
