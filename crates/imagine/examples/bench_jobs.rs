//! What an image job's progress costs per denoising step: the step event (the job's state
//! updated under the queue's lock and the event sent), and a preview (the latents decoded to a
//! small PNG), each as a share of the step's own time; then a whole job through the worker with
//! a preview every 4 steps against the bare pipeline, as a cross-check.
//!
//! `cargo run --release -p hearth-imagine --example bench_jobs -- [--sizes 256,512] [--steps 8]
//!  [--runs 3]`
//!
//! It times the tiny SDXL-shaped test model, the worst case: its steps are short, so a fixed
//! cost per step weighs the most (the full-size model's steps on a CPU are seconds, and it would
//! be loaded twice here, once bare and once in the worker). The last line is JSON for scripts.

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use candle_core::{DType, Device};
use hearth_imagine::{
    ImageParams, ImageWorker, JobEvent, JobSpec, JobState, ModelFiles, SdxlPipeline,
};

struct Args {
    sizes: Vec<usize>,
    steps: usize,
    runs: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        sizes: vec![512, 1024],
        steps: 8,
        runs: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--sizes" => {
                a.sizes = val()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--steps" => a.steps = val()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--runs" => a.runs = val()?.parse().map_err(|e| format!("--runs: {e}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn params(size: usize, steps: usize, seed: u64) -> ImageParams {
    ImageParams {
        prompt: "a lighthouse at dusk".into(),
        negative_prompt: String::new(),
        seed,
        steps,
        width: size,
        height: size,
        guidance_scale: 0.0,
        init: None,
        loras: Vec::new(),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = std::env::temp_dir().join(format!("hearth-bench-jobs-{}", std::process::id()));
    let run = || -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        hearth_imagine::write_tiny_sdxl(&dir, hearth_imagine::tiny::TINY_SEED)?;
        let pipeline = || -> hearth_imagine::Result<SdxlPipeline> {
            SdxlPipeline::load(&ModelFiles::from_dir(&dir, None)?, &Device::Cpu, DType::F32)
        };
        let bare = pipeline()?;
        let worker = ImageWorker::spawn(pipeline()?, 4, "bench")?;
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        let model = "tiny test model";
        println!(
            "{model}, cpu f32, {} threads",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!(
            "  size  s/step   event µs  event %   preview ms  preview/4 %   job+preview s  bare s"
        );
        let mut rows = Vec::new();
        for &size in &args.sizes {
            // Step time: the bare sampler's, timed between its calls of the observer.
            let mut step_times = Vec::new();
            let mut last_latents = None;
            for run in 0..args.runs {
                let noise = bare.noise(&params(size, args.steps, run as u64))?;
                let mut last = None::<Instant>;
                bare.sample_observed(
                    &params(size, args.steps, run as u64),
                    &noise,
                    &mut |_, l| {
                        let now = Instant::now();
                        if let Some(t) = last.replace(now) {
                            step_times.push((now - t).as_secs_f64());
                        }
                        last_latents = Some(l.clone());
                        false
                    },
                )?;
            }
            let step = median(step_times);
            let latents = last_latents.expect("a step ran");
            // The step event: the state under a lock, the event sent (as the worker does).
            let states = Mutex::new(std::collections::HashMap::<String, JobState>::new());
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let n = 10_000;
            let t = Instant::now();
            for i in 0..n {
                states
                    .lock()
                    .map_err(|_| "a poisoned lock")?
                    .insert("job".into(), JobState::Running { step: i, steps: n });
                let _ = tx.send(JobEvent::Step {
                    step: i,
                    steps: n,
                    preview: None,
                });
                let _ = rx.try_recv();
            }
            let event = t.elapsed().as_secs_f64() / n as f64;
            // A preview.
            let mut previews = Vec::new();
            for _ in 0..10 {
                let t = Instant::now();
                bare.preview_png(&latents)?;
                previews.push(t.elapsed().as_secs_f64());
            }
            let preview = median(previews);
            // Cross-check: a whole job through the worker, a preview every 4 steps and every
            // event read, against the bare pipeline's image.
            let (mut job_s, mut bare_s) = (Vec::new(), Vec::new());
            for run in 0..args.runs {
                let t = Instant::now();
                bare.generate(&params(size, args.steps, run as u64), &|| false)?;
                bare_s.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                let spec = JobSpec {
                    user: "bench".into(),
                    params: params(size, args.steps, run as u64),
                    preview_every: 4,
                };
                let mut job = worker.submit(spec)?;
                rt.block_on(async {
                    while job.events.recv().await.is_some() {}
                    (&mut job.result).await
                })
                .map_err(|_| hearth_imagine::Error::WorkerStopped)??;
                job_s.push(t.elapsed().as_secs_f64());
            }
            let (job_s, bare_s) = (median(job_s), median(bare_s));
            println!(
                "{size:>6} {step:>7.4} {:>10.2} {:>8.4} {:>12.3} {:>12.3} {job_s:>15.3} {bare_s:>7.3}",
                event * 1e6,
                100.0 * event / step,
                preview * 1e3,
                100.0 * (event + preview / 4.0) / step,
            );
            rows.push(serde_json::json!({
                "size": size, "step_s": step, "event_s": event, "event_pct": 100.0 * event / step,
                "preview_s": preview, "preview_every_4_pct": 100.0 * (event + preview / 4.0) / step,
                "job_with_previews_s": job_s, "bare_s": bare_s,
            }));
        }
        Ok(
            serde_json::json!({ "model": model, "steps": args.steps, "runs": args.runs, "sizes": rows }),
        )
    };
    let result = run();
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
