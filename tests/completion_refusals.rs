//! The completion service's refusals over HTTP, on the same real server as `completion.rs`:
//! every invalid field named, bad credentials, a worst case beyond the balance, a model that
//! failed to load, and a store that fails its health check. None of them charges anything.

use serde_json::{json, Value};

use crate::completion::{dec, request, spawn_completion};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_error_is_an_invalid_request_naming_its_field() {
    let app = spawn_completion().await;
    let token = app.user("validator", "10").await;
    let base = request(&token, "hi", 8);
    let with = |key: &str, value: Value| {
        let mut b = base.clone();
        b[key] = value;
        b
    };
    let without = |key: &str| {
        let mut b = base.clone();
        b.as_object_mut().unwrap().remove(key);
        b
    };
    let cases = [
        (with("model", json!("gpt-9")), "model"),
        (without("model"), "model"),
        (without("messages"), "messages"),
        (with("messages", json!([])), "messages"),
        (
            with("messages", json!([{"role": "wizard", "content": "x"}])),
            "messages[0].role",
        ),
        (
            with("messages", json!([{"role": "user"}])),
            "messages[0].content",
        ),
        (with("temperature", json!(5.1)), "temperature"),
        (with("temperature", json!(-1)), "temperature"),
        (with("maxOutputTokens", json!(0)), "maxOutputTokens"),
        (with("maxOutputTokens", json!(2049)), "maxOutputTokens"),
        (with("maxOutputTokens", json!(16385)), "maxOutputTokens"),
        (with("maxOutputTokens", json!(2.5)), "maxOutputTokens"),
        (
            with("overrideGrossMarginPercent", json!(100)),
            "overrideGrossMarginPercent",
        ),
        (
            with("overrideGrossMarginPercent", json!(-5)),
            "overrideGrossMarginPercent",
        ),
        (with("developerId", json!(12)), "developerId"),
    ];
    for (body, field) in cases {
        for path in ["/", "/stream"] {
            let (status, err) = app.post(path, body.clone()).await;
            assert_eq!(status, 400, "{path} {field}: {err}");
            assert_eq!(err["error"]["type"], "InvalidRequest", "{field}: {err}");
            assert_eq!(err["error"]["details"]["field"], field, "{err}");
            assert!(
                err["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(field.split('[').next().unwrap()),
                "{err}"
            );
        }
    }
    // beta-4-mini allows temperature up to 2.0 only.
    let mut beta = with("model", json!("beta-4-mini"));
    beta["temperature"] = json!(2.5);
    let (status, err) = app.post("/", beta).await;
    assert_eq!(
        (status, err["error"]["details"]["field"].as_str()),
        (400, Some("temperature"))
    );
    // Unknown model lists the valid ids.
    let (_, err) = app.post("/", with("model", json!("gpt-9"))).await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("alpha-3.3")
            && message.contains("beta-4-mini")
            && message.contains("gamma-3.5-sonnet")
    );
    // A prompt longer than the context minus maxOutputTokens gives both numbers.
    let long = "word ".repeat(9000);
    let (status, err) = app.post("/", request(&token, &long, 2048)).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["details"]["field"], "messages");
    assert!(
        err["error"]["details"]["promptTokens"].as_u64().unwrap()
            > err["error"]["details"]["maxPromptTokens"].as_u64().unwrap()
    );
    // Malformed JSON is an InvalidRequest too.
    let r = app
        .http
        .post(format!("{}/", app.url))
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Nothing was charged for any of it.
    assert_eq!(app.store().balance("validator").await.unwrap(), dec("10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bad_expired_or_revoked_tokens_are_invalid_credentials() {
    let app = spawn_completion().await;
    let good = app.user("creds", "10").await;
    let tokens = app.tokens();
    let expired = tokens
        .issue_at(
            chrono::Utc::now() - chrono::Duration::hours(2),
            "creds",
            false,
            chrono::Duration::hours(1),
        )
        .unwrap()
        .token;
    let revoked = tokens
        .issue("creds", false, chrono::Duration::hours(1))
        .unwrap();
    app.store()
        .revoke_token(&revoked.jti, revoked.expires_at)
        .await
        .unwrap();
    let mut missing = request(&good, "hi", 4);
    missing.as_object_mut().unwrap().remove("serviceToken");
    for (name, body) in [
        ("missing", missing),
        ("garbage", request("not-a-jwt", "hi", 4)),
        ("expired", request(&expired, "hi", 4)),
        ("revoked", request(&revoked.token, "hi", 4)),
    ] {
        for path in ["/", "/stream"] {
            let (status, err) = app.post(path, body.clone()).await;
            assert_eq!(status, 401, "{name} {path}: {err}");
            assert_eq!(err["error"]["type"], "InvalidCredentials", "{name}: {err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worst_case_beyond_the_balance_is_refused_with_insufficient_funds() {
    let app = spawn_completion().await;
    // 2048 output tokens at 2.40 per million cost 0.004915: more than 0.001.
    let token = app.user("poor", "0.001").await;
    for path in ["/", "/stream"] {
        let (status, err) = app.post(path, request(&token, "hi", 2048)).await;
        assert_eq!(status, 402, "{err}");
        assert_eq!(err["error"]["type"], "InsufficientFunds");
        assert_eq!(err["error"]["details"]["available"], "0.001000");
        assert!(dec(err["error"]["details"]["needed"].as_str().unwrap()) > dec("0.001"));
    }
    assert_eq!(app.store().balance("poor").await.unwrap(), dec("0.001"));
    // A request whose worst case fits goes through.
    let (status, ok) = app.post("/", request(&token, "hi", 8)).await;
    assert_eq!(status, 200, "{ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_whose_weights_failed_to_load_is_a_gateway_error() {
    let app = spawn_completion().await;
    let token = app.user("gw", "10").await;
    let mut body = request(&token, "hi", 8);
    body["model"] = json!("gamma-3.5-sonnet");
    body["temperature"] = json!(0.5);
    for path in ["/", "/stream"] {
        let (status, err) = app.post(path, body.clone()).await;
        assert_eq!(status, 502, "{err}");
        assert_eq!(err["error"]["type"], "GatewayError");
        assert!(err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gamma-3.5-sonnet"));
    }
    let (status, health) = {
        let r = app.http.get(format!("{}/", app.url)).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, 200);
    assert!(health["models"]["gamma-3.5-sonnet"]
        .as_str()
        .unwrap()
        .starts_with("unavailable"));
    assert_eq!(app.store().balance("gw").await.unwrap(), dec("10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_the_store_and_answers_500_when_it_is_unusable() {
    let app = spawn_completion().await;
    let r = app.http.get(format!("{}/", app.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "healthy");
    assert_eq!(body["env"], "development");
    assert!(body["ui"].as_str().unwrap().ends_with("/ui"));
    // Take the database away from under the running server.
    std::fs::remove_dir_all(app.store().path().expect("the embedded store")).unwrap();
    let r = app.http.get(format!("{}/", app.url)).send().await.unwrap();
    assert_eq!(r.status(), 500);
    let body: Value = r.json().await.unwrap();
    assert_ne!(body["status"], "healthy");
}
