//! `POST /v1/rerank` (and `/rerank`, `/v2/rerank`) on a generated tiny cross-encoder
//! (tests/fixtures/rerank), driven by the official `cohere` Python package (a client nobody here
//! wrote): the order and scores sentence-transformers' `CrossEncoder` gives the same pairs,
//! `top_n`, documents echoed, billing to the token and the errors as that client sorts them; then
//! the hostile cases over raw HTTP, each refused with nothing held while others are served.

use std::path::PathBuf;

use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::common::run_client_script;
use crate::completion::{dec, spawn_completion_table, App};
use crate::embeddings::post_json;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rerank")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(fixture().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The completion listener with the tiny cross-encoder as `tiny` (1000 credits per million
/// tokens), its documents capped at 16 a request.
async fn spawn() -> App {
    let rows = format!(
        "[rerank.\"tiny\"]\nweights = \"{}\"\ninput_price_per_million = \"1000\"\n\
         max_inputs = 16\n",
        fixture().display()
    );
    spawn_completion_table("", &rows, |raw| {
        raw.completion.max_concurrent_per_user = Some(0)
    })
    .await
}

/// The documents' indexes best first, and their scores, from the reference.
fn ranked(scores: &[Value]) -> Vec<(usize, f64)> {
    let mut order: Vec<(usize, f64)> = scores
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.as_f64().unwrap()))
        .collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    order
}

fn assert_ranked(got: &Value, want: &[(usize, f64)], what: &str) {
    let got = got.as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{what}: {got:?}");
    for (g, (index, score)) in got.iter().zip(want) {
        assert_eq!(g["index"], *index, "{what}: {got:?}");
        let s = g["relevance_score"].as_f64().unwrap();
        assert!(
            (s - score).abs() <= 1e-5 + 1e-3 * score,
            "{what}: document {index} scored {s}, reference {score}"
        );
    }
}

#[tokio::test]
async fn the_cohere_client_gets_cross_encoder_order_and_scores_and_pays_per_token() {
    let app = spawn().await;
    let key = app.user("rr", "100").await;
    let r = reference();
    let case = &r["cases"][0];
    let query = case["query"].as_str().unwrap();
    let documents = &r["documents"];
    let output = run_client_script(
        "cohere_rerank.py",
        vec![
            "--base-url".into(),
            app.url.clone(),
            "--key".into(),
            key.clone(),
            "--model".into(),
            "tiny".into(),
            "--query".into(),
            query.into(),
            "--documents-json".into(),
            documents.to_string(),
        ],
        Vec::new(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client failed:\n{stderr}");
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    let want = ranked(case["scores"].as_array().unwrap());
    assert_ranked(&out["v2"]["results"], &want, "v2");
    assert!(out["v2"]["id"].as_str().unwrap().starts_with("rerank-"));
    assert_ranked(&out["v2_top2"], &want[..2], "top 2");
    // v1 with return_documents: each result carries its own document's text.
    for result in out["v1_documents"].as_array().unwrap() {
        let index = result["index"].as_u64().unwrap() as usize;
        assert_eq!(result["text"], documents[index], "{result}");
    }
    let errors = &out["errors"];
    assert_eq!(errors["unknown_model"]["status"], 404, "{errors}");
    assert_eq!(errors["no_documents"]["status"], 400, "{errors}");
    assert_eq!(errors["no_documents"]["param"], "documents", "{errors}");
    assert_eq!(errors["bad_key"]["status"], 401, "{errors}");

    // Three rankings of every document, each pair's tokens billed at 1000 per million.
    let pair_tokens: u64 = case["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .sum();
    app.wait_no_holds("rr").await;
    let spent = dec("100") - app.store().balance("rr").await.unwrap();
    assert_eq!(spent, Decimal::from(3 * pair_tokens) * dec("0.001"));
}

/// `POST {path}` with `body`: the status and the answer.
async fn post(app: &App, path: &str, auth: &str, body: Value) -> (u16, Value) {
    let url = format!("{}{path}", app.url);
    post_json(app.http.clone(), url, auth.to_string(), body).await
}

#[tokio::test]
async fn every_route_and_document_shape_ranks_alike_with_usage() {
    let app = spawn().await;
    let key = app.user("rr-shapes", "100").await;
    let auth = format!("Bearer {key}");
    let r = reference();
    let case = &r["cases"][1];
    let want = ranked(case["scores"].as_array().unwrap());
    let texts = r["documents"].as_array().unwrap();
    let objects: Vec<Value> = texts.iter().map(|t| json!({"text": t})).collect();
    let tokens: u64 = case["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .sum();
    for (path, documents) in [("/v1/rerank", json!(texts)), ("/rerank", json!(objects))] {
        let body = json!({"model": "tiny", "query": case["query"], "documents": documents,
            "top_n": 3, "return_documents": true});
        let (status, answer) = post(&app, path, &auth, body).await;
        assert_eq!(status, 200, "{path}: {answer}");
        assert_eq!(answer["model"], "tiny");
        assert_ranked(&answer["results"], &want[..3], path);
        for result in answer["results"].as_array().unwrap() {
            let index = result["index"].as_u64().unwrap() as usize;
            assert_eq!(result["document"]["text"], texts[index]);
        }
        assert_eq!(answer["usage"]["prompt_tokens"], tokens, "{path}");
        assert_eq!(answer["usage"]["total_tokens"], tokens, "{path}");
    }
    // Without return_documents the results carry none.
    let body = json!({"model": "tiny", "query": case["query"], "documents": texts});
    let (status, answer) = post(&app, "/v1/rerank", &auth, body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["results"][0].get("document").is_none(), "{answer}");
    // The model is listed beside the others.
    let models: Value = app
        .http
        .get(format!("{}/v1/models", app.url))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(models["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["id"] == "tiny"));
}

#[tokio::test]
async fn hostile_rerank_requests_are_refused_with_nothing_held_while_others_are_served() {
    let app = spawn().await;
    let key = app.user("rr-h", "100").await;
    let auth = format!("Bearer {key}");
    let steady = {
        let (http, url, auth) = (app.http.clone(), app.url.clone(), auth.clone());
        tokio::spawn(async move {
            for _ in 0..10 {
                let resp = http
                    .post(format!("{url}/v1/rerank"))
                    .header("authorization", &auth)
                    .json(&json!({"model": "tiny", "query": "port", "documents": ["a", "b"]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
            }
        })
    };
    let many: Vec<String> = (0..10_000).map(|i| format!("document {i}")).collect();
    let cases = [
        (
            "10,000 documents",
            json!({"model": "tiny", "query": "q", "documents": many}),
            "documents",
        ),
        (
            "no documents",
            json!({"model": "tiny", "query": "q", "documents": []}),
            "documents",
        ),
        (
            "documents of mixed types",
            json!({"model": "tiny", "query": "q", "documents": ["a", {"text": "b"}, 3]}),
            "documents",
        ),
        (
            "a document object with more than text",
            json!({"model": "tiny", "query": "q", "documents": [{"text": "a", "id": 1}]}),
            "documents",
        ),
        (
            "an empty query",
            json!({"model": "tiny", "query": "  ", "documents": ["a"]}),
            "query",
        ),
        (
            "no query",
            json!({"model": "tiny", "documents": ["a"]}),
            "query",
        ),
        (
            "top_n of 0",
            json!({"model": "tiny", "query": "q", "documents": ["a"], "top_n": 0}),
            "top_n",
        ),
        (
            "an unknown field",
            json!({"model": "tiny", "query": "q", "documents": ["a"], "rank_fields": ["x"]}),
            "rank_fields",
        ),
    ];
    for (name, body, param) in cases {
        let (got, answer) = post(&app, "/v1/rerank", &auth, body).await;
        assert_eq!(got, 400, "{name}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{name}: {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{name}");
    }
    let (got, answer) = post(
        &app,
        "/v1/rerank",
        &auth,
        json!({"model": "tiny", "query": "q", "documents": ["a ".repeat(5 << 20)]}),
    )
    .await;
    assert_eq!(got, 413, "{answer}");
    let (got, _) = post(&app, "/v1/rerank", "Bearer nope", json!({"model": "tiny"})).await;
    assert_eq!(got, 401);
    steady.await.unwrap();
    // A long document is cut to what the model reads, not refused: billed for what was read.
    let (got, answer) = post(
        &app,
        "/v1/rerank",
        &auth,
        json!({"model": "tiny", "query": "q", "documents": ["word ".repeat(5000)]}),
    )
    .await;
    assert_eq!(got, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"], 128);
    let series = |name| crate::common::metric(&app.http, &app.url, name, Some("model=\"tiny\""));
    assert_eq!(series("hearth_encoder_inputs_total").await, Some(21.0));
    app.wait_no_holds("rr-h").await;
    // The steady client's ten requests (two pairs of five tokens each) and the long one.
    let spent = dec("100") - app.store().balance("rr-h").await.unwrap();
    assert_eq!(spent, Decimal::from(10 * 2 * 5 + 128) * dec("0.001"));
}

/// A GGUF decoder reranker as a model row (a generated Qwen3-Reranker-style file,
/// tests/fixtures/embed/decoders): llama.cpp's server's order and scores over HTTP, and the
/// prompt tokens llama.cpp counts, billed.
#[tokio::test]
async fn a_gguf_decoder_reranker_answers_llama_cpps_order_and_bills_its_prompts() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embed/decoders");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("rerankers.json")).unwrap())
            .unwrap();
    let model = &reference["models"][0];
    assert_eq!(model["template"], true);
    let rows = format!(
        "[rerank.\"qwen3-rank\"]\nweights = \"{}\"\ninput_price_per_million = \"1000\"\n",
        dir.join(model["file"].as_str().unwrap()).display()
    );
    let app = spawn_completion_table("", &rows, |raw| {
        raw.completion.max_concurrent_per_user = Some(0)
    })
    .await;
    let key = app.user("rr-gguf", "100").await;
    let case = &model["cases"][0];
    let documents = &reference["documents"];
    let (status, answer) = post(
        &app,
        "/v1/rerank",
        &format!("Bearer {key}"),
        json!({"model": "qwen3-rank", "query": case["query"], "documents": documents}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let scores: Vec<Value> = case["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["score"].clone())
        .collect();
    let want = ranked(&scores);
    let got = answer["results"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, (index, score)) in got.iter().zip(&want) {
        assert_eq!(g["index"], *index, "{answer}");
        let s = g["relevance_score"].as_f64().unwrap();
        // Within the Q8_0 file's tolerance of crates/embed/tests/decoder_rerank.rs.
        assert!(
            (s - score).abs() <= 5e-3,
            "document {index}: {s} vs {score}"
        );
    }
    let tokens: u64 = case["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["n_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(answer["usage"]["prompt_tokens"], tokens);
    app.wait_no_holds("rr-gguf").await;
    let spent = dec("100") - app.store().balance("rr-gguf").await.unwrap();
    assert_eq!(spent, Decimal::from(tokens) * dec("0.001"));
}
