//! HTTP load generator for streamed completions: N concurrent SSE streams at a time, measuring
//! time to first token, inter-token latency p50/p99 and aggregate output tokens/s.
//!
//! ```text
//! cargo bench --bench loadgen -- --url http://127.0.0.1:8081 --token <serviceToken> \
//!     [--target hearth|openai|llama] [--model alpha-3.3] [--streams 1,4,8,16] [--max-tokens 64]
//!     [--ignore-eos] [--json out.jsonl]
//! ```
//! `--target hearth` posts the spec's completion request to `{url}/stream` and reads `{token}`
//! events until `{completed}`; `--target llama` posts an OpenAI-style chat request to
//! llama.cpp's `llama-server` (`{url}/v1/chat/completions`), for the same figures on the same
//! model; `--target openai` posts the same request to Hearth's OpenAI route (with `model` and
//! the token as a bearer header). Only loopback addresses are accepted. Prompts are the scheduler bench's.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "shared/http.rs"]
mod http;
#[path = "../crates/scheduler/benches/shared/prompts.rs"]
mod prompts;
#[path = "../crates/scheduler/benches/shared/stats.rs"]
mod stats;
use http::read_sse;
use prompts::PROMPTS;
use stats::{decode_rate, quantile};

#[derive(Clone)]
struct Args {
    url: String,
    target: Target,
    token: String,
    model: String,
    streams: Vec<usize>,
    max_tokens: usize,
    ignore_eos: bool,
    json: Option<String>,
    label: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Target {
    Hearth,
    /// Hearth's `/v1/chat/completions`.
    OpenAi,
    Llama,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: String::new(),
        target: Target::Hearth,
        token: String::new(),
        model: "alpha-3.3".into(),
        streams: vec![1, 4, 8, 16],
        max_tokens: 64,
        ignore_eos: false,
        json: None,
        label: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = http::loopback(&value()?)?,
            "--token" => args.token = value()?,
            "--model" => args.model = value()?,
            "--label" => args.label = Some(value()?),
            "--target" => {
                args.target = match value()?.as_str() {
                    "hearth" => Target::Hearth,
                    "openai" => Target::OpenAi,
                    "llama" => Target::Llama,
                    other => {
                        return Err(format!(
                            "--target {other}: expected hearth, openai or llama"
                        ))
                    }
                }
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
            "--ignore-eos" => args.ignore_eos = true,
            "--json" => args.json = Some(value()?),
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.url.is_empty() {
        return Err("--url is required".into());
    }
    if args.target != Target::Llama && args.token.is_empty() {
        return Err("--token is required for --target hearth and openai".into());
    }
    Ok(args)
}

/// One stream's observations.
struct StreamStats {
    tokens: usize,
    ttft_ms: f64,
    gaps_ms: Vec<f64>,
}

async fn one_stream(
    client: reqwest::Client,
    args: Args,
    prompt: &'static str,
    t0: Instant,
) -> Result<StreamStats, String> {
    let (url, body) = match args.target {
        Target::Hearth => (
            format!("{}/stream", args.url),
            json!({
                "serviceToken": args.token,
                "model": args.model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.0,
                "maxOutputTokens": args.max_tokens,
            }),
        ),
        Target::OpenAi | Target::Llama => {
            let mut body = json!({
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": args.max_tokens,
                "temperature": 0.0,
                "stream": true,
                "ignore_eos": args.ignore_eos,
                "stream_options": {"include_usage": true},
            });
            if args.target == Target::OpenAi {
                body["model"] = json!(args.model);
            } else {
                body["top_k"] = json!(1);
                body["cache_prompt"] = json!(false);
            }
            (format!("{}/v1/chat/completions", args.url), body)
        }
    };
    let mut request = client.post(&url).json(&body);
    if args.target == Target::OpenAi {
        request = request.bearer_auth(&args.token);
    }
    let response = http::send(request, &url).await?;
    let mut stats = StreamStats {
        tokens: 0,
        ttft_ms: f64::NAN,
        gaps_ms: Vec::new(),
    };
    let mut last: Option<Instant> = None;
    let mut counted = 0usize;
    let mut error = None;
    let target = args.target;
    read_sse(response, |data| {
        let now = Instant::now();
        let mut piece = false;
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
        match target {
            Target::Hearth => {
                if value.get("token").is_some() {
                    piece = true;
                } else if value.get("completed").is_some() || value.get("aborted").is_some() {
                    stats.tokens = value["response"]["usage"]["completionTokens"]
                        .as_u64()
                        .unwrap_or(0) as usize;
                    if value.get("aborted").is_some() {
                        error = Some(format!("stream aborted: {data}"));
                    }
                    return false;
                }
            }
            Target::OpenAi | Target::Llama => {
                if let Some(n) = value["usage"]["completion_tokens"].as_u64() {
                    stats.tokens = n as usize;
                }
                let content = &value["choices"][0]["delta"]["content"];
                if content.as_str().is_some_and(|s| !s.is_empty()) {
                    piece = true;
                    counted += 1;
                }
            }
        }
        if piece {
            match last {
                None => stats.ttft_ms = (now - t0).as_secs_f64() * 1e3,
                Some(prev) => stats.gaps_ms.push((now - prev).as_secs_f64() * 1e3),
            }
            last = Some(now);
        }
        true
    })
    .await?;
    if let Some(e) = error {
        return Err(e);
    }
    if stats.tokens == 0 {
        stats.tokens = counted;
    }
    Ok(stats)
}

/// What one concurrency level measured.
struct Level {
    tokens: usize,
    wall: Duration,
    /// Aggregate decode tokens/s (see `stats::decode_rate`).
    decode_tok_s: f64,
    ttft: Vec<f64>,
    itl: Vec<f64>,
}

async fn level(client: &reqwest::Client, args: &Args, n: usize) -> Result<Level, String> {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(one_stream(
                client.clone(),
                args.clone(),
                PROMPTS[i % PROMPTS.len()],
                t0,
            ))
        })
        .collect();
    let (mut tokens, mut ttft, mut itl, mut per_stream) = (0, Vec::new(), Vec::new(), Vec::new());
    for task in tasks {
        let s = task.await.map_err(|e| e.to_string())??;
        tokens += s.tokens;
        ttft.push(s.ttft_ms);
        itl.extend_from_slice(&s.gaps_ms);
        per_stream.push(s.gaps_ms);
    }
    let wall = t0.elapsed();
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    Ok(Level {
        tokens,
        wall,
        decode_tok_s: decode_rate(&per_stream),
        ttft,
        itl,
    })
}

async fn run(args: Args) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| e.to_string())?;
    // Warm-up at the largest level: connections, weights paged in, and the server's KV caches
    // and worker threads allocated, as on a server that has been running (the scheduler bench
    // warms up the same way).
    let max_streams = args.streams.iter().copied().max().unwrap_or(1);
    level(&client, &args, max_streams).await?;
    let label = args.label.clone().unwrap_or_else(|| match args.target {
        Target::Hearth => "hearth-http".into(),
        Target::OpenAi => "hearth-v1".into(),
        Target::Llama => "llama-server".into(),
    });
    println!(
        "{label}: {} max_tokens={}{}",
        args.url,
        args.max_tokens,
        if args.ignore_eos {
            " (eos ignored)"
        } else {
            ""
        }
    );
    println!("| streams | tokens | wall s | tok/s (wall) | decode tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut json_lines = String::new();
    for &n in &args.streams {
        let Level {
            tokens,
            wall,
            decode_tok_s,
            ttft,
            itl,
        } = level(&client, &args, n).await?;
        let tps = tokens as f64 / wall.as_secs_f64();
        println!(
            "| {n} | {tokens} | {:.2} | {tps:.1} | {decode_tok_s:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            wall.as_secs_f64(),
            quantile(&ttft, 0.5),
            quantile(&ttft, 0.99),
            quantile(&itl, 0.5),
            quantile(&itl, 0.99)
        );
        json_lines.push_str(
            &json!({
                "target": label,
                "streams": n,
                "tokens": tokens,
                "wall_s": wall.as_secs_f64(),
                "tok_s": tps,
                "decode_tok_s": decode_tok_s,
                "ttft_p50_ms": quantile(&ttft, 0.5),
                "itl_p50_ms": quantile(&itl, 0.5),
                "itl_p99_ms": quantile(&itl, 0.99),
            })
            .to_string(),
        );
        json_lines.push('\n');
    }
    if let Some(path) = &args.json {
        std::fs::write(path, json_lines).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn main() {
    http::main_with("loadgen", parse_args(), run);
}
