//! Holds that always end, and the per-user cap on concurrent requests: the completion service
//! over HTTP on the real server with the real SmolLM2 weights. A client that gives up while its
//! request waits in the engine's queue is charged nothing and its hold is released; one user past
//! the cap is answered 429 `RateLimited` while other users are served; a client that gives up
//! while its model is still loading holds nothing and frees its slot. Every refusal says when to
//! come back with its owner's figure: `Retry-After` on a full queue and on completions cut by
//! shutdown is the engines' configured `[completion] retry_after_secs`, on the 429 the cap's.
//! Elsewhere: cancelled hold placement, and a client that stops reading (aborted at
//! `client_stall_timeout_secs` and charged for what was made): `billing.rs` and `completion.rs`
//! unit tests (over loopback the kernel buffers a megabyte of an unread stream, tens of thousands
//! of events, before the server sees a full socket); mid-stream disconnects and stream shutdown:
//! `tests/completion.rs`; images, queued and mid-generation: `tests/imagine.rs`. Tokenizing runs
//! before the hold is placed, so a client gone then has nothing to release.

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use crate::common::eventually;
use crate::completion::{dec, request, spawn_completion_with, App};

/// Starts a completion that runs until it is stopped: 2,000 tokens on the OpenAI route with
/// `ignore_eos`, so it cannot end on its own within a test however fast the machine (greedy
/// SmolLM2 ends any prompt's answer within a few hundred tokens). `stream` asks for events.
fn endless(
    app: &App,
    token: &str,
    stream: bool,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let (http, url, token) = (app.http.clone(), app.url.clone(), token.to_owned());
    let body = serde_json::json!({
        "model": "alpha-3.3",
        "messages": [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}],
        "max_tokens": 2000,
        "temperature": 0.0,
        "ignore_eos": true,
        "stream": stream,
    });
    tokio::spawn(async move {
        http.post(format!("{url}/v1/chat/completions"))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
    })
}

/// An endless stream ([`endless`]) that has made its first token: its body, still open.
async fn endless_stream(
    app: &App,
    token: &str,
) -> impl futures::Stream<Item = reqwest::Result<axum::body::Bytes>> + Unpin {
    let running = endless(app, token, true).await.unwrap().unwrap();
    assert_eq!(running.status(), 200);
    let mut body = running.bytes_stream();
    assert!(is_chunk(next_event(&mut body).await));
    body
}

/// Whether `event` is an OpenAI stream chunk.
fn is_chunk(event: Option<Value>) -> bool {
    event.is_some_and(|e| e["object"] == "chat.completion.chunk")
}

/// The engines' retry figure in the tests of refusals for load: not the default (1), so that a
/// header saying it proves the configured figure reached the client.
const RETRY_AFTER_SECS: u64 = 7;

/// One running sequence at a time, `extra` more scheduler keys, the per-user cap off and the
/// engines' retry figure set to [`RETRY_AFTER_SECS`].
async fn one_at_a_time(extra: &str) -> App {
    spawn_completion_with(&format!("max_active = 1\n{extra}"), |raw| {
        raw.completion.max_concurrent_per_user = Some(0);
        raw.completion.retry_after_secs = Some(RETRY_AFTER_SECS);
    })
    .await
}

/// Checks a refusal for load: 503 `Overloaded`, `Retry-After` and `details.retryAfterSeconds`
/// both the engines' configured figure. Returns the body.
async fn assert_overloaded_after_the_engines_figure(refused: reqwest::Response) -> Value {
    let (status, header) = (
        refused.status(),
        refused.headers().get("retry-after").cloned(),
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(status, 503, "{body}");
    let header = header.expect("Retry-After");
    assert_eq!(header, RETRY_AFTER_SECS.to_string().as_str(), "{body}");
    // The spec's shape, or the OpenAI one with ours under `hearth`.
    let error = match body["error"].get("hearth") {
        Some(hearth) => hearth.clone(),
        None => body["error"].clone(),
    };
    assert_eq!(error["type"], "Overloaded", "{body}");
    assert_eq!(error["details"]["retryAfterSeconds"], RETRY_AFTER_SECS);
    body
}

/// The engine's gauge `name` (`/metrics`), once it reads `value`; false after 30 s.
async fn gauge_becomes(app: &App, name: &str, value: f64) -> bool {
    let (within, every) = (Duration::from_secs(30), Duration::from_millis(100));
    eventually(within, every, || async {
        app.metric(name).await == Some(value)
    })
    .await
}

/// Waits up to 10 s for `user`'s open holds to number `n`.
async fn holds_become(app: &App, user: &str, n: usize) -> bool {
    let (within, every) = (Duration::from_secs(10), Duration::from_millis(10));
    eventually(within, every, || async {
        app.store().holds(user).await.unwrap().len() == n
    })
    .await
}

/// The `data:` payload of the next SSE event of `body`.
async fn next_event(
    body: &mut (impl futures::Stream<Item = reqwest::Result<axum::body::Bytes>> + Unpin),
) -> Option<Value> {
    let mut buf = String::new();
    loop {
        if let Some(end) = buf.find("\n\n") {
            let data = buf[..end].lines().find_map(|l| l.strip_prefix("data:"))?;
            return serde_json::from_str(data.trim_start()).ok();
        }
        buf.push_str(std::str::from_utf8(&body.next().await?.ok()?).ok()?);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_while_queued_is_charged_nothing_and_its_hold_is_released() {
    // One running stream at a time: a second request waits in the engine's queue.
    let app = spawn_completion_with("max_active = 1", |raw| {
        raw.completion.max_concurrent_per_user = Some(0)
    })
    .await;
    let runner = app.user("runner", "10").await;
    let waiter = app.user("waiter", "10").await;
    let mut body = endless_stream(&app, &runner).await;

    let ledger_before = app.store().ledger("waiter").await.unwrap().len();
    let (http, url, req) = (
        app.http.clone(),
        app.url.clone(),
        request(&waiter, "Hi", 20),
    );
    let queued =
        tokio::spawn(async move { http.post(format!("{url}/stream")).json(&req).send().await });
    // Its hold is placed once it is priced, before it is queued; then the client gives up.
    assert!(
        holds_become(&app, "waiter", 1).await,
        "the request never got as far as its hold"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    queued.abort();
    let _ = queued.await;
    // The runner is still generating, so the waiter never left the queue.
    assert!(is_chunk(next_event(&mut body).await));

    assert!(
        holds_become(&app, "waiter", 0).await,
        "the queued request's hold was stranded"
    );
    assert_eq!(app.store().balance("waiter").await.unwrap(), dec("10"));
    assert_eq!(
        app.store().ledger("waiter").await.unwrap().len(),
        ledger_before,
        "nothing was charged"
    );
    drop(body);
    assert!(
        holds_become(&app, "runner", 0).await,
        "the runner's hold was never settled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_past_the_cap_gets_429_rate_limited_while_other_users_are_served() {
    let app =
        spawn_completion_with("", |raw| raw.completion.max_concurrent_per_user = Some(1)).await;
    let ann = app.user("ann", "10").await;
    let bob = app.user("bob", "10").await;
    let body = endless_stream(&app, &ann).await;

    let refused = app
        .http
        .post(format!("{}/", app.url))
        .json(&request(&ann, "Hi", 5))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    // The per-user cap's own figure (`user_slots.rs`), in the header and the details.
    let figure = hearth_server::user_slots::RETRY_AFTER.as_secs();
    assert_eq!(
        refused.headers()["retry-after"],
        figure.to_string().as_str()
    );
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["type"], "RateLimited", "{error}");
    assert_eq!(error["error"]["details"]["limit"], 1);
    assert_eq!(error["error"]["details"]["retryAfterSeconds"], figure);
    // The refusal held nothing: only the running stream's hold is open.
    assert_eq!(app.store().holds("ann").await.unwrap().len(), 1);

    let (status, served) = app.post("/", request(&bob, "Hi", 5)).await;
    assert_eq!(status, 200, "another user is served: {served}");

    drop(body);
    assert!(holds_become(&app, "ann", 0).await);
    // The slot is given back with the settlement, a moment after the hold ends.
    let mut again = app.post("/", request(&ann, "Hi", 5)).await;
    for _ in 0..20 {
        if again.0 != 429 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        again = app.post("/", request(&ann, "Hi", 5)).await;
    }
    let (status, again) = again;
    assert_eq!(
        status, 200,
        "the slot is free once the stream ends: {again}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_while_its_model_loads_holds_nothing_and_frees_its_slot() {
    // A model whose weights file is a pipe nobody writes to yet: its load waits on the open.
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("slow.gguf");
    let made = std::process::Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .unwrap();
    assert!(made.success());
    let entry = format!(
        "\n[text.\"slow-1\"]\nweights = \"{}\"\ntemperature_max = 1.0\nmax_output_tokens = 64\nmax_input_tokens = 1000\ninput_price_per_million = \"1\"\noutput_price_per_million = \"1\"\n",
        pipe.display()
    );
    let app = spawn_completion_with("", |raw| {
        let table = raw.models.clone().unwrap();
        let mut text = std::fs::read_to_string(&table).unwrap();
        text.push_str(&entry);
        std::fs::write(&table, text).unwrap();
        raw.completion.max_concurrent_per_user = Some(1);
    })
    .await;
    let token = app.user("early", "10").await;
    let ledger_before = app.store().ledger("early").await.unwrap().len();
    let mut req = request(&token, "Hi", 8);
    req["model"] = "slow-1".into();
    let (http, url) = (app.http.clone(), app.url.clone());
    let waiting = tokio::spawn(async move { http.post(format!("{url}/")).json(&req).send().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the request should wait for the load"
    );
    waiting.abort();
    let _ = waiting.await;

    // Nothing held or charged, and the slot is free for the user's next request.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(app.store().holds("early").await.unwrap().is_empty());
    assert_eq!(app.store().balance("early").await.unwrap(), dec("10"));
    assert_eq!(
        app.store().ledger("early").await.unwrap().len(),
        ledger_before
    );
    let (status, body) = app.post("/", request(&token, "Hi", 4)).await;
    assert_eq!(
        status, 200,
        "the abandoned request kept the user's slot: {body}"
    );

    // Let the load finish (it fails: the pipe is empty) so no thread waits past the test. Opened
    // for reading and writing, a pipe never blocks the opener on Linux.
    let unblock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pipe)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(unblock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_overloaded_with_the_engines_configured_retry_after() {
    // One running sequence and no room to wait: the next request is refused at once.
    let app = one_at_a_time("max_queued = 0").await;
    let runner = app.user("runner", "10").await;
    let refused = app.user("refused", "10").await;
    let body = endless_stream(&app, &runner).await;

    let answer = app
        .http
        .post(format!("{}/", app.url))
        .json(&request(&refused, "Hi", 5))
        .send()
        .await
        .unwrap();
    assert_overloaded_after_the_engines_figure(answer).await;
    // The OpenAI route is refused by the same engine with the same figure.
    let answer = app
        .http
        .post(format!("{}/v1/chat/completions", app.url))
        .bearer_auth(&refused)
        .json(&serde_json::json!({
            "model": "alpha-3.3",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 5,
        }))
        .send()
        .await
        .unwrap();
    let error = assert_overloaded_after_the_engines_figure(answer).await;
    assert_eq!(error["error"]["code"], "overloaded", "{error}");
    // Refused before anything ran: its holds were released, nothing was charged.
    assert!(holds_become(&app, "refused", 0).await);
    assert_eq!(app.store().balance("refused").await.unwrap(), dec("10"));
    drop(body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_cut_by_shutdown_answer_503_with_the_engines_configured_retry_after() {
    let app = one_at_a_time("").await;
    let runner = app.user("runner", "10").await;
    let waiter = app.user("waiter", "10").await;
    // One completion running (until it is stopped), one waiting in the engine's queue behind it.
    let running = endless(&app, &runner, false);
    assert!(
        gauge_becomes(&app, "hearth_completion_active_sequences", 1.0).await,
        "the first completion never ran"
    );
    let queued = {
        let (http, url) = (app.http.clone(), app.url.clone());
        let body = request(&waiter, "Hi", 5);
        tokio::spawn(async move { http.post(format!("{url}/")).json(&body).send().await })
    };
    assert!(
        gauge_becomes(&app, "hearth_completion_queue_depth", 1.0).await,
        "the second completion never queued"
    );

    app.app.running().shutdown_token().cancel();
    // The queued one is refused by the draining engine, with its figure; nothing is charged.
    let queued = queued.await.unwrap().unwrap();
    let error = assert_overloaded_after_the_engines_figure(queued).await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{error}"
    );
    assert!(holds_become(&app, "waiter", 0).await);
    assert_eq!(app.store().balance("waiter").await.unwrap(), dec("10"));
    // The running one is aborted after the grace period (500 ms here): the same answer, with
    // its partial response under `hearth`, billed.
    let running = running.await.unwrap().unwrap();
    let error = assert_overloaded_after_the_engines_figure(running).await;
    let partial = &error["error"]["hearth"]["details"]["response"];
    assert!(
        partial["usage"]["completionTokens"].as_u64().unwrap() >= 1,
        "{error}"
    );
    let after = dec(partial["balanceAfter"].as_str().unwrap());
    assert!(after < dec("10"), "{partial}");
    assert_eq!(app.store().balance("runner").await.unwrap(), after);
}
