//! Batched prefill and decode throughput of the candle backend on a device (a GPU under CUDA),
//! on a llama-shaped model with random weights made on that device (`TextModel::random`; no
//! files), or on a GGUF file (`--file`, e.g. the one llama.cpp's `llama-bench` reads), at several
//! stream counts.
//!
//! `bench_device [--device cuda] [--streams 1,8,32,64] [--prompt 128] [--gen 64]
//!  [--layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ff 8192 --vocab 32768 | --file F.gguf]
//!  [--warmup 0]`
//!
//! For each stream count: one prefill call of all the streams' prompts (random ids), then
//! `--gen` decode steps of one row per stream, each bringing the logits back and picking the
//! next tokens greedily on the host, as the scheduler does. Short warm-up rounds run first, the
//! most streams first (kernels loaded, the cache pool grown to its largest, each stream count's
//! decode step captured as a CUDA graph; unless `--warmup 0`, for a profiler that should see the
//! first call's kernels). Prints one JSON line per stream count: prefill and decode tokens per
//! second, the time of one decode step and of the first. Logs (`RUST_LOG`, default `warn`) go
//! to stderr: `RUST_LOG=hearth_infer=debug` shows each graph captured.

use std::process::ExitCode;
use std::time::Instant;

use hearth_infer::{DeviceSpec, GpuTuning, LlamaShape, Step, TextModel, TextModelConfig};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_device: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut shape = LlamaShape::default();
    let (mut device, mut streams, mut prompt, mut gen) =
        ("cuda".to_string(), vec![1, 8, 32, 64], 128usize, 64usize);
    let mut file = None;
    let mut warmup = true;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let val = args.next().ok_or(format!("{flag} needs a value"))?;
        let num = || val.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--device" => device = val.clone(),
            "--streams" => {
                streams = val
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--streams: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--prompt" => prompt = num()?,
            "--gen" => gen = num()?,
            "--layers" => shape.layers = num()?,
            "--hidden" => shape.hidden = num()?,
            "--heads" => shape.heads = num()?,
            "--kv-heads" => shape.kv_heads = num()?,
            "--ff" => shape.ff = num()?,
            "--vocab" => shape.vocab = num()?,
            "--file" => file = Some(val.clone()),
            "--warmup" => warmup = num()? != 0,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let spec: DeviceSpec = device.parse()?;
    let t = Instant::now();
    // HEARTH_CUDA_EVENTS=track, HEARTH_CUDA_POOL=trim, HEARTH_DECODE_ATTENTION=gather,
    // HEARTH_FUSED=off, HEARTH_GEMV=off and HEARTH_CUDA_GRAPHS=off turn the GPU's fast paths off
    // one by one, to measure each.
    let gpu = GpuTuning::from_vars(|k| std::env::var(k).ok());
    let mut model = match &file {
        Some(path) => {
            let mut cfg = TextModelConfig::local(path);
            cfg.device = spec;
            cfg.gpu = gpu;
            TextModel::load(&cfg).map_err(|e| e.to_string())?
        }
        None => TextModel::random(shape, spec, gpu, 7).map_err(|e| e.to_string())?,
    };
    match &file {
        Some(path) => eprintln!(
            "model: {path}, loaded in {:.1} s on {device}",
            t.elapsed().as_secs_f64()
        ),
        None => eprintln!(
            "model: {:.2}B parameters, made in {:.1} s on {device}",
            shape.parameters() as f64 / 1e9,
            t.elapsed().as_secs_f64()
        ),
    }
    if warmup {
        // Kernels loaded, the cache pool grown to the largest round's size first (so that no
        // round's prefill pays for the pool's growth), then each round's decode step captured
        // as a CUDA graph (`HEARTH_CUDA_GRAPHS`), as a server has after its first requests.
        let mut sizes = streams.clone();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        for &b in &sizes {
            round(&mut model, b, prompt, gen, 2)?;
        }
    }
    for &b in &streams {
        let (prefill, first, decode) = round(&mut model, b, prompt, gen, gen)?;
        println!(
            "{{\"streams\":{b},\"prompt\":{prompt},\"gen\":{gen},\"prefill_tok_s\":{:.1},\"decode_tok_s\":{:.1},\"decode_step_ms\":{:.3},\"first_step_ms\":{:.3}}}",
            (b * prompt) as f64 / prefill,
            (b * gen) as f64 / decode,
            decode / gen as f64 * 1e3,
            first * 1e3
        );
    }
    Ok(())
}

/// One round of `b` streams made for `prompt + gen` positions, `decode` steps of them:
/// (prefill seconds, the first decode step's seconds, all decode steps' seconds).
fn round(
    m: &mut TextModel,
    b: usize,
    prompt: usize,
    gen: usize,
    decode: usize,
) -> Result<(f64, f64, f64), String> {
    let vocab = m.info().vocab_size;
    let mut seqs = (0..b)
        .map(|_| m.new_sequence(prompt + gen))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|i| {
            (0..prompt)
                .map(|j| ((i * 7919 + j * 104_729) % vocab) as u32)
                .collect()
        })
        .collect();
    let t = Instant::now();
    let mut steps: Vec<Step> = seqs
        .iter_mut()
        .zip(&prompts)
        .map(|(seq, p)| Step { seq, tokens: p })
        .collect();
    let mut next = pick(m.forward(&mut steps).map_err(|e| e.to_string())?, vocab);
    let prefill = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut first = 0.0;
    for i in 0..decode {
        let toks: Vec<[u32; 1]> = next.iter().map(|&id| [id]).collect();
        let mut steps: Vec<Step> = seqs
            .iter_mut()
            .zip(&toks)
            .map(|(seq, tok)| Step { seq, tokens: tok })
            .collect();
        next = pick(m.forward(&mut steps).map_err(|e| e.to_string())?, vocab);
        if i == 0 {
            first = t.elapsed().as_secs_f64();
        }
    }
    Ok((prefill, first, t.elapsed().as_secs_f64()))
}

/// Each row's greedy token.
fn pick(logits: &[f32], vocab: usize) -> Vec<u32> {
    logits
        .chunks_exact(vocab)
        .map(|row| {
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i as u32)
        })
        .collect()
}
