//! Prefix reuse over HTTP: one user's chat on the spec's `POST /` leaves its KV cache, and
//! another user's next turn of the same conversation on `/v1/chat/completions` starts from it
//! (`/metrics` counts the reused tokens), answering exactly as a server with `prefix_reuse =
//! false` does, and billed for every prompt token all the same.

use serde_json::{json, Value};

use crate::completion::{request, spawn_completion_with, App};

/// `hearth_completion_prefix_reused_tokens_total` for alpha-3.3 (0 before any reuse).
async fn reused(app: &App) -> f64 {
    app.metric("hearth_completion_prefix_reused_tokens_total")
        .await
        .unwrap_or(0.0)
}

/// The second turn through the OpenAI route, as `user`.
async fn second_turn(app: &App, user: &str, first_answer: &str) -> Value {
    let key = app.user(user, "5").await;
    let body = json!({
        "model": "alpha-3.3",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three rivers of Europe."},
            {"role": "assistant", "content": first_answer},
            {"role": "user", "content": "Which of them is the longest?"}
        ],
        "temperature": 0,
        "max_tokens": 16,
    });
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.url))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_turn_on_another_route_reuses_the_cache_and_answers_as_without_reuse() {
    let with = spawn_completion_with("", |_| {}).await;
    let without = spawn_completion_with("prefix_reuse = false", |_| {}).await;

    // Turn 1 on the spec's route, by one user.
    let token = with.user("first-user", "5").await;
    let (status, first) = with
        .post("/", request(&token, "Name three rivers of Europe.", 16))
        .await;
    assert_eq!(status, 200, "{first}");
    let first_answer = first["output"].as_str().unwrap().to_string();
    assert_eq!(reused(&with).await, 0.0);

    // Turn 2 on the OpenAI route, by another user: the cache of turn 1 holds its start.
    let a = second_turn(&with, "second-user", &first_answer).await;
    let saved = reused(&with).await;
    let prompt_tokens = a["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(
        saved > 10.0 && saved < prompt_tokens,
        "reused {saved} of {prompt_tokens} prompt tokens"
    );
    let b = second_turn(&without, "second-user", &first_answer).await;
    assert_eq!(
        reused(&without).await,
        0.0,
        "prefix_reuse = false turns it off"
    );
    assert_eq!(
        a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"],
        "the same answer with and without reuse"
    );
    assert_eq!(
        a["usage"], b["usage"],
        "every prompt token is billed either way"
    );
    assert_eq!(a["hearth"]["input_cost"], b["hearth"]["input_cost"]);
}
