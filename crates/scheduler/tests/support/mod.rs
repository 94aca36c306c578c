//! What the scheduler's test files share: a tiny random model's scheduler, prompts through the
//! chat template, and requests.
#![allow(dead_code)] // each test file uses a different part

use std::path::PathBuf;

use hearth_infer::{ChatMessage, Role, SamplingParams, TextModel, TextModelConfig};
use hearth_scheduler::{Generation, Output, Request, Scheduler, SchedulerConfig, SchedulerHandle};
use hearth_types::TokenEvent;

pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    }
}

pub fn config(name: &str) -> SchedulerConfig {
    SchedulerConfig {
        name: name.into(),
        // Small chunks so that the prompts below are prefilled over several steps, interleaved
        // with the decoding of the others.
        prefill_chunk: 8,
        max_step_tokens: 24,
        ..SchedulerConfig::default()
    }
}

pub fn tiny(cfg: SchedulerConfig) -> SchedulerHandle {
    Scheduler::spawn(TextModel::tiny_random(7), cfg).expect("spawn")
}

pub fn prompt(sched: &SchedulerHandle, text: &str) -> Vec<u32> {
    let tok = sched.tokenizer();
    let rendered = tok
        .apply_chat_template(&[ChatMessage::new(Role::User, text)])
        .expect("template");
    tok.encode(&rendered).expect("encode")
}

pub fn request(ids: Vec<u32>, params: SamplingParams, stream_id: &str) -> Request {
    Request {
        prompt_ids: ids,
        params,
        stream_id: stream_id.into(),
        span: tracing::Span::none(),
        ignore_eos: false,
        constraint: None,
    }
}

/// A request that runs to `max_tokens` whatever the model samples (end-of-sequence ignored), for
/// tests that need a stream to keep running.
pub fn long(ids: Vec<u32>, max_tokens: usize, stream_id: &str) -> Request {
    Request {
        ignore_eos: true,
        ..request(ids, greedy(max_tokens), stream_id)
    }
}

pub async fn run(
    sched: &SchedulerHandle,
    ids: Vec<u32>,
    params: SamplingParams,
    id: &str,
) -> Output {
    sched
        .submit(request(ids, params, id))
        .await
        .expect("submit")
        .collect()
        .await
}

/// Submits `long(ids, max_tokens, id)` from a task of its own (`submit` returns only once the
/// request is admitted) and reads it to the end; the task yields the tokens generated.
pub fn spawn_long(
    sched: &SchedulerHandle,
    ids: Vec<u32>,
    max_tokens: usize,
    id: String,
) -> tokio::task::JoinHandle<usize> {
    let s = sched.clone();
    tokio::spawn(async move {
        let g = s.submit(long(ids, max_tokens, &id)).await.expect("submit");
        g.collect().await.usage.completion_tokens
    })
}

/// Reads events until `n` tokens have arrived (or the stream ended).
pub async fn read_tokens(generation: &mut Generation, n: usize) -> String {
    let mut text = String::new();
    let mut seen = 0;
    while seen < n {
        match generation.next().await {
            Some(TokenEvent::Token { text: piece, .. }) => {
                text.push_str(&piece);
                seen += 1;
            }
            other => panic!("stream ended early: {other:?}"),
        }
    }
    text
}

/// The real SmolLM2-135M-Instruct Q4_1 (fetched by `scripts/fetch-weights.sh`) on 2 threads.
pub fn smollm2_model() -> TextModel {
    weights_model("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The file `name` of `weights/` (fetched by `scripts/fetch-weights.sh`) on 2 threads.
pub fn weights_model(name: &str) -> TextModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../weights")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        path.display()
    );
    TextModel::load(&TextModelConfig {
        threads: 2,
        ..TextModelConfig::local(&path)
    })
    .unwrap_or_else(|e| panic!("load {name}: {e}"))
}
