//! Image service over HTTP, on the tiny SDXL-shaped model: a real server (auth + imagine) on
//! ephemeral ports, a real user signed in through `/token`, real PNGs.

use base64::Engine as _;
use hearth_server::Service;
use reqwest::StatusCode;
use rust_decimal::Decimal;
use serde_json::{json, Value};
use std::str::FromStr;

use crate::common::{assert_error, TestApp};

/// The price in the test model table: per 1024x1024 4-step image.
const PRICE: &str = "0.040";

/// A running auth + imagine server serving the tiny model from its own folder.
pub struct ImagineApp {
    pub app: TestApp,
    _models: tempfile::TempDir,
}

impl ImagineApp {
    /// `initial_balance` is what every new user starts with (margin 0 by default); `extra` is
    /// appended to the `[image."xl-lightning"]` entry of the model table.
    pub async fn start(initial_balance: &str, extra: &str) -> ImagineApp {
        Self::start_with(initial_balance, extra, |_| {}).await
    }

    /// [`ImagineApp::start`] with settings changed by `configure`.
    pub async fn start_with(
        initial_balance: &str,
        extra: &str,
        configure: impl FnOnce(&mut hearth_server::config::RawConfig) + Send + 'static,
    ) -> ImagineApp {
        let models = tempfile::tempdir().unwrap();
        hearth_imagine::write_tiny_sdxl(
            &models.path().join("tiny-sdxl"),
            hearth_imagine::tiny::TINY_SEED,
        )
        .unwrap();
        let table = models.path().join("models.toml");
        std::fs::write(
            &table,
            format!(
                "[image.\"xl-lightning\"]\nweights = \"no-real-weights-here\"\ntiny_weights = \"tiny-sdxl\"\nprice_per_image = \"{PRICE}\"\n{extra}\n"
            ),
        )
        .unwrap();
        let balance = initial_balance.to_string();
        let app = TestApp::builder()
            .services(&[Service::Auth, Service::Imagine])
            .configure(move |raw| {
                raw.models = Some(table);
                raw.billing.initial_balance = Some(balance);
                raw.billing.default_margin_percent = Some("0".into());
                configure(raw);
            })
            .spawn()
            .await;
        ImagineApp {
            app,
            _models: models,
        }
    }

    pub async fn imagine(&self, body: Value) -> (StatusCode, Value) {
        self.app.post(Service::Imagine, "/", body).await
    }

    async fn balance_now(&self, user: &str) -> Decimal {
        self.app.running().state.store.balance(user).await.unwrap()
    }
}

fn png_of(resp: &Value) -> Vec<u8> {
    let url = resp["imageUrl"].as_str().expect("imageUrl");
    let b64 = url
        .strip_prefix("data:image/png;base64,")
        .expect("a PNG data URL");
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

fn png_size(png: &[u8]) -> (u32, u32) {
    let img =
        image::load_from_memory_with_format(png, image::ImageFormat::Png).expect("a valid PNG");
    (img.width(), img.height())
}

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

#[tokio::test]
async fn an_image_request_returns_a_png_of_the_requested_size_and_the_spec_fields() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("alice").await;
    let (status, r) = img
        .imagine(json!({"serviceToken": token, "prompt": "a red fox", "width": 320, "height": 256, "steps": 2, "seed": 42}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(png_size(&png_of(&r)), (320, 256));
    assert_eq!(r["prompt"], "a red fox");
    assert_eq!(r["model"], "xl-lightning");
    assert_eq!(r["metadata"]["seed"], 42);
    assert_eq!(r["metadata"]["steps"], 2);
    assert_eq!(r["metadata"]["width"], 320);
    assert_eq!(r["metadata"]["height"], 256);
    assert_eq!(r["metadata"]["negativePrompt"], "");
    assert_eq!(r["metadata"]["testModel"], true, "the tiny model says so");
    assert_eq!(r["usage"]["type"], "imagine");
    assert!(
        r["usage"]["cost"].is_string()
            && r["balanceBefore"].is_string()
            && r["balanceAfter"].is_string()
    );
}

#[tokio::test]
async fn the_same_seed_gives_identical_bytes_and_another_seed_a_different_image() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("bob").await;
    let body = |seed: u64| json!({"serviceToken": token, "prompt": "a lighthouse", "width": 256, "height": 256, "steps": 2, "seed": seed});
    let (_, a) = img.imagine(body(7)).await;
    let (_, b) = img.imagine(body(7)).await;
    let (_, c) = img.imagine(body(8)).await;
    assert_eq!(
        png_of(&a),
        png_of(&b),
        "same seed and parameters must give byte-identical PNGs"
    );
    assert_ne!(
        png_of(&a),
        png_of(&c),
        "a different seed must give a different image"
    );
    // With no seed, one is chosen and reported; reusing it reproduces the image.
    let (_, r) = img.imagine(json!({"serviceToken": token, "prompt": "a lighthouse", "width": 256, "height": 256, "steps": 2})).await;
    let seed = r["metadata"]["seed"].as_u64().expect("the seed used");
    let (_, again) = img.imagine(body(seed)).await;
    assert_eq!(png_of(&r), png_of(&again));
}

#[tokio::test]
async fn a_negative_prompt_changes_the_image_and_is_echoed() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("neg").await;
    let body = |neg: &str| json!({"serviceToken": token, "prompt": "a cat", "negativePrompt": neg, "width": 256, "height": 256, "steps": 1, "seed": 3});
    let (s1, plain) = img.imagine(body("")).await;
    let (s2, guided) = img.imagine(body("blurry")).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(guided["metadata"]["negativePrompt"], "blurry");
    assert_ne!(png_of(&plain), png_of(&guided));
}

#[tokio::test]
async fn balance_arithmetic_is_exact_for_size_steps_and_margin() {
    let img = ImagineApp::start("1", "").await;
    let token = img.app.token("carol").await;
    // 256x256, 2 steps, margin 0: 0.040 x 65536/1048576 x 2/4 = 0.00125
    let (_, r) = img.imagine(json!({"serviceToken": token, "prompt": "x", "width": 256, "height": 256, "steps": 2, "seed": 1})).await;
    assert_eq!(r["usage"]["cost"], "0.001250");
    assert_eq!(r["balanceBefore"], "1.000000");
    assert_eq!(r["balanceAfter"], "0.998750");
    // 512x256, 3 steps, 20 % margin: 0.040 x 131072/1048576 x 3/4 / 0.8 = 0.0046875 -> 0.004688
    let (_, r) = img
        .imagine(json!({"serviceToken": token, "prompt": "x", "width": 512, "height": 256, "steps": 3, "seed": 1, "overrideGrossMarginPercent": 20}))
        .await;
    assert_eq!(r["usage"]["cost"], "0.004688");
    assert_eq!(r["balanceBefore"], "0.998750");
    assert_eq!(r["balanceAfter"], "0.994062");
    assert_eq!(img.balance_now("carol").await, d("0.994062"));
    assert!(
        img.app
            .running()
            .state
            .store
            .holds("carol")
            .await
            .unwrap()
            .is_empty(),
        "no hold left behind"
    );
}

#[tokio::test]
async fn insufficient_funds_is_refused_before_generating_and_charges_nothing() {
    let img = ImagineApp::start("0.001", "").await;
    let token = img.app.token("dave").await;
    let (status, r) = img
        .imagine(
            json!({"serviceToken": token, "prompt": "x", "width": 256, "height": 256, "steps": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{r}");
    assert_error(&r, "InsufficientFunds");
    assert_eq!(img.balance_now("dave").await, d("0.001"));
}

#[tokio::test]
async fn bad_credentials_are_invalid_credentials() {
    let img = ImagineApp::start("10", "").await;
    for body in [
        json!({"prompt": "x"}),
        json!({"prompt": "x", "serviceToken": "not-a-jwt"}),
    ] {
        let (status, r) = img.imagine(body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{r}");
        assert_error(&r, "InvalidCredentials");
    }
}

#[tokio::test]
async fn every_validation_error_names_its_field() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("erin").await;
    let cases = [
        (json!({}), "prompt"),
        (json!({"prompt": ""}), "prompt"),
        (json!({"prompt": ["a"]}), "prompt"),
        (
            json!({"prompt": "x", "negativePrompt": 5}),
            "negativePrompt",
        ),
        (json!({"prompt": "x", "seed": -1}), "seed"),
        (json!({"prompt": "x", "seed": 1.5}), "seed"),
        (json!({"prompt": "x", "seed": 4294967296u64}), "seed"),
        (json!({"prompt": "x", "steps": 0}), "steps"),
        (json!({"prompt": "x", "steps": 9}), "steps"),
        (json!({"prompt": "x", "width": 100}), "width"),
        (json!({"prompt": "x", "width": 300}), "width"),
        (json!({"prompt": "x", "width": 4096}), "width"),
        (json!({"prompt": "x", "height": "512"}), "height"),
        (
            json!({"prompt": "x", "width": 2048, "height": 2048}),
            "height",
        ),
        (
            json!({"prompt": "x", "overrideGrossMarginPercent": 100}),
            "overrideGrossMarginPercent",
        ),
        (
            json!({"prompt": "x", "overrideGrossMarginPercent": -1}),
            "overrideGrossMarginPercent",
        ),
        (json!({"prompt": "x", "developerId": 3}), "developerId"),
        (json!({"prompt": "x", "model": "another-model"}), "model"),
    ];
    for (mut body, field) in cases {
        body["serviceToken"] = json!(token);
        let (status, r) = img.imagine(body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {r}");
        assert_error(&r, "InvalidRequest");
        assert_eq!(r["error"]["details"]["field"], field, "{body} -> {r}");
    }
    assert_eq!(img.balance_now("erin").await, d("10"), "nothing charged");
}

#[tokio::test]
async fn health_reports_the_tiny_test_model_and_the_page_has_the_controls() {
    let img = ImagineApp::start("10", "").await;
    let app = &img.app;
    // The model loads in the background; health says `loading` until then.
    let mut h = Value::Null;
    for _ in 0..600 {
        let (status, body) = app.get(Service::Imagine, "/").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        h = body;
        if h["model"]["status"] != "loading" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(h["status"], "healthy", "{h}");
    assert_eq!(h["ui"], format!("{}/ui", app.url(Service::Imagine)));
    assert!(h["env"].is_string());
    assert_eq!(h["model"]["status"], "ready");
    assert_eq!(h["model"]["weights"], "tiny-test-model");
    assert_eq!(h["model"]["testModel"], true);
    let page = app
        .client
        .get(format!("{}/ui", app.url(Service::Imagine)))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for id in [
        "id=\"prompt\"",
        "id=\"negativePrompt\"",
        "id=\"seed\"",
        "id=\"dice\"",
        "id=\"steps\"",
        "id=\"width\"",
        "id=\"height\"",
        "id=\"download\"",
    ] {
        assert!(page.contains(id), "page lacks {id}");
    }
    assert!(
        page.contains(&format!("{}/ui", app.url(Service::Auth))),
        "sign-in goes through the auth page"
    );
}

#[tokio::test]
async fn health_is_500_when_the_model_cannot_load() {
    let models = tempfile::tempdir().unwrap();
    // A folder that looks like a model but is not one: loading fails, and health says so.
    std::fs::create_dir_all(models.path().join("broken/unet")).unwrap();
    let table = models.path().join("models.toml");
    std::fs::write(
        &table,
        "[image.\"xl-lightning\"]\nweights = \"broken\"\nprice_per_image = \"0.04\"\n",
    )
    .unwrap();
    let app = TestApp::builder()
        .services(&[Service::Auth, Service::Imagine])
        .configure(move |raw| raw.models = Some(table))
        .spawn()
        .await;
    let (mut status, mut body) = (StatusCode::OK, Value::Null);
    for _ in 0..200 {
        (status, body) = app.get(Service::Imagine, "/").await;
        if body["model"]["status"] != "loading" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["status"], "failing");
    assert_eq!(body["model"]["status"], "failed");
    // Requests answer at once, as a failed model backend (GatewayError), rather than hang.
    let token = app.token("gus").await;
    let (status, body) = app
        .post(
            Service::Imagine,
            "/",
            json!({"prompt": "x", "serviceToken": token, "width": 256, "height": 256}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_error(&body, "GatewayError");
}

#[tokio::test]
async fn a_full_queue_answers_overloaded_and_abandoned_requests_cost_nothing() {
    // One image at a time plus one waiting: of four concurrent large requests, some are refused.
    // All four are one user's, so the per-user cap is off (it has a test of its own below).
    let img = ImagineApp::start_with("100", "max_queued = 1", |raw| {
        raw.imagine.max_concurrent_per_user = Some(0)
    })
    .await;
    let token = img.app.token("frank").await;
    let body = json!({"serviceToken": token, "prompt": "x", "width": 1024, "height": 1024, "steps": 8, "seed": 1});
    let url = format!("{}/", img.app.url(Service::Imagine));
    let reqs = (0..4).map(|_| {
        let (http, url, body) = (img.app.client.clone(), url.clone(), body.clone());
        async move {
            // Give up (disconnect) after a while: the server must drop the work and release holds.
            let send = http
                .post(url)
                .json(&body)
                .timeout(std::time::Duration::from_millis(1500))
                .send();
            match send.await {
                Ok(r) => {
                    let status = r.status();
                    let retry_after = r.headers().get("retry-after").cloned();
                    let body = r.json::<Value>().await.unwrap_or(Value::Null);
                    Some((status, retry_after, body))
                }
                Err(_) => None,
            }
        }
    });
    let results = futures::future::join_all(reqs).await;
    let refused: Vec<_> = results
        .iter()
        .flatten()
        .filter(|(s, _, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    assert!(
        !refused.is_empty(),
        "expected an Overloaded answer, got {results:?}"
    );
    let (_, retry_after, body) = refused[0];
    assert_error(body, "Overloaded");
    // The image worker's own figure, in the header and the details.
    let figure = hearth_imagine::RETRY_AFTER.as_secs();
    assert_eq!(
        retry_after.as_ref().expect("Retry-After"),
        figure.to_string().as_str()
    );
    assert_eq!(body["error"]["details"]["retryAfterSeconds"], figure);
    // Every other request was abandoned: once the worker notices, no hold remains and the
    // balance is untouched.
    let store = img.app.running().state.store.clone();
    let mut holds = usize::MAX;
    for _ in 0..1200 {
        holds = store.holds("frank").await.unwrap().len();
        if holds == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(holds, 0, "holds of abandoned requests are released");
    assert_eq!(img.balance_now("frank").await, d("100"));
}

#[tokio::test]
async fn a_user_past_the_cap_gets_429_rate_limited_and_the_refusal_holds_nothing() {
    let img = ImagineApp::start_with("100", "", |raw| {
        raw.imagine.max_concurrent_per_user = Some(1)
    })
    .await;
    let token = img.app.token("gail").await;
    let other = img.app.token("hugo").await;
    let big = json!({"serviceToken": token, "prompt": "x", "width": 1024, "height": 1024, "steps": 8, "seed": 1});
    let url = format!("{}/", img.app.url(Service::Imagine));
    let first = tokio::spawn(img.app.client.post(&url).json(&big).send());
    let store = img.app.running().state.store.clone();
    for _ in 0..500 {
        if !store.holds("gail").await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.holds("gail").await.unwrap().len(),
        1,
        "the first image is under way"
    );
    let small =
        json!({"serviceToken": token, "prompt": "x", "width": 256, "height": 256, "steps": 1});
    let refused = img.app.client.post(&url).json(&small).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The per-user cap's own figure (`user_slots.rs`), in the header and the details.
    let figure = hearth_server::user_slots::RETRY_AFTER.as_secs();
    assert_eq!(
        refused.headers()["retry-after"],
        figure.to_string().as_str()
    );
    let body: Value = refused.json().await.unwrap();
    assert_error(&body, "RateLimited");
    assert_eq!(body["error"]["details"]["retryAfterSeconds"], figure);
    assert_eq!(
        store.holds("gail").await.unwrap().len(),
        1,
        "the refusal placed no hold"
    );
    // Another user is not held back by gail's cap.
    let (status, body) = img
        .imagine(
            json!({"serviceToken": other, "prompt": "x", "width": 256, "height": 256, "steps": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Once the first image is done, gail may ask again.
    let done = first.await.unwrap().unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let (status, body) = img.imagine(small).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
