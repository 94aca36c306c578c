//! Multi-turn chats over HTTP, against any OpenAI-compatible server on this machine (Hearth's
//! `/v1/chat/completions`, llama.cpp's `llama-server`): each conversation adds a user message of
//! about 150 tokens per turn and the model's answer, so the prompt grows to about 2,000 tokens
//! by turn 10. Reports the time to first token of every turn (median over the conversations),
//! the wall time and the aggregate output tokens/s, per number of concurrent conversations.
//!
//! ```text
//! cargo bench --bench chat_turns -- --url http://127.0.0.1:8082 [--token <serviceToken>] \
//!     [--model alpha-3.3] [--turns 10] [--conversations 1,8] [--max-tokens 32] \
//!     [--label hearth] [--json out.jsonl]
//! ```
//! Answers are greedy and exactly `--max-tokens` long (`ignore_eos`, which both servers read),
//! so that every server sees the same prompt lengths. The conversations are the scheduler's
//! `multiturn` bench's. Only loopback addresses are accepted.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "shared/http.rs"]
mod http;
#[path = "../crates/scheduler/benches/shared/turns.rs"]
mod turns;
use http::read_sse;
use turns::{user_message, SYSTEM};

#[derive(Clone)]
struct Args {
    url: String,
    token: String,
    model: String,
    label: String,
    turns: usize,
    conversations: Vec<usize>,
    max_tokens: usize,
    json: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: String::new(),
        token: String::new(),
        model: "alpha-3.3".into(),
        label: "server".into(),
        turns: 10,
        conversations: vec![1, 8],
        max_tokens: 32,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--url" => args.url = http::loopback(&value()?)?,
            "--token" => args.token = value()?,
            "--model" => args.model = value()?,
            "--label" => args.label = value()?,
            "--turns" => args.turns = number(value()?)?,
            "--max-tokens" => args.max_tokens = number(value()?)?,
            "--conversations" => {
                args.conversations = value()?
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse()
                            .map_err(|e| format!("--conversations: {e}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--json" => args.json = Some(value()?),
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.url.is_empty() {
        return Err("--url is required".into());
    }
    Ok(args)
}

/// One turn's observations.
struct Turn {
    ttft_ms: f64,
    prompt_tokens: u64,
    completion_tokens: u64,
    answer: String,
}

/// One streamed chat request; its time to the first piece of content.
async fn turn(client: &reqwest::Client, args: &Args, messages: &[Value]) -> Result<Turn, String> {
    let url = format!("{}/v1/chat/completions", args.url);
    let body = json!({
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    let t0 = Instant::now();
    let response = http::send(client.post(&url).bearer_auth(&args.token).json(&body), &url).await?;
    let mut out = Turn {
        ttft_ms: f64::NAN,
        prompt_tokens: 0,
        completion_tokens: 0,
        answer: String::new(),
    };
    let mut error = None;
    read_sse(response, |data| {
        if data == "[DONE]" {
            return false;
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                error = Some(format!("bad event {data:?}: {e}"));
                return false;
            }
        };
        if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
            out.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
            out.completion_tokens = usage["completion_tokens"].as_u64().unwrap_or(0);
        }
        if let Some(piece) = value["choices"][0]["delta"]["content"].as_str() {
            if !piece.is_empty() && out.ttft_ms.is_nan() {
                out.ttft_ms = t0.elapsed().as_secs_f64() * 1e3;
            }
            out.answer.push_str(piece);
        }
        true
    })
    .await?;
    match error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Conversation `c`, `turns` turns long, each answer added to its history.
async fn conversation(
    client: reqwest::Client,
    args: Args,
    c: usize,
    turns: usize,
) -> Result<Vec<Turn>, String> {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    let mut out = Vec::with_capacity(turns);
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": user_message(c, t)}));
        let done = turn(&client, &args, &messages).await?;
        messages.push(json!({"role": "assistant", "content": done.answer.trim()}));
        out.push(done);
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `n` conversations at once: per turn the median TTFT and the longest prompt; the wall time
/// and the output tokens.
async fn level(client: &reqwest::Client, args: &Args, n: usize) -> Result<Value, String> {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|c| tokio::spawn(conversation(client.clone(), args.clone(), c, args.turns)))
        .collect();
    let mut all = Vec::with_capacity(n);
    for task in tasks {
        all.push(task.await.map_err(|e| e.to_string())??);
    }
    let wall = t0.elapsed().as_secs_f64();
    let ttft: Vec<f64> = (0..args.turns)
        .map(|t| median(all.iter().map(|c| c[t].ttft_ms).collect()))
        .collect();
    let prompt: Vec<u64> = (0..args.turns)
        .map(|t| all.iter().map(|c| c[t].prompt_tokens).max().unwrap_or(0))
        .collect();
    let tokens: u64 = all.iter().flatten().map(|t| t.completion_tokens).sum();
    Ok(json!({
        "label": args.label,
        "conversations": n,
        "ttft_ms": ttft,
        "prompt_tokens": prompt,
        "wall_s": wall,
        "completion_tokens": tokens,
        "tok_s": tokens as f64 / wall,
    }))
}

async fn run(args: Args) -> Result<(), String> {
    // A new connection per request: llama-server closes a keep-alive connection after 5 s idle,
    // and a pooled one closed in that instant fails the request. Connecting over loopback costs
    // microseconds against TTFTs of tens of milliseconds, and every server gets the same.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1800))
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| e.to_string())?;
    // Warm-up: one short conversation of its own (connections, weights paged in, buffers).
    conversation(client.clone(), args.clone(), 1000, 1).await?;
    let mut lines = String::new();
    for &n in &args.conversations {
        let result = level(&client, &args, n).await?;
        println!(
            "{}: {n} conversation(s), wall {:.1} s, {:.1} output tok/s; TTFT p50 per turn (ms): {}",
            args.label,
            result["wall_s"].as_f64().unwrap_or(f64::NAN),
            result["tok_s"].as_f64().unwrap_or(f64::NAN),
            result["ttft_ms"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| format!("{:.0}", v.as_f64().unwrap_or(f64::NAN)))
                .collect::<Vec<_>>()
                .join(" ")
        );
        lines.push_str(&result.to_string());
        lines.push('\n');
    }
    if let Some(path) = &args.json {
        std::fs::write(path, lines).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn main() {
    http::main_with("chat_turns", parse_args(), run);
}
