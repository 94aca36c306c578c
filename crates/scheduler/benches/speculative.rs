//! Speculative decoding against plain decoding, in one process and one run: engines on the same
//! GGUF file, one plain, one drafting by prompt lookup and, with `--draft FILE`, one drafting with
//! that smaller model (same tokenizer), fed the same greedy requests in rotating order, round
//! after round. For each task (`shared/grounded.rs`: input-grounded work and open chat) and each
//! concurrency level it prints the median aggregate decode rate of each engine (each stream's
//! tokens after its first over the time from its first token to its last, summed over streams),
//! each speculating engine's ratio to plain, the share of its drafted tokens the model confirmed,
//! and whether the engines' outputs were the same text (they must be).
//!
//! ```text
//! cargo bench -p hearth-scheduler --bench speculative -- \
//!     [--model weights/SmolLM2-135M-Instruct.Q4_1.gguf] [--template own|gemma] [--threads 2]
//!     [--streams 1,8] [--max-tokens 160] [--rounds 3] [--tasks summarise,json]
//!     [--draft weights/SmolLM2-135M-Instruct.Q4_0.gguf] [--json out.jsonl] [--prompts out.json]
//! ```
//! `--template gemma` renders Gemma's turns (the Gemma 3 270M file has no chat template of its
//! own). `--prompts` writes each task's prompt token ids, for the same requests to llama.cpp's
//! server (`scripts/bench-spec.sh`).

use std::path::PathBuf;
use std::time::Instant;

use hearth_infer::{ChatMessage, Role, SamplingParams, TextModel, TextModelConfig};
use hearth_scheduler::{
    DraftModel, Ngram, Request, Scheduler, SchedulerConfig, SchedulerHandle, Speculation,
};
use hearth_types::TokenEvent;
use serde_json::json;

#[path = "shared/grounded.rs"]
mod grounded;
#[allow(dead_code)] // quantile only
#[path = "shared/stats.rs"]
mod stats;

struct Args {
    model: PathBuf,
    draft: Option<PathBuf>,
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
        draft: None,
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
            "--draft" => args.draft = Some(value()?.into()),
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

/// One engine of the comparison and what it measured at the current task and level.
struct Engine {
    name: &'static str,
    handle: SchedulerHandle,
    rates: Vec<f64>,
}

/// One task at one level: every engine, `rounds` times, starting one engine later each round.
async fn compare(
    engines: &mut [Engine],
    ids: &[u32],
    n: usize,
    args: &Args,
    tag: &str,
) -> (usize, bool) {
    let (mut tokens, mut same) = (0, true);
    for e in engines.iter_mut() {
        e.rates.clear();
    }
    for round in 0..args.rounds {
        let mut texts: Option<Vec<String>> = None;
        for k in 0..engines.len() {
            let e = &mut engines[(round + k) % engines.len()];
            let run = level(
                &e.handle,
                ids,
                n,
                args.max_tokens,
                &format!("{}-{tag}-{round}", e.name),
            )
            .await;
            e.rates.push(run.tok_s);
            tokens = run.tokens;
            match &texts {
                None => texts = Some(run.texts),
                Some(t) => same &= *t == run.texts,
            }
        }
    }
    (tokens, same)
}

async fn run(args: Args) {
    let load = |file: &PathBuf| {
        TextModel::load(&TextModelConfig {
            threads: args.threads,
            ..TextModelConfig::local(file)
        })
        .unwrap_or_else(|e| {
            eprintln!("cannot load {}: {e}", file.display());
            std::process::exit(1)
        })
    };
    let config = |name: &str, speculation| SchedulerConfig {
        name: name.into(),
        speculation,
        ..SchedulerConfig::default()
    };
    let spawn = |name: &'static str, speculation| Engine {
        name,
        handle: Scheduler::spawn(load(&args.model), config(name, speculation)).expect("spawn"),
        rates: Vec::new(),
    };
    let mut engines = vec![
        spawn("plain", Speculation::Off),
        spawn("ngram", Speculation::Ngram(Ngram::default())),
    ];
    if let Some(draft) = &args.draft {
        let c = config("draft", Speculation::Draft(DraftModel::default()));
        let handle =
            Scheduler::spawn_with_draft(load(&args.model), load(draft), c).unwrap_or_else(|e| {
                eprintln!("cannot draft with {}: {e}", draft.display());
                std::process::exit(1)
            });
        engines.push(Engine {
            name: "draft",
            handle,
            rates: Vec::new(),
        });
    }
    let tok = engines[0].handle.tokenizer();
    let render = |text: &str| {
        let rendered = if args.gemma {
            format!("<bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n")
        } else {
            tok.apply_chat_template(&[ChatMessage::new(Role::User, text)])
                .expect("template")
        };
        tok.encode(&rendered).expect("encode")
    };
    let file_name = |p: &PathBuf| {
        p.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let model = file_name(&args.model);
    let draft = args.draft.as_ref().map(file_name);
    eprintln!(
        "{model}{}: {} threads, greedy, at most {} tokens, {} rounds",
        draft
            .as_ref()
            .map(|d| format!(" (draft {d})"))
            .unwrap_or_default(),
        args.threads,
        args.max_tokens,
        args.rounds
    );
    let speculating: Vec<&str> = engines[1..].iter().map(|e| e.name).collect();
    let heads: String = speculating
        .iter()
        .map(|n| format!(" {n} tok/s | ratio | accepted/drafted |"))
        .collect();
    println!("| task | grounded | streams | tokens | plain tok/s |{heads} same output |");
    println!(
        "|---|---|---:|---:|---:|{}---|",
        "---:|---:|---:|".repeat(speculating.len())
    );
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
            let before: Vec<_> = engines.iter().map(|e| e.handle.metrics()).collect();
            let (tokens, same) =
                compare(&mut engines, &ids, n, &args, &format!("{task}-{n}")).await;
            let plain = median(engines[0].rates.clone());
            let mut line = json!({
                "model": model, "draft": draft, "task": task, "grounded": grounded, "streams": n,
                "tokens": tokens, "plain_tok_s": plain, "same_output": same,
                "threads": args.threads, "rounds": args.rounds,
            });
            let mut cells = String::new();
            for (e, before) in engines.iter().zip(&before).skip(1) {
                let after = e.handle.metrics();
                let drafted = after.drafted_tokens - before.drafted_tokens;
                let accepted = after.accepted_tokens - before.accepted_tokens;
                let rate = median(e.rates.clone());
                cells += &format!(" {rate:.1} | {:.2} | {accepted}/{drafted} |", rate / plain);
                let name = e.name;
                line[format!("{name}_tok_s")] = json!(rate);
                line[format!("{name}_ratio")] = json!(rate / plain);
                line[format!("{name}_drafted")] = json!(drafted);
                line[format!("{name}_accepted")] = json!(accepted);
            }
            println!(
                "| {task} | {grounded} | {n} | {tokens} | {plain:.1} |{cells} {} |",
                if same { "yes" } else { "NO" }
            );
            lines.push(line);
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
    for e in engines {
        e.handle.shutdown().await;
    }
}
