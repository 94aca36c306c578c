//! Speculative decoding (prompt lookup) changes how many steps a generation takes, never what it
//! generates: with the real SmolLM2 and Gemma 3 weights and every architecture fixture, greedy
//! output with speculation is token for token the output without it (prompts that copy their
//! input, where drafts are taken, and open prompts, where they mostly are not); sampled output is
//! the same for the same seed, and the distribution of a sampled position over many seeds matches;
//! grammar-constrained output, stop strings, `max_tokens` inside a draft and prefix reuse all
//! hold.

mod support;

use std::path::{Path, PathBuf};

use hearth_grammar::Grammars;
use hearth_infer::{BackendChoice, SamplingParams, TextModel, TextModelConfig};
use hearth_scheduler::{Ngram, Request, Scheduler, SchedulerConfig, SchedulerHandle, Speculation};
use hearth_types::TokenEvent;
use serde_json::json;
use support::*;

fn spec_config(name: &str, on: bool) -> SchedulerConfig {
    SchedulerConfig {
        name: name.into(),
        speculation: if on {
            Speculation::Ngram(Ngram::default())
        } else {
            Speculation::Off
        },
        ..SchedulerConfig::default()
    }
}

fn pair(load: impl Fn() -> TextModel) -> (SchedulerHandle, SchedulerHandle) {
    let on = Scheduler::spawn(load(), spec_config("spec", true)).expect("spawn");
    let off = Scheduler::spawn(load(), spec_config("plain", false)).expect("spawn");
    (on, off)
}

fn gemma3_model() -> TextModel {
    weights_model("gemma-3-270m-Q4_K_M.gguf")
}

/// What a generation gave: every token id (each reported once with its log-probability), the
/// text, and the final event.
#[derive(Debug, PartialEq)]
struct Generated {
    ids: Vec<u32>,
    text: String,
    end: String,
}

async fn generate(sched: &SchedulerHandle, request: Request) -> Generated {
    let mut g = sched.submit(request).await.expect("submit");
    let mut out = Generated {
        ids: Vec::new(),
        text: String::new(),
        end: String::new(),
    };
    while let Some(event) = g.next().await {
        match event {
            TokenEvent::Token { text, logprobs, .. } => {
                out.text.push_str(&text);
                out.ids.extend(logprobs.iter().map(|l| l.id));
            }
            other => out.end = format!("{other:?}"),
        }
    }
    out
}

fn with_logprobs(params: SamplingParams) -> SamplingParams {
    SamplingParams {
        logprobs: Some(0),
        ..params
    }
}

/// Prompts a team's box sees: copying from the input, and open ones.
const TASKS: [&str; 4] = [
    "Repeat this sentence exactly, word for word: The quick brown fox jumps over the lazy dog \
     near the river bank, and then the quick brown fox jumps over the lazy dog again.",
    "Here is some code:\nfn add(a: i32, b: i32) -> i32 {\n    a + b\n}\nfn sub(a: i32, b: i32) -> \
     i32 {\n    a - b\n}\nRewrite the code above, renaming add to plus.",
    "Write a short poem about the sea.",
    "List the days of the week.",
];

/// Greedy generations of `prompts` on both engines, two at a time (so drafting rows share steps
/// with plain ones); asserts they agree and returns (drafted, accepted) of the speculating one.
async fn agree(
    on: &SchedulerHandle,
    off: &SchedulerHandle,
    prompts: &[Vec<u32>],
    max: usize,
) -> (u64, u64) {
    for (n, pair) in prompts.chunks(2).enumerate() {
        let mut with = Vec::new();
        let mut without = Vec::new();
        for (k, ids) in pair.iter().enumerate() {
            let req = |s: &str| {
                request(
                    ids.clone(),
                    with_logprobs(greedy(max)),
                    &format!("{s}-{n}-{k}"),
                )
            };
            with.push(generate(on, req("on")));
            without.push(generate(off, req("off")));
        }
        let with = futures::future::join_all(with).await;
        let without = futures::future::join_all(without).await;
        for (w, wo) in with.iter().zip(&without) {
            assert!(!w.ids.is_empty());
            assert_eq!(w, wo, "speculation changed a greedy generation");
        }
    }
    let m = on.metrics();
    (m.drafted_tokens, m.accepted_tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_the_same_with_and_without_speculation_on_smollm2_and_gemma3() {
    let (on, off) = pair(smollm2_model);
    let prompts: Vec<Vec<u32>> = TASKS.iter().map(|t| prompt(&on, t)).collect();
    let (drafted, accepted) = agree(&on, &off, &prompts, 64).await;
    // How much is drafted depends on the step times the engine learns (the machine's load),
    // never on the output: that copying prompts take some drafts is all this can ask.
    assert!(
        accepted > 0,
        "copying prompts take drafts: {accepted} of {drafted}"
    );
    assert!(
        on.metrics().steps < off.metrics().steps,
        "fewer steps with speculation"
    );

    let (on, off) = pair(gemma3_model);
    let tok = on.tokenizer();
    let prompts: Vec<Vec<u32>> = TASKS
        .iter()
        .map(|t| {
            tok.encode(&format!(
                "<start_of_turn>user\n{t}<end_of_turn>\n<start_of_turn>model\n"
            ))
            .unwrap()
        })
        .collect();
    let (drafted, accepted) = agree(&on, &off, &prompts, 48).await;
    assert!(
        accepted > 0,
        "Gemma 3 takes drafts too: {accepted} of {drafted}"
    );
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/arch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_the_same_with_and_without_speculation_on_every_architecture_fixture() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixtures")
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-q4_k_m.gguf"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "every architecture: {files:?}");
    let mut accepted = 0;
    for file in &files {
        let load = || {
            TextModel::load(&TextModelConfig {
                threads: 2,
                backend: BackendChoice::Fast,
                ..TextModelConfig::local(file)
            })
            .expect("load fixture")
        };
        let (on, off) = pair(load);
        let tok = on.tokenizer();
        // Random weights loop soon; a prompt that repeats itself gives lookup something to find.
        let prompts: Vec<Vec<u32>> = ["one two three four one two three four one two", "hello"]
            .iter()
            .map(|t| tok.encode(t).unwrap())
            .collect();
        accepted += agree(&on, &off, &prompts, 40).await.1;
    }
    assert!(accepted > 0, "no fixture ever took a draft");
}

/// Sampled output is the same for the same seed (each position draws from the sampler in turn,
/// as plain decoding does), and a sampled position's tokens over many seeds are distributed
/// alike (seeds apart, so the comparison is one of distributions, not of draws).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_output_keeps_its_distribution_and_for_one_seed_its_tokens() {
    let (on, off) = pair(smollm2_model);
    let ids = prompt(&on, TASKS[0]);
    let params = |seed: u64, max_tokens: usize| {
        with_logprobs(SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed,
            max_tokens,
            ..SamplingParams::default()
        })
    };
    for seed in [1, 2, 3] {
        let req = |s: &str| request(ids.clone(), params(seed, 40), s);
        let (w, wo) = tokio::join!(generate(&on, req("on")), generate(&off, req("off")));
        assert_eq!(w, wo, "seed {seed}");
    }
    // The 12th token of 150 seeds on each engine, counted.
    const AT: usize = 11;
    const N: u64 = 150;
    let mut counts: std::collections::HashMap<u32, [u32; 2]> = Default::default();
    for (e, sched) in [&on, &off].into_iter().enumerate() {
        for batch in (0..N).collect::<Vec<_>>().chunks(16) {
            let runs = batch.iter().map(|&s| {
                let seed = 1000 + s + e as u64 * N;
                let req = Request {
                    ignore_eos: true,
                    ..request(ids.clone(), params(seed, AT + 1), &format!("d{e}-{s}"))
                };
                generate(sched, req)
            });
            for g in futures::future::join_all(runs).await {
                if let Some(&t) = g.ids.get(AT) {
                    counts.entry(t).or_default()[e] += 1;
                }
            }
        }
    }
    let (a, b): (u32, u32) = counts
        .values()
        .fold((0, 0), |(a, b), c| (a + c[0], b + c[1]));
    assert_eq!(
        (a, b),
        (N as u32, N as u32),
        "every run reaches the position"
    );
    // Tokens seen fewer than 8 times in both samples together share one bin: with 150 draws a
    // side, a long tail of singletons says nothing about the distributions.
    let mut bins: Vec<[u32; 2]> = vec![[0, 0]];
    for c in counts.values() {
        if c[0] + c[1] >= 8 {
            bins.push(*c);
        } else {
            bins[0][0] += c[0];
            bins[0][1] += c[1];
        }
    }
    assert!(
        bins.len() >= 4,
        "the position is sampled, not fixed: {counts:?}"
    );
    let tv: f64 = bins
        .iter()
        .map(|c| (c[0] as f64 / a as f64 - c[1] as f64 / b as f64).abs())
        .sum::<f64>()
        / 2.0;
    // Two samples of 150 from one distribution over a few bins: the distance stays well under
    // this (a sampler that skewed a token by a fifth of its mass would not).
    assert!(
        tv < 0.2,
        "total variation {tv:.3} between the engines' token distributions: {counts:?}"
    );
    assert!(
        on.metrics().accepted_tokens > 0,
        "the sampled runs verified drafts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_stopped_and_length_limited_output_is_the_same_with_speculation() {
    let (on, off) = pair(smollm2_model);
    let grammars = Grammars::new(&on.tokenizer()).expect("token table");
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
        "required": ["name", "city"],
        "additionalProperties": false
    });
    let ids = prompt(
        &on,
        "Extract as JSON with keys name and city: Maria Rossi lives in the city of Bologna.",
    );
    let json_request = |s: &str| Request {
        constraint: Some(grammars.json_schema(&schema).expect("compiles")),
        ..request(ids.clone(), with_logprobs(greedy(64)), s)
    };
    let (w, wo) = tokio::join!(
        generate(&on, json_request("on")),
        generate(&off, json_request("off"))
    );
    assert_eq!(w, wo);
    let value: serde_json::Value = serde_json::from_str(&w.text).expect("valid JSON");
    assert!(value["name"].is_string(), "{value}");

    // Stop strings and max_tokens that fall inside a draft: the copy prompt drafts long runs.
    let copy = prompt(&on, TASKS[0]);
    for (stop, max) in [
        (vec!["lazy dog again".to_string()], 64),
        (vec![], 5),
        (vec![], 17),
    ] {
        let params = SamplingParams {
            stop: stop.clone(),
            ..with_logprobs(greedy(max))
        };
        let req = |s: &str| request(copy.clone(), params.clone(), s);
        let (w, wo) = tokio::join!(generate(&on, req("on")), generate(&off, req("off")));
        assert_eq!(w, wo, "stop {stop:?}, max_tokens {max}");
        assert!(w.ids.len() <= max);
    }
    assert!(on.metrics().accepted_tokens > 0);
}

/// A stream's kept cache holds only the positions it confirmed: the next turn of a chat, which
/// reuses it, answers as an engine without speculation or reuse does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_turn_reuses_a_speculating_streams_cache_and_answers_the_same() {
    let on = Scheduler::spawn(smollm2_model(), spec_config("spec", true)).expect("spawn");
    let off = Scheduler::spawn(
        smollm2_model(),
        SchedulerConfig {
            prefix_reuse: false,
            ..spec_config("plain", false)
        },
    )
    .expect("spawn");
    let tok = on.tokenizer();
    let mut messages = vec![hearth_infer::ChatMessage::new(
        hearth_infer::Role::User,
        TASKS[1],
    )];
    for turn in 0..2 {
        let ids = tok
            .encode(&tok.apply_chat_template(&messages).unwrap())
            .unwrap();
        let req = |s: &str| {
            request(
                ids.clone(),
                with_logprobs(greedy(48)),
                &format!("{s}-{turn}"),
            )
        };
        let (w, wo) = tokio::join!(generate(&on, req("on")), generate(&off, req("off")));
        assert_eq!(w, wo, "turn {turn}");
        messages.push(hearth_infer::ChatMessage::new(
            hearth_infer::Role::Assistant,
            &w.text,
        ));
        messages.push(hearth_infer::ChatMessage::new(
            hearth_infer::Role::User,
            "Now rename sub to minus as well.",
        ));
    }
    let m = on.metrics();
    assert!(m.prefix_reused_tokens > 0 && m.accepted_tokens > 0, "{m:?}");
}
