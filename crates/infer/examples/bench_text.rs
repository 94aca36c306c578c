//! Hearth's side of `scripts/bench-text.sh`: load a GGUF, then measure the two tests
//! `llama-bench -p N -n M` runs, the same way: after one warm-up of each, prefill a fixed
//! N-token prompt in one step into an empty cache, and, separately, decode M tokens greedily
//! one at a time starting from an empty cache (B sequences in lock-step with `--batch B`).
//! Prints one JSON line with load time, tokens/s and peak RSS.
//!
//! cargo run --release -p hearth-infer --example bench_text -- \
//!     --model weights/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 --prompt 128 --gen 128

use std::time::Instant;

use hearth_infer::{BackendChoice, Sampler, SamplingParams, Step, TextModel, TextModelConfig};

struct Args {
    model: String,
    threads: usize,
    prompt: usize,
    gen: usize,
    batch: usize,
    backend: BackendChoice,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: "weights/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        threads: 2,
        prompt: 128,
        gen: 128,
        batch: 1,
        backend: BackendChoice::Auto,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = value()?,
            "--threads" => a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--prompt" => a.prompt = value()?.parse().map_err(|e| format!("--prompt: {e}"))?,
            "--gen" => a.gen = value()?.parse().map_err(|e| format!("--gen: {e}"))?,
            "--batch" => a.batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--backend" => a.backend = value()?.parse()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.prompt == 0 || a.batch == 0 {
        return Err("--prompt and --batch must be at least 1".into());
    }
    Ok(a)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let mut cfg = TextModelConfig::local(&args.model);
    cfg.threads = args.threads;
    cfg.backend = args.backend;
    let t0 = Instant::now();
    let mut model = TextModel::load(&cfg)?;
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = model.info().vocab_size;

    // A fixed prompt of exactly `--prompt` ids: real text, repeated as needed.
    let tok = model.tokenizer();
    let text =
        "The quick brown fox jumps over the lazy dog. Hearth serves language models on small \
                machines, one batch at a time, and counts every token it makes. ";
    let mut prompt = Vec::new();
    while prompt.len() < args.prompt {
        prompt.extend(tok.encode(text)?);
    }
    prompt.truncate(args.prompt);

    let mut samplers: Vec<Sampler> = (0..args.batch)
        .map(|_| Sampler::new(&SamplingParams::default()))
        .collect();
    let fresh = |model: &TextModel| {
        (0..args.batch)
            .map(|_| model.new_sequence(args.prompt + args.gen + 1))
            .collect::<Result<Vec<_>, _>>()
    };

    // Prefill: every sequence's prompt in one batched step.
    let prefill = |model: &mut TextModel, seqs: &mut Vec<hearth_infer::Sequence>| {
        let mut steps: Vec<Step> = seqs
            .iter_mut()
            .map(|seq| Step {
                seq,
                tokens: &prompt,
            })
            .collect();
        model.forward(&mut steps).map(|l| l.len())
    };
    // Decode: one token per sequence per step, greedy, not stopping at EOS, from an empty
    // cache whose first input is the prompt's first token (llama-bench starts from BOS).
    let decode = |model: &mut TextModel,
                  seqs: &mut Vec<hearth_infer::Sequence>,
                  samplers: &mut Vec<Sampler>,
                  n: usize|
     -> Result<(), hearth_infer::Error> {
        let mut next = vec![prompt[0]; seqs.len()];
        for _ in 0..n {
            let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let mut steps: Vec<Step> = seqs
                .iter_mut()
                .zip(&toks)
                .map(|(seq, t)| Step { seq, tokens: t })
                .collect();
            let logits = model.forward(&mut steps)?;
            for (b, n) in next.iter_mut().enumerate() {
                *n = samplers[b].sample(&logits[b * vocab..(b + 1) * vocab], &[]);
            }
        }
        Ok(())
    };

    // Warm-up (pages the weights in, sizes the scratch buffers), as llama-bench does.
    let mut warm = fresh(&model)?;
    prefill(&mut model, &mut warm)?;
    let mut warm = fresh(&model)?;
    decode(&mut model, &mut warm, &mut samplers, 1)?;
    drop(warm);

    let mut seqs = fresh(&model)?;
    let t1 = Instant::now();
    prefill(&mut model, &mut seqs)?;
    let prefill_s = t1.elapsed().as_secs_f64();
    drop(seqs);

    let mut seqs = fresh(&model)?;
    let t2 = Instant::now();
    decode(&mut model, &mut seqs, &mut samplers, args.gen)?;
    let decode_s = t2.elapsed().as_secs_f64();

    println!(
        "{{\"engine\":\"hearth\",\"backend\":\"{}\",\"threads\":{},\"batch\":{},\"load_s\":{:.4},\"prefill_tokens\":{},\"prefill_tok_s\":{:.2},\"decode_tokens\":{},\"decode_tok_s\":{:.2},\"peak_rss_kib\":{},\"weights_bytes\":{}}}",
        model.info().backend,
        model.threads(),
        args.batch,
        load_s,
        args.prompt * args.batch,
        (args.prompt * args.batch) as f64 / prefill_s,
        args.gen * args.batch,
        (args.gen * args.batch) as f64 / decode_s,
        peak_rss_kib(),
        model.info().weights_bytes,
    );
    Ok(())
}
