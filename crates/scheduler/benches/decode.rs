//! Aggregate decode throughput and inter-token latency of the scheduler alone (no HTTP), at
//! several concurrency levels, on a real GGUF model.
//!
//! ```text
//! cargo bench -p hearth-scheduler --bench decode -- \
//!     [--model weights/SmolLM2-135M-Instruct.Q4_1.gguf] [--threads 2] [--streams 1,2,4,8,16]
//!     [--max-tokens 64] [--natural-stop] [--schema] [--json out.jsonl]
//! ```
//! Every stream generates exactly `--max-tokens` tokens (end-of-sequence ignored) unless
//! `--natural-stop` is given. Prints a Markdown table; `--json` also writes one JSON object per
//! concurrency level (the format `benches/loadgen.rs` writes, so scripts can compare them).
//! `--schema` runs every level twice in a row, plain and then with each stream constrained by a
//! JSON schema (hearth-grammar; a list of at least 200 objects with free-text fields, which no
//! stream can finish within `--max-tokens`), and prints the constrained/plain ratios, the
//! constraint's own time per token and the sampler's with and without a mask. `--rounds N`
//! repeats every level N times, alternating plain and constrained; ratios are of the medians.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use decode_schema::{Clock, Timed};
use hearth_grammar::Grammars;
use hearth_infer::{
    ChatMessage, Role, SamplingParams, TextModel, TextModelConfig, TokenConstraint,
};
use hearth_scheduler::{Request, Scheduler, SchedulerConfig, SchedulerHandle};
use hearth_types::TokenEvent;

#[path = "decode_schema.rs"]
mod decode_schema;
#[path = "shared/prompts.rs"]
mod prompts;
#[path = "shared/stats.rs"]
mod stats;
use prompts::PROMPTS;
use stats::{decode_rate, quantile};

struct Args {
    model: PathBuf,
    threads: usize,
    streams: Vec<usize>,
    max_tokens: usize,
    natural_stop: bool,
    schema: bool,
    rounds: usize,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut args = Args {
        model: root.join("weights/SmolLM2-135M-Instruct.Q4_1.gguf"),
        threads: 2,
        streams: vec![1, 2, 4, 8, 16],
        max_tokens: 64,
        natural_stop: false,
        schema: false,
        rounds: 1,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = value()?.into(),
            "--threads" => {
                args.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?
            }
            "--max-tokens" => {
                args.max_tokens = value()?.parse().map_err(|e| format!("--max-tokens: {e}"))?
            }
            "--streams" => {
                args.streams = value()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--streams: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--natural-stop" => args.natural_stop = true,
            "--schema" => args.schema = true,
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--json" => args.json = Some(value()?.into()),
            "--bench" => {} // passed by `cargo bench`
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// What one concurrency level measured.
struct Level {
    tokens: usize,
    wall: Duration,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    /// Aggregate decode tokens/s (see `stats::decode_rate`).
    decode_tok_s: f64,
}

async fn one_stream(
    sched: SchedulerHandle,
    ids: Vec<u32>,
    max_tokens: usize,
    ignore_eos: bool,
    id: String,
    t0: Instant,
    grammars: Option<(Grammars, Arc<Clock>)>,
) -> (usize, f64, Vec<f64>) {
    let constraint = grammars.map(|(g, clock)| {
        let inner = g
            .json_schema(&decode_schema::schema())
            .expect("the schema compiles");
        Box::new(Timed { inner, clock }) as Box<dyn TokenConstraint>
    });
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    };
    let request = Request {
        prompt_ids: ids,
        params,
        stream_id: id,
        span: tracing::Span::none(),
        ignore_eos,
        constraint,
    };
    let mut generation = sched.submit(request).await.expect("submit");
    let mut last: Option<Instant> = None;
    let mut ttft = f64::NAN;
    let mut gaps = Vec::new();
    let mut tokens = 0;
    while let Some(event) = generation.next().await {
        let now = Instant::now();
        match event {
            TokenEvent::Token { .. } => {
                match last {
                    None => ttft = (now - t0).as_secs_f64() * 1e3,
                    Some(prev) => gaps.push((now - prev).as_secs_f64() * 1e3),
                }
                last = Some(now);
            }
            TokenEvent::Finished { usage, .. } => tokens = usage.completion_tokens,
            TokenEvent::Aborted { usage, reason } => panic!("stream aborted: {reason:?} {usage:?}"),
        }
    }
    (tokens, ttft, gaps)
}

async fn level(
    sched: &SchedulerHandle,
    prompts: &[Vec<u32>],
    n: usize,
    args: &Args,
    grammars: Option<&(Grammars, Arc<Clock>)>,
) -> Level {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(one_stream(
                sched.clone(),
                prompts[i % prompts.len()].clone(),
                args.max_tokens,
                !args.natural_stop,
                format!("bench-{n}-{i}-{}", grammars.is_some()),
                t0,
                grammars.cloned(),
            ))
        })
        .collect();
    let mut out = Level {
        tokens: 0,
        wall: Duration::ZERO,
        ttft: vec![],
        itl: vec![],
        decode_tok_s: 0.0,
    };
    let mut per_stream = Vec::with_capacity(n);
    for task in tasks {
        let (tokens, ttft, gaps) = task.await.expect("stream task");
        out.tokens += tokens;
        out.ttft.push(ttft);
        out.itl.extend_from_slice(&gaps);
        per_stream.push(gaps);
    }
    out.decode_tok_s = decode_rate(&per_stream);
    out.wall = t0.elapsed();
    out.ttft.sort_by(f64::total_cmp);
    out.itl.sort_by(f64::total_cmp);
    out
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("decode bench: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let config = TextModelConfig {
        threads: args.threads,
        // HEARTH_KERNEL=avx512vnni (any path name) forces the fast path's kernels, for A/B runs.
        kernel: std::env::var("HEARTH_KERNEL")
            .ok()
            .and_then(|name| hearth_infer::KernelPath::from_name(&name)),
        ..TextModelConfig::local(&args.model)
    };
    let started = Instant::now();
    let model = TextModel::load(&config).unwrap_or_else(|e| {
        eprintln!("cannot load {}: {e}", args.model.display());
        std::process::exit(1)
    });
    eprintln!(
        "loaded {} ({} backend, {} threads) in {:.1}s",
        args.model.display(),
        model.info().backend,
        model.threads(),
        started.elapsed().as_secs_f64()
    );
    let max_streams = args.streams.iter().copied().max().unwrap_or(1);
    let sched = Scheduler::spawn(
        model,
        SchedulerConfig {
            name: "bench".into(),
            max_active: max_streams,
            ..SchedulerConfig::default()
        },
    )
    .expect("spawn");
    let tok = sched.tokenizer();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| {
            let text = tok
                .apply_chat_template(&[ChatMessage::new(Role::User, *p)])
                .expect("template");
            tok.encode(&text).expect("encode")
        })
        .collect();
    // Warm-up at the largest level: page the weights in, size the buffers, and allocate the
    // KV caches that a server which has been running keeps (as `loadgen` does over HTTP).
    let _ = level(&sched, &prompts, max_streams, &args, None).await;
    let grammars = args.schema.then(|| {
        let started = Instant::now();
        let g = Grammars::new(&tok).expect("token table");
        eprintln!(
            "grammar token table built in {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        let (plain, masked) = decode_schema::sampler_cost(tok.vocab_size());
        eprintln!(
            "sampler, greedy over {} logits: {plain:.1} µs plain, {masked:.1} µs with a mask",
            tok.vocab_size()
        );
        (g, Arc::new(Clock::default()))
    });

    println!(
        "scheduler alone: {} threads={} max_tokens={} ({})",
        args.model
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?"),
        args.threads,
        args.max_tokens,
        if args.natural_stop {
            "natural stop"
        } else {
            "eos ignored"
        }
    );
    println!("| streams | tokens | wall s | tok/s (wall) | decode tok/s | decode × 1 stream | TTFT p50 ms | ITL p50 ms | ITL p99 ms | p99 × 1 stream |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut base: Option<(f64, f64)> = None;
    let mut json = String::new();
    // Per level: the rates of every plain and every constrained run.
    let mut runs: Vec<LevelRuns> = Vec::new();
    for &n in &args.streams {
        let (mut plain, mut constrained, mut mask_us) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..args.rounds {
            // Plain, then (with --schema) constrained.
            for schema in std::iter::once(None).chain(grammars.as_ref().map(Some)) {
                let l = level(&sched, &prompts, n, &args, schema).await;
                let tps = l.tokens as f64 / l.wall.as_secs_f64();
                let p99 = quantile(&l.itl, 0.99);
                let (dps1, p99_1) = *base.get_or_insert((l.decode_tok_s, p99));
                let label = match (schema.is_some(), args.rounds > 1) {
                    (false, false) => n.to_string(),
                    (true, false) => format!("{n} schema"),
                    (false, true) => format!("{n} (round {})", round + 1),
                    (true, true) => format!("{n} schema (round {})", round + 1),
                };
                println!(
                    "| {} | {} | {:.2} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} |",
                    label,
                    l.tokens,
                    l.wall.as_secs_f64(),
                    tps,
                    l.decode_tok_s,
                    l.decode_tok_s / dps1,
                    quantile(&l.ttft, 0.5),
                    quantile(&l.itl, 0.5),
                    p99,
                    p99 / p99_1
                );
                json.push_str(&format!(
                    "{{\"target\":\"scheduler\",\"streams\":{},\"schema\":{},\"tokens\":{},\"wall_s\":{:.4},\"tok_s\":{:.3},\"decode_tok_s\":{:.3},\"ttft_p50_ms\":{:.3},\"itl_p50_ms\":{:.3},\"itl_p99_ms\":{:.3}}}\n",
                    n,
                    schema.is_some(),
                    l.tokens,
                    l.wall.as_secs_f64(),
                    tps,
                    l.decode_tok_s,
                    quantile(&l.ttft, 0.5),
                    quantile(&l.itl, 0.5),
                    p99
                ));
                let rates = Rates {
                    wall: tps,
                    decode: l.decode_tok_s,
                };
                match schema {
                    None => plain.push(rates),
                    Some((_, clock)) => {
                        constrained.push(rates);
                        mask_us.push(clock.take().0);
                    }
                }
            }
        }
        let mask_us = mask_us.iter().sum::<f64>() / mask_us.len().max(1) as f64;
        runs.push(LevelRuns {
            streams: n,
            plain,
            constrained,
            mask_us,
        });
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    for r in runs.iter().filter(|r| !r.constrained.is_empty()) {
        let pick = |runs: &[Rates], rate: fn(&Rates) -> f64| {
            median(&runs.iter().map(rate).collect::<Vec<_>>())
        };
        println!(
            "schema/plain at {} streams (medians of {}): tok/s (wall) {:.1} %, decode tok/s {:.1} %; constraint {:.0} µs per token (mask + commit)",
            r.streams,
            r.plain.len(),
            pick(&r.constrained, |r| r.wall) / pick(&r.plain, |r| r.wall) * 100.0,
            pick(&r.constrained, |r| r.decode) / pick(&r.plain, |r| r.decode) * 100.0,
            r.mask_us,
        );
    }
    let m = sched.metrics();
    println!(
        "engine: {} steps, step time p50 {:.1} ms, batch rows max {}",
        m.steps,
        m.step_time_us.p50 / 1e3,
        m.batch_rows.max
    );
    if let Some(path) = &args.json {
        std::fs::write(path, json).expect("write --json");
    }
    sched.shutdown().await;
}

/// Tokens per second of one run: over its wall time, and over its decode steps.
#[derive(Clone, Copy)]
struct Rates {
    wall: f64,
    decode: f64,
}

/// Every run of one level of streams, plain and constrained, and the constraint's own time.
struct LevelRuns {
    streams: usize,
    plain: Vec<Rates>,
    constrained: Vec<Rates>,
    mask_us: f64,
}
