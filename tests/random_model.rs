//! `hearth dev random-model`: a random llama written with a real model's tokenizer is a model the
//! server serves like any other (it is how the GPU benchmark makes its 1.1B model on a machine
//! that cannot be sent weights, then serves it and hands the same file to llama.cpp), and
//! arguments it cannot honour are refused with what was wrong.

use std::path::{Path, PathBuf};

use hearth_server::Service;
use reqwest::StatusCode;
use rust_decimal::Decimal;
use serde_json::json;

use crate::common::{hearth_cli, TestApp};

fn smollm2() -> PathBuf {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        path.display()
    );
    path
}

/// Runs `hearth dev random-model ARGS`: (success, stdout, stderr).
fn random_model(args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["dev", "random-model"];
    all.extend_from_slice(args);
    hearth_cli(&all, &[])
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn a_random_model_with_a_copied_tokenizer_is_served_and_billed_like_any_model() {
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("tok.gguf");
    let (ok, out, err) = random_model(&[
        s(&tok),
        "--tokenizer-only",
        "--tokenizer-from",
        s(&smollm2()),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("49152 tokens"), "{out}");
    assert!(
        std::fs::metadata(&tok).unwrap().len() < 4 << 20,
        "the tokenizer alone is small enough to carry"
    );
    let model = dir.path().join("m.gguf");
    let small = [
        "--layers",
        "2",
        "--hidden",
        "256",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--ff",
        "512",
    ];
    let mut args = vec![s(&model), "--tokenizer-from", s(&tok), "--weights", "q8_0"];
    args.extend(small);
    let (ok, out, err) = random_model(&args);
    assert!(ok, "{err}");
    assert!(out.contains("Q8_0, vocabulary 49152"), "{out}");

    let table = dir.path().join("models.toml");
    std::fs::write(
        &table,
        format!(
            "[defaults]\nthreads = 1\n\n[text.\"random\"]\nweights = \"{}\"\n\
             input_price_per_million = \"1.00\"\noutput_price_per_million = \"4.00\"\n",
            model.display()
        ),
    )
    .unwrap();
    let app = TestApp::builder()
        .services(&[Service::Auth, Service::Completion])
        .configure(|raw| raw.models = Some(table.clone()))
        .spawn()
        .await;
    let token = app.token("ada").await;
    let (status, body) = app
        .post(
            Service::Completion,
            "/",
            json!({
                "serviceToken": token,
                "model": "random",
                "messages": [{"role": "user", "content": "Say something."}],
                "maxOutputTokens": 12,
                "temperature": 0.0,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let usage = &body["usage"];
    // SmolLM2's chat template wrapped the message: more prompt tokens than its three words.
    let prompt = usage["promptTokens"].as_u64().unwrap();
    assert!(prompt > 10, "{body}");
    let completion = usage["completionTokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion), "{body}");
    let d = |v: &serde_json::Value| v.as_str().unwrap().parse::<Decimal>().unwrap();
    let cost = d(&usage["inputCost"]) + d(&usage["outputCost"]);
    assert!(cost > Decimal::ZERO, "{body}");
    assert_eq!(
        d(&body["balanceBefore"]) - d(&body["balanceAfter"]),
        cost,
        "{body}"
    );
    app.stop().await;
}

#[test]
fn arguments_a_random_model_cannot_honour_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let (ok, _, err) = random_model(&[
        s(&out),
        "--tokenizer-from",
        s(&smollm2()),
        "--weights",
        "q5_k",
    ]);
    assert!(!ok);
    assert!(err.contains("choose f16, q8_0, q4_0 or q4_k"), "{err}");

    // 200 is not a multiple of Q4_K's 256-value blocks.
    let (ok, _, err) = random_model(&[
        s(&out),
        "--tokenizer-from",
        s(&smollm2()),
        "--weights",
        "q4_k",
        "--hidden",
        "200",
        "--heads",
        "4",
        "--kv-heads",
        "2",
    ]);
    assert!(!ok);
    assert!(err.contains("multiples of 256"), "{err}");
    assert!(!out.exists(), "nothing is written for a refused shape");

    // A file that is not GGUF has no tokenizer to copy.
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file").unwrap();
    let (ok, _, err) = random_model(&[s(&out), "--tokenizer-from", s(&junk)]);
    assert!(!ok);
    assert!(err.contains("junk.gguf") || err.contains("magic"), "{err}");
}
