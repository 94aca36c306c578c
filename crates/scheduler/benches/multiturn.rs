//! Multi-turn chats on the scheduler alone (no HTTP): each conversation adds a user message of
//! about 150 tokens per turn and the model's answer, so the prompt grows to about 2,000 tokens by
//! turn 10; the time to first token of every turn, with prefix reuse and without, in one run.
//!
//! ```text
//! cargo bench -p hearth-scheduler --bench multiturn -- \
//!     [--model weights/SmolLM2-135M-Instruct.Q4_1.gguf] [--threads 2] [--turns 10]
//!     [--conversations 1,8] [--max-tokens 32]
//! ```
//! Prints, per number of concurrent conversations, the median TTFT of each turn with and
//! without reuse, their ratio and the prompt length; and the aggregate throughput of each run.

use std::path::PathBuf;
use std::time::Instant;

use hearth_infer::{ChatMessage, Role, SamplingParams, TextModel, TextModelConfig};
use hearth_scheduler::{Request, Scheduler, SchedulerConfig, SchedulerHandle};
use hearth_types::TokenEvent;

#[path = "shared/turns.rs"]
mod turns;
use turns::{user_message, SYSTEM};

struct Args {
    model: PathBuf,
    threads: usize,
    turns: usize,
    conversations: Vec<usize>,
    max_tokens: usize,
}

fn args() -> Args {
    let mut a = Args {
        model: PathBuf::from("weights/SmolLM2-135M-Instruct.Q4_1.gguf"),
        threads: 2,
        turns: 10,
        conversations: vec![1, 8],
        max_tokens: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = value().into(),
            "--threads" => a.threads = value().parse().expect("--threads"),
            "--turns" => a.turns = value().parse().expect("--turns"),
            "--conversations" => {
                a.conversations = value()
                    .split(',')
                    .map(|n| n.parse().expect("--conversations"))
                    .collect()
            }
            "--max-tokens" => a.max_tokens = value().parse().expect("--max-tokens"),
            "--bench" => {} // passed by `cargo bench`
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// One conversation of `turns` turns; the TTFT (ms) and prompt length of each.
async fn conversation(
    sched: SchedulerHandle,
    c: usize,
    turns: usize,
    max_tokens: usize,
) -> Vec<(f64, usize)> {
    let tok = sched.tokenizer();
    let mut messages = vec![ChatMessage::new(Role::System, SYSTEM)];
    let mut out = Vec::with_capacity(turns);
    for turn in 0..turns {
        messages.push(ChatMessage::new(Role::User, user_message(c, turn)));
        let prompt = tok
            .encode(&tok.apply_chat_template(&messages).expect("template"))
            .expect("encode");
        let len = prompt.len();
        let request = Request {
            prompt_ids: prompt,
            params: SamplingParams {
                temperature: 0.0,
                max_tokens,
                ..SamplingParams::default()
            },
            stream_id: format!("c{c}-t{turn}"),
            span: tracing::Span::none(),
            ignore_eos: false,
            constraint: None,
        };
        let t0 = Instant::now();
        let mut generation = sched.submit(request).await.expect("submit");
        let mut ttft = f64::NAN;
        let mut text = String::new();
        while let Some(event) = generation.next().await {
            if let TokenEvent::Token { text: piece, .. } = event {
                if ttft.is_nan() {
                    ttft = t0.elapsed().as_secs_f64() * 1e3;
                }
                text.push_str(&piece);
            }
        }
        out.push((ttft, len));
        messages.push(ChatMessage::new(Role::Assistant, text.trim()));
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every conversation at once; per turn, the median TTFT and the longest prompt; the wall time.
async fn run(sched: &SchedulerHandle, n: usize, a: &Args) -> (Vec<(f64, usize)>, f64) {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|c| tokio::spawn(conversation(sched.clone(), c, a.turns, a.max_tokens)))
        .collect();
    let mut per_conv = Vec::new();
    for t in tasks {
        per_conv.push(t.await.expect("conversation"));
    }
    let wall = t0.elapsed().as_secs_f64();
    let turns = (0..a.turns)
        .map(|t| {
            let ttft = median(per_conv.iter().map(|c| c[t].0).collect());
            let len = per_conv.iter().map(|c| c[t].1).max().unwrap_or(0);
            (ttft, len)
        })
        .collect();
    (turns, wall)
}

fn engine(a: &Args, prefix_reuse: bool) -> SchedulerHandle {
    let model = TextModel::load(&TextModelConfig {
        threads: a.threads,
        // HEARTH_KERNEL=avx512vnni (any path name) forces the fast path's kernels, for A/B runs.
        kernel: std::env::var("HEARTH_KERNEL")
            .ok()
            .and_then(|name| hearth_infer::KernelPath::from_name(&name)),
        ..TextModelConfig::local(&a.model)
    })
    .expect("load the model");
    Scheduler::spawn(
        model,
        SchedulerConfig {
            name: format!("multiturn-{prefix_reuse}"),
            prefix_reuse,
            ..SchedulerConfig::default()
        },
    )
    .expect("spawn")
}

#[tokio::main]
async fn main() {
    let a = args();
    println!(
        "multi-turn chats, scheduler alone: {} threads={} turns={} answer <= {} tokens",
        a.model.display(),
        a.threads,
        a.turns,
        a.max_tokens
    );
    for &n in &a.conversations {
        // Without reuse first, then with, each on a fresh engine (nothing kept from before).
        let without = engine(&a, false);
        let (plain, wall_plain) = run(&without, n, &a).await;
        without.shutdown().await;
        let with = engine(&a, true);
        let (reused, wall_reused) = run(&with, n, &a).await;
        let saved = with.metrics().prefix_reused_tokens;
        with.shutdown().await;
        println!("\n{n} conversation(s): TTFT p50 per turn (ms)");
        println!("| turn | prompt tokens | without reuse | with reuse | with / without |");
        println!("|---:|---:|---:|---:|---:|");
        for (t, ((p, len), (r, _))) in plain.iter().zip(&reused).enumerate() {
            println!("| {} | {len} | {p:.1} | {r:.1} | {:.3} |", t + 1, r / p);
        }
        println!(
            "wall time: {wall_plain:.2} s without reuse, {wall_reused:.2} s with ({:.2}x); prompt tokens reused: {saved}",
            wall_plain / wall_reused
        );
    }
}
