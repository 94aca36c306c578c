//! The authentication service over HTTP: tokens, validation, logout, health, errors, page.

use crate::common::{assert_error, spawn_app, TestApp};
use base64::Engine;
use chrono::{DateTime, Duration, Utc};
use hearth_server::app::paths;
use hearth_server::Service;
use reqwest::StatusCode;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

async fn validate(app: &TestApp, token: &str) -> (StatusCode, Value) {
    app.post(Service::Auth, "/validate", json!({ "serviceToken": token }))
        .await
}

/// The server's own service-token key, to forge tokens the way only a key holder could.
fn service_tokens(app: &TestApp) -> hearth_auth::ServiceTokens {
    let secret =
        hearth_auth::load_or_create_secret(&paths::service_token_secret(&app.data_dir())).unwrap();
    hearth_auth::ServiceTokens::new(secret.as_bytes(), "hearth", "hearth-services")
}

#[tokio::test]
async fn health_is_healthy_with_env_and_ui_url() {
    let app = spawn_app().await;
    let (status, body) = app.get(Service::Auth, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "healthy");
    assert_eq!(body["env"], "development");
    assert_eq!(body["ui"], format!("{}/ui", app.url(Service::Auth)));
}

#[tokio::test]
async fn health_is_503_unhealthy_once_the_store_is_gone() {
    let app = spawn_app().await;
    std::fs::remove_dir_all(paths::store(&app.data_dir())).unwrap();
    let (status, body) = app.get(Service::Auth, "/").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["status"], "unhealthy");
}

#[tokio::test]
async fn token_then_validate_reports_user_marketing_and_expiry() {
    let app = spawn_app().await;
    let idp = app.idp_token_with("mia", Duration::hours(1), true);
    let before = Utc::now();
    let (status, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "mia", "idpToken": idp, "lifetimeSeconds": 600 }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let token = body["serviceToken"].as_str().unwrap();
    assert_eq!(token.split('.').count(), 3, "a JWT");
    let (status, v) = validate(&app, token).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["valid"], true);
    assert_eq!(v["userId"], "mia");
    assert_eq!(v["isMarketing"], true);
    let expires: DateTime<Utc> = v["expiresAt"].as_str().unwrap().parse().unwrap();
    let lifetime = (expires - before).num_seconds();
    assert!((599..=601).contains(&lifetime), "lifetime {lifetime}");
    assert!(v["expiresAt"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn token_lifetime_defaults_to_an_hour_and_out_of_bounds_is_invalid_request() {
    let app = spawn_app().await;
    let (status, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "ned", "idpToken": app.idp_token("ned") }),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, v) = validate(&app, body["serviceToken"].as_str().unwrap()).await;
    let expires: DateTime<Utc> = v["expiresAt"].as_str().unwrap().parse().unwrap();
    assert!(((expires - Utc::now()).num_seconds() - 3600).abs() <= 2);
    for bad in [json!(0), json!(59), json!(2_592_001), json!(-5)] {
        let (status, body) = app
            .post(Service::Auth, "/token", json!({ "userId": "ned", "idpToken": app.idp_token("ned"), "lifetimeSeconds": bad }))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(assert_error(&body, "InvalidRequest").contains("lifetimeSeconds"));
        assert_eq!(body["error"]["details"]["field"], "lifetimeSeconds");
    }
}

#[tokio::test]
async fn token_for_another_user_than_the_identity_token_is_invalid_credentials() {
    let app = spawn_app().await;
    let (status, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "mallory", "idpToken": app.idp_token("alice") }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
}

#[tokio::test]
async fn expired_or_forged_identity_tokens_are_refused_at_sign_in() {
    let app = spawn_app().await;
    let expired = app.idp_token_with("olga", Duration::seconds(-10), false);
    let (status, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "olga", "idpToken": expired }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
    let forged = hearth_auth::SharedSecretIdp::new(&[7u8; 32])
        .mint("olga", Duration::hours(1), false)
        .unwrap();
    let (status, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "olga", "idpToken": forged }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
}

#[tokio::test]
async fn malformed_requests_are_invalid_request_naming_the_field() {
    let app = spawn_app().await;
    let url = format!("{}/token", app.url(Service::Auth));
    let cases: Vec<(&str, &str, &str)> = vec![
        ("application/json", "{\"userId\": ", "body"),
        (
            "application/json",
            "{\"userId\": 5, \"idpToken\": \"x\"}",
            "userId",
        ),
        ("application/json", "{\"userId\": \"a\"}", "idpToken"),
        (
            "application/json",
            "{\"userId\": \"a\", \"idpToken\": \"x\", \"lifetimeSeconds\": \"soon\"}",
            "lifetimeSeconds",
        ),
        ("application/json", "[1, 2]", "body"),
        (
            "text/plain",
            "{\"userId\": \"a\", \"idpToken\": \"x\"}",
            "Content-Type",
        ),
    ];
    for (ctype, body, field) in cases {
        let resp = app
            .client
            .post(&url)
            .header("content-type", ctype)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        let v: Value = resp.json().await.expect("JSON error body, not plain text");
        let msg = assert_error(&v, "InvalidRequest");
        assert_eq!(v["error"]["details"]["field"], field, "{body}: {msg}");
        assert!(msg.contains(field), "message {msg:?} should name {field}");
    }
    // No content type at all.
    let resp = app.client.post(&url).body("{}").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_oversize_body_is_413_with_type_invalid_request() {
    let app = TestApp::builder()
        .configure(|c| c.max_body_bytes = Some(4096))
        .spawn()
        .await;
    let big = "x".repeat(10_000);
    let (status, body) = app
        .post(Service::Auth, "/validate", json!({ "serviceToken": big }))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(&body, "InvalidRequest");
}

#[tokio::test]
async fn validate_refuses_tampered_foreign_and_unsigned_tokens_as_invalid_credentials() {
    let app = spawn_app().await;
    let token = app.token("pat").await;
    let parts: Vec<&str> = token.split('.').collect();
    // Tampered payload: same signature, user changed.
    let mut claims: Value = serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
    claims["sub"] = json!("admin");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        B64.encode(claims.to_string()),
        parts[2]
    );
    // alg none: header says none, no signature.
    let none = format!(
        "{}.{}.",
        B64.encode(r#"{"alg":"none","typ":"JWT"}"#),
        parts[1]
    );
    // Signed with a key that is not the server's.
    let foreign = hearth_auth::ServiceTokens::new(&[9u8; 32], "hearth", "hearth-services")
        .issue("pat", false, Duration::hours(1))
        .unwrap()
        .token;
    for (name, bad) in [
        ("tampered", tampered),
        ("alg none", none),
        ("foreign key", foreign),
        ("garbage", "abc".into()),
        ("empty", String::new()),
    ] {
        let (status, body) = validate(&app, &bad).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{name}");
        assert_error(&body, "InvalidCredentials");
    }
    assert_eq!(validate(&app, &token).await.0, StatusCode::OK);
}

#[tokio::test]
async fn an_expired_service_token_is_session_expired() {
    let app = spawn_app().await;
    let expired = service_tokens(&app)
        .issue_at(
            Utc::now() - Duration::hours(2),
            "quinn",
            false,
            Duration::seconds(60),
        )
        .unwrap()
        .token;
    let (status, body) = validate(&app, &expired).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "SessionExpired");
}

#[tokio::test]
async fn logout_revokes_the_token() {
    let app = spawn_app().await;
    let token = app.token("rita").await;
    let (status, body) = app
        .post(Service::Auth, "/logout", json!({ "serviceToken": token }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "success");
    assert!(body["message"].as_str().unwrap().contains("revoked"));
    let (status, body) = validate(&app, &token).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(assert_error(&body, "InvalidCredentials").contains("revoked"));
    // The in-process check the completion and image services use agrees.
    assert!(app.running().state.authenticate(&token).await.is_err());
}

#[tokio::test]
async fn logout_with_idp_token_revokes_every_token_from_it_and_refuses_it_at_sign_in() {
    let app = spawn_app().await;
    let idp = app.idp_token("sam");
    let other_idp = app.idp_token("sam");
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let (_, body) = app
            .post(
                Service::Auth,
                "/token",
                json!({ "userId": "sam", "idpToken": idp }),
            )
            .await;
        tokens.push(body["serviceToken"].as_str().unwrap().to_string());
    }
    let (_, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "sam", "idpToken": other_idp }),
        )
        .await;
    let unrelated = body["serviceToken"].as_str().unwrap().to_string();

    let (status, body) = app
        .post(
            Service::Auth,
            "/logout",
            json!({ "serviceToken": tokens[0], "idpToken": idp }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "success");
    for t in &tokens {
        let (status, body) = validate(&app, t).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_error(&body, "InvalidCredentials");
    }
    let (status, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "sam", "idpToken": idp }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(assert_error(&body, "InvalidCredentials").contains("logged out"));
    assert_eq!(
        validate(&app, &unrelated).await.0,
        StatusCode::OK,
        "another identity token's session lives on"
    );
}

#[tokio::test]
async fn logout_with_someone_elses_idp_token_is_refused() {
    let app = spawn_app().await;
    let token = app.token("tess").await;
    let (status, body) = app
        .post(
            Service::Auth,
            "/logout",
            json!({ "serviceToken": token, "idpToken": app.idp_token("uma") }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
    assert_eq!(
        validate(&app, &token).await.0,
        StatusCode::OK,
        "nothing was revoked"
    );
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_in_the_error_shape() {
    let app = spawn_app().await;
    let (status, body) = app.get(Service::Auth, "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "NotFound");
    let (status, body) = app.get(Service::Auth, "/token").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&body, "InvalidRequest");
}

#[tokio::test]
async fn two_servers_run_side_by_side_in_one_process_with_separate_keys() {
    let a = spawn_app().await;
    let b = spawn_app().await;
    let token_a = a.token("vic").await;
    assert_eq!(validate(&a, &token_a).await.0, StatusCode::OK);
    let (status, body) = validate(&b, &token_a).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
}

#[tokio::test]
async fn sign_in_page_explains_a_refused_foreign_callback_and_accepts_an_allowed_one() {
    let app = TestApp::builder()
        .configure(|c| c.auth.callback_origins = Some(vec!["https://app.example.com".into()]))
        .spawn()
        .await;
    let page = |q: String| {
        let url = format!("{}/ui{q}", app.url(Service::Auth));
        let client = app.client.clone();
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let plain = page(String::new()).await;
    assert!(plain.contains("id=\"signin\"") && plain.contains("id=\"idpToken\""));
    let foreign = page("?callback=https%3A%2F%2Fevil.example%2Fsteal".into()).await;
    assert!(foreign.contains("id=\"callback-refused\""));
    assert!(foreign.contains("https://evil.example is not an allowed origin"));
    assert!(
        foreign.contains("\"callback\":null"),
        "a refused callback is never redirected to"
    );
    let js = page("?callback=javascript%3Aalert(1)".into()).await;
    assert!(js.contains("id=\"callback-refused\""));
    let allowed = page("?callback=https%3A%2F%2Fapp.example.com%2Fdone".into()).await;
    assert!(allowed.contains("id=\"callback-notice\""));
    assert!(allowed.contains("\"callback\":\"https://app.example.com/done\""));
    let own = page(format!("?callback={}/ui", app.url(Service::Auth))).await;
    assert!(
        own.contains("id=\"callback-notice\""),
        "the service's own origin is allowed"
    );
}

#[tokio::test]
async fn balance_answers_the_signed_in_user_and_refuses_a_bad_token() {
    let app = spawn_app().await;
    let token = app.token("wes").await;
    let (status, body) = app
        .post(Service::Auth, "/balance", json!({ "serviceToken": token }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({ "userId": "wes", "balance": "10.000000" }));

    let (status, body) = app
        .post(
            Service::Auth,
            "/balance",
            json!({ "serviceToken": "not.a.token" }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
    let (status, _) = app
        .post(Service::Auth, "/logout", json!({ "serviceToken": token }))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app
        .post(Service::Auth, "/balance", json!({ "serviceToken": token }))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked token");
    assert_error(&body, "InvalidCredentials");
}

/// The pages of the other services ask for the balance from their own origins: the preflight
/// and the answer allow those origins, and no other.
#[tokio::test]
async fn balance_answers_cors_for_hearths_own_origins_only() {
    let app = TestApp::builder()
        .services(&[Service::Auth, Service::Markdown])
        .spawn()
        .await;
    let url = format!("{}/balance", app.url(Service::Auth));
    let preflight = |origin: String| {
        app.client
            .request(reqwest::Method::OPTIONS, &url)
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header("Access-Control-Request-Headers", "content-type")
            .send()
    };
    let own = app.url(Service::Markdown);
    let r = preflight(own.clone()).await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(r.headers()["access-control-allow-origin"], own.as_str());
    let r = preflight("https://evil.example".into()).await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());

    let token = app.token("xan").await;
    let r = app
        .client
        .post(&url)
        .header("Origin", own.as_str())
        .json(&json!({ "serviceToken": token }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["access-control-allow-origin"], own.as_str());
    // The spec's routes stay as they were: no CORS on them.
    let r = app
        .client
        .post(format!("{}/validate", app.url(Service::Auth)))
        .header("Origin", own.as_str())
        .json(&json!({ "serviceToken": token }))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}
