//! Ollama's API (`/api/...`), driven by the official `ollama` Python package (a client nobody
//! here wrote; `scripts/python-clients.sh` installs it): chat and generate, whole and streamed
//! as NDJSON, equal to the spec's route token for token, with options (`num_predict`, `stop`,
//! `seed`, `top_k`), a JSON-schema `format`, `raw`, a load-only request, a tool-call round
//! trip, the model routes, `/api/embed` against sentence-transformers' vectors, and errors as
//! that client reports them. Then over raw HTTP: hostile bodies in Ollama's error shape with
//! nothing held, and a stream the client drops, billed for what it made.

use serde_json::{json, Value};

use crate::common::run_client_script;
use crate::completion::{
    assert_billed_for_what_it_made, dec, request, spawn_completion_table, App,
};

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The completion listener with the default chat models and all-MiniLM-L6-v2 as `minilm`.
async fn spawn() -> App {
    let weights = root().join("weights/all-MiniLM-L6-v2");
    let rows = format!(
        "[embedding.\"minilm\"]\nweights = \"{}\"\ninput_price_per_million = \"1000\"\n",
        weights.display()
    );
    spawn_completion_table("", &rows, |raw| {
        raw.completion.max_concurrent_per_user = Some(0)
    })
    .await
}

async fn run_client(app: &App, key: &str, poor: &str, cases: &str, stop: &str) -> Value {
    let args: Vec<String> = [
        "--host",
        &app.url,
        "--key",
        key,
        "--poor-key",
        poor,
        "--model",
        "alpha-3.3",
        "--embed-model",
        "minilm",
        "--cases",
        cases,
        "--stop",
        stop,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let output = run_client_script("ollama_client.py", args, Vec::new()).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the ollama client failed:\n{stderr}"
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

#[tokio::test]
async fn the_ollama_client_runs_every_kind_of_request() {
    let app = spawn().await;
    let key = app.user("ol", "100").await;
    let poor = app.user("ol-poor", "0").await;
    let (status, spec) = app
        .post("/", request(&key, "What is the capital of France?", 24))
        .await;
    assert_eq!(status, 200, "{spec}");
    let expected = spec["output"].as_str().unwrap().to_string();
    let word = expected.split_whitespace().nth(1).unwrap().to_string();
    let out = run_client(
        &app,
        &key,
        &poor,
        "chat,generate,tools,models,embed,errors",
        &word,
    )
    .await;

    // Chat: greedy equals POST /, whole and as NDJSON lines, with Ollama's counts.
    let c = &out["chat"];
    assert_eq!(
        c["content"],
        expected.as_str(),
        "greedy /api/chat equals POST /"
    );
    assert_eq!(c["role"], "assistant");
    assert_eq!(c["done"], true);
    assert_eq!(c["prompt_eval_count"], spec["usage"]["promptTokens"]);
    assert_eq!(c["eval_count"], spec["usage"]["completionTokens"]);
    assert!(c["total_duration"].as_u64().unwrap() > 0);
    assert_eq!(c["streamed"], expected.as_str());
    assert!(c["lines"].as_u64().unwrap() >= 2);
    assert_eq!(c["stream_done"], true);
    assert_eq!(c["stream_eval_count"], c["eval_count"]);
    assert_eq!(c["short_reason"], "length");
    assert_eq!(c["short_count"], 3);
    assert!(!c["people"].as_array().unwrap().is_empty());
    assert_eq!(c["load_reason"], "load");

    // Generate: the prompt with its system through the template is the same conversation.
    let g = &out["generate"];
    assert_eq!(g["response"], expected.as_str());
    assert_eq!(g["streamed"], expected.as_str());
    assert_eq!(g["stopped"], &expected[..expected.find(&word).unwrap()]);
    assert_eq!(g["stopped_reason"], "stop");
    assert_eq!(g["raw_count"], 8);
    assert!(!g["raw"].as_str().unwrap().is_empty());

    // Tools: a format in a call's shape makes the answer a call, read back as one with its
    // arguments an object (streamed too); sent back with the tool's answer by name, the model
    // answers in text.
    let t = &out["tools"];
    let call = json!([{"name": "get_weather", "arguments": {"city": "Paris"}}]);
    assert_eq!(t["calls"], call, "{t}");
    assert_eq!(t["streamed"], call, "{t}");
    assert_eq!(t["content"], "");
    assert!(!t["answer"].as_str().unwrap().is_empty());

    // The model routes.
    let m = &out["models"];
    let tags = m["tags"].as_array().unwrap();
    assert!(tags.contains(&json!("alpha-3.3")) && tags.contains(&json!("minilm")));
    assert!(m["show_capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("completion")));
    assert_eq!(
        m["show_template"], true,
        "a loaded model shows its template"
    );
    assert!(m["ps"].as_array().unwrap().contains(&json!("alpha-3.3")));
    // keep_alive: 0 with nothing to generate unloads it (`ollama stop`); then a load for ten
    // minutes shows in ps as when it leaves.
    assert_eq!(m["stop_reason"], "unload");
    assert!(
        !m["ps_after_stop"]
            .as_array()
            .unwrap()
            .contains(&json!("alpha-3.3")),
        "{m}"
    );
    assert_eq!(m["load_reason"], "load");
    let expires_in = m["expires_in"].as_f64().expect("alpha-3.3 is in ps again");
    assert!((500.0..=600.0).contains(&expires_in), "{expires_in}");
    assert_eq!(m["version"], env!("CARGO_PKG_VERSION"));

    // Embeddings: sentence-transformers' vectors (tests/fixtures/embed/minilm.json holds
    // others; here one text alone and in a batch give the same unit vector).
    let e = &out["embed"];
    assert_eq!(e["count"], 2);
    assert_eq!(e["width"], 384);
    assert!(e["tokens"].as_u64().unwrap() > 0);
    let (a, b): (Vec<f64>, Vec<f64>) = (
        serde_json::from_value(e["first"].clone()).unwrap(),
        serde_json::from_value(e["single"].clone()).unwrap(),
    );
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    assert!(dot > 0.9999, "cosine {dot}");

    // Errors, as the client reports them.
    let x = &out["errors"];
    assert_eq!(x["no_key"]["status"], 401);
    assert!(x["no_key"]["error"].as_str().unwrap().contains("Bearer"));
    assert_eq!(x["bad_key"]["status"], 401);
    assert_eq!(x["unknown_model"]["status"], 404);
    assert_eq!(x["think"]["status"], 400);
    assert_eq!(x["mirostat"]["status"], 400);
    assert!(x["mirostat"]["error"]
        .as_str()
        .unwrap()
        .contains("mirostat"));
    assert_eq!(x["images"]["status"], 400);
    assert_eq!(x["no_funds"]["status"], 402);
    assert_eq!(x["runtime_options"]["status"], 200);

    app.wait_no_holds("ol").await;
    assert_eq!(app.store().balance("ol-poor").await.unwrap(), dec("0"));
}

async fn post(app: &App, path: &str, key: Option<&str>, body: &str) -> reqwest::Response {
    let mut req = app
        .http
        .post(format!("{}{path}", app.url))
        .body(body.to_string());
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn hostile_ollama_requests_get_its_error_shape_and_hold_nothing() {
    let app = spawn().await;
    let key = app.user("ol-mallory", "5").await;
    let ok = json!({"model": "alpha-3.3", "stream": false, "messages": [{"role": "user", "content": "hi"}],
        "options": {"num_predict": 4}});
    let with = |k: &str, v: Value| {
        let mut body = ok.clone();
        body[k] = v;
        body.to_string()
    };
    let cases: Vec<(&str, &str, Option<&str>, String, u16)> = vec![
        ("no key", "/api/chat", None, ok.to_string(), 401),
        (
            "not json",
            "/api/chat",
            Some(&key),
            "{\"model\": ".into(),
            400,
        ),
        (
            "no model",
            "/api/chat",
            Some(&key),
            with("model", json!("")),
            400,
        ),
        (
            "bad role",
            "/api/chat",
            Some(&key),
            with("messages", json!([{"role": "robot", "content": "x"}])),
            400,
        ),
        (
            "bad content",
            "/api/chat",
            Some(&key),
            with("messages", json!([{"role": "user", "content": 7}])),
            400,
        ),
        (
            "bad options",
            "/api/chat",
            Some(&key),
            with("options", json!({"num_predict": 0})),
            400,
        ),
        (
            "bad keep_alive",
            "/api/chat",
            Some(&key),
            with("keep_alive", json!("until Tuesday")),
            400,
        ),
        (
            "keep_alive of the wrong type",
            "/api/chat",
            Some(&key),
            with("keep_alive", json!({"minutes": 5})),
            400,
        ),
        (
            "unknown option",
            "/api/chat",
            Some(&key),
            with("options", json!({"warp": 9})),
            400,
        ),
        (
            "bad stop",
            "/api/chat",
            Some(&key),
            with("options", json!({"stop": [""]})),
            400,
        ),
        (
            "bad format",
            "/api/chat",
            Some(&key),
            with("format", json!("yaml")),
            400,
        ),
        (
            "bad tool",
            "/api/chat",
            Some(&key),
            with(
                "tools",
                json!([{"type": "function", "function": {"name": "no spaces allowed"}}]),
            ),
            400,
        ),
        (
            "raw with system",
            "/api/generate",
            Some(&key),
            json!({"model": "alpha-3.3", "prompt": "x", "raw": true, "system": "s"}).to_string(),
            400,
        ),
        (
            "context",
            "/api/generate",
            Some(&key),
            json!({"model": "alpha-3.3", "prompt": "x", "context": [1, 2]}).to_string(),
            400,
        ),
        (
            "unknown model",
            "/api/generate",
            Some(&key),
            json!({"model": "nope", "prompt": "x"}).to_string(),
            404,
        ),
        (
            "embed nothing",
            "/api/embed",
            Some(&key),
            json!({"model": "minilm", "input": []}).to_string(),
            400,
        ),
        (
            "10 MB",
            "/api/chat",
            Some(&key),
            with(
                "messages",
                json!([{"role": "user", "content": "x".repeat(10 * 1024 * 1024)}]),
            ),
            413,
        ),
        (
            "10,000 messages",
            "/api/chat",
            Some(&key),
            with(
                "messages",
                json!(vec![json!({"role": "user", "content": "x"}); 10_000]),
            ),
            400,
        ),
        (
            "10,000 embed inputs",
            "/api/embed",
            Some(&key),
            json!({"model": "minilm", "input": vec!["x"; 10_000]}).to_string(),
            400,
        ),
    ];
    for (name, path, key, body, status) in cases {
        let response = post(&app, path, key, &body).await;
        assert_eq!(response.status().as_u16(), status, "{name}");
        let answer: Value = response.json().await.unwrap();
        assert!(answer["error"].is_string(), "{name}: {answer}");
    }
    app.wait_no_holds("ol-mallory").await;
    assert_eq!(app.store().balance("ol-mallory").await.unwrap(), dec("5"));
}

#[tokio::test]
async fn a_stream_the_client_drops_stops_and_is_billed_for_what_it_made() {
    use futures::StreamExt;
    let app = spawn().await;
    let key = app.user("ol-quitter", "10").await;
    let before = app.store().balance("ol-quitter").await.unwrap();
    let body = json!({"model": "alpha-3.3", "options": {"num_predict": 1500},
        "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}]});
    let response = post(&app, "/api/chat", Some(&key), &body.to_string()).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let mut stream = response.bytes_stream();
    let mut lines = 0;
    while lines < 4 {
        let chunk = stream.next().await.unwrap().unwrap();
        lines += chunk.iter().filter(|&&b| b == b'\n').count();
    }
    drop(stream);
    assert_billed_for_what_it_made(&app, "ol-quitter", before, 1500).await;
}
