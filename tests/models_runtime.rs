//! Models at run time: loaded, unloaded and reloaded through the admin API, the CLI and
//! `SIGHUP` while other streams run; unloaded when idle past their keep-alive (the memory leaves
//! the process); a memory budget that evicts the least recently used idle model and refuses,
//! naming who holds the memory, when everything is busy; a broken table that changes nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hearth_server::Service;
use serde_json::{json, Value};

use crate::common::process::{proc_status_kib, ServerProcess};
use crate::common::{assert_error, eventually, hearth_cli, metric, TestApp};

const SMOLLM2: &str = "weights/SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "weights/gemma-3-270m-Q4_K_M.gguf";
/// Gemma 3 270M's GGUF has no chat template (models.toml says the same).
const GEMMA_TEMPLATE: &str = r#"chat_template = """{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}{% set r = 'model' %}{% else %}{% set r = 'user' %}{% endif %}<start_of_turn>{{ r }}
{{ m.content | trim }}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}""""#;

fn weights(file: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        path.display()
    );
    path
}

/// One `[text."id"]` row on `file` with a small KV budget, and `extra` keys.
fn row(id: &str, file: &str, extra: &str) -> String {
    let template = if file == GEMMA { GEMMA_TEMPLATE } else { "" };
    format!(
        "[text.\"{id}\"]\nweights = \"{}\"\ninput_price_per_million = \"1\"\noutput_price_per_million = \"2\"\nmax_output_tokens = 4096\nkv_budget_mb = 32\nshutdown_grace_ms = 500\n{template}\n{extra}\n\n",
        weights(file).display()
    )
}

fn write_table(path: &Path, rows: &[String]) {
    std::fs::write(
        path,
        format!("[defaults]\nthreads = 2\n\n{}", rows.concat()),
    )
    .unwrap();
}

fn chat(token: &str, model: &str, content: &str, max: u64) -> Value {
    json!({
        "serviceToken": token,
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0.0,
        "maxOutputTokens": max,
    })
}

/// A prompt both models answer at length, greedily.
const LONG: &str = "Count from 1 to 300, one number after another, separated by commas.";

/// A table of SmolLM2 as alpha-3.3 and Gemma as gamma-3.5-sonnet (extra keys on each row) in a
/// fresh folder: the folder (kept while it lives) and the table's path.
fn two_models(alpha: &str, gamma: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("models.toml");
    write_table(
        &table,
        &[
            row("alpha-3.3", SMOLLM2, alpha),
            row("gamma-3.5-sonnet", GEMMA, gamma),
        ],
    );
    (dir, table)
}

/// The auth and completion services on the table at `table`, with `configure`'s settings.
async fn spawn(
    table: &Path,
    configure: impl FnOnce(&mut hearth_server::config::RawConfig),
) -> TestApp {
    let table = table.to_path_buf();
    TestApp::builder()
        .services(&[Service::Auth, Service::Completion])
        .configure(|raw| {
            raw.models = Some(table);
            raw.completion.max_concurrent_per_user = Some(0);
            configure(raw);
        })
        .spawn()
        .await
}

/// The admin API's answer at `/admin/{path}`.
async fn admin(app: &TestApp, path: &str, mut body: Value) -> (u16, Value) {
    body["adminKey"] = json!(app.admin_key());
    let (status, value) = app
        .post(Service::Auth, &format!("/admin/{path}"), body)
        .await;
    (status.as_u16(), value)
}

/// `id`'s row of `hearth models list` as the admin API gives it.
async fn model_row(app: &TestApp, id: &str) -> Value {
    let (status, body) = admin(app, "models", json!({})).await;
    assert_eq!(status, 200, "{body}");
    body["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no row {id} in {body}"))
}

async fn state_becomes(app: &TestApp, id: &str, state: &str) {
    let reached = eventually(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { model_row(app, id).await["state"] == state },
    )
    .await;
    assert!(
        reached,
        "{id} never became {state}: {}",
        model_row(app, id).await
    );
}

/// The CLI against the running server's data dir, off the runtime that serves it.
async fn cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend(["--data-dir".into(), app.data_dir().display().to_string()]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        hearth_cli(&args, &[])
    })
    .await
    .unwrap()
}

/// The text of a whole completion.
async fn complete(http: &reqwest::Client, base: &str, body: &Value) -> String {
    let r = http
        .post(format!("{base}/"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    text_of(&v)
}

/// A completion response's output text.
fn text_of(response: &Value) -> String {
    let out = &response["output"];
    out["content"]
        .as_str()
        .or(out.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| out.to_string())
}

/// A started stream: its tokens so far, and the rest read on.
struct Stream {
    body: reqwest::Response,
    buf: String,
    tokens: String,
}

impl Stream {
    async fn start(http: &reqwest::Client, base: &str, body: &Value) -> Stream {
        let r = http
            .post(format!("{base}/stream"))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut s = Stream {
            body: r,
            buf: String::new(),
            tokens: String::new(),
        };
        assert!(
            s.next().await.is_some_and(|e| e["token"].is_string()),
            "a first token"
        );
        s
    }

    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else {
                    continue;
                };
                let v: Value = serde_json::from_str(data.trim_start()).unwrap();
                if let Some(t) = v["token"].as_str() {
                    self.tokens.push_str(t);
                }
                return Some(v);
            }
            let chunk = self.body.chunk().await.unwrap()?;
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Reads to the end: the whole text and the final event.
    async fn finish(mut self) -> (String, Value) {
        let mut last = Value::Null;
        while let Some(e) = self.next().await {
            last = e;
        }
        (self.tokens, last)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_unload_and_reload_through_the_admin_api_and_the_cli_leave_a_running_stream_untouched()
{
    let (_dir, table) = two_models("", "");
    let app = spawn(&table, |_| {}).await;
    let (http, base) = (app.client.clone(), app.url(Service::Completion));
    let token = app.token("ops").await;
    app.credit("ops", "100").await;
    let request = chat(&token, "alpha-3.3", LONG, 400);
    state_becomes(&app, "gamma-3.5-sonnet", "ready").await;
    let alone = complete(&http, &base, &request).await;

    let stream = Stream::start(&http, &base, &request).await;
    // Unload the other model with the CLI; the list shows it.
    let (ok, out, err) = cli(&app, &["models", "unload", "gamma-3.5-sonnet"]).await;
    assert!(ok, "{out}{err}");
    state_becomes(&app, "gamma-3.5-sonnet", "unloaded").await;
    let (ok, out, err) = cli(&app, &["models", "list"]).await;
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("gamma-3.5-sonnet"))
        .unwrap();
    assert!(line.contains("unloaded"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("alpha-3.3") && l.contains("ready")),
        "{out}"
    );
    // Load it again through the admin API: answered once ready.
    let (status, body) = admin(&app, "models/load", json!({ "id": "gamma-3.5-sonnet" })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"]["state"], "ready");
    // A reload adding an id on alpha's weights: it shares alpha's engine, nothing reloads.
    write_table(
        &table,
        &[
            row("alpha-3.3", SMOLLM2, ""),
            row("beta-4-mini", SMOLLM2, ""),
            row("gamma-3.5-sonnet", GEMMA, ""),
        ],
    );
    let (ok, out, err) = cli(&app, &["models", "reload"]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("added: beta-4-mini"), "{out}");
    assert!(
        out.contains("unchanged: alpha-3.3, gamma-3.5-sonnet"),
        "{out}"
    );
    let beta = model_row(&app, "beta-4-mini").await;
    assert_eq!(beta["state"], "ready", "{beta}");
    assert_eq!(beta["sharesWith"], json!(["alpha-3.3"]));

    let (text, last) = stream.finish().await;
    assert!(last["completed"].as_bool().unwrap_or(false), "{last}");
    assert_eq!(
        text, alone,
        "the running stream is the same, token for token"
    );
    assert_eq!(text_of(&last["response"]), alone);
    // Unknown ids and pinned models are refused, with the admin API's errors.
    let (status, body) = admin(&app, "models/unload", json!({ "id": "nope" })).await;
    assert_eq!(status, 404);
    assert_error(&body, "NotFound");
    let (ok, _, err) = cli(&app, &["models", "load", "nope"]).await;
    assert!(!ok && err.contains("nope"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_evicts_the_least_recently_used_idle_model_and_refuses_while_everything_is_busy()
{
    // SmolLM2 holds 94 + 32 MiB, Gemma 242 + 32 MiB: one at a time fits in 350 MiB.
    let (_dir, table) = two_models("", "");
    let app = spawn(&table, |raw| raw.loading.ram_budget_mb = Some(350)).await;
    let (http, base) = (app.client.clone(), app.url(Service::Completion));
    let token = app.token("ops").await;
    app.credit("ops", "100").await;
    state_becomes(&app, "alpha-3.3", "ready").await;
    assert_eq!(
        model_row(&app, "gamma-3.5-sonnet").await["state"],
        "unloaded",
        "what does not fit is not loaded at start"
    );
    let (_, health) = app.get(Service::Completion, "/").await;
    assert_eq!(health["models"]["gamma-3.5-sonnet"], "unloaded");

    // A request for gamma unloads the idle alpha and waits for gamma to load.
    let gamma = complete(&http, &base, &chat(&token, "gamma-3.5-sonnet", "Hello", 8)).await;
    assert!(!gamma.is_empty());
    assert_eq!(model_row(&app, "alpha-3.3").await["state"], "unloaded");
    let waits = metric(&http, &base, "hearth_model_load_waits_total", None).await;
    assert!(
        waits.unwrap_or(0.0) >= 1.0,
        "the wait is counted: {waits:?}"
    );

    // gamma busy with a stream: alpha has no room, and the refusal names who holds it.
    let stream = Stream::start(&http, &base, &chat(&token, "gamma-3.5-sonnet", LONG, 300)).await;
    let r = http
        .post(format!("{base}/"))
        .json(&chat(&token, "alpha-3.3", "Hello", 8))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    let message = assert_error(&body, "Overloaded");
    assert!(
        message.contains("is held by gamma-3.5-sonnet (274 MiB, busy, 1 requests)"),
        "names the holder: {message}"
    );
    let (status, body) = admin(&app, "models/load", json!({ "id": "alpha-3.3" })).await;
    assert_eq!(status, 503, "{body}");
    drop(stream);
    // Once gamma is idle again, alpha comes back (gamma leaves for it).
    let back = eventually(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let r = http
                .post(format!("{base}/"))
                .json(&chat(&token, "alpha-3.3", "Hello", 8))
                .send()
                .await
                .unwrap();
            r.status() == 200
        },
    )
    .await;
    assert!(back);
    assert_eq!(
        model_row(&app, "gamma-3.5-sonnet").await["state"],
        "unloaded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_of_a_broken_table_keeps_every_model_and_answers_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("models.toml");
    write_table(&table, &[row("alpha-3.3", SMOLLM2, "")]);
    let app = spawn(&table, |_| {}).await;
    state_becomes(&app, "alpha-3.3", "ready").await;
    let good = std::fs::read_to_string(&table).unwrap();
    let missing = dir.path().join("gone.gguf");
    for (broken, says) in [
        (
            good.replace("kv_budget_mb", "kv_budgt_mb"),
            "the closest is kv_budget_mb",
        ),
        (
            good.replace(
                &weights(SMOLLM2).display().to_string(),
                &missing.display().to_string(),
            ),
            "does not exist",
        ),
        (
            good.replace("kv_budget_mb = 32", "kv_budget_mb = \"lots\""),
            "kv_budget_mb",
        ),
        (format!("{good}\n[text.\"new\"]\nweights = 3\n"), "weights"),
        ("[text.\"x\"\n".to_string(), "models.toml"),
    ] {
        std::fs::write(&table, &broken).unwrap();
        let (status, body) = admin(&app, "models/reload", json!({})).await;
        assert_eq!(status, 400, "{broken}: {body}");
        let message = assert_error(&body, "InvalidRequest");
        assert!(message.contains(says), "{says:?} in {message}");
        let alpha = model_row(&app, "alpha-3.3").await;
        assert_eq!(alpha["state"], "ready", "{alpha}");
        assert!(alpha["next"].is_null(), "nothing new loads: {alpha}");
    }
    let (ok, _, err) = cli(&app, &["models", "reload"]).await;
    assert!(!ok && err.contains("models.toml"), "{err}");
    std::fs::write(&table, good).unwrap();
    let (status, body) = admin(&app, "models/reload", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changes"]["unchanged"], json!(["alpha-3.3"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_switches_a_changed_model_while_its_running_stream_finishes_on_the_old_version() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("models.toml");
    write_table(&table, &[row("m", SMOLLM2, "")]);
    let server = ServerProcess::start(&["auth", "completion"], &table, &[]);
    let (http, base) = (reqwest::Client::new(), server.url("completion").to_string());
    let token = server.token("ops").await;
    let request = chat(&token, "m", LONG, 400);
    let old = complete(&http, &base, &request).await;

    let stream = Stream::start(&http, &base, &request).await;
    assert!(server.model_row("m").await["inFlight"].as_u64() >= Some(1));
    // m becomes Gemma, and g names the same Gemma row to compare with.
    write_table(&table, &[row("g", GEMMA, ""), row("m", GEMMA, "")]);
    server.signal("HUP");
    let switched = eventually(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let m = server.model_row("m").await;
            m["state"] == "ready" && m["next"].is_null() && m["sharesWith"] == json!(["g"])
        },
    )
    .await;
    assert!(switched, "{}", server.model_row("m").await);
    let new = complete(&http, &base, &request).await;
    let gemma = complete(&http, &base, &chat(&token, "g", LONG, 400)).await;
    assert_eq!(new, gemma, "new requests run on the new version");
    assert_ne!(new, old);

    let (text, last) = stream.finish().await;
    assert!(last["completed"].as_bool().unwrap_or(false), "{last}");
    assert_eq!(
        text, old,
        "the running stream finished on the old version, token for token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_expiry_unloads_an_idle_model_and_its_memory_leaves_the_process() {
    let (_dir, table) = two_models("pinned = true", "keep_alive = \"2s\"");
    let server = ServerProcess::start(&["auth", "completion"], &table, &[]);
    let (http, base) = (reqwest::Client::new(), server.url("completion").to_string());
    let token = server.token("ops").await;
    complete(&http, &base, &chat(&token, "gamma-3.5-sonnet", "Hello", 16)).await;
    assert_eq!(server.model_row("gamma-3.5-sonnet").await["state"], "ready");
    let loaded_kib = proc_status_kib(server.pid(), "VmRSS:");
    let gone = eventually(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { server.model_row("gamma-3.5-sonnet").await["state"] == "unloaded" },
    )
    .await;
    assert!(gone, "gamma leaves after 2 s idle");
    let unloaded_kib = proc_status_kib(server.pid(), "VmRSS:");
    // Gemma's weights are 241 MiB on disk; most of them must leave the process.
    assert!(
        loaded_kib.saturating_sub(unloaded_kib) > 150 * 1024,
        "RSS {loaded_kib} KiB loaded, {unloaded_kib} KiB after the unload"
    );
    assert_eq!(
        server.model_row("alpha-3.3").await["state"],
        "ready",
        "pinned stays"
    );
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = text
        .lines()
        .find(|l| {
            l.starts_with("hearth_model_state{")
                && l.contains("model=\"gamma-3.5-sonnet\"")
                && l.contains("state=\"unloaded\"")
        })
        .unwrap_or_else(|| panic!("no state series in {text}"));
    assert!(series.ends_with(" 1"), "{series}");
    // The next request loads it again.
    complete(&http, &base, &chat(&token, "gamma-3.5-sonnet", "Hello", 16)).await;
}
