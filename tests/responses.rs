//! OpenAI's Responses API (`/v1/responses`, stateless), driven by the official `openai`
//! package's `responses` client: a greedy answer equal to the spec's route, streamed (raw
//! events and the SDK's stream helper, which checks the events add up), input items,
//! `incomplete` at the output limit, a forced function call and its output sent back, a
//! streamed call's arguments, JSON-schema output, and what is refused by name. Then a stream
//! the client drops, billed for what it made.

use serde_json::{json, Value};

use crate::common::run_client_script;
use crate::completion::{assert_billed_for_what_it_made, dec, request, spawn_completion_with, App};

async fn spawn() -> App {
    spawn_completion_with("", |raw| raw.completion.max_concurrent_per_user = Some(0)).await
}

#[tokio::test]
async fn the_openai_client_runs_the_responses_api() {
    let app = spawn().await;
    let key = app.user("rs", "100").await;
    let (status, spec) = app
        .post("/", request(&key, "What is the capital of France?", 24))
        .await;
    assert_eq!(status, 200, "{spec}");
    let expected = spec["output"].as_str().unwrap();
    let args: Vec<String> = [
        "--base-url",
        &format!("{}/v1", app.url),
        "--key",
        &key,
        "--model",
        "alpha-3.3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let output = run_client_script("openai_responses.py", args, Vec::new()).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client failed:\n{stderr}");
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();

    let plain = &out["plain"];
    assert!(plain["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(plain["object"], "response");
    assert_eq!(
        plain["text"], expected,
        "greedy /v1/responses equals POST /"
    );
    assert_eq!(plain["items"], json!(["message"]));
    assert_eq!(
        plain["usage"]["input_tokens"],
        spec["usage"]["promptTokens"]
    );
    assert_eq!(
        plain["usage"]["output_tokens"],
        spec["usage"]["completionTokens"]
    );

    let s = &out["stream"];
    assert_eq!(s["text"], expected);
    assert_eq!(s["final_text"], expected);
    assert_eq!(s["usage"], plain["usage"]);
    let events: Vec<&str> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(
        events[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        events[events.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            plain["status"]
                .as_str()
                .map_or("", |st| if st == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                })
        ]
    );
    assert_eq!(out["helper_text"], expected);
    assert_eq!(
        out["items_text"], expected,
        "the same conversation as items"
    );

    let short = &out["short"];
    assert_eq!(short["status"], "incomplete");
    assert_eq!(short["reason"], "max_output_tokens");
    assert_eq!(short["tokens"], 3);

    let t = &out["tools"];
    assert_eq!(t["name"], "get_weather");
    assert!(t["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(t["arguments"]["city"].is_string(), "{t}");
    assert_eq!(t["reply_items"], json!(["message"]));
    assert!(!t["reply"].as_str().unwrap().is_empty());
    assert!(t["streamed_arguments"]["city"].is_string());

    assert!(!out["people"].as_array().unwrap().is_empty());

    let e = &out["errors"];
    assert_eq!(e["bad_key"]["status"], 401);
    assert_eq!(e["bad_key"]["class"], "AuthenticationError");
    assert_eq!(e["store"]["status"], 400);
    assert_eq!(e["store"]["param"], "store");
    assert_eq!(e["previous"]["status"], 400);
    assert_eq!(e["previous"]["param"], "previous_response_id");
    assert_eq!(e["unknown_model"]["status"], 404);
    assert_eq!(e["image"]["status"], 400);
    app.wait_no_holds("rs").await;
}

#[tokio::test]
async fn a_responses_stream_the_client_drops_is_billed_for_what_it_made() {
    use futures::StreamExt;
    let app = spawn().await;
    let key = app.user("rs-quitter", "10").await;
    let before = app.store().balance("rs-quitter").await.unwrap();
    let response = app
        .http
        .post(format!("{}/v1/responses", app.url))
        .bearer_auth(&key)
        .json(
            &json!({"model": "alpha-3.3", "max_output_tokens": 1500, "stream": true,
            "input": "Write a very long story about a lighthouse."}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut deltas = 0;
    while deltas < 4 {
        let chunk = stream.next().await.unwrap().unwrap();
        deltas += String::from_utf8_lossy(&chunk)
            .matches("event: response.output_text.delta")
            .count();
    }
    drop(stream);
    assert_billed_for_what_it_made(&app, "rs-quitter", before, 1500).await;
}

#[tokio::test]
async fn hostile_responses_requests_get_openais_error_shape_and_hold_nothing() {
    let app = spawn().await;
    let key = app.user("rs-mallory", "5").await;
    let ok = json!({"model": "alpha-3.3", "input": "hi", "max_output_tokens": 4});
    let with = |k: &str, v: Value| {
        let mut body = ok.clone();
        body[k] = v;
        body.to_string()
    };
    let item = json!({"role": "user", "content": "x "});
    let cases: Vec<(&str, Option<&str>, String, u16)> = vec![
        ("no key", None, ok.to_string(), 401),
        ("not json", Some(&key), "{\"model\": ".into(), 400),
        ("wrong type", Some(&key), with("input", json!(7)), 400),
        ("empty input", Some(&key), with("input", json!([])), 400),
        (
            "unknown item",
            Some(&key),
            with("input", json!([{"type": "computer_call"}])),
            400,
        ),
        (
            "bad role",
            Some(&key),
            with("input", json!([{"role": "robot", "content": "x"}])),
            400,
        ),
        (
            "bad tool",
            Some(&key),
            with("tools", json!([{"type": "web_search"}])),
            400,
        ),
        (
            "bad format",
            Some(&key),
            with("text", json!({"format": {"type": "yaml"}})),
            400,
        ),
        (
            "bad tool_choice",
            Some(&key),
            with("tool_choice", json!({"type": "function", "name": "nope"})),
            400,
        ),
        (
            "10,000 items",
            Some(&key),
            with("input", json!(vec![item; 10_000])),
            400,
        ),
        (
            "10 MB",
            Some(&key),
            with("input", json!("x".repeat(10 * 1024 * 1024))),
            413,
        ),
    ];
    for (name, key, body, status) in cases {
        let mut req = app
            .http
            .post(format!("{}/v1/responses", app.url))
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        let response = req.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{name}");
        let answer: Value = response.json().await.unwrap();
        assert!(answer["error"]["message"].is_string(), "{name}: {answer}");
        assert!(answer["error"]["type"].is_string(), "{name}: {answer}");
    }
    app.wait_no_holds("rs-mallory").await;
    assert_eq!(app.store().balance("rs-mallory").await.unwrap(), dec("5"));
}
