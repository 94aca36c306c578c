//! Hearth's side of `scripts/bench-text.sh`: load a GGUF, then measure the tests `llama-bench -p
//! N1,N2 -n M -d 0,D` runs, the same way: after one warm-up of each, prefill a fixed N-token
//! prompt in one step into an empty cache (for each N), and, separately, decode M tokens greedily
//! one at a time from a cache that already holds D tokens (for each D; the D tokens are filled
//! before the clock starts), B sequences in lock-step with `--batch B`.
//! Prints one JSON line: load time, peak RSS, `prefill` {N: tok/s}, `decode` {D: tok/s}, and the
//! first of each as `prefill_tok_s` / `decode_tok_s`.
//!
//! cargo run --release -p hearth-infer --example bench_text -- \
//!     --model weights/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 --prompt 128,512 --gen 128 \
//!     [--depth 0,2048] [--kv f32|f16|q8_0]

use std::time::Instant;

use hearth_infer::{
    BackendChoice, KvPrecision, Sampler, SamplingParams, Step, TextModel, TextModelConfig,
};

struct Args {
    model: String,
    threads: usize,
    prompts: Vec<usize>,
    gen: usize,
    depths: Vec<usize>,
    batch: usize,
    backend: BackendChoice,
    kv: KvPrecision,
}

fn list(flag: &str, v: String) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|n| n.trim().parse().map_err(|e| format!("{flag}: {e}")))
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: "weights/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        threads: 2,
        prompts: vec![128],
        gen: 128,
        depths: vec![0],
        batch: 1,
        backend: BackendChoice::Auto,
        kv: KvPrecision::F32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = value()?,
            "--threads" => a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--prompt" => a.prompts = list("--prompt", value()?)?,
            "--gen" => a.gen = value()?.parse().map_err(|e| format!("--gen: {e}"))?,
            "--depth" => a.depths = list("--depth", value()?)?,
            "--batch" => a.batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--backend" => a.backend = value()?.parse()?,
            "--kv" => a.kv = value()?.parse()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.prompts.contains(&0) || a.batch == 0 || a.depths.is_empty() {
        return Err("--prompt lengths and --batch must be at least 1".into());
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
    cfg.kv_precision = args.kv;
    // HEARTH_KERNEL=avx512vnni (any path name) forces the fast path's kernels, for A/B runs.
    cfg.kernel = std::env::var("HEARTH_KERNEL")
        .ok()
        .and_then(|name| hearth_infer::KernelPath::from_name(&name));
    let t0 = Instant::now();
    let mut model = TextModel::load(&cfg)?;
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = model.info().vocab_size;

    // A fixed text of as many ids as the longest prompt or depth: real text, repeated.
    let tok = model.tokenizer();
    let text =
        "The quick brown fox jumps over the lazy dog. Hearth serves language models on small \
                machines, one batch at a time, and counts every token it makes. ";
    let longest = args
        .prompts
        .iter()
        .chain(&args.depths)
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let mut ids = Vec::new();
    while ids.len() < longest {
        ids.extend(tok.encode(text)?);
    }
    ids.truncate(longest);
    let capacity = longest + args.gen + 1;

    let mut samplers: Vec<Sampler> = (0..args.batch)
        .map(|_| Sampler::new(&SamplingParams::default()))
        .collect();
    let fresh = |model: &TextModel| {
        (0..args.batch)
            .map(|_| model.new_sequence(capacity))
            .collect::<Result<Vec<_>, _>>()
    };

    // Prefill: every sequence's first `n` ids in one batched step.
    let prefill = |model: &mut TextModel, seqs: &mut Vec<hearth_infer::Sequence>, n: usize| {
        let mut steps: Vec<Step> = seqs
            .iter_mut()
            .map(|seq| Step {
                seq,
                tokens: &ids[..n],
            })
            .collect();
        model.forward(&mut steps).map(|l| l.len())
    };
    // Decode: one token per sequence per step, greedy, not stopping at EOS; the first input is
    // the text's first id (llama-bench starts from BOS).
    let decode = |model: &mut TextModel,
                  seqs: &mut Vec<hearth_infer::Sequence>,
                  samplers: &mut Vec<Sampler>,
                  n: usize|
     -> Result<(), hearth_infer::Error> {
        let mut next = vec![ids[0]; seqs.len()];
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
    // Each warm-up cache is dropped before the next is made (a shadowed binding would live on).
    {
        let mut warm = fresh(&model)?;
        prefill(&mut model, &mut warm, args.prompts[0])?;
    }
    {
        let mut warm = fresh(&model)?;
        decode(&mut model, &mut warm, &mut samplers, 1)?;
    }

    let mut prefill_rates = Vec::new();
    for &n in &args.prompts {
        let mut seqs = fresh(&model)?;
        let t = Instant::now();
        prefill(&mut model, &mut seqs, n)?;
        prefill_rates.push((n, (n * args.batch) as f64 / t.elapsed().as_secs_f64()));
    }
    let mut decode_rates = Vec::new();
    for &depth in &args.depths {
        let mut seqs = fresh(&model)?;
        if depth > 0 {
            prefill(&mut model, &mut seqs, depth)?;
        }
        let t = Instant::now();
        decode(&mut model, &mut seqs, &mut samplers, args.gen)?;
        decode_rates.push((
            depth,
            (args.gen * args.batch) as f64 / t.elapsed().as_secs_f64(),
        ));
    }

    let map = |rates: &[(usize, f64)]| {
        rates
            .iter()
            .map(|(n, r)| format!("\"{n}\":{r:.2}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    println!(
        "{{\"engine\":\"hearth\",\"backend\":\"{}\",\"threads\":{},\"batch\":{},\"load_s\":{:.4},\"gen\":{},\"prefill\":{{{}}},\"decode\":{{{}}},\"prefill_tok_s\":{:.2},\"decode_tok_s\":{:.2},\"peak_rss_kib\":{},\"weights_bytes\":{}}}",
        model.info().backend,
        model.threads(),
        args.batch,
        load_s,
        args.gen,
        map(&prefill_rates),
        map(&decode_rates),
        prefill_rates[0].1,
        decode_rates[0].1,
        peak_rss_kib(),
        model.info().weights_bytes,
    );
    Ok(())
}
