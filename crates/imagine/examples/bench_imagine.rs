//! Image generation benchmark: seconds per image and per denoising step.
//!
//! `cargo run --release -p hearth-imagine --example bench_imagine -- [--model DIR] [--sizes 512,1024]
//!  [--steps 4] [--runs 3] [--device cpu|cuda] [--dtype f32|f16|bf16] [--guidance 2.0]
//!  [--random-full] [--save DIR]`
//!
//! Without `--model` it writes the tiny SDXL-shaped test model to a temporary folder and times
//! that; with `--random-full`, the full-size SDXL base shapes with random weights made on the
//! device (`SdxlPipeline::random`: no weights can be had here). `--guidance 0` runs without
//! classifier-free guidance (one UNet batch row per step), as SDXL-Lightning does. Each size gets one warm-up image, then `--runs` timed images (seeds 1..=runs); the
//! report gives the mean of: prompt encoding, each UNet step, the VAE decode, PNG encoding, and
//! the whole image. The last line is JSON for scripts. `--save DIR` writes each size's last image
//! as `DIR/bench-<size>.png`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use candle_core::Tensor;
use hearth_imagine::model::{parse_device, parse_dtype};
use hearth_imagine::pipeline::to_rgb8;
use hearth_imagine::{EulerDiscrete, ImageParams, ModelFiles, SdxlPipeline};

struct Args {
    model: Option<PathBuf>,
    sizes: Vec<usize>,
    steps: usize,
    runs: usize,
    device: String,
    dtype: Option<String>,
    save: Option<PathBuf>,
    guidance: f64,
    random_full: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: None,
        sizes: vec![512, 1024],
        steps: 4,
        runs: 3,
        device: "cpu".into(),
        dtype: None,
        save: None,
        guidance: 2.0,
        random_full: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = Some(PathBuf::from(val()?)),
            "--sizes" => {
                a.sizes = val()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--steps" => a.steps = val()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--runs" => a.runs = val()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--device" => a.device = val()?,
            "--dtype" => a.dtype = Some(val()?),
            "--save" => a.save = Some(PathBuf::from(val()?)),
            "--guidance" => a.guidance = val()?.parse().map_err(|e| format!("--guidance: {e}"))?,
            "--random-full" => a.random_full = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

type Timings = (f64, Vec<f64>, f64, f64, f64, Vec<u8>);

/// One image with per-phase timings: (encode, per-step, decode, png, total, png bytes).
fn timed_image(p: &SdxlPipeline, prm: &ImageParams) -> hearth_imagine::Result<Timings> {
    let start = Instant::now();
    let t = Instant::now();
    let embeds = p.encode_prompt(&prm.prompt)?;
    let enc = secs(t);
    let sched = EulerDiscrete::new(&Default::default(), prm.steps)?;
    let time_ids = p.time_ids(prm.width, prm.height, 1)?;
    let mut lat = (p.initial_noise(prm.seed, prm.width, prm.height)? * sched.init_noise_sigma())?;
    let mut steps = Vec::new();
    for (i, &ts) in sched.timesteps().iter().enumerate() {
        let t = Instant::now();
        let x = sched.scale_model_input(&lat, i)?;
        let eps = p.unet_forward(&x, ts, &embeds, &time_ids)?;
        lat = sched.step(&eps, i, &lat)?;
        // Force the work to finish (matters on CUDA, where kernels run asynchronously).
        let _: Tensor = lat.sum_all()?;
        steps.push(secs(t));
    }
    let t = Instant::now();
    let img = to_rgb8(&p.decode(&lat)?)?;
    let dec = secs(t);
    let t = Instant::now();
    let png = img.to_png()?;
    let png_s = secs(t);
    Ok((enc, steps, dec, png_s, secs(start), png))
}

fn main() -> ExitCode {
    // HEARTH_IMAGE_CONV, HEARTH_IMAGE_FUSED, HEARTH_IMAGE_ATTENTION: the GPU paths, to compare.
    hearth_imagine::layers::Tuning::from_vars(|k| std::env::var(k).ok()).install();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let tmp;
    let (dir, tiny) = match &args.model {
        Some(d) => (d.clone(), hearth_imagine::tiny::is_tiny_model(d)),
        None => {
            tmp = std::env::temp_dir().join(format!("hearth-bench-tiny-{}", std::process::id()));
            let written = if args.random_full {
                hearth_imagine::tiny::write_full_sdxl_configs(&tmp)
            } else {
                hearth_imagine::write_tiny_sdxl(&tmp, hearth_imagine::tiny::TINY_SEED)
            };
            if let Err(e) = written {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            (tmp.clone(), true)
        }
    };
    let run = || -> hearth_imagine::Result<()> {
        let device = parse_device(&args.device)?;
        let dtype = parse_dtype(args.dtype.as_deref(), &device)?;
        let t = Instant::now();
        let files = ModelFiles::from_dir(&dir, None)?;
        let p = if args.random_full {
            SdxlPipeline::random(&files, &device, dtype)?
        } else {
            SdxlPipeline::load(&files, &device, dtype)?
        };
        println!(
            "model {} ({}), device {}, dtype {:?}, loaded in {:.2}s, {} threads",
            dir.display(),
            if args.random_full {
                "full-size SDXL shapes, random weights"
            } else if tiny {
                "tiny test model"
            } else {
                "real weights"
            },
            args.device,
            dtype,
            secs(t),
            candle_core::utils::get_num_threads()
        );
        println!(
            "{:>6} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "size", "steps", "s/image", "s/step", "encode", "decode", "png"
        );
        let mut json = Vec::new();
        for &size in &args.sizes {
            let prm = |seed| ImageParams {
                prompt: "a photo of an astronaut riding a horse on the moon".into(),
                negative_prompt: String::new(),
                seed,
                steps: args.steps,
                width: size,
                height: size,
                guidance_scale: args.guidance,
                init: None,
                loras: Vec::new(),
            };
            timed_image(&p, &prm(0))?; // warm-up
            let (mut enc, mut step, mut dec, mut png, mut total) = (0.0, 0.0, 0.0, 0.0, 0.0);
            let mut last_png = Vec::new();
            for r in 0..args.runs {
                let (e, s, d, g, t, png_bytes) = timed_image(&p, &prm(r as u64 + 1))?;
                last_png = png_bytes;
                enc += e;
                step += s.iter().sum::<f64>() / s.len() as f64;
                dec += d;
                png += g;
                total += t;
            }
            if let Some(dir) = &args.save {
                let path = dir.join(format!("bench-{size}.png"));
                std::fs::write(&path, &last_png)
                    .map_err(|e| hearth_imagine::Error::Io { path, source: e })?;
            }
            let n = args.runs.max(1) as f64;
            let (enc, step, dec, png, total) = (enc / n, step / n, dec / n, png / n, total / n);
            println!(
                "{size:>6} {:>6} {total:>10.3} {step:>10.4} {enc:>10.4} {dec:>10.3} {png:>10.4}",
                args.steps
            );
            json.push(format!(
                "{{\"size\":{size},\"steps\":{},\"runs\":{},\"s_per_image\":{total:.4},\"s_per_step\":{step:.5},\"encode_s\":{enc:.5},\"decode_s\":{dec:.4},\"png_s\":{png:.5}}}",
                args.steps, args.runs
            ));
        }
        println!("[{}]", json.join(","));
        Ok(())
    };
    let result = run();
    if args.model.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
