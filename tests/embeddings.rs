//! `POST /v1/embeddings`, driven by the official `openai` Python package (a client nobody here
//! wrote): one text, a batch, base64, shortened vectors, token ids and truncation, each vector
//! checked against sentence-transformers' for the same text (tests/fixtures/embed/minilm.json),
//! billing to the token, and the errors as that client sorts them; then the hostile cases over
//! raw HTTP, each refused with nothing held while the engine keeps serving.

use std::path::PathBuf;

use std::time::{Duration, Instant};

use base64::Engine as _;
use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::common::run_client_script;
use crate::completion::{dec, spawn_completion_table, App};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn reference() -> Value {
    let text = std::fs::read_to_string(root().join("tests/fixtures/embed/minilm.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The completion listener with all-MiniLM-L6-v2 as `minilm` (1000 credits per million input
/// tokens, so that a request costs a visible amount), again as `minilm-short`, which may
/// shorten its vectors, as `minilm-one`, whose queue holds one input, and as `minilm-f32`, in
/// f32 on candle.
async fn spawn() -> App {
    let weights = root().join("weights/all-MiniLM-L6-v2");
    assert!(
        weights.join("model.safetensors").exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        weights.display()
    );
    let rows = format!(
        "[embedding.\"minilm\"]\nweights = \"{w}\"\ninput_price_per_million = \"1000\"\n\
         max_inputs = 64\nmax_queued = 256\n\n\
         [embedding.\"minilm-short\"]\nweights = \"{w}\"\ninput_price_per_million = \"1000\"\n\
         shortens = true\n\n\
         [embedding.\"minilm-one\"]\nweights = \"{w}\"\ninput_price_per_million = \"1000\"\n\
         max_queued = 1\n\n\
         [embedding.\"minilm-f32\"]\nweights = \"{w}\"\ninput_price_per_million = \"1000\"\n\
         precision = \"f32\"\n",
        w = weights.display()
    );
    spawn_completion_table("", &rows, |raw| {
        raw.completion.max_concurrent_per_user = Some(0)
    })
    .await
}

fn vector(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[tokio::test]
async fn the_openai_client_gets_sentence_transformers_vectors_and_pays_per_token() {
    let app = spawn().await;
    let key = app.user("emb", "100").await;
    let r = reference();
    let texts: Vec<String> = r["texts"].as_array().unwrap()[..6]
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let long = r["texts"][7].as_str().unwrap();
    let output = run_client_script(
        "openai_embeddings.py",
        vec![
            "--base-url".into(),
            format!("{}/v1", app.url),
            "--key".into(),
            key.clone(),
            "--model".into(),
            "minilm".into(),
            "--short-model".into(),
            "minilm-short".into(),
            "--texts-json".into(),
            serde_json::to_string(&texts).unwrap(),
            "--long-text".into(),
            long.into(),
        ],
        Vec::new(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client failed:\n{stderr}");
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    let want = |i: usize| vector(&r["vectors"][i]);

    assert_eq!(out["single"]["model"], "minilm");
    assert_eq!(out["single"]["object"], "list");
    assert_eq!(out["single"]["usage"], r["tokens"][0]);
    let c = cosine(&vector(&out["single"]["vector"]), &want(0));
    assert!(c >= 0.9999, "one text, through base64: cosine {c}");
    let batch = &out["batch"];
    assert_eq!(batch["indexes"], json!([0, 1, 2, 3, 4, 5]));
    let tokens: u64 = (0..6).map(|i| r["tokens"][i].as_u64().unwrap()).sum();
    assert_eq!(batch["usage"], tokens);
    assert_eq!(batch["total"], tokens);
    for i in 0..6 {
        let c = cosine(&vector(&batch["vectors"][i]), &want(i));
        assert!(c >= 0.9999, "batch input {i}: cosine {c}");
    }
    // base64 is the little-endian float32 bytes of the same vector.
    for (i, b) in out["base64"].as_array().unwrap().iter().enumerate() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b.as_str().unwrap())
            .unwrap();
        let floats: Vec<f64> = bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect();
        assert_eq!(floats.len(), 384);
        assert!(cosine(&floats, &want(i)) >= 0.9999);
    }
    // Shortened: the first 64 dimensions, at unit length again.
    for (i, s) in out["short"].as_array().unwrap().iter().enumerate() {
        let s = vector(s);
        assert_eq!(s.len(), 64);
        let norm: f64 = s.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
        assert!(cosine(&s, &want(i)[..64]) >= 0.9999);
    }
    // Token ids as given: [CLS] hello world [SEP] is the text "hello world".
    assert_eq!(out["ids"]["usage"], 4);
    assert!(cosine(&vector(&out["ids"]["vector"]), &vector(&out["ids"]["text"])) >= 0.99999);
    // Asked to truncate, the long text is cut where sentence-transformers cuts it.
    assert_eq!(out["truncated"]["usage"], r["max_seq_length"]);
    assert!(cosine(&vector(&out["truncated"]["vector"]), &want(7)) >= 0.9999);

    let errors = &out["errors"];
    assert_eq!(errors["too_long"]["status"], 400, "{errors}");
    assert_eq!(errors["too_long"]["class"], "BadRequestError");
    assert_eq!(errors["too_long"]["param"], "input");
    let message = errors["too_long"]["message"].as_str().unwrap();
    assert!(message.contains("input 1 has 324 tokens"), "{message}");
    assert_eq!(errors["dimensions"]["status"], 400);
    assert_eq!(errors["dimensions"]["param"], "dimensions");
    assert_eq!(errors["unknown_model"]["status"], 404);
    assert_eq!(errors["unknown_model"]["class"], "NotFoundError");
    assert_eq!(errors["empty"]["status"], 400);
    assert_eq!(errors["bad_key"]["class"], "AuthenticationError");

    // Billed to the token at 1000 credits per million, and nothing left held.
    app.wait_no_holds("emb").await;
    let billed = out["tokens_billed"].as_u64().unwrap();
    let spent = dec("100") - app.store().balance("emb").await.unwrap();
    assert_eq!(
        spent,
        Decimal::from(billed) * dec("0.001"),
        "{billed} tokens"
    );
}

/// `POST /v1/embeddings` with `body`: the status and the answer.
async fn embed(http: reqwest::Client, url: String, auth: String, body: Value) -> (u16, Value) {
    post_json(http, format!("{url}/v1/embeddings"), auth, body).await
}

/// `POST url` with a JSON `body` and `authorization: auth`: the status and the answer (null when
/// it is not JSON).
pub(crate) async fn post_json(
    http: reqwest::Client,
    url: String,
    auth: String,
    body: Value,
) -> (u16, Value) {
    let resp = http
        .post(url)
        .header("authorization", auth)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json::<Value>().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn hostile_requests_are_refused_with_nothing_held_while_others_are_served() {
    let app = spawn().await;
    let key = app.user("emb-h", "100").await;
    let auth = format!("Bearer {key}");
    let post = |body: Value| embed(app.http.clone(), app.url.clone(), auth.clone(), body);
    // A client embedding steadily meanwhile.
    let steady = {
        let (http, url, auth) = (app.http.clone(), app.url.clone(), auth.clone());
        tokio::spawn(async move {
            let mut served = 0;
            for _ in 0..10 {
                let body = json!({"model": "minilm", "input": "steady"});
                let (status, answer) = embed(http.clone(), url.clone(), auth.clone(), body).await;
                assert_eq!(status, 200, "{answer}");
                served += 1;
            }
            served
        })
    };
    let many: Vec<String> = (0..10_000).map(|i| format!("text {i}")).collect();
    let cases = [
        (
            "10,000 inputs",
            json!({"model": "minilm", "input": many}),
            400,
            "input",
        ),
        (
            "an empty array",
            json!({"model": "minilm", "input": []}),
            400,
            "input",
        ),
        (
            "a token id outside the vocabulary",
            json!({"model": "minilm", "input": [[101, 99_999_999, 102]]}),
            400,
            "input",
        ),
        (
            "a negative token id",
            json!({"model": "minilm", "input": [[101, -5, 102]]}),
            400,
            "input",
        ),
        (
            "mixed types",
            json!({"model": "minilm", "input": ["text", 5, {"text": "x"}]}),
            400,
            "input",
        ),
        ("no input", json!({"model": "minilm"}), 400, "input"),
        (
            "a bad encoding",
            json!({"model": "minilm", "input": "x", "encoding_format": "hex"}),
            400,
            "encoding_format",
        ),
        (
            "an unknown field",
            json!({"model": "minilm", "input": "x", "temperature": 1}),
            400,
            "temperature",
        ),
    ];
    for (name, body, status, param) in cases {
        let (got, answer) = post(body).await;
        assert_eq!(got, status, "{name}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{name}: {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{name}");
    }
    // A 10 MB string is over the body limit: 413 in the API's shape.
    let (got, answer) = post(json!({"model": "minilm", "input": "a ".repeat(5 << 20)})).await;
    assert_eq!(got, 413, "{answer}");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert_eq!(steady.await.unwrap(), 10);
    // More inputs than the engine's queue holds: 503 overloaded with Retry-After, the hold
    // given back before the answer (the steady client is done: no other hold is in flight).
    let resp = app
        .http
        .post(format!("{}/v1/embeddings", app.url))
        .header("authorization", auth.clone())
        .json(&json!({"model": "minilm-one", "input": ["one", "two"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "overloaded", "{answer}");
    assert!(app.store().holds("emb-h").await.unwrap().is_empty());
    // The engine's work shows in /metrics.
    let minilm = Some("model=\"minilm\"");
    let series = |name| crate::common::metric(&app.http, &app.url, name, minilm);
    assert!(series("hearth_encoder_inputs_total").await.unwrap() >= 10.0);
    assert!(series("hearth_encoder_batches_total").await.unwrap() >= 1.0);
    assert_eq!(series("hearth_encoder_queue_depth").await, Some(0.0));
    app.wait_no_holds("emb-h").await;
    // Only the steady client's requests were billed: one token each and the two specials.
    let spent = dec("100") - app.store().balance("emb-h").await.unwrap();
    assert_eq!(spent, Decimal::from(10 * 3) * dec("0.001"));
}

#[tokio::test]
async fn a_client_that_goes_away_mid_embedding_is_not_charged() {
    let app = spawn().await;
    let key = app.user("emb-gone", "100").await;
    let long = reference()["texts"][7].as_str().unwrap().to_string();
    // 64 inputs of 256 tokens: seconds of work on two cores.
    let body = json!({"model": "minilm", "input": vec![long; 64], "truncate_prompt_tokens": -1});
    let request = tokio::spawn(embed(
        app.http.clone(),
        app.url.clone(),
        format!("Bearer {key}"),
        body,
    ));
    // Once the hold is placed, the client goes away.
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.store().holds("emb-gone").await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no hold was ever placed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    app.wait_no_holds("emb-gone").await;
    assert_eq!(
        app.store().balance("emb-gone").await.unwrap(),
        dec("100"),
        "the abandoned request was charged"
    );
    // The engine serves the next client.
    let (status, answer) = embed(
        app.http.clone(),
        app.url.clone(),
        format!("Bearer {key}"),
        json!({"model": "minilm", "input": "after"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn both_precisions_give_sentence_transformers_vectors() {
    let app = spawn().await;
    let key = app.user("emb-p", "100").await;
    let r = reference();
    for model in ["minilm", "minilm-f32"] {
        let body = json!({"model": model, "input": [r["texts"][0], r["texts"][6]]});
        let (status, answer) = embed(
            app.http.clone(),
            app.url.clone(),
            format!("Bearer {key}"),
            body,
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        for (k, i) in [(0, 0), (1, 6)] {
            let c = cosine(
                &vector(&answer["data"][k]["embedding"]),
                &vector(&r["vectors"][i]),
            );
            assert!(c >= 0.9999, "{model}, text {i}: cosine {c}");
        }
    }
}

/// A GGUF decoder embedder as a model row: llama.cpp's vectors over HTTP (tests/fixtures/embed/
/// decoders), billed per token, `dimensions` refused by name (the row does not shorten).
#[tokio::test]
async fn a_gguf_decoder_embedder_answers_llama_cpps_vectors_and_bills_its_tokens() {
    let dir = root().join("tests/fixtures/embed/decoders");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("decoders.json")).unwrap()).unwrap();
    let qwen = &reference["models"][0];
    let rows = format!(
        "[embedding.\"qwen3-embed\"]\nweights = \"{}\"\ninput_price_per_million = \"1000\"\n",
        dir.join(qwen["file"].as_str().unwrap()).display()
    );
    let app = spawn_completion_table("", &rows, |raw| {
        raw.completion.max_concurrent_per_user = Some(0)
    })
    .await;
    let key = app.user("emb-gguf", "100").await;
    let inputs = qwen["inputs"].as_array().unwrap();
    let texts: Vec<&Value> = inputs.iter().map(|i| &i["text"]).collect();
    let (status, answer) = embed(
        app.http.clone(),
        app.url.clone(),
        format!("Bearer {key}"),
        json!({"model": "qwen3-embed", "input": texts}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let tokens: u64 = inputs
        .iter()
        .map(|i| i["tokens"].as_array().unwrap().len() as u64)
        .sum();
    assert_eq!(answer["usage"]["prompt_tokens"], tokens);
    for (k, input) in inputs.iter().enumerate() {
        let c = cosine(
            &vector(&answer["data"][k]["embedding"]),
            &vector(&input["embedding"]),
        );
        assert!(c >= 0.9999, "input {k}: cosine {c}");
    }
    let (status, answer) = embed(
        app.http.clone(),
        app.url.clone(),
        format!("Bearer {key}"),
        json!({"model": "qwen3-embed", "input": "hello", "dimensions": 16}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("dimensions"), "{answer}");
}
