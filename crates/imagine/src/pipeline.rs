//! The SDXL pipeline: prompt -> both CLIP encoders -> Euler sampling with the UNet -> VAE
//! decode -> RGB bytes. Sampling starts from noise (text-to-image), from an encoded image with
//! part of the schedule (image-to-image, diffusers' `StableDiffusionXLImg2ImgPipeline`), or from
//! that with a mask that puts the image's own latents back outside it after every step
//! (inpainting, `StableDiffusionXLInpaintPipeline` with the base UNet).

mod start;

use candle_core::{DType, Device, Tensor, D};

use crate::clip::ClipTextEncoder;
use crate::config::{read_json, ClipTextConfig, SchedulerConfig, UNetConfig, VaeConfig};
use crate::edit::{self, InitImage};
use crate::error::{Error, Result};
use crate::euler::EulerDiscrete;
use crate::files::ModelFiles;
use crate::tokenizer::ClipTokenizer;
use crate::unet::SdxlUNet;
use crate::vae::{VaeDecoder, VaeEncoder};
use crate::weights::{mmap_var_builder, random_var_builder};
pub use start::Noise;

/// One validated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageParams {
    pub prompt: String,
    /// Empty for none. Non-empty turns on classifier-free guidance with `guidance_scale`.
    pub negative_prompt: String,
    pub seed: u64,
    pub steps: usize,
    pub width: usize,
    pub height: usize,
    /// Used only when `negative_prompt` is non-empty.
    pub guidance_scale: f64,
    /// An edit's starting image (at `width` x `height`), strength and mask; `None` draws from
    /// noise alone.
    pub init: Option<InitImage>,
    /// LoRAs in effect for this generation, in order (at most [`crate::lora::MAX_ACTIVE_LORAS`]).
    pub loras: Vec<crate::lora::ActiveLora>,
}

impl ImageParams {
    /// Whether classifier-free guidance runs (two UNet passes per step).
    pub fn uses_guidance(&self) -> bool {
        !self.negative_prompt.is_empty() && self.guidance_scale > 1.0
    }

    /// The index in the `steps`-step schedule where sampling starts: 0 from noise; for an edit
    /// `steps - min(floor(steps x strength), steps)`, as diffusers' `get_timesteps`. An edit whose
    /// strength leaves no step to run is an error naming `strength`.
    pub fn first_step(&self) -> Result<usize> {
        match &self.init {
            None => Ok(0),
            Some(init) => Ok(self.steps - edit::steps_to_run(self.steps, init.strength)?),
        }
    }

    /// The denoising steps that run: `steps`, or an edit's share of them.
    pub fn steps_to_run(&self) -> usize {
        self.steps - self.first_step().unwrap_or(0)
    }
}

/// Prompt conditioning for the UNet.
#[derive(Debug, Clone)]
pub struct PromptEmbeds {
    /// `(batch, seq, hidden_1 + hidden_2)`: both penultimate hidden states, concatenated.
    pub context: Tensor,
    /// `(batch, projection_dim)`: the second encoder's projected pooled output.
    pub pooled: Tensor,
}

/// An 8-bit RGB image, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub width: usize,
    pub height: usize,
    pub rgb: Vec<u8>,
}

impl Image {
    /// Encodes the image as PNG (deterministic for the same pixels).
    pub fn to_png(&self) -> Result<Vec<u8>> {
        let buf =
            image::RgbImage::from_raw(self.width as u32, self.height as u32, self.rgb.clone())
                .ok_or_else(|| Error::Png("pixel buffer does not match the size".into()))?;
        let mut out = std::io::Cursor::new(Vec::new());
        buf.write_to(&mut out, image::ImageFormat::Png)
            .map_err(|e| Error::Png(e.to_string()))?;
        Ok(out.into_inner())
    }
}

/// A loaded SDXL model. Immutable once loaded: one instance serves requests one at a time from
/// its worker, all per-request state (latents, schedule) lives in `generate`.
pub struct SdxlPipeline {
    tokenizer: ClipTokenizer,
    tokenizer_2: ClipTokenizer,
    text_encoder: ClipTextEncoder,
    text_encoder_2: ClipTextEncoder,
    unet: SdxlUNet,
    vae: VaeDecoder,
    /// `None` when the VAE's file has no encoder: text-to-image only.
    vae_encoder: Option<VaeEncoder>,
    vae_scale: f64,
    latent_channels: usize,
    /// An inpainting UNet: its input is the latents, the mask and the masked picture's latents.
    inpainting_unet: bool,
    scheduler: SchedulerConfig,
    device: Device,
    dtype: DType,
    vae_dtype: DType,
}

impl std::fmt::Debug for SdxlPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdxlPipeline")
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .field("vae_scale", &self.vae_scale)
            .finish_non_exhaustive()
    }
}

impl SdxlPipeline {
    /// Loads every component. `dtype` is the UNet/text-encoder dtype (f32 on CPU; f16 or bf16
    /// on CUDA); the VAE runs in f32 unless its config says it is fp16-safe
    /// (`force_upcast: false`, as in madebyollin/sdxl-vae-fp16-fix).
    pub fn load(files: &ModelFiles, device: &Device, dtype: DType) -> Result<Self> {
        Self::build(files, device, dtype, &|path, dtype| {
            mmap_var_builder(path, dtype, device)
        })
    }

    /// The model `files`' configs and tokenizers describe, with random weights made on the
    /// device instead of read from its weight files (which need not exist): for benchmarks of
    /// full-size shapes (`tiny::write_full_sdxl_configs`).
    pub fn random(files: &ModelFiles, device: &Device, dtype: DType) -> Result<Self> {
        Self::build(files, device, dtype, &|_, dtype| {
            Ok(random_var_builder(dtype, device))
        })
    }

    fn build(
        files: &ModelFiles,
        device: &Device,
        dtype: DType,
        weights: &dyn Fn(&std::path::Path, DType) -> Result<candle_nn::VarBuilder<'static>>,
    ) -> Result<Self> {
        let te1: ClipTextConfig = read_json(&files.text_encoder_config)?;
        let te2: ClipTextConfig = read_json(&files.text_encoder_2_config)?;
        let unet_cfg: UNetConfig = read_json(&files.unet_config)?;
        let vae_cfg: VaeConfig = read_json(&files.vae_config)?;
        let scheduler = match &files.scheduler_config {
            Some(p) => read_json(p)?,
            None => SchedulerConfig::default(),
        };
        let context_dim = te1.hidden_size + te2.hidden_size;
        if unet_cfg.cross_attention_dim != context_dim {
            return Err(Error::config(
                &files.unet_config,
                format!(
                    "cross_attention_dim {} != text encoder widths {} + {}",
                    unet_cfg.cross_attention_dim, te1.hidden_size, te2.hidden_size
                ),
            ));
        }
        let tokenizer = ClipTokenizer::from_dir(&files.tokenizer, te1.max_position_embeddings)?;
        let tokenizer_2 = ClipTokenizer::from_dir(&files.tokenizer_2, te2.max_position_embeddings)?;
        let text_encoder = ClipTextEncoder::new(weights(&files.text_encoder, dtype)?, &te1, false)?;
        let text_encoder_2 =
            ClipTextEncoder::new(weights(&files.text_encoder_2, dtype)?, &te2, true)?;
        let latent = vae_cfg.latent_channels;
        let inpainting_unet = unet_cfg.in_channels == 2 * latent + 1;
        if unet_cfg.in_channels != latent && !inpainting_unet {
            return Err(Error::config(
                &files.unet_config,
                format!(
                    "in_channels {} fits neither the VAE's {latent} latent channels nor an \
                     inpainting UNet's {}",
                    unet_cfg.in_channels,
                    2 * latent + 1
                ),
            ));
        }
        let unet = SdxlUNet::new(weights(&files.unet, dtype)?, &unet_cfg)?;
        let vae_dtype = if dtype == DType::F32 || vae_cfg.force_upcast == Some(false) {
            dtype
        } else {
            DType::F32
        };
        let vae_weights = weights(&files.vae, vae_dtype)?;
        let vae = VaeDecoder::new(vae_weights.clone(), &vae_cfg)?;
        let vae_encoder = vae_weights
            .contains_tensor("encoder.conv_in.weight")
            .then(|| VaeEncoder::new(vae_weights, &vae_cfg))
            .transpose()?;
        Ok(SdxlPipeline {
            tokenizer,
            tokenizer_2,
            text_encoder,
            text_encoder_2,
            unet,
            vae,
            vae_encoder,
            vae_scale: vae_cfg.scaling_factor,
            latent_channels: latent,
            inpainting_unet,
            scheduler,
            device: device.clone(),
            dtype,
            vae_dtype,
        })
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The LoRA tables of the text encoders and the UNet, in that order.
    pub(crate) fn lora_tables(&self) -> [&crate::lora::Table; 3] {
        let (t1, t2) = (&self.text_encoder.adapters, &self.text_encoder_2.adapters);
        [t1, t2, &self.unet.adapters]
    }

    /// The VAE scaling factor read from `vae/config.json`.
    pub fn vae_scaling_factor(&self) -> f64 {
        self.vae_scale
    }

    /// Token ids of `text` for both tokenizers.
    pub fn tokenize(&self, text: &str) -> (Vec<u32>, Vec<u32>) {
        (self.tokenizer.encode(text), self.tokenizer_2.encode(text))
    }

    /// Encodes one prompt: penultimate hidden states of both encoders concatenated, and the
    /// second encoder's projected pooled output.
    pub fn encode_prompt(&self, text: &str) -> Result<PromptEmbeds> {
        let (ids1, ids2) = self.tokenize(text);
        let t1 = Tensor::new(ids1.as_slice(), &self.device)?.unsqueeze(0)?;
        let t2 = Tensor::new(ids2.as_slice(), &self.device)?.unsqueeze(0)?;
        let o1 = self.text_encoder.forward(&t1)?;
        let o2 = self.text_encoder_2.forward(&t2)?;
        let context = Tensor::cat(&[&o1.penultimate, &o2.penultimate], D::Minus1)?;
        let pooled = o2
            .pooled
            .ok_or_else(|| Error::config("text_encoder_2", "no text projection"))?;
        Ok(PromptEmbeds { context, pooled })
    }

    /// The text encoders' raw outputs for one prompt (for parity checks):
    /// (encoder 1 penultimate, encoder 2 penultimate, encoder 2 projected pooled).
    pub fn encode_prompt_parts(&self, text: &str) -> Result<(Tensor, Tensor, Tensor)> {
        let (ids1, ids2) = self.tokenize(text);
        let t1 = Tensor::new(ids1.as_slice(), &self.device)?.unsqueeze(0)?;
        let t2 = Tensor::new(ids2.as_slice(), &self.device)?.unsqueeze(0)?;
        let o1 = self.text_encoder.forward(&t1)?;
        let o2 = self.text_encoder_2.forward(&t2)?;
        let pooled = o2
            .pooled
            .ok_or_else(|| Error::config("text_encoder_2", "no text projection"))?;
        Ok((o1.penultimate, o2.penultimate, pooled))
    }

    /// SDXL's added time ids: original size, crop top-left (0, 0), target size.
    pub fn time_ids(&self, width: usize, height: usize, batch: usize) -> Result<Tensor> {
        let (w, h) = (width as f32, height as f32);
        let row = [h, w, 0.0, 0.0, h, w];
        let data: Vec<f32> = (0..batch).flat_map(|_| row).collect();
        Ok(Tensor::from_vec(data, (batch, 6), &self.device)?)
    }

    /// One UNet evaluation (noise prediction) in the model dtype, returned as f32.
    pub fn unet_forward(
        &self,
        latents: &Tensor,
        timestep: f64,
        embeds: &PromptEmbeds,
        time_ids: &Tensor,
    ) -> Result<Tensor> {
        let out = self.unet.forward(
            &latents.to_dtype(self.dtype)?,
            timestep,
            &embeds.context.to_dtype(self.dtype)?,
            &embeds.pooled,
            time_ids,
        )?;
        Ok(out.to_dtype(DType::F32)?)
    }

    /// Decodes latents `(1, 4, h/8, w/8)` to an f32 image tensor `(1, 3, h, w)` in [-1, 1]
    /// (not clamped): `vae.decode(latents / scaling_factor)`.
    pub fn decode(&self, latents: &Tensor) -> Result<Tensor> {
        let scaled = (latents / self.vae_scale)?.to_dtype(self.vae_dtype)?;
        Ok(self.vae.decode(&scaled)?.to_dtype(DType::F32)?)
    }

    /// Runs the sampler from the given unit-variance `noise` and returns the final latents
    /// (f32). `should_stop` is polled before every step; returning true aborts with
    /// [`Error::Cancelled`].
    pub fn sample(
        &self,
        params: &ImageParams,
        noise: &Noise,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<Tensor> {
        let run = params.steps_to_run();
        self.sample_observed(params, noise, &mut |done, _| done < run && should_stop())
    }

    /// [`Self::sample`], calling `observe` with the steps done (of
    /// [`ImageParams::steps_to_run`]) and the latents before every step and once after the
    /// last; its true aborts with [`Error::Cancelled`].
    pub fn sample_observed(
        &self,
        params: &ImageParams,
        noise: &Noise,
        observe: &mut dyn FnMut(usize, &Tensor) -> bool,
    ) -> Result<Tensor> {
        let _loras = self.apply_loras(&params.loras)?; // text encoders and UNet, until return
        check_size(params.width, params.height)?;
        let schedule = EulerDiscrete::new(&self.scheduler, params.steps)?;
        let first = params.first_step()?;
        let start::Start {
            mut latents,
            keep,
            extra,
        } = self.start(params, noise, &schedule, first)?;
        let cfg = params.uses_guidance();
        let embeds = {
            let pos = self.encode_prompt(&params.prompt)?;
            if cfg {
                let neg = self.encode_prompt(&params.negative_prompt)?;
                PromptEmbeds {
                    context: Tensor::cat(&[&neg.context, &pos.context], 0)?,
                    pooled: Tensor::cat(&[&neg.pooled, &pos.pooled], 0)?,
                }
            } else {
                pos
            }
        };
        let batch = if cfg { 2 } else { 1 };
        let time_ids = self.time_ids(params.width, params.height, batch)?;
        for (done, i) in (first..params.steps).enumerate() {
            if observe(done, &latents) {
                return Err(Error::Cancelled);
            }
            let t = schedule.timesteps()[i];
            let input = if cfg {
                Tensor::cat(&[&latents, &latents], 0)?
            } else {
                latents.clone()
            };
            let input = schedule.scale_model_input(&input, i)?;
            let input = match &extra {
                // An inpainting UNet reads the mask and the masked picture beside the latents.
                Some(extra) if cfg => Tensor::cat(&[&input, &Tensor::cat(&[extra, extra], 0)?], 1)?,
                Some(extra) => Tensor::cat(&[&input, extra], 1)?,
                None => input,
            };
            let pred = self.unet_forward(&input, t, &embeds, &time_ids)?;
            let pred = if cfg {
                let uncond = pred.get(0)?.unsqueeze(0)?;
                let text = pred.get(1)?.unsqueeze(0)?;
                (&uncond + ((text - &uncond)? * params.guidance_scale)?)?
            } else {
                pred
            };
            latents = schedule.step(&pred, i, &latents)?;
            if let Some(keep) = &keep {
                latents = keep.blend(&latents, &schedule, i + 1)?;
            }
            tracing::debug!(step = i + 1, steps = params.steps, "denoising step done");
        }
        if observe(params.steps - first, &latents) {
            return Err(Error::Cancelled);
        }
        Ok(latents)
    }

    /// The whole pipeline: seeded noise, sampling, decoding, conversion to 8-bit RGB.
    /// `should_stop` is polled before every step and once after the last.
    pub fn generate(&self, params: &ImageParams, should_stop: &dyn Fn() -> bool) -> Result<Image> {
        self.generate_observed(params, &mut |_, _| should_stop())
    }

    /// [`Self::generate`], calling `observe` as [`Self::sample_observed`] does.
    pub fn generate_observed(
        &self,
        params: &ImageParams,
        observe: &mut dyn FnMut(usize, &Tensor) -> bool,
    ) -> Result<Image> {
        check_size(params.width, params.height)?;
        let noise = self.noise(params)?;
        let latents = self.sample_observed(params, &noise, observe)?;
        to_rgb8(&self.decode(&latents)?)
    }

    /// A small PNG (an eighth of the image's size) of what `latents` will decode to, from a
    /// linear map of the four latent channels to RGB instead of the VAE: cheap enough for
    /// every step.
    pub fn preview_png(&self, latents: &Tensor) -> Result<Vec<u8>> {
        // SDXL's latent-to-RGB approximation (a least-squares fit, as previewers use).
        const FACTORS: [[f32; 3]; 4] = [
            [0.3651, 0.4232, 0.4341],
            [-0.2533, -0.0042, 0.1068],
            [0.1076, 0.1111, -0.0362],
            [-0.3165, -0.2492, -0.2188],
        ];
        const BIAS: [f32; 3] = [0.1084, -0.0175, -0.0011];
        let (_, c, h, w) = latents.dims4()?;
        if c != 4 {
            return Err(Error::InvalidParams {
                field: "latents",
                message: format!("{c} channels, expected 4"),
            });
        }
        let values = latents
            .get(0)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let plane = h * w;
        let mut rgb = Vec::with_capacity(plane * 3);
        for p in 0..plane {
            for (k, bias) in BIAS.iter().enumerate() {
                let x: f32 = (0..4)
                    .map(|ch| values[ch * plane + p] * FACTORS[ch][k])
                    .sum();
                rgb.push((((x + bias + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0).round() as u8);
            }
        }
        Image {
            width: w,
            height: h,
            rgb,
        }
        .to_png()
    }
}

fn check_size(width: usize, height: usize) -> Result<()> {
    for (field, v) in [("width", width), ("height", height)] {
        if v == 0 || !v.is_multiple_of(8) {
            return Err(Error::InvalidParams {
                field,
                message: "must be a positive multiple of 8".into(),
            });
        }
    }
    Ok(())
}

/// `(1, 3, h, w)` in [-1, 1] -> 8-bit RGB, as diffusers' postprocessing does:
/// `round(clamp(x / 2 + 0.5, 0, 1) * 255)`.
pub fn to_rgb8(image: &Tensor) -> Result<Image> {
    let (_, c, h, w) = image.dims4()?;
    if c != 3 {
        return Err(Error::config(
            "vae",
            format!("decoder gave {c} channels, not 3"),
        ));
    }
    let x = ((image.get(0)? / 2.0)? + 0.5)?
        .clamp(0f32, 1f32)?
        .affine(255.0, 0.0)?
        .round()?
        .permute((1, 2, 0))?
        .flatten_all()?
        .to_device(&Device::Cpu)?
        .to_vec1::<f32>()?;
    Ok(Image {
        width: w,
        height: h,
        rgb: x.into_iter().map(|v| v as u8).collect(),
    })
}
