//! Numerical parity with diffusers + transformers (the reference SDXL implementation).
//!
//! `tests/fixtures/imagine/sdxl-parity.safetensors` was produced by `scripts/sdxl-parity.sh`:
//! it runs the tiny model that Hearth's generator writes (seed `TINY_SEED`) through torch and
//! saves each component's output. These tests write the same tiny model again, check that its
//! weight files are byte-identical to the ones the reference used, and recompute every output.
//!
//! Tolerance: max |hearth - reference| / max |reference| per tensor, f32 on CPU: 1e-5 for every
//! component (same math, different summation order; measured 3-4e-7 for the text encoders,
//! 1e-6 for the UNet step, the VAE and the 4-step latents, 6e-7 for the sigmas; 2e-6 with
//! guidance). The tests print what they measure.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use hearth_imagine::tiny::TINY_SEED;
use hearth_imagine::{
    write_tiny_sdxl, Image, ImageParams, InitImage, Mask, ModelFiles, Noise, PromptEmbeds,
    SdxlPipeline,
};
use sha2::{Digest, Sha256};

const TIGHT: f64 = 1e-5;

struct Fixture {
    t: HashMap<String, Tensor>,
    meta: serde_json::Value,
}

impl Fixture {
    fn get(&self, name: &str) -> &Tensor {
        self.t
            .get(name)
            .unwrap_or_else(|| panic!("fixture lacks {name}"))
    }
    fn meta(&self, key: &str) -> String {
        self.meta[key]
            .as_str()
            .unwrap_or_else(|| panic!("meta lacks {key}"))
            .to_string()
    }
    fn usize(&self, key: &str) -> usize {
        self.meta(key).parse().unwrap()
    }
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/imagine")
}

fn load() -> (tempfile::TempDir, SdxlPipeline, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_sdxl(dir.path(), TINY_SEED).unwrap();
    let t =
        candle_core::safetensors::load(fixture_dir().join("sdxl-parity.safetensors"), &Device::Cpu)
            .expect("parity fixture (run scripts/sdxl-parity.sh)");
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("sdxl-parity.json")).unwrap(),
    )
    .unwrap();
    let fx = Fixture { t, meta };
    let files = ModelFiles::from_dir(dir.path(), None).unwrap();
    let p = SdxlPipeline::load(&files, &Device::Cpu, DType::F32).unwrap();
    (dir, p, fx)
}

/// max |a - b| / max |b|, after checking shapes agree.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shape mismatch");
    let a = a.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let b = b.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let diff = (&a - &b)
        .unwrap()
        .abs()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    let scale = b
        .abs()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
        .max(1e-12);
    diff / scale
}

fn check(name: &str, ours: &Tensor, reference: &Tensor, tol: f64) {
    let e = rel_err(ours, reference);
    println!("{name}: relative max error {e:.3e} (tolerance {tol:.0e})");
    assert!(
        e <= tol,
        "{name}: relative max error {e:.3e} exceeds {tol:.0e}"
    );
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn generator_writes_exactly_the_weights_the_reference_ran() {
    let (dir, _p, fx) = load();
    for (key, file) in [
        ("unet_sha256", "unet/diffusion_pytorch_model.safetensors"),
        ("vae_sha256", "vae/diffusion_pytorch_model.safetensors"),
        ("te1_sha256", "text_encoder/model.safetensors"),
        ("te2_sha256", "text_encoder_2/model.safetensors"),
    ] {
        assert_eq!(
            sha256(&dir.path().join(file)),
            fx.meta(key),
            "{file} differs from the reference's"
        );
    }
}

#[test]
fn both_tokenizers_match_transformers_clip_tokenizer() {
    let (_d, p, fx) = load();
    let (ids1, ids2) = p.tokenize(&fx.meta("prompt"));
    let want1: Vec<i64> = fx.get("tokens_1").flatten_all().unwrap().to_vec1().unwrap();
    let want2: Vec<i64> = fx.get("tokens_2").flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(ids1.iter().map(|&x| x as i64).collect::<Vec<_>>(), want1);
    assert_eq!(ids2.iter().map(|&x| x as i64).collect::<Vec<_>>(), want2);
}

#[test]
fn text_encoders_match_penultimate_states_and_projected_pooled_output() {
    let (_d, p, fx) = load();
    let prompt = fx.meta("prompt");
    let (h1, h2, pooled) = p.encode_prompt_parts(&prompt).unwrap();
    check(
        "text_encoder penultimate",
        &h1,
        fx.get("te1_penultimate"),
        TIGHT,
    );
    check(
        "text_encoder_2 penultimate",
        &h2,
        fx.get("te2_penultimate"),
        TIGHT,
    );
    check(
        "text_encoder_2 pooled+projected",
        &pooled,
        fx.get("te2_pooled"),
        TIGHT,
    );
    let e = p.encode_prompt(&prompt).unwrap();
    check(
        "prompt_embeds (concat)",
        &e.context,
        fx.get("prompt_embeds"),
        TIGHT,
    );
    check(
        "pooled_prompt_embeds",
        &e.pooled,
        fx.get("pooled_prompt_embeds"),
        TIGHT,
    );
}

#[test]
fn one_unet_step_matches_diffusers_with_added_time_conditioning() {
    let (_d, p, fx) = load();
    let size = fx.usize("unet_size");
    let embeds = PromptEmbeds {
        context: fx.get("prompt_embeds").clone(),
        pooled: fx.get("pooled_prompt_embeds").clone(),
    };
    let time_ids = p.time_ids(size, size, 1).unwrap();
    let t: f64 = fx.meta("unet_timestep").parse().unwrap();
    let out = p
        .unet_forward(fx.get("unet_in"), t, &embeds, &time_ids)
        .unwrap();
    check("unet noise prediction", &out, fx.get("unet_out"), TIGHT);
}

#[test]
fn vae_decode_matches_with_the_configured_scaling_factor() {
    let (_d, p, fx) = load();
    assert_eq!(p.vae_scaling_factor(), 0.13025);
    let out = p.decode(fx.get("vae_in")).unwrap();
    check("vae decode", &out, fx.get("vae_out"), TIGHT);
}

#[test]
fn euler_trailing_schedule_matches_diffusers() {
    let (_d, _p, fx) = load();
    let s = hearth_imagine::EulerDiscrete::new(&Default::default(), fx.usize("gen_steps")).unwrap();
    let ts = Tensor::new(s.timesteps(), &Device::Cpu).unwrap();
    let sig = Tensor::new(s.sigmas(), &Device::Cpu).unwrap();
    check("timesteps", &ts, fx.get("sched_timesteps"), 0.0);
    check("sigmas", &sig, fx.get("sched_sigmas"), TIGHT);
}

fn params(fx: &Fixture, negative: &str, steps: usize, guidance: f64) -> ImageParams {
    let size = fx.usize("gen_size");
    ImageParams {
        prompt: fx.meta("prompt"),
        negative_prompt: negative.to_string(),
        seed: 0,
        steps,
        width: size,
        height: size,
        guidance_scale: guidance,
        init: None,
        loras: Vec::new(),
    }
}

#[test]
fn full_four_step_generation_matches_from_the_same_initial_noise() {
    let (_d, p, fx) = load();
    let prm = params(&fx, "", fx.usize("gen_steps"), 0.0);
    let lat = p
        .sample(&prm, &Noise::from(fx.get("gen_noise")), &|| false)
        .unwrap();
    check("4-step latents", &lat, fx.get("gen_latents"), TIGHT);
    let img = p.decode(&lat).unwrap();
    check("4-step decoded image", &img, fx.get("gen_image"), TIGHT);
}

#[test]
fn negative_prompt_with_guidance_matches_diffusers_cfg() {
    let (_d, p, fx) = load();
    let scale: f64 = fx.meta("cfg_scale").parse().unwrap();
    let prm = params(
        &fx,
        &fx.meta("negative_prompt"),
        fx.usize("cfg_steps"),
        scale,
    );
    assert!(prm.uses_guidance());
    let lat = p
        .sample(&prm, &Noise::from(fx.get("gen_noise")), &|| false)
        .unwrap();
    check("cfg latents", &lat, fx.get("cfg_latents"), TIGHT);
}

/// The fixture's picture and mask as the pipeline takes them.
fn edit_inputs(fx: &Fixture) -> (Image, Mask) {
    let size = fx.usize("edit_size");
    let bytes =
        |name: &str| -> Vec<u8> { fx.get(name).flatten_all().unwrap().to_vec1::<u8>().unwrap() };
    let image = Image {
        width: size,
        height: size,
        rgb: bytes("edit_image"),
    };
    let mask = Mask {
        width: size,
        height: size,
        luma: bytes("edit_mask"),
    };
    (image, mask)
}

fn strength(fx: &Fixture, key: &str) -> f64 {
    fx.meta(key).parse().unwrap()
}

/// An edit of the fixture's picture with the reference's own draws.
fn edit(
    fx: &Fixture,
    strength: f64,
    steps: usize,
    mask: Option<Mask>,
    cfg: bool,
) -> (ImageParams, Noise) {
    let (image, _) = edit_inputs(fx);
    let mut prm = if cfg {
        let scale = fx.meta("cfg_scale").parse().unwrap();
        params(fx, &fx.meta("negative_prompt"), steps, scale)
    } else {
        params(fx, "", steps, 0.0)
    };
    prm.width = image.width;
    prm.height = image.height;
    prm.init = Some(InitImage {
        image,
        strength,
        mask,
    });
    let noise = Noise {
        latents: fx.get("edit_noise").clone(),
        posterior: Some(fx.get("edit_posterior").clone()),
        masked_posterior: None,
    };
    (prm, noise)
}

#[test]
fn vae_encoder_matches_diffusers_latent_distribution() {
    let (_d, p, fx) = load();
    let (image, _) = edit_inputs(&fx);
    let dist = p.encode_image(&image).unwrap();
    check("vae encode mean", &dist.mean, fx.get("enc_mean"), TIGHT);
    check("vae encode std", &dist.std, fx.get("enc_std"), TIGHT);
}

#[test]
fn image_to_image_matches_diffusers_img2img_at_half_strength() {
    let (_d, p, fx) = load();
    let (prm, noise) = edit(
        &fx,
        strength(&fx, "img2img_strength"),
        fx.usize("edit_steps"),
        None,
        false,
    );
    assert_eq!(prm.steps_to_run(), 2, "half of 4 steps run");
    let lat = p.sample(&prm, &noise, &|| false).unwrap();
    check("img2img latents", &lat, fx.get("img2img_latents"), TIGHT);
}

#[test]
fn inpainting_matches_diffusers_and_keeps_the_image_outside_the_mask() {
    let (_d, p, fx) = load();
    let (_, mask) = edit_inputs(&fx);
    let (prm, noise) = edit(
        &fx,
        strength(&fx, "inpaint_strength"),
        fx.usize("edit_steps"),
        Some(mask.clone()),
        false,
    );
    let lat = p.sample(&prm, &noise, &|| false).unwrap();
    check("inpaint latents", &lat, fx.get("inpaint_latents"), TIGHT);
    // Outside the mask the result is the picture's own latents, exactly.
    let (image, _) = edit_inputs(&fx);
    let kept = (p.encode_image(&image).unwrap())
        .sample(noise.posterior.as_ref().unwrap())
        .unwrap();
    let kept = (kept * p.vae_scaling_factor()).unwrap();
    let (at, far) = (lat.get(0).unwrap(), kept.get(0).unwrap());
    // Latent (7, 0) lies in the keep region (mask rows 56..64 are black).
    let a: Vec<f32> = at
        .narrow(1, 7, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f32> = far
        .narrow(1, 7, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(a, b, "the unmasked bottom row is the image's own latents");
}

#[test]
fn full_strength_inpainting_with_guidance_matches_diffusers() {
    let (_d, p, fx) = load();
    let (_, mask) = edit_inputs(&fx);
    let (prm, noise) = edit(&fx, 1.0, fx.usize("inpaint_cfg_steps"), Some(mask), true);
    assert!(prm.uses_guidance());
    let lat = p.sample(&prm, &noise, &|| false).unwrap();
    check(
        "inpaint cfg latents",
        &lat,
        fx.get("inpaint_cfg_latents"),
        TIGHT,
    );
}

#[test]
fn a_strength_that_leaves_no_step_is_refused_naming_strength() {
    let (_d, p, fx) = load();
    // 0.2 of 4 steps is 0.8 of a step: none runs.
    let (prm, noise) = edit(&fx, 0.2, 4, None, false);
    let err = p.sample(&prm, &noise, &|| false).unwrap_err();
    assert!(
        matches!(
            err,
            hearth_imagine::Error::InvalidParams {
                field: "strength",
                ..
            }
        ),
        "{err}"
    );
}

/// The tiny model with its 9-channel inpainting UNet, checked against the reference's digest.
fn load_inpainting() -> (tempfile::TempDir, SdxlPipeline) {
    let dir = tempfile::tempdir().unwrap();
    hearth_imagine::tiny::write_tiny_sdxl_inpainting(dir.path(), TINY_SEED).unwrap();
    let files = ModelFiles::from_dir(dir.path(), None).unwrap();
    let p = SdxlPipeline::load(&files, &Device::Cpu, DType::F32).unwrap();
    assert!(p.is_inpainting());
    (dir, p)
}

#[test]
fn an_inpainting_unet_matches_diffusers_at_full_strength_and_with_guidance() {
    let (_d, _p, fx) = load();
    let (dir, p) = load_inpainting();
    assert_eq!(
        sha256(&dir.path().join("unet/diffusion_pytorch_model.safetensors")),
        fx.meta("inpaint_unet_sha256"),
        "the inpainting UNet differs from the reference's"
    );
    let (_, mask) = edit_inputs(&fx);
    let steps = fx.usize("edit_steps");
    let with_masked = |mut noise: Noise| {
        noise.masked_posterior = Some(fx.get("edit_masked_posterior").clone());
        noise
    };
    let (prm, noise) = edit(&fx, 1.0, steps, Some(mask.clone()), false);
    let lat = p.sample(&prm, &with_masked(noise), &|| false).unwrap();
    check(
        "inpainting unet latents",
        &lat,
        fx.get("inpaint9_latents"),
        TIGHT,
    );
    let (prm, noise) = edit(
        &fx,
        strength(&fx, "inpaint_strength"),
        steps,
        Some(mask),
        true,
    );
    let lat = p.sample(&prm, &with_masked(noise), &|| false).unwrap();
    check(
        "inpainting unet cfg latents",
        &lat,
        fx.get("inpaint9_cfg_latents"),
        TIGHT,
    );
}

#[test]
fn an_inpainting_unet_refuses_requests_without_a_picture_and_a_mask() {
    let (_d, _p, fx) = load();
    let (_dir, p) = load_inpainting();
    let text = params(&fx, "", 2, 0.0);
    let err = p
        .sample(&text, &p.noise(&text).unwrap(), &|| false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            hearth_imagine::Error::InvalidParams { field: "image", .. }
        ),
        "{err}"
    );
    let (prm, _) = edit(&fx, 0.5, 4, None, false);
    let err = p
        .sample(&prm, &p.noise(&prm).unwrap(), &|| false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            hearth_imagine::Error::InvalidParams { field: "mask", .. }
        ),
        "{err}"
    );
}
