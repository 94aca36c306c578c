//! Speculative decoding over HTTP: a model row with `speculative = { method = "ngram" }` answers
//! a request that copies its input exactly as a server without it does, on the spec's `POST /`
//! and `/stream` and on `/v1/chat/completions`, billed the same; `/metrics` counts the drafted and
//! confirmed tokens; a client that leaves mid-stream is billed for what was made and leaves no
//! hold. The same for `{ method = "draft", model = "id" }`, with a Q4_0 copy of SmolLM2 (from
//! `hearth dev requantize`) drafting; a draft whose vocabulary is not the model's leaves the
//! model unavailable, saying why.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::hearth_cli;
use crate::completion::{
    assert_billed_for_what_it_made, cost_of, events, request, spawn_completion_table,
    spawn_completion_with, App,
};

const COPY: &str = "Repeat this list exactly, one item per line: apples, pears, plums, \
    cherries, apricots, peaches, quinces, figs, dates, grapes, apples, pears, plums, cherries.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculating_model_answers_and_bills_as_one_without_and_counts_its_drafts() {
    let with = spawn_completion_with("speculative = { method = \"ngram\" }", |_| {}).await;
    let without = spawn_completion_with("", |_| {}).await;
    let (a, b) = (
        with.user("spec", "5").await,
        without.user("spec", "5").await,
    );

    let (status, fast) = with.post("/", request(&a, COPY, 96)).await;
    assert_eq!(status, 200, "{fast}");
    let (_, plain) = without.post("/", request(&b, COPY, 96)).await;
    assert_eq!(fast["output"], plain["output"], "the same answer");
    assert_eq!(fast["usage"], plain["usage"]);
    assert_eq!(cost_of(&fast), cost_of(&plain), "the same bill");

    assert_drafts_confirmed(&with).await;
    assert_eq!(
        without
            .metric("hearth_completion_drafted_tokens_total")
            .await,
        Some(0.0),
        "off unless the row asks for it"
    );

    // The SSE stream's tokens make the same answer.
    let streamed: String = events(with.stream(request(&a, COPY, 96)).await)
        .await
        .iter()
        .filter_map(|e| e["token"].as_str().map(str::to_string))
        .collect();
    assert_eq!(Value::String(streamed), plain["output"]);

    // The OpenAI route too.
    let chat = json!({"model": "alpha-3.3", "messages": [{"role": "user", "content": COPY}],
                      "temperature": 0, "max_tokens": 64});
    let mut answers = Vec::new();
    for (app, token) in [(&with, &a), (&without, &b)] {
        let resp = app
            .http
            .post(format!("{}/v1/chat/completions", app.url))
            .bearer_auth(token)
            .json(&chat)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        answers.push(body["choices"][0]["message"]["content"].clone());
    }
    assert_eq!(answers[0], answers[1]);
}

/// That `app`'s `/metrics` counts drafted tokens and some of them confirmed.
async fn assert_drafts_confirmed(app: &App) {
    let drafted = app
        .metric("hearth_completion_drafted_tokens_total")
        .await
        .unwrap();
    let accepted = app
        .metric("hearth_completion_accepted_tokens_total")
        .await
        .unwrap();
    assert!(
        accepted > 0.0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
}

/// A client streaming a long copy leaves after its first event: billed for what was made, no
/// hold left.
async fn leave_after_the_first_event(app: &App) {
    use futures::StreamExt;
    let token = app.user("leaver", "10").await;
    let before = app.store().balance("leaver").await.unwrap();
    let response = app.stream(request(&token, COPY, 2000)).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(body);
    assert_billed_for_what_it_made(app, "leaver", before, 2000).await;
}

/// A `[text."smol-draft"]` row serving `weights`.
pub(crate) fn draft_row(weights: &Path) -> String {
    format!(
        "[text.\"smol-draft\"]\nweights = \"{}\"\ninput_price_per_million = \"0.01\"\n\
         output_price_per_million = \"0.01\"\n",
        weights.display()
    )
}

/// SmolLM2 re-encoded as Q4_0 by `hearth dev requantize`, in `dir`.
pub(crate) fn smollm2_q4_0(dir: &Path) -> PathBuf {
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = dir.join("smollm2.q4_0.gguf");
    let (ok, stdout, stderr) = hearth_cli(
        &[
            "dev",
            "requantize",
            source.to_str().unwrap(),
            out.to_str().unwrap(),
            "--type",
            "q4_0",
        ],
        &[],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("as q4_0"), "{stdout}");
    out
}

/// alpha-3.3 drafted for by a Q4_0 copy of its own weights.
async fn spawn_drafting(dir: &Path) -> App {
    spawn_completion_table(
        "speculative = { method = \"draft\", model = \"smol-draft\" }",
        &draft_row(&smollm2_q4_0(dir)),
        |_| {},
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_a_draft_model_answers_and_bills_as_one_without_and_counts_its_drafts() {
    let dir = tempfile::tempdir().unwrap();
    let with = spawn_drafting(dir.path()).await;
    let without = spawn_completion_with("", |_| {}).await;
    let (a, b) = (
        with.user("draft", "5").await,
        without.user("draft", "5").await,
    );
    let open = "Write three sentences about the sea.";
    for (prompt, max_tokens) in [(COPY, 96), (open, 64)] {
        let (status, fast) = with.post("/", request(&a, prompt, max_tokens)).await;
        assert_eq!(status, 200, "{fast}");
        let (_, plain) = without.post("/", request(&b, prompt, max_tokens)).await;
        assert_eq!(
            fast["output"], plain["output"],
            "the same answer to {prompt:?}"
        );
        assert_eq!(fast["usage"], plain["usage"]);
        assert_eq!(cost_of(&fast), cost_of(&plain), "the same bill");
    }
    assert_drafts_confirmed(&with).await;

    // Streamed, and on the OpenAI route with a sampled request (the rejection rule keeps the
    // seed's answer only in distribution, so that one is checked for its shape and bill).
    let streamed: String = events(with.stream(request(&a, COPY, 96)).await)
        .await
        .iter()
        .filter_map(|e| e["token"].as_str().map(str::to_string))
        .collect();
    let (_, plain) = without.post("/", request(&b, COPY, 96)).await;
    assert_eq!(Value::String(streamed), plain["output"]);
    let chat = json!({"model": "alpha-3.3", "messages": [{"role": "user", "content": COPY}],
                      "temperature": 0.8, "seed": 3, "max_tokens": 32});
    let resp = with
        .http
        .post(format!("{}/v1/chat/completions", with.url))
        .bearer_auth(&a)
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    // The draft's row serves on its own too.
    let mut small = request(&a, "hi", 8);
    small["model"] = json!("smol-draft");
    let (status, out) = with.post("/", small).await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_drafted_stream_is_billed_for_what_was_made() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_drafting(dir.path()).await;
    leave_after_the_first_event(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_with_another_vocabulary_leaves_the_model_unavailable_and_says_why() {
    let gemma = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/gemma-3-270m-Q4_K_M.gguf");
    let app = spawn_completion_table(
        "speculative = { method = \"draft\", model = \"smol-draft\" }",
        &draft_row(&gemma),
        |_| {},
    )
    .await;
    let token = app.user("vocab", "10").await;
    let (status, err) = app.post("/", request(&token, "hi", 8)).await;
    assert_eq!(status, 502, "{err}");
    assert_eq!(err["error"]["type"], "GatewayError");
    // The draft's own row loads beside (the failed engine is alpha-3.3's).
    let mut health = Value::Null;
    for _ in 0..600 {
        let r = app.http.get(format!("{}/", app.url)).send().await.unwrap();
        health = r.json().await.unwrap();
        if health["models"]["smol-draft"] == "ready" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(health["models"]["smol-draft"], "ready", "{health}");
    let why = health["models"]["alpha-3.3"].as_str().unwrap();
    assert!(
        why.starts_with("unavailable") && why.contains("vocabulary"),
        "{why}"
    );
    assert_eq!(
        app.store().balance("vocab").await.unwrap(),
        crate::completion::dec("10"),
        "nothing is charged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_speculating_stream_is_billed_for_what_was_made() {
    let app = spawn_completion_with("speculative = { method = \"ngram\" }", |_| {}).await;
    leave_after_the_first_event(&app).await;
}
