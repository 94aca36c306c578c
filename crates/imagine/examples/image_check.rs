//! The image layers' GPU paths against candle's f32 arithmetic, on a GPU.
//!
//! `cargo run --release -p hearth-imagine --features cudnn --example image_check`
//!
//! Each layer of `hearth_imagine::layers` runs on the GPU twice with the same values: in f16
//! (Hearth's kernels: cuDNN convolutions, the fused group norm and GEGLU, attention in f16) and
//! in f32 (candle's own ops). Then the tiny test model's UNet step and VAE decode run on the GPU
//! in f16 and on the CPU in f32. Each check prints one JSON line with the largest difference
//! relative to the reference's largest value; run it again with `HEARTH_IMAGE_CONV=candle
//! HEARTH_IMAGE_FUSED=off HEARTH_IMAGE_ATTENTION=f32` to see candle's own f16 error beside it.

use std::collections::HashMap;
use std::process::ExitCode;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use hearth_imagine::layers::{attention, geglu, Conv2d, GroupNorm, Tuning};
use hearth_imagine::{write_tiny_sdxl, ImageParams, ModelFiles, SdxlPipeline};

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// max |a - b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> R<f64> {
    let a = a
        .to_dtype(DType::F64)?
        .to_device(&Device::Cpu)?
        .flatten_all()?;
    let b = b
        .to_dtype(DType::F64)?
        .to_device(&Device::Cpu)?
        .flatten_all()?;
    let d = (&a - &b)?.abs()?.max(0)?.to_scalar::<f64>()?;
    let s = b.abs()?.max(0)?.to_scalar::<f64>()?.max(1e-12);
    Ok(d / s)
}

fn report(what: &str, e: f64, limit: f64) -> bool {
    let ok = e.is_finite() && e <= limit;
    println!("{{\"check\":\"{what}\",\"rel_err\":{e:.3e},\"limit\":{limit:.0e},\"ok\":{ok}}}");
    ok
}

/// A layer's f16 and f32 weights from the same values.
fn builders(
    t: &HashMap<String, Tensor>,
    dev: &Device,
) -> (VarBuilder<'static>, VarBuilder<'static>) {
    (
        VarBuilder::from_tensors(t.clone(), DType::F16, dev),
        VarBuilder::from_tensors(t.clone(), DType::F32, dev),
    )
}

fn layers(dev: &Device) -> R<bool> {
    let mut ok = true;
    let randn = |shape: &[usize]| Tensor::randn(0f32, 1f32, shape, dev);
    // Group norm (+ SiLU), plain and with a large mean, at the UNet's first level.
    for (what, shift) in [("group_norm_silu", 0.0), ("group_norm_mean_100", 100.0)] {
        let t = HashMap::from([
            ("weight".to_string(), ((randn(&[320])? * 0.2)? + 1.0)?),
            ("bias".to_string(), (randn(&[320])? * 0.1)?),
        ]);
        let (h, f) = builders(&t, dev);
        let (gh, gf) = (
            GroupNorm::new(h, 32, 320, 1e-5)?,
            GroupNorm::new(f, 32, 320, 1e-5)?,
        );
        let x = (randn(&[1, 320, 128, 128])? + shift)?;
        let silu = shift == 0.0;
        let y = gh.forward(&x.to_dtype(DType::F16)?, silu)?;
        ok &= report(what, rel(&y, &gf.forward(&x, silu)?)?, 2e-2);
    }
    // GEGLU of the feed-forward at 64x64 positions.
    let x = randn(&[1, 4096, 2 * 2560])?;
    let y = geglu(&x.to_dtype(DType::F16)?)?;
    ok &= report("geglu", rel(&y, &geglu(&x)?)?, 2e-2);
    // Convolutions: 3x3, 3x3 of stride 2, 1x1 (the UNet's and the VAE's shapes).
    for (what, c_in, c_out, size, k, stride, pad) in [
        ("conv3x3", 320, 640, 128, 3, 1, 1),
        ("conv3x3_stride2", 640, 640, 64, 3, 2, 1),
        ("conv1x1", 960, 640, 64, 1, 1, 0),
        ("conv3x3_vae", 128, 128, 1024, 3, 1, 1),
    ] {
        let t = HashMap::from([
            (
                "weight".to_string(),
                (randn(&[c_out, c_in, k, k])? / ((c_in * k * k) as f64).sqrt())?,
            ),
            ("bias".to_string(), (randn(&[c_out])? * 0.1)?),
        ]);
        let (h, f) = builders(&t, dev);
        let (ch, cf) = (
            Conv2d::new(h, c_in, c_out, k, stride, pad)?,
            Conv2d::new(f, c_in, c_out, k, stride, pad)?,
        );
        let x = randn(&[1, c_in, size, size])?;
        let y = ch.forward(&x.to_dtype(DType::F16)?)?;
        ok &= report(what, rel(&y, &cf.forward(&x)?)?, 2e-2);
    }
    // Attention: the UNet's 64x64 level (10 heads of 64) and the VAE's (one head of 512).
    for (what, n, l, d) in [
        ("attention_unet", 10, 4096, 64),
        ("attention_vae", 1, 16384, 512),
    ] {
        let (q, k, v) = (randn(&[n, l, d])?, randn(&[n, l, d])?, randn(&[n, l, d])?);
        let s = 1.0 / (d as f64).sqrt();
        let h = |t: &Tensor| t.to_dtype(DType::F16);
        let y = attention(&h(&q)?, &h(&k)?, &h(&v)?, s)?;
        ok &= report(what, rel(&y, &attention(&q, &k, &v, s)?)?, 2e-2);
    }
    Ok(ok)
}

fn tiny_model(dev: &Device) -> R<bool> {
    let dir = std::env::temp_dir().join(format!("hearth-image-check-{}", std::process::id()));
    write_tiny_sdxl(&dir, hearth_imagine::tiny::TINY_SEED)?;
    let files = ModelFiles::from_dir(&dir, None)?;
    let cpu = SdxlPipeline::load(&files, &Device::Cpu, DType::F32)?;
    let gpu = SdxlPipeline::load(&files, dev, DType::F16)?;
    let mut ok = true;
    let prompt = "a lighthouse on a cliff at dusk";
    let (ec, eg) = (cpu.encode_prompt(prompt)?, gpu.encode_prompt(prompt)?);
    let ids_c = cpu.time_ids(64, 64, 1)?;
    let ids_g = gpu.time_ids(64, 64, 1)?;
    let lat = Tensor::randn(0f32, 1f32, (1, 4, 8, 8), &Device::Cpu)?;
    let uc = cpu.unet_forward(&lat, 500.0, &ec, &ids_c)?;
    let ug = gpu.unet_forward(&lat.to_device(dev)?, 500.0, &eg, &ids_g)?;
    ok &= report("tiny_unet_step", rel(&ug, &uc)?, 5e-2);
    let dc = cpu.decode(&lat)?;
    let dg = gpu.decode(&lat.to_device(dev)?)?;
    ok &= report("tiny_vae_decode", rel(&dg, &dc)?, 5e-2);
    // A whole 4-step image: the largest pixel difference, as a fraction of 255.
    let p = ImageParams {
        prompt: prompt.into(),
        negative_prompt: String::new(),
        seed: 7,
        steps: 4,
        width: 64,
        height: 64,
        guidance_scale: 1.0,
        init: None,
        loras: Vec::new(),
    };
    let (ic, ig) = (cpu.generate(&p, &|| false)?, gpu.generate(&p, &|| false)?);
    let worst = ic
        .rgb
        .iter()
        .zip(&ig.rgb)
        .map(|(a, b)| a.abs_diff(*b))
        .max();
    ok &= report(
        "tiny_image_pixels",
        f64::from(worst.unwrap_or(255)) / 255.0,
        0.1,
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(ok)
}

fn main() -> ExitCode {
    // HEARTH_IMAGE_CONV, HEARTH_IMAGE_FUSED, HEARTH_IMAGE_ATTENTION: the GPU paths, to compare.
    hearth_imagine::layers::Tuning::from_vars(|k| std::env::var(k).ok()).install();
    let run = || -> R<bool> {
        let dev = hearth_imagine::model::parse_device("cuda")?;
        println!("{{\"tuning\":\"{:?}\"}}", Tuning::get());
        Ok(layers(&dev)? & tiny_model(&dev)?)
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
