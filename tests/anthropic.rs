//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), driven by the
//! official `anthropic` Python package (a client nobody here wrote; `scripts/python-clients.sh`
//! installs it): plain and streamed answers equal to the spec's route token for token, stop
//! sequences and `max_tokens` as stop reasons, a forced tool call's round trip (whole and
//! streamed as `input_json_delta`s), `tool_choice: any`, structured output
//! (`output_config.format`), token counting, bearer credentials,
//! and errors as that client sorts them. Then over raw HTTP: the event names of a stream,
//! hostile bodies in Anthropic's error shape with nothing held, and a client that goes away.

use serde_json::{json, Value};

use crate::common::run_client_script;
use crate::completion::{assert_billed_for_what_it_made, dec, request, spawn_completion_with, App};

async fn run_client(app: &App, key: &str, poor: &str, cases: &str, extra: &[&str]) -> Value {
    let mut args: Vec<String> = vec![
        "--base-url".into(),
        app.url.clone(),
        "--key".into(),
        key.into(),
        "--poor-key".into(),
        poor.into(),
        "--model".into(),
        "alpha-3.3".into(),
        "--cases".into(),
        cases.into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let output = run_client_script("anthropic_client.py", args, Vec::new()).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the anthropic client failed:\n{stderr}"
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

async fn spawn() -> App {
    spawn_completion_with("", |raw| raw.completion.max_concurrent_per_user = Some(0)).await
}

#[tokio::test]
async fn the_anthropic_client_runs_every_kind_of_request() {
    let app = spawn().await;
    let key = app.user("an", "100").await;
    let poor = app.user("an-poor", "0").await;
    // The spec's route, greedy, for the same conversation: the answer every front end gives.
    let (status, spec) = app
        .post("/", request(&key, "What is the capital of France?", 24))
        .await;
    assert_eq!(status, 200, "{spec}");
    let expected = spec["output"].as_str().unwrap().to_string();
    // A stop sequence from inside that answer: its second word.
    let word = expected
        .split_whitespace()
        .nth(1)
        .expect("a greedy answer of several words")
        .to_string();
    let out = run_client(
        &app,
        &key,
        &poor,
        "messages,stream,stop,tools,structured,count,errors",
        &["--stop", &word],
    )
    .await;

    let m = &out["messages"];
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["model"], "alpha-3.3");
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        m["text"],
        expected.as_str(),
        "greedy /v1/messages equals POST /"
    );
    assert_eq!(m["blocks"][0]["type"], "text");
    assert_eq!(m["usage"]["input_tokens"], spec["usage"]["promptTokens"]);
    assert_eq!(
        m["usage"]["output_tokens"],
        spec["usage"]["completionTokens"]
    );
    let reason = m["stop_reason"].as_str().unwrap();
    assert!(reason == "end_turn" || reason == "max_tokens", "{m}");
    assert_eq!(m["stop_sequence"], Value::Null);
    assert_eq!(out["bearer"]["text"], expected.as_str());

    // Streamed: Anthropic's event order, the same text, the same usage.
    let s = &out["stream"];
    let events: Vec<&str> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(events[..2], ["message_start", "content_block_start"]);
    assert_eq!(
        events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(events[2..events.len() - 3]
        .iter()
        .all(|e| *e == "content_block_delta" || *e == "text"));
    assert_eq!(s["text"], expected.as_str());
    assert_eq!(s["final_text"], expected.as_str());
    assert_eq!(s["usage"], m["usage"]);
    assert_eq!(s["stop_reason"], m["stop_reason"]);

    // A stop sequence ends the answer before it, and says which; max_tokens says so.
    let stop = &out["stop"];
    assert_eq!(stop["stop_reason"], "stop_sequence", "{stop}");
    assert_eq!(stop["stop_sequence"], word.as_str());
    let cut = &expected[..expected.find(&word).unwrap()];
    assert_eq!(stop["text"], cut);
    assert_eq!(stop["short_reason"], "max_tokens");
    assert_eq!(stop["short_tokens"], 3);

    // Tools: a forced call with valid input, its result sent back, a text reply; `any` forces
    // a call too; streamed, the input arrives as input_json_delta events and parses the same.
    let t = &out["tools"];
    assert_eq!(t["stop_reason"], "tool_use");
    assert_eq!(t["name"], "get_weather");
    assert!(t["id"].as_str().unwrap().starts_with("toolu_"));
    assert!(t["input"]["city"].is_string(), "{t}");
    assert_ne!(t["answer_stop_reason"], "tool_use");
    assert_eq!(t["any_name"], "get_weather");
    assert!(t["any_input"]["city"].is_string());
    let streamed = &t["streamed"];
    assert_eq!(streamed["name"], "get_weather");
    assert_eq!(streamed["input"], t["input"]);
    assert_eq!(streamed["stop_reason"], "tool_use");
    assert!(streamed["deltas"].as_u64().unwrap() >= 1);

    // output_config.format: sampled answers that parse and follow the schema (the script
    // validated each with jsonschema).
    assert!(!out["structured"].as_array().unwrap().is_empty());
    for answer in out["structured"].as_array().unwrap() {
        assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
        assert!(answer["parsed"]["name"].is_string());
    }

    // count_tokens: what the generation reads; tools add their description.
    let c = &out["count"];
    assert_eq!(c["input_tokens"], c["used"]);
    assert!(c["with_tools"].as_u64() > c["input_tokens"].as_u64());

    // Errors, as the client classifies them.
    let e = &out["errors"];
    assert_eq!(e["bad_key"]["status"], 401);
    assert_eq!(e["bad_key"]["class"], "AuthenticationError");
    assert_eq!(e["bad_key"]["type"], "authentication_error");
    assert_eq!(e["unknown_model"]["status"], 404);
    assert_eq!(e["unknown_model"]["class"], "NotFoundError");
    for case in ["thinking", "image", "too_many_tokens"] {
        assert_eq!(e[case]["status"], 400, "{case}: {}", e[case]);
        assert_eq!(e[case]["class"], "BadRequestError");
        assert_eq!(e[case]["type"], "invalid_request_error");
    }
    assert_eq!(e["no_funds"]["status"], 402);
    assert_eq!(e["no_funds"]["type"], "billing_error");

    app.wait_no_holds("an").await;
    assert_eq!(app.store().balance("an-poor").await.unwrap(), dec("0"));
}

/// `POST /v1/messages` over raw HTTP with the token as `x-api-key`.
async fn post(app: &App, key: Option<&str>, body: &str) -> reqwest::Response {
    let mut req = app
        .http
        .post(format!("{}/v1/messages", app.url))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(body.to_string());
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn a_stream_names_its_events_as_anthropic_does() {
    let app = spawn().await;
    let key = app.user("an-sse", "100").await;
    let body = json!({"model": "alpha-3.3", "max_tokens": 8, "stream": true,
        "messages": [{"role": "user", "content": "Say hello."}]});
    let response = post(&app, Some(&key), &body.to_string()).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("x-stream-id"));
    let text = response.text().await.unwrap();
    let mut names = Vec::new();
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let name = event
            .lines()
            .find_map(|l| l.strip_prefix("event:"))
            .map(str::trim)
            .unwrap_or_else(|| panic!("an event without a name: {event:?}"));
        let data: Value = serde_json::from_str(
            event
                .lines()
                .find_map(|l| l.strip_prefix("data:"))
                .unwrap()
                .trim(),
        )
        .unwrap();
        assert_eq!(
            data["type"], name,
            "each payload's type is its event's name"
        );
        names.push(name.to_string());
    }
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(names.last().unwrap(), "message_stop");
    app.wait_no_holds("an-sse").await;
}

#[tokio::test]
async fn hostile_messages_get_anthropics_error_shape_and_hold_nothing() {
    let app = spawn().await;
    let key = app.user("an-mallory", "5").await;
    let ok = json!({"model": "alpha-3.3", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let with = |k: &str, v: Value| {
        let mut body = ok.clone();
        body[k] = v;
        body.to_string()
    };
    let without = |k: &str| {
        let mut body = ok.clone();
        body.as_object_mut().unwrap().remove(k);
        body.to_string()
    };
    let cases: Vec<(&str, Option<&str>, String, u16, &str)> = vec![
        ("no key", None, ok.to_string(), 401, "authentication_error"),
        (
            "not json",
            Some(&key),
            "{\"model\": ".into(),
            400,
            "invalid_request_error",
        ),
        (
            "no max_tokens",
            Some(&key),
            without("max_tokens"),
            400,
            "invalid_request_error",
        ),
        (
            "no messages",
            Some(&key),
            with("messages", json!([])),
            400,
            "invalid_request_error",
        ),
        (
            "bad role",
            Some(&key),
            with("messages", json!([{"role": "tool", "content": "x"}])),
            400,
            "invalid_request_error",
        ),
        (
            "bad block",
            Some(&key),
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "video"}]}]),
            ),
            400,
            "invalid_request_error",
        ),
        (
            "tool_use from the user",
            Some(&key),
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
            ),
            400,
            "invalid_request_error",
        ),
        (
            "server tool",
            Some(&key),
            with(
                "tools",
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
            ),
            400,
            "invalid_request_error",
        ),
        (
            "unknown tool named",
            Some(&key),
            with("tool_choice", json!({"type": "tool", "name": "nope"})),
            400,
            "invalid_request_error",
        ),
        (
            "any without tools",
            Some(&key),
            with("tool_choice", json!({"type": "any"})),
            400,
            "invalid_request_error",
        ),
        (
            "too many stops",
            Some(&key),
            with("stop_sequences", json!(vec!["x"; 17])),
            400,
            "invalid_request_error",
        ),
        (
            "empty stop",
            Some(&key),
            with("stop_sequences", json!([""])),
            400,
            "invalid_request_error",
        ),
        (
            "bad top_p",
            Some(&key),
            with("top_p", json!(1.5)),
            400,
            "invalid_request_error",
        ),
        (
            "bad system",
            Some(&key),
            with("system", json!(7)),
            400,
            "invalid_request_error",
        ),
        (
            "unknown model",
            Some(&key),
            with("model", json!("nope")),
            404,
            "not_found_error",
        ),
        (
            "10 MB",
            Some(&key),
            with("system", json!("x".repeat(10 * 1024 * 1024))),
            413,
            "request_too_large",
        ),
        (
            "10,000 blocks",
            Some(&key),
            with(
                "messages",
                json!([{"role": "user", "content": vec![json!({"type": "text", "text": "x "}); 10_000]}]),
            ),
            400,
            "invalid_request_error",
        ),
        (
            "wrong types",
            Some(&key),
            with("max_tokens", json!("four")),
            400,
            "invalid_request_error",
        ),
    ];
    for (name, key, body, status, kind) in cases {
        let response = post(&app, key, &body).await;
        assert_eq!(response.status().as_u16(), status, "{name}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["type"], "error", "{name}: {answer}");
        assert_eq!(answer["error"]["type"], kind, "{name}: {answer}");
        assert!(answer["error"]["message"].is_string(), "{name}");
    }
    app.wait_no_holds("an-mallory").await;
    assert_eq!(app.store().balance("an-mallory").await.unwrap(), dec("5"));
}

#[tokio::test]
async fn a_stream_the_client_abandons_stops_and_is_billed_for_what_it_made() {
    use futures::StreamExt;
    let app = spawn().await;
    let key = app.user("an-quitter", "10").await;
    let before = app.store().balance("an-quitter").await.unwrap();
    let body = json!({"model": "alpha-3.3", "max_tokens": 1500, "stream": true,
        "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}]});
    let response = post(&app, Some(&key), &body.to_string()).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut deltas = 0;
    while deltas < 4 {
        let chunk = stream.next().await.unwrap().unwrap();
        deltas += String::from_utf8_lossy(&chunk)
            .matches("event: content_block_delta")
            .count();
    }
    drop(stream);
    assert_billed_for_what_it_made(&app, "an-quitter", before, 1500).await;
}
