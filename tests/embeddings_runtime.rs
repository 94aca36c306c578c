//! Embedding models in the run-time registry (docs/loading.md): unloaded until their first
//! request, unloaded again past their `keep_alive` and loaded again by the next request (which
//! gets the same vector), listed by the admin API with kind `embedding`, their states in
//! `/metrics`, and a reload's new price billed from the next request on while the loaded model
//! stays.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hearth_server::Service;
use hearth_store::LedgerMeta;
use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::common::{eventually, metric, TestApp};
use crate::completion::dec;

fn minilm() -> PathBuf {
    let weights = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/all-MiniLM-L6-v2");
    assert!(
        weights.join("model.safetensors").exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        weights.display()
    );
    weights
}

/// A table of one embedding row, `minilm`, at `price` credits per million tokens, idle for at
/// most a second.
fn write_table(path: &Path, price: &str) {
    std::fs::write(
        path,
        format!(
            "[defaults]\nthreads = 2\n\n[embedding.\"minilm\"]\nweights = \"{}\"\n\
             input_price_per_million = \"{price}\"\nkeep_alive = \"1s\"\n",
            minilm().display()
        ),
    )
    .unwrap();
}

/// The admin API's answer at `/admin/{path}`.
async fn admin(app: &TestApp, path: &str) -> (u16, Value) {
    let body = json!({ "adminKey": app.admin_key() });
    let (status, value) = app
        .post(Service::Auth, &format!("/admin/{path}"), body)
        .await;
    (status.as_u16(), value)
}

/// `minilm`'s row in the admin list.
async fn row(app: &TestApp) -> Value {
    let (status, body) = admin(app, "models").await;
    assert_eq!(status, 200, "{body}");
    body["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "minilm")
        .cloned()
        .unwrap_or_else(|| panic!("no row minilm in {body}"))
}

/// The vector of "hello world" and the tokens billed for it.
async fn embed(app: &TestApp, token: &str) -> (Vec<f64>, u64) {
    let resp = app
        .client
        .post(format!("{}/v1/embeddings", app.url(Service::Completion)))
        .bearer_auth(token)
        .json(&json!({ "model": "minilm", "input": "hello world" }))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    let vector = answer["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    (vector, answer["usage"]["prompt_tokens"].as_u64().unwrap())
}

#[tokio::test]
async fn an_embedding_model_loads_on_demand_leaves_past_its_keep_alive_and_reloads_with_a_new_price(
) {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("models.toml");
    write_table(&table, "1000");
    let app = TestApp::builder()
        .services(&[Service::Auth, Service::Completion])
        .configure(|raw| raw.models = Some(table.clone()))
        .spawn()
        .await;
    let store = &app.running().state.store;
    let token = app.token("emb-rt").await;
    store
        .credit("emb-rt", dec("100"), &LedgerMeta::reason("test funds"))
        .await
        .unwrap();
    let balance = || async { store.balance("emb-rt").await.unwrap() };

    // Listed, but nothing loaded before the first request.
    let first = row(&app).await;
    assert_eq!(first["kind"], "embedding", "{first}");
    assert_eq!(first["state"], "unloaded", "{first}");
    assert_eq!(first["keepAlive"], "1s", "{first}");

    let (vector, tokens) = embed(&app, &token).await;
    let answered = Instant::now();
    assert_eq!(row(&app).await["state"], "ready");

    // A second idle: it leaves, and says so in the list and in /metrics.
    let left = eventually(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { row(&app).await["state"] == "unloaded" },
    )
    .await;
    assert!(left, "still loaded: {}", row(&app).await);
    assert!(
        answered.elapsed() >= Duration::from_millis(800),
        "unloaded after {:?}, before its keep-alive",
        answered.elapsed()
    );
    let base = app.url(Service::Completion);
    let state = |s: &'static str| {
        let label = format!("model=\"minilm\",state=\"{s}\"");
        let (http, base) = (app.client.clone(), base.clone());
        async move { metric(&http, &base, "hearth_model_state", Some(&label)).await }
    };
    assert_eq!(state("unloaded").await, Some(1.0));
    assert_eq!(state("ready").await, Some(0.0));
    assert_eq!(
        metric(&app.client, &base, "hearth_model_unloads_total", None).await,
        Some(1.0)
    );

    // The next request loads it again, and gets the same vector.
    let (again, again_tokens) = embed(&app, &token).await;
    assert_eq!(again_tokens, tokens);
    assert_eq!(again.len(), vector.len());
    let drift = vector
        .iter()
        .zip(&again)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(drift < 1e-6, "the reloaded model's vector moved by {drift}");

    // A reload that only changes the price keeps the model and bills the next request anew.
    write_table(&table, "2000");
    let (status, reloaded) = admin(&app, "models/reload").await;
    assert_eq!(status, 200, "{reloaded}");
    assert_eq!(
        reloaded["changes"]["unchanged"],
        json!(["minilm"]),
        "{reloaded}"
    );
    let before = balance().await;
    let (_, tokens) = embed(&app, &token).await;
    let spent = before - balance().await;
    assert_eq!(
        spent,
        Decimal::from(tokens) * dec("0.002"),
        "{tokens} tokens"
    );
}
