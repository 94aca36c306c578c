//! Speculative decoding over HTTP: a model row with `speculative = { method = "ngram" }` answers
//! a request that copies its input exactly as a server without it does, on the spec's `POST /`
//! and `/stream` and on `/v1/chat/completions`, billed the same; `/metrics` counts the drafted and
//! confirmed tokens; a client that leaves mid-stream is billed for what was made and leaves no
//! hold.

use serde_json::{json, Value};

use crate::completion::{
    assert_billed_for_what_it_made, cost_of, events, request, spawn_completion_with,
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

    let drafted = with
        .metric("hearth_completion_drafted_tokens_total")
        .await
        .unwrap();
    let accepted = with
        .metric("hearth_completion_accepted_tokens_total")
        .await
        .unwrap();
    assert!(
        accepted > 0.0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_speculating_stream_is_billed_for_what_was_made() {
    use futures::StreamExt;
    let app = spawn_completion_with("speculative = { method = \"ngram\" }", |_| {}).await;
    let token = app.user("leaver", "10").await;
    let before = app.store().balance("leaver").await.unwrap();
    let response = app.stream(request(&token, COPY, 2000)).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(body);
    assert_billed_for_what_it_made(&app, "leaver", before, 2000).await;
}
