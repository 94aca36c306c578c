//! The OpenAI-compatible routes, driven by the official `openai` Python package (a client
//! nobody here wrote; `scripts/python-clients.sh` installs it): models, plain and streamed
//! chat, text completions, log probabilities, JSON-schema output that parses and validates,
//! a tool-call round trip (forced call, the tool's answer, the reply), errors as that client
//! sorts them, and a stream the client abandons. Plus the hostile cases over raw HTTP.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::run_client_script;
use crate::completion::{assert_billed_for_what_it_made, dec, request, spawn_completion_with, App};

/// Runs `tests/clients/openai_client.py` with `args`; its JSON output.
async fn run_client(args: Vec<String>) -> Value {
    let output = run_client_script("openai_client.py", args, Vec::new()).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the openai client failed:\n{stderr}"
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

async fn spawn() -> App {
    spawn_completion_with("", |raw| raw.completion.max_concurrent_per_user = Some(0)).await
}

fn client_args(app: &App, key: &str, poor: &str, cases: &str) -> Vec<String> {
    vec![
        "--base-url".into(),
        format!("{}/v1", app.url),
        "--key".into(),
        key.into(),
        "--poor-key".into(),
        poor.into(),
        "--model".into(),
        "alpha-3.3".into(),
        "--cases".into(),
        cases.into(),
    ]
}

#[tokio::test]
async fn the_openai_client_runs_every_kind_of_request() {
    let app = spawn().await;
    let key = app.user("oa", "100").await;
    let poor = app.user("oa-poor", "0").await;
    let out = run_client(client_args(
        &app,
        &key,
        &poor,
        "models,chat,stream,completions,logprobs,json_schema,tools,errors",
    ))
    .await;

    let ids = out["models"]["ids"].as_array().unwrap();
    assert!(ids.contains(&json!("alpha-3.3")) && ids.contains(&json!("beta-4-mini")));
    assert_eq!(out["models"]["retrieved"], "alpha-3.3");

    // Plain chat: greedy, so it equals the spec's route for the same messages, token for token.
    let chat = &out["chat"];
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["role"], "assistant");
    let content = chat["content"].as_str().unwrap();
    assert!(!content.is_empty());
    let (status, spec) = app
        .post("/", request(&key, "What is the capital of France?", 24))
        .await;
    assert_eq!(status, 200, "{spec}");
    assert_eq!(spec["output"], content, "greedy /v1 equals POST /");
    let usage = &chat["usage"];
    assert_eq!(usage["prompt_tokens"], spec["usage"]["promptTokens"]);
    assert_eq!(
        usage["completion_tokens"],
        spec["usage"]["completionTokens"]
    );
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );
    // ignore_eos: an answer that stops on its own goes on to exactly max_tokens.
    let eos = &chat["ignore_eos"];
    assert_eq!(eos["short_finish"], "stop", "{eos}");
    assert!(eos["short_tokens"].as_u64().unwrap() < 64);
    assert_eq!(eos["finish_reason"], "length");
    assert_eq!(eos["completion_tokens"], 64);
    let short = eos["short"].as_str().unwrap();
    assert!(eos["content"].as_str().unwrap().starts_with(short), "{eos}");
    let hearth = &chat["hearth"];
    assert_eq!(hearth["input_cost"], spec["usage"]["inputCost"]);
    assert!(
        dec(hearth["balance_after"].as_str().unwrap())
            < dec(hearth["balance_before"].as_str().unwrap())
    );

    // Streamed: the same text, the role first, usage in the last chunk.
    let stream = &out["stream"];
    assert_eq!(stream["content"], content);
    assert_eq!(stream["roles"], json!(["assistant"]));
    assert_eq!(
        stream["usage"]["completion_tokens"],
        usage["completion_tokens"]
    );
    assert_eq!(stream["finish_reason"], chat["finish_reason"]);
    assert_eq!(stream["hearth"]["input_cost"], hearth["input_cost"]);

    // Text completions, whole and streamed; a stop sequence ends the text before it.
    let text = &out["completions"];
    assert!(!text["text"].as_str().unwrap().is_empty());
    assert_eq!(text["streamed"], text["text"]);
    assert_eq!(text["usage"]["completion_tokens"], 8);
    // The streamed usage chunk carries the same usage and cost as the whole answer.
    assert_eq!(text["streamed_usage"], text["usage"]);
    assert_eq!(
        text["streamed_hearth"]["input_cost"],
        text["hearth"]["input_cost"]
    );
    assert_eq!(
        text["streamed_hearth"]["output_cost"],
        text["hearth"]["output_cost"]
    );
    assert!(!text["stopped_text"].as_str().unwrap().contains(" 6"));
    assert_eq!(text["stopped_finish"], "stop");

    // Log probabilities: one entry per generated token, three alternatives each, spelling the
    // answer.
    let lp = &out["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len() as u64,
        lp["completion_tokens"].as_u64().unwrap()
    );
    assert!(lp["top_counts"].as_array().unwrap().iter().all(|n| n == 3));
    assert!(lp["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l.as_f64().unwrap() <= 0.0));
    let spelled: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(spelled, lp["content"].as_str().unwrap());

    // JSON schema: the script parsed and validated every answer (jsonschema) or failed.
    for answer in out["json_schema"]["schema"].as_array().unwrap() {
        assert_eq!(answer["finish_reason"], "stop", "{answer}");
        assert!(answer["parsed"]["name"].is_string());
    }
    assert!(out["json_schema"]["json_object"].is_object());

    // Tools: a forced call with valid arguments, its answer, then a reply; streamed the same.
    let tools = &out["tools"];
    assert_eq!(tools["first_finish"], "tool_calls");
    assert_eq!(tools["call_name"], "get_weather");
    assert!(tools["arguments"]["city"].is_string());
    assert!(!tools["answer"].as_str().unwrap().is_empty());
    assert_eq!(tools["required_name"], "get_weather");
    let streamed = &tools["streamed"];
    assert_eq!(streamed["name"], "get_weather");
    assert_eq!(streamed["ids"], 1);
    assert_eq!(streamed["finish_reason"], "tool_calls");
    assert_eq!(streamed["arguments"], tools["required_arguments"]);

    // Errors, as the client classifies them.
    let e = &out["errors"];
    assert_eq!(e["bad_key"]["status"], 401);
    assert_eq!(e["bad_key"]["class"], "AuthenticationError");
    assert_eq!(e["unknown_model"]["status"], 404);
    assert_eq!(e["unknown_model"]["class"], "NotFoundError");
    assert_eq!(e["n_two"]["status"], 400);
    assert_eq!(e["n_two"]["param"], "n");
    assert_eq!(e["too_many_tokens"]["param"], "max_tokens");
    assert_eq!(e["bad_schema"]["status"], 400);
    assert_eq!(e["bad_schema"]["param"], "response_format");
    assert_eq!(e["no_funds"]["status"], 402);
    assert_eq!(e["no_funds"]["code"], "insufficient_quota");
    assert_eq!(e["ignore_eos_grammar"]["status"], 400);
    assert_eq!(e["ignore_eos_grammar"]["param"], "ignore_eos");

    app.wait_no_holds("oa").await;
    assert_eq!(app.store().balance("oa-poor").await.unwrap(), dec("0"));
}

#[tokio::test]
async fn a_stream_the_client_abandons_stops_and_is_billed_for_what_it_made() {
    let app = spawn().await;
    let key = app.user("quitter", "10").await;
    let before = app.store().balance("quitter").await.unwrap();
    let out = run_client(client_args(&app, &key, &key, "cancel")).await;
    assert_eq!(out["cancel"]["chunks_read"], 4);
    // The worst case held 1,500 output tokens; a few dozen were made.
    assert_billed_for_what_it_made(&app, "quitter", before, 1500).await;
}

async fn post_raw(app: &App, path: &str, key: Option<&str>, body: &str) -> (u16, Value, Duration) {
    let started = Instant::now();
    let mut req = app
        .http
        .post(format!("{}{path}", app.url))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (
        status,
        r.json().await.unwrap_or(Value::Null),
        started.elapsed(),
    )
}

#[tokio::test]
async fn hostile_requests_get_the_apis_error_shape_quickly_and_hold_nothing() {
    let app = spawn().await;
    let key = app.user("mallory", "5").await;
    let chat = "/v1/chat/completions";
    let ok = |extra: Value| {
        let mut body = json!({"model": "alpha-3.3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string()
    };
    // A schema nested past the JSON parser's depth limit is refused as bad JSON (written as
    // text: a `Value` that deep would overflow this test's own stack).
    let deep_schema = format!(
        "{}{{\"type\": \"string\"}}{}",
        "{\"type\": \"object\", \"properties\": {\"a\": ".repeat(2000),
        "}}".repeat(2000)
    );
    let deep = ok(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": "SCHEMA"}}}))
        .replace("\"SCHEMA\"", &deep_schema);
    let cases: Vec<(&str, Option<&str>, String, u16, &str)> = vec![
        ("no key", None, ok(json!({})), 401, "authentication_error"),
        (
            "not json",
            Some(&key),
            "{\"model\": ".into(),
            400,
            "invalid_request_error",
        ),
        (
            "array body",
            Some(&key),
            "[1,2]".into(),
            400,
            "invalid_request_error",
        ),
        (
            "wrong type",
            Some(&key),
            ok(json!({"temperature": "hot"})),
            400,
            "invalid_request_error",
        ),
        (
            "temperature range",
            Some(&key),
            ok(json!({"temperature": 99})),
            400,
            "invalid_request_error",
        ),
        (
            "tool without id",
            Some(&key),
            ok(json!({"messages": [{"role": "tool", "content": "x"}]})),
            400,
            "invalid_request_error",
        ),
        (
            "image part",
            Some(&key),
            ok(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            400,
            "invalid_request_error",
        ),
        (
            "unknown tool choice",
            Some(&key),
            ok(json!({"tool_choice": {"type": "function", "function": {"name": "x"}}})),
            400,
            "invalid_request_error",
        ),
        (
            "five stops",
            Some(&key),
            ok(json!({"stop": ["a", "b", "c", "d", "e"]})),
            400,
            "invalid_request_error",
        ),
        (
            "deep schema",
            Some(&key),
            ok(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": deep}}}),
            ),
            400,
            "invalid_request_error",
        ),
        (
            "bad schema",
            Some(&key),
            ok(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": {"type": 7}}}}),
            ),
            400,
            "invalid_request_error",
        ),
    ];
    for (name, key, body, status, kind) in cases {
        let (got, answer, took) = post_raw(&app, chat, key, &body).await;
        assert_eq!(got, status, "{name}: {answer}");
        assert_eq!(answer["error"]["type"], kind, "{name}: {answer}");
        assert!(answer["error"]["message"].is_string(), "{name}");
        assert!(took < Duration::from_secs(10), "{name} took {took:?}");
    }
    assert_eq!(app.store().balance("mallory").await.unwrap(), dec("5"));
    // Grammars built to be expensive (a huge alternation, a regex whose automaton explodes):
    // refused, or generated within their bounds; either way answered in seconds.
    let many: Vec<String> = (0..5_000)
        .map(|i| format!("value-{i}-{}", "x".repeat(20)))
        .collect();
    let costly = [
        json!({"enum": many}),
        json!({"type": "string", "pattern": "((a|b)*c(a|b){40}){1,50}"}),
        json!({"type": "object", "properties": (0..300).map(|i| (format!("k{i}"), json!({"type": "integer"}))).collect::<serde_json::Map<_, _>>(), "required": (0..300).map(|i| format!("k{i}")).collect::<Vec<_>>()}),
    ];
    for schema in costly {
        let body = ok(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}),
        );
        let (got, answer, took) = post_raw(&app, chat, Some(&key), &body).await;
        assert!(got == 200 || got == 400, "{got}: {answer}");
        if got == 400 {
            assert_eq!(answer["error"]["param"], "response_format", "{answer}");
        }
        assert!(took < Duration::from_secs(20), "took {took:?}");
    }
    app.wait_no_holds("mallory").await;
}

/// Runs the client's image `case` as `user` against a fresh image server with 10 credits; the
/// server, and the case's output.
async fn run_image_case(user: &str, case: &str) -> (crate::imagine::ImagineApp, Value) {
    let img = crate::imagine::ImagineApp::start("10", "").await;
    let key = img.app.token(user).await;
    let base = format!("{}/v1", img.app.url(hearth_server::Service::Imagine));
    let mut out = run_client(vec![
        "--base-url".into(),
        base.clone(),
        "--key".into(),
        key.clone(),
        "--poor-key".into(),
        key,
        "--model".into(),
        "alpha-3.3".into(),
        "--cases".into(),
        case.into(),
        "--image-base-url".into(),
        base,
        "--image-model".into(),
        "xl-lightning".into(),
    ])
    .await;
    (img, out[case].take())
}

/// The balance is 10 less `cost`, and nothing is held.
async fn paid(img: &crate::imagine::ImagineApp, user: &str, cost: &str) {
    let store = &img.app.running().state.store;
    assert_eq!(store.balance(user).await.unwrap(), dec("10") - dec(cost));
    assert!(store.holds(user).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_openai_client_generates_an_image_and_it_is_billed() {
    let (img, images) = run_image_case("painter", "images").await;
    assert_eq!(images["count"], 1);
    assert_eq!(
        (images["width"].as_u64(), images["height"].as_u64()),
        (Some(256), Some(256))
    );
    assert_eq!(images["n_two_param"], "n");
    // 0.040 per 1024² image at 4 steps: a sixteenth of the pixels at half the steps.
    let hearth = &images["hearth"];
    assert_eq!(hearth["cost"], "0.001250");
    assert_eq!(hearth["seed"], 42);
    paid(&img, "painter", "0.00125").await;
}

#[tokio::test]
async fn the_openai_client_edits_an_image_with_a_mask_and_it_is_billed_for_the_steps_run() {
    let (img, edits) = run_image_case("retoucher", "image_edits").await;
    assert_eq!(edits["count"], 1);
    assert_eq!(
        (edits["width"].as_u64(), edits["height"].as_u64()),
        (Some(256), Some(256))
    );
    assert_eq!(edits["wrong_mask_param"], "mask", "{edits}");
    // Strength 0.5 of 4 steps runs 2: a sixteenth of the pixels at half the steps.
    let hearth = &edits["hearth"];
    assert_eq!(hearth["cost"], "0.001250", "{hearth}");
    assert_eq!(hearth["seed"], 42);
    paid(&img, "retoucher", "0.00125").await;
}
