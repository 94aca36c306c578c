//! The completion service over HTTP on the real server with the real SmolLM2 weights
//! (`scripts/fetch-weights.sh`): response shapes, SSE streaming, greedy determinism under
//! concurrency, stream shutdown, client disconnects, validation, credentials, funds, exact
//! balance arithmetic and the health check.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use futures::StreamExt;
use hearth_server::Service;
use hearth_store::{LedgerMeta, Store};
use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::common::TestApp;

const SMOLLM2: &str = "weights/SmolLM2-135M-Instruct.Q4_1.gguf";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A model table serving the real SmolLM2 weights as alpha-3.3 and beta-4-mini, and a missing
/// file as gamma-3.5-sonnet (to see a failed load answered as a gateway error).
pub fn models_toml(dir: &Path) -> PathBuf {
    let weights = root().join(SMOLLM2);
    assert!(
        weights.exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        weights.display()
    );
    let text = format!(
        r#"
[defaults]
threads = 2

[text."alpha-3.3"]
weights = "{w}"
temperature_max = 5.0
max_output_tokens = 2048
max_input_tokens = 128000
input_price_per_million = "0.60"
output_price_per_million = "2.40"
shutdown_grace_ms = 500

[text."beta-4-mini"]
weights = "{w}"
temperature_max = 2.0
max_output_tokens = 16384
max_input_tokens = 128000
input_price_per_million = "0.15"
output_price_per_million = "0.60"

[text."gamma-3.5-sonnet"]
weights = "{missing}"
temperature_max = 1.0
max_output_tokens = 8192
max_input_tokens = 200000
input_price_per_million = "3.00"
output_price_per_million = "15.00"
"#,
        w = weights.display(),
        missing = dir.join("no-such-model.gguf").display()
    );
    let path = dir.join("models.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The auth and completion services on the shared harness, with the table above.
pub(crate) struct App {
    pub(crate) app: TestApp,
    pub(crate) url: String,
    pub(crate) http: reqwest::Client,
    _models: tempfile::TempDir,
}

/// The tests in this file are about one user's many concurrent requests meeting the engine and
/// the store, so the per-user cap is off here; `tests/holds.rs` tests the cap itself.
pub(crate) async fn spawn_completion() -> App {
    spawn_completion_with("", |raw| raw.completion.max_concurrent_per_user = Some(0)).await
}

/// The same with `extra` appended to the alpha-3.3 row and settings changed by `configure`.
pub(crate) async fn spawn_completion_with(
    extra: &str,
    configure: impl FnOnce(&mut hearth_server::config::RawConfig),
) -> App {
    spawn_completion_table(extra, "", configure).await
}

/// The same, with `rows` (more tables, such as `[embedding."id"]`) appended to the model table.
pub(crate) async fn spawn_completion_table(
    extra: &str,
    rows: &str,
    configure: impl FnOnce(&mut hearth_server::config::RawConfig),
) -> App {
    let models = tempfile::tempdir().unwrap();
    let table = models_toml(models.path());
    let text = std::fs::read_to_string(&table).unwrap().replacen(
        "shutdown_grace_ms = 500",
        &format!("shutdown_grace_ms = 500\n{extra}"),
        1,
    );
    std::fs::write(&table, format!("{text}\n{rows}")).unwrap();
    let app = TestApp::builder()
        .services(&[Service::Auth, Service::Completion])
        .configure(|raw| {
            raw.models = Some(table);
            configure(raw);
        })
        .spawn()
        .await;
    let url = app.url(Service::Completion);
    App {
        http: app.client.clone(),
        app,
        url,
        _models: models,
    }
}

/// After a stream of `alpha-3.3` (2.40 credits per million output tokens) asking for
/// `max_tokens` that its client dropped early: no hold is left, and `user` paid for the tokens
/// made, far less than the worst case's output.
pub(crate) async fn assert_billed_for_what_it_made(
    app: &App,
    user: &str,
    before: Decimal,
    max_tokens: u64,
) {
    app.wait_no_holds(user).await;
    let charged = before - app.store().balance(user).await.unwrap();
    let worst_output = dec("2.40") * Decimal::from(max_tokens) / dec("1000000");
    assert!(charged > dec("0"), "the tokens made are billed");
    assert!(
        charged < worst_output / dec("4"),
        "charged {charged}: generation went on"
    );
}

pub(crate) fn dec(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

impl App {
    pub(crate) fn store(&self) -> &Store {
        &self.app.running().state.store
    }

    /// Waits (at most 10 s) until `user` has no hold left.
    pub(crate) async fn wait_no_holds(&self, user: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !self.store().holds(user).await.unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{user}'s hold was never settled"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// The value of alpha-3.3's series `name` in the listener's `/metrics`, if it has one.
    pub(crate) async fn metric(&self, name: &str) -> Option<f64> {
        crate::common::metric(&self.http, &self.url, name, Some("model=\"alpha-3.3\"")).await
    }

    pub(crate) fn tokens(&self) -> &hearth_auth::ServiceTokens {
        &self.app.running().state.tokens
    }

    /// Signs `user` in for real and sets their balance to exactly `balance`.
    pub(crate) async fn user(&self, user: &str, balance: &str) -> String {
        let token = self.app.token(user).await;
        let now = self.store().balance(user).await.unwrap();
        let want = dec(balance);
        let meta = LedgerMeta::reason("test funds");
        if want > now {
            self.store().credit(user, want - now, &meta).await.unwrap();
        } else if want < now {
            self.store().debit(user, now - want, &meta).await.unwrap();
        }
        token
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn stream(&self, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}/stream", self.url))
            .json(&body)
            .send()
            .await
            .unwrap()
    }
}

pub(crate) fn request(token: &str, content: &str, max: u64) -> Value {
    json!({
        "serviceToken": token,
        "model": "alpha-3.3",
        "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": content}],
        "temperature": 0.0,
        "maxOutputTokens": max,
    })
}

/// Reads SSE `data:` payloads until the body ends.
pub(crate) async fn events(response: reqwest::Response) -> Vec<Value> {
    let mut out = Vec::new();
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = body.next().await {
        buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for line in event.lines() {
                if let Some(data) = line.strip_prefix("data:") {
                    out.push(serde_json::from_str(data.trim_start()).unwrap());
                }
            }
        }
    }
    out
}

fn concat_tokens(events: &[Value]) -> String {
    events.iter().filter_map(|e| e["token"].as_str()).collect()
}

pub(crate) fn cost_of(response: &Value) -> Decimal {
    dec(response["usage"]["inputCost"].as_str().unwrap())
        + dec(response["usage"]["outputCost"].as_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_returns_the_spec_completion_shape_and_bills_it() {
    let app = spawn_completion().await;
    let token = app.user("shape", "10").await;
    let (status, body) = app.post("/", request(&token, "Say hello.", 12)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "alpha-3.3");
    assert!(body["output"].as_str().is_some_and(|s| !s.is_empty()));
    let usage = &body["usage"];
    assert_eq!(usage["type"], "completion");
    assert!(usage["promptTokens"].as_u64().unwrap() > 5);
    let n = usage["completionTokens"].as_u64().unwrap();
    assert!((1..=12).contains(&n));
    // cost = tokens × price / 1e6, 6 decimal places, margin 0 by default... whatever the margin,
    // the balance moved by exactly the reported cost.
    let before = dec(body["balanceBefore"].as_str().unwrap());
    let after = dec(body["balanceAfter"].as_str().unwrap());
    assert_eq!(before, dec("10"));
    assert_eq!(before - after, cost_of(&body));
    assert_eq!(app.store().balance("shape").await.unwrap(), after);
    assert!(app.store().holds("shape").await.unwrap().is_empty());
    let object_keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(object_keys.len(), 5, "unexpected fields: {object_keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_sends_tokens_that_concatenate_to_the_output_then_completed() {
    let app = spawn_completion().await;
    let token = app.user("streamer", "10").await;
    let response = app.stream(request(&token, "Name three colours.", 24)).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let id = response.headers()["x-stream-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(!id.is_empty());
    let events = events(response).await;
    let last = events.last().unwrap();
    assert_eq!(last["completed"], true, "{last}");
    for e in &events[..events.len() - 1] {
        assert_eq!(
            e.as_object().unwrap().len(),
            1,
            "a token event has one field: {e}"
        );
        assert!(e["token"].is_string());
    }
    assert_eq!(
        concat_tokens(&events),
        last["response"]["output"].as_str().unwrap()
    );
    assert_eq!(last["response"]["usage"]["type"], "completion");
    // The stream is over: its id is no longer active.
    let (status, body) = app
        .post("/stream/shutdown", json!({ "streamId": id }))
        .await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_the_same_through_post_stream_and_eight_at_once() {
    let app = spawn_completion().await;
    let token = app.user("greedy", "100").await;
    let prompts = [
        "What is the capital of France?",
        "Write one sentence about the sea.",
        "List two fruits.",
        "Explain what a CPU does in one sentence.",
    ];
    let mut alone = Vec::new();
    for p in prompts {
        let (status, body) = app.post("/", request(&token, p, 20)).await;
        assert_eq!(status, 200, "{body}");
        alone.push(body["output"].as_str().unwrap().to_string());
    }
    let streamed = events(app.stream(request(&token, prompts[0], 20)).await).await;
    assert_eq!(concat_tokens(&streamed), alone[0]);

    let mut tasks = Vec::new();
    for i in 0..8 {
        let (http, url, body) = (
            app.http.clone(),
            app.url.clone(),
            request(&token, prompts[i % 4], 20),
        );
        tasks.push(tokio::spawn(async move {
            let path = if i % 2 == 0 { "/" } else { "/stream" };
            let r = http
                .post(format!("{url}{path}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            if i % 2 == 0 {
                r.json::<Value>().await.unwrap()["output"]
                    .as_str()
                    .unwrap()
                    .to_string()
            } else {
                concat_tokens(&events(r).await)
            }
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(
            t.await.unwrap(),
            alone[i % 4],
            "request {i} differs when run with 7 others"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_a_live_stream_aborts_it_bills_the_partial_output_and_answers_200() {
    let app = spawn_completion().await;
    let token = app.user("stopper", "10").await;
    let response = app
        .stream(request(
            &token,
            "Count from one to one thousand in words.",
            2000,
        ))
        .await;
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-stream-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mut body = response.bytes_stream();
    // Wait for the first token, then stop the stream.
    let mut seen = String::new();
    while !seen.contains("\"token\"") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    let (status, stopped) = app
        .post("/stream/shutdown", json!({ "streamId": id }))
        .await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["streamId"], id.as_str());
    assert_eq!(stopped["status"], "terminated");
    let partial = &stopped["response"];
    let n = partial["usage"]["completionTokens"].as_u64().unwrap();
    assert!((1..2000).contains(&n), "{partial}");
    // The client saw the same partial response in its aborted event.
    while let Some(chunk) = body.next().await {
        seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let last: Value = seen
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data:").or_else(|| e.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .last()
        .unwrap();
    assert_eq!(last["aborted"], true, "{last}");
    assert_eq!(&last["response"], partial);
    // Billed for the partial output only.
    let before = dec(partial["balanceBefore"].as_str().unwrap());
    let after = dec(partial["balanceAfter"].as_str().unwrap());
    assert_eq!(before - after, cost_of(partial));
    assert_eq!(app.store().balance("stopper").await.unwrap(), after);
    // Stopping it again, or an id that never existed: 404 in the error shape.
    let (status, again) = app
        .post("/stream/shutdown", json!({ "streamId": id }))
        .await;
    assert_eq!(status, 404, "{again}");
    assert_eq!(again["error"]["type"], "NotFound");
    let (status, unknown) = app
        .post("/stream/shutdown", json!({ "streamId": "no-such-stream" }))
        .await;
    assert_eq!(status, 404);
    assert!(unknown["error"]["message"].is_string());
    let (status, bad) = app.post("/stream/shutdown", json!({})).await;
    assert_eq!(status, 400);
    assert_eq!(bad["error"]["details"]["field"], "streamId");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_stops_generation_and_is_billed_for_what_was_generated() {
    let app = spawn_completion().await;
    let token = app.user("leaver", "10").await;
    let prompt = "Write a very long story about a dragon.";
    // The same greedy request read to its end, for comparison.
    let (status, full) = app.post("/", request(&token, prompt, 300)).await;
    assert_eq!(status, 200, "{full}");
    let full_tokens = full["usage"]["completionTokens"].as_u64().unwrap();
    assert!(
        full_tokens > 40,
        "the reference answer is too short to tell: {full_tokens}"
    );
    let full_cost = cost_of(&full);

    let balance = app.store().balance("leaver").await.unwrap();
    let response = app.stream(request(&token, prompt, 300)).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(body);
    // The hold settles once the engine notices; wait for it.
    for _ in 0..600 {
        if app.store().holds("leaver").await.unwrap().is_empty()
            && app.store().balance("leaver").await.unwrap() != balance
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        app.store().holds("leaver").await.unwrap().is_empty(),
        "the hold was never settled"
    );
    let charged = balance - app.store().balance("leaver").await.unwrap();
    assert!(charged > Decimal::ZERO);
    assert!(
        charged < full_cost,
        "charged {charged}, as much as the full answer ({full_cost})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balances_add_up_exactly_over_many_concurrent_requests() {
    let app = spawn_completion().await;
    let token = app.user("many", "5").await;
    let initial = app.store().balance("many").await.unwrap();
    let ledger_before = app.store().ledger("many").await.unwrap().len();
    let mut tasks = Vec::new();
    for i in 0..12u64 {
        let (http, url) = (app.http.clone(), app.url.clone());
        let mut body = request(
            &token,
            &format!("Tell me a fact about the number {i}."),
            4 + i * 3,
        );
        body["overrideGrossMarginPercent"] = json!(i * 7 % 99);
        body["developerId"] = json!(format!("dev-{i}"));
        body["applicationId"] = json!("app-x");
        tasks.push(tokio::spawn(async move {
            if i % 3 == 0 {
                let r = http
                    .post(format!("{url}/stream"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                events(r).await.last().unwrap()["response"].clone()
            } else {
                http.post(format!("{url}/"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
                    .json::<Value>()
                    .await
                    .unwrap()
            }
        }));
    }
    let mut total = Decimal::ZERO;
    let mut costs = Vec::new();
    for t in tasks {
        let response = t.await.unwrap();
        assert!(response["usage"].is_object(), "{response}");
        let cost = cost_of(&response);
        let before = dec(response["balanceBefore"].as_str().unwrap());
        let after = dec(response["balanceAfter"].as_str().unwrap());
        assert!(after < before);
        total += cost;
        costs.push(cost);
    }
    let final_balance = app.store().balance("many").await.unwrap();
    assert_eq!(final_balance, initial - total);
    let ledger = app.store().ledger("many").await.unwrap();
    let rows = &ledger[ledger_before..];
    assert_eq!(rows.len(), 12, "one ledger row per request");
    let mut debits: Vec<Decimal> = rows.iter().map(|r| -r.amount).collect();
    debits.sort();
    costs.sort();
    assert_eq!(debits, costs);
    assert!(rows
        .iter()
        .all(|r| r.application_id.as_deref() == Some("app-x")));
    assert!(rows.iter().all(|r| r
        .developer_id
        .as_deref()
        .is_some_and(|d| d.starts_with("dev-"))));
    assert_eq!(ledger.last().unwrap().balance_after, final_balance);
    assert!(app.store().holds("many").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_page_is_served_with_the_model_bounds_and_the_sign_in_link() {
    let app = spawn_completion().await;
    let r = app
        .http
        .get(format!("{}/ui", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(html.contains("\"temperatureMax\":2.0") && html.contains("beta-4-mini"));
    let auth_ui = format!("{}/ui", app.app.url(Service::Auth));
    assert!(
        html.contains(&auth_ui),
        "the page does not point at the sign-in page"
    );
    assert!(!html.contains("__MODELS_JSON__"));
}
