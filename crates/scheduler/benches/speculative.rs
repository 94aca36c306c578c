//! Speculative decoding (prompt lookup) against plain decoding, in one process and one run: two
//! engines on the same GGUF file, one speculating, fed the same greedy requests in alternating
//! order, round after round. For each task (`shared/grounded.rs`: input-grounded work and open
//! chat) and each concurrency level it prints the median aggregate decode rate of each engine
//! (each stream's tokens after its first over the time from its first token to its last, summed
//! over streams), their ratio, the share of drafted tokens the model confirmed, and whether the
//! two engines' outputs were the same text (they must be).
//!
//! ```text
//! cargo bench -p hearth-scheduler --bench speculative -- \
//!     [--model weights/SmolLM2-135M-Instruct.Q4_1.gguf] [--template own|gemma] [--threads 2]
//!     [--streams 1,8] [--max-tokens 160] [--rounds 3] [--tasks summarise,json]
//!     [--json out.jsonl] [--prompts out.json]
//! ```
//! `--template gemma` renders Gemma's turns (the Gemma 3 270M file has no chat template of its
//! own). `--prompts` writes each task's prompt token ids, for the same requests to llama.cpp's
//! server (`scripts/bench-spec.sh`).

use std::path::PathBuf;
use std::time::Instant;

use hearth_infer::{ChatMessage, Role, SamplingParams, TextModel, TextModelConfig};
use hearth_scheduler::{Ngram, Request, Scheduler, SchedulerConfig, SchedulerHandle, Speculation};
use hearth_types::TokenEvent;
use serde_json::json;

#[path = "shared/grounded.rs"]
mod grounded;
#[allow(dead_code)] // quantile only
#[path = "shared/stats.rs"]
mod stats;

struct Args {
    model: PathBuf,
    gemma: bool,
    threads: usize,
    streams: Vec<usize>,
    max_tokens: usize,
    rounds: usize,
    tasks: Option<Vec<String>>,
    json: Option<PathBuf>,
    prompts: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut args = Args {
        model: root.join("weights/SmolLM2-135M-Instruct.Q4_1.gguf"),
        gemma: false,
        threads: 2,
        streams: vec![1, 8],
        max_tokens: 160,
        rounds: 3,
        tasks: None,
        json: None,
        prompts: None,
    };
    let list = |v: String| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .collect::<Vec<_>>()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--model" => args.model = value()?.into(),
            "--template" => args.gemma = value()? == "gemma",
            "--threads" => args.threads = number(value()?)?,
            "--max-tokens" => args.max_tokens = number(value()?)?,
            "--rounds" => args.rounds = number(value()?)?.max(1),
            "--streams" => {
                args.streams = list(value()?)
                    .into_iter()
                    .map(number)
                    .collect::<Result<_, _>>()?
            }
            "--tasks" => args.tasks = Some(list(value()?)),
            "--json" => args.json = Some(value()?.into()),
            "--prompts" => args.prompts = Some(value()?.into()),
            "--bench" => {} // passed by `cargo bench`
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// One level's run on one engine: the decode rate, the tokens, the texts.
struct Run {
    tok_s: f64,
    tokens: usize,
    texts: Vec<String>,
}

/// One stream: its tokens, its decode rate (tokens after the first over the time from the first
/// token's event to the last one's; confirmed drafts arrive together) and its text.
async fn stream(
    sched: SchedulerHandle,
    ids: Vec<u32>,
    max_tokens: usize,
    id: String,
) -> (usize, f64, String) {
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
        ignore_eos: false,
        constraint: None,
    };
    let mut generation = sched.submit(request).await.expect("submit");
    let (mut first, mut last, mut text) = (None::<Instant>, None::<Instant>, String::new());
    let mut tokens = 0;
    while let Some(event) = generation.next().await {
        let now = Instant::now();
        match event {
            TokenEvent::Token { text: piece, .. } => {
                first.get_or_insert(now);
                last = Some(now);
                text.push_str(&piece);
            }
            TokenEvent::Finished { usage, .. } | TokenEvent::Aborted { usage, .. } => {
                tokens = usage.completion_tokens
            }
        }
    }
    let rate = match (first, last) {
        (Some(a), Some(b)) if b > a => (tokens.saturating_sub(1)) as f64 / (b - a).as_secs_f64(),
        _ => 0.0,
    };
    (tokens, rate, text)
}

async fn level(
    sched: &SchedulerHandle,
    ids: &[u32],
    n: usize,
    max_tokens: usize,
    tag: &str,
) -> Run {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(stream(
                sched.clone(),
                ids.to_vec(),
                max_tokens,
                format!("{tag}-{i}"),
            ))
        })
        .collect();
    let mut run = Run {
        tok_s: 0.0,
        tokens: 0,
        texts: Vec::new(),
    };
    for t in tasks {
        let (tokens, rate, text) = t.await.expect("stream task");
        run.tokens += tokens;
        run.tok_s += rate;
        run.texts.push(text);
    }
    run
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    stats::quantile(&v, 0.5)
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("speculative bench: {e}");
        std::process::exit(2)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let load = || {
        TextModel::load(&TextModelConfig {
            threads: args.threads,
            ..TextModelConfig::local(&args.model)
        })
        .unwrap_or_else(|e| {
            eprintln!("cannot load {}: {e}", args.model.display());
            std::process::exit(1)
        })
    };
    let engine = |name: &str, speculation| {
        let config = SchedulerConfig {
            name: name.into(),
            speculation,
            ..SchedulerConfig::default()
        };
        Scheduler::spawn(load(), config).expect("spawn")
    };
    let off = engine("plain", Speculation::Off);
    let on = engine("ngram", Speculation::Ngram(Ngram::default()));
    let tok = on.tokenizer();
    let render = |text: &str| {
        let rendered = if args.gemma {
            format!("<bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n")
        } else {
            tok.apply_chat_template(&[ChatMessage::new(Role::User, text)])
                .expect("template")
        };
        tok.encode(&rendered).expect("encode")
    };
    let model = args
        .model
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    eprintln!(
        "{model}: {} threads, greedy, at most {} tokens, {} rounds",
        args.threads, args.max_tokens, args.rounds
    );
    println!("| task | grounded | streams | tokens | plain tok/s | ngram tok/s | ratio | accepted/drafted | same output |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    let mut lines = Vec::new();
    let mut prompts = serde_json::Map::new();
    for (task, grounded) in grounded::TASKS {
        if args
            .tasks
            .as_ref()
            .is_some_and(|t| !t.iter().any(|x| x == task))
        {
            continue;
        }
        let ids = render(&grounded::prompt(task));
        prompts.insert(task.to_string(), json!(ids));
        for &n in &args.streams {
            let (mut plain, mut ngram) = (Vec::new(), Vec::new());
            let before = on.metrics();
            let mut same = true;
            let mut tokens = 0;
            for round in 0..args.rounds {
                let tag = format!("{task}-{n}-{round}");
                let (a, b) = if round % 2 == 0 {
                    let a = level(&off, &ids, n, args.max_tokens, &format!("off-{tag}")).await;
                    (
                        a,
                        level(&on, &ids, n, args.max_tokens, &format!("on-{tag}")).await,
                    )
                } else {
                    let b = level(&on, &ids, n, args.max_tokens, &format!("on-{tag}")).await;
                    (
                        level(&off, &ids, n, args.max_tokens, &format!("off-{tag}")).await,
                        b,
                    )
                };
                same &= a.texts == b.texts;
                tokens = a.tokens;
                plain.push(a.tok_s);
                ngram.push(b.tok_s);
            }
            let after = on.metrics();
            let drafted = after.drafted_tokens - before.drafted_tokens;
            let accepted = after.accepted_tokens - before.accepted_tokens;
            let (p, s) = (median(plain), median(ngram));
            println!(
                "| {task} | {grounded} | {n} | {tokens} | {p:.1} | {s:.1} | {:.2} | {accepted}/{drafted} | {} |",
                s / p,
                if same { "yes" } else { "NO" }
            );
            lines.push(json!({
                "model": model, "task": task, "grounded": grounded, "streams": n,
                "tokens": tokens, "plain_tok_s": p, "ngram_tok_s": s, "ratio": s / p,
                "drafted": drafted, "accepted": accepted, "same_output": same,
                "threads": args.threads, "rounds": args.rounds,
            }));
        }
    }
    if let Some(path) = &args.json {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(path, text).expect("write --json");
    }
    if let Some(path) = &args.prompts {
        std::fs::write(path, serde_json::Value::Object(prompts).to_string())
            .expect("write --prompts");
    }
    off.shutdown().await;
    on.shutdown().await;
}
