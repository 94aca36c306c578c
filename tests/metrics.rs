//! `GET /metrics` on every listener, read by a parser nobody here wrote: the official Python
//! client's (`prometheus_client.parser`, installed by `scripts/python-clients.sh`), through
//! `tests/clients/prometheus_check.py`. The tests make real requests (completions on SmolLM2,
//! a conversion, an image on the tiny model, failures) and check that the counters moved by
//! exactly what was done; that `/metrics` answers without a credential and shows no user data;
//! and that hostile paths do not grow the series.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hearth_server::Service;
use reqwest::multipart::{Form, Part};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{run_client_script, TestApp};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One sample as the parser read it.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed scrape: families (name -> type) and samples.
#[derive(Debug)]
struct Scrape {
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Scrape {
    /// The value of the one sample named `name` whose labels include `labels` (0 when there
    /// is none: a counter not yet moved has no series); panics if several match.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().map_or(0.0, |s| s.value)
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

/// Scrapes `service`'s `/metrics` with no credential, checks the answer's type, and parses it
/// with the Python client. Returns the raw text too.
async fn scrape(app: &TestApp, service: Service) -> (String, Scrape) {
    let resp = app
        .client
        .get(format!("{}/metrics", app.url(service)))
        .send()
        .await
        .expect("scrape sent");
    assert_eq!(resp.status(), StatusCode::OK, "{service} /metrics");
    let content_type = resp.headers()[reqwest::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/plain") && content_type.contains("version=0.0.4"),
        "{service}: {content_type}"
    );
    let text = resp.text().await.unwrap();
    let parsed = parse(&text).await;
    for s in &parsed.samples {
        assert_eq!(
            s.labels.get("service").map(String::as_str),
            Some(service.name()),
            "every series on the {service} listener says so: {s:?}"
        );
    }
    (text, parsed)
}

async fn parse(text: &str) -> Scrape {
    let out = run_client_script("prometheus_check.py", Vec::new(), text.as_bytes().to_vec()).await;
    assert!(
        out.status.success(),
        "the Prometheus parser refused the text: {}\n---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let types = json["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let samples = json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Sample {
            name: s["name"].as_str().unwrap().to_string(),
            labels: s["labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect(),
            value: match &s["value"] {
                Value::String(v) if v == "+Inf" => f64::INFINITY,
                Value::String(v) => panic!("unexpected value {v}"),
                v => v.as_f64().unwrap(),
            },
        })
        .collect();
    Scrape { types, samples }
}

/// A model table with the real SmolLM2 (alpha-3.3 and beta-4-mini share its engine) and the
/// tiny image model, in `dir`.
fn models_toml(dir: &Path) -> PathBuf {
    let weights = root().join("weights/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        weights.exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        weights.display()
    );
    hearth_imagine::write_tiny_sdxl(&dir.join("tiny-sdxl"), hearth_imagine::tiny::TINY_SEED)
        .unwrap();
    let text = format!(
        r#"
[defaults]
threads = 2

[text."alpha-3.3"]
weights = "{w}"
max_output_tokens = 2048
input_price_per_million = "0.60"
output_price_per_million = "2.40"

[text."beta-4-mini"]
weights = "{w}"
max_output_tokens = 2048
input_price_per_million = "0.15"
output_price_per_million = "0.60"

[image."xl-lightning"]
weights = "no-real-weights-here"
tiny_weights = "tiny-sdxl"
price_per_image = "0.040"
"#,
        w = weights.display()
    );
    let path = dir.join("models.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn dec(v: &Value) -> f64 {
    v.as_str().expect("a money string").parse().unwrap()
}

/// What a request moved: `after - before` of a counter.
fn moved(before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    after.value(name, labels) - before.value(name, labels)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_counts_what_it_did_in_text_a_prometheus_parser_reads() {
    let models = tempfile::tempdir().unwrap();
    let table = models_toml(models.path());
    let app = TestApp::builder()
        .services(&Service::ALL)
        .configure(|raw| {
            raw.models = Some(table);
            raw.billing.initial_balance = Some("5".into());
            raw.billing.default_margin_percent = Some("0".into());
        })
        .spawn()
        .await;
    let user = "metrics-user-7f3a";
    let token = app.token(user).await;
    // Wait for the text model, so that every engine series is there from the first scrape.
    for _ in 0..600 {
        let (_, health) = app.get(Service::Completion, "/").await;
        if health["models"]["alpha-3.3"] == "ready" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    let mut before = BTreeMap::new();
    for service in Service::ALL {
        before.insert(service, scrape(&app, service).await.1);
    }

    // Completion: two answers, one refused credential.
    let prompt = "Name a colour of the sea, in one word.";
    let mut charged = 0.0;
    let mut generated = 0.0;
    for model in ["alpha-3.3", "beta-4-mini"] {
        let (status, body) = app
            .post(
                Service::Completion,
                "/",
                json!({ "serviceToken": token, "model": model, "maxOutputTokens": 6, "temperature": 0,
                        "messages": [{ "role": "user", "content": prompt }] }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        charged += dec(&body["usage"]["inputCost"]) + dec(&body["usage"]["outputCost"]);
        generated += body["usage"]["completionTokens"].as_f64().unwrap();
    }
    let (status, _) = app
        .post(
            Service::Completion,
            "/",
            json!({ "serviceToken": "not-a-token", "model": "alpha-3.3",
                    "messages": [{ "role": "user", "content": "hi" }] }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Markdown: one conversion, one refused document, one unknown path.
    let upload = |name: &str, bytes: &[u8]| {
        let form = Form::new().part(
            "file",
            Part::bytes(bytes.to_vec()).file_name(name.to_string()),
        );
        app.client
            .post(format!("{}/", app.url(Service::Markdown)))
            .multipart(form)
            .send()
    };
    let file_name = "quarterly-secret-plan.html";
    let ok = upload(file_name, b"<h1>Plan</h1><p>Ship it.</p>")
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let refused = upload("tool.exe", b"MZ\x90\x00\x03\x00\x00\x00")
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _) = app.get(Service::Markdown, "/no/such/page").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Imagine: one image of 2 steps on the tiny model.
    let image_prompt = "a lighthouse painted by a metrics test";
    let (status, body) = app
        .post(
            Service::Imagine,
            "/",
            json!({ "serviceToken": token, "prompt": image_prompt, "width": 256, "height": 256, "steps": 2, "seed": 1 }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let image_cost = dec(&body["usage"]["cost"]);

    // Auth: an admin credit.
    app.credit(user, "2.5").await;

    let mut after = BTreeMap::new();
    let mut texts = Vec::new();
    for service in Service::ALL {
        let (text, parsed) = scrape(&app, service).await;
        texts.push(text);
        after.insert(service, parsed);
    }
    let (b, a) = (&before[&Service::Completion], &after[&Service::Completion]);

    // Requests by route template, method and status, with their latency.
    let requests = "hearth_http_requests_total";
    let root_post_200 = [("route", "/"), ("method", "POST"), ("status", "200")];
    assert_eq!(moved(b, a, requests, &root_post_200), 2.0);
    let root_post_401 = [("route", "/"), ("method", "POST"), ("status", "401")];
    assert_eq!(moved(b, a, requests, &root_post_401), 1.0);
    let root_post = [("route", "/"), ("method", "POST")];
    assert_eq!(
        moved(
            b,
            a,
            "hearth_http_request_duration_seconds_count",
            &root_post
        ),
        3.0
    );
    assert_eq!(
        a.types
            .get("hearth_http_request_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );

    // The engine: both ids share one engine, named after the first.
    let engine = [("model", "alpha-3.3")];
    assert_eq!(
        a.value("hearth_completion_model_info", &[("model", "beta-4-mini")]),
        1.0
    );
    assert_eq!(
        a.matching("hearth_completion_model_info", &[("model", "beta-4-mini")])
            .next()
            .unwrap()
            .labels["engine"],
        "alpha-3.3"
    );
    assert_eq!(
        moved(b, a, "hearth_completion_generated_tokens_total", &engine),
        generated
    );
    assert!(generated > 0.0);
    assert!(moved(b, a, "hearth_completion_prompt_tokens_total", &engine) > 0.0);
    assert_eq!(
        moved(b, a, "hearth_completion_requests_total", &engine),
        2.0
    );
    assert!(
        moved(
            b,
            a,
            "hearth_completion_time_to_first_token_seconds_count",
            &engine
        ) >= 1.0
    );
    assert!(
        moved(
            b,
            a,
            "hearth_completion_step_duration_seconds_count",
            &engine
        ) >= 1.0
    );
    assert!(moved(b, a, "hearth_completion_batch_size_count", &engine) >= 1.0);
    assert_eq!(
        a.value(
            "hearth_completion_time_to_first_token_seconds_bucket",
            &[("model", "alpha-3.3"), ("le", "+Inf")]
        ),
        a.value(
            "hearth_completion_time_to_first_token_seconds_count",
            &engine
        )
    );
    assert_eq!(a.value("hearth_completion_queue_depth", &engine), 0.0);
    assert_eq!(a.value("hearth_completion_active_sequences", &engine), 0.0);
    assert_eq!(
        a.value("hearth_completion_kv_cache_in_use_bytes", &engine),
        0.0
    );
    assert!(a.value("hearth_completion_kv_cache_budget_bytes", &engine) > 0.0);
    assert_eq!(
        a.value("hearth_completion_model_ready", &[("model", "beta-4-mini")]),
        1.0
    );

    // Money: what the answers say they cost, and every hold ended.
    let held = moved(b, a, "hearth_billing_held_credits_total", &[]);
    let settled = moved(b, a, "hearth_billing_charged_credits_total", &[]);
    let released = moved(b, a, "hearth_billing_released_credits_total", &[]);
    assert!(
        close(settled, charged),
        "charged {settled}, answers say {charged}"
    );
    assert!(
        held >= settled && close(held, settled + released),
        "{held} {settled} {released}"
    );

    // Markdown: by detected format and outcome.
    let (b, a) = (&before[&Service::Markdown], &after[&Service::Markdown]);
    let conversions = "hearth_markdown_conversions_total";
    assert_eq!(
        moved(b, a, conversions, &[("format", "html"), ("outcome", "ok")]),
        1.0
    );
    assert_eq!(
        moved(
            b,
            a,
            conversions,
            &[("format", "unknown"), ("outcome", "unsupported")]
        ),
        1.0
    );
    assert_eq!(
        moved(
            b,
            a,
            "hearth_markdown_conversion_duration_seconds_count",
            &[("format", "html")]
        ),
        1.0
    );
    let unmatched_get_404 = [("route", "unmatched"), ("method", "GET"), ("status", "404")];
    assert_eq!(moved(b, a, requests, &unmatched_get_404), 1.0);
    let root_post_415 = [("route", "/"), ("method", "POST"), ("status", "415")];
    assert_eq!(moved(b, a, requests, &root_post_415), 1.0);

    // Imagine: one step-time sample per denoising step; nothing waiting; the money.
    let (b, a) = (&before[&Service::Imagine], &after[&Service::Imagine]);
    let model = [("model", "xl-lightning")];
    assert_eq!(
        moved(b, a, "hearth_imagine_step_duration_seconds_count", &model),
        2.0
    );
    assert!(moved(b, a, "hearth_imagine_step_duration_seconds_sum", &model) > 0.0);
    assert_eq!(a.value("hearth_imagine_queue_depth", &model), 0.0);
    let settled = moved(b, a, "hearth_billing_charged_credits_total", &[]);
    assert!(close(settled, image_cost), "{settled} {image_cost}");
    assert!(close(
        moved(b, a, "hearth_billing_held_credits_total", &[]),
        image_cost
    ));

    // Auth: the sign-in and the admin credit.
    let (b, a) = (&before[&Service::Auth], &after[&Service::Auth]);
    assert_eq!(
        moved(b, a, "hearth_billing_admin_added_credits_total", &[]),
        2.5
    );
    let credit_200 = [
        ("route", "/admin/credit"),
        ("method", "POST"),
        ("status", "200"),
    ];
    assert_eq!(moved(b, a, requests, &credit_200), 1.0);
    assert_eq!(
        a.value(requests, &[("route", "/token"), ("status", "200")]),
        1.0
    );

    // No user data on any listener: no user id, token, prompt or file name.
    for text in &texts {
        for secret in [user, token.as_str(), prompt, image_prompt, file_name] {
            assert!(!text.contains(secret), "/metrics shows {secret:?}:\n{text}");
        }
    }
}

#[tokio::test]
async fn a_thousand_unknown_paths_and_odd_methods_add_one_series() {
    let app = TestApp::builder().spawn().await;
    let (_, before) = scrape(&app, Service::Auth).await;
    let base = app.url(Service::Auth);
    let requests = (0..1000).map(|i| {
        let path = format!("/{}/{i}?q={}", rand::random::<u64>(), rand::random::<u32>());
        app.client.get(format!("{base}{path}")).send()
    });
    for resp in futures::future::join_all(requests).await {
        assert_eq!(resp.unwrap().status(), StatusCode::NOT_FOUND);
    }
    for method in ["BREW", "PROPFIND", "X-ANYTHING"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let resp = app
            .client
            .request(method, format!("{base}/x/{}", rand::random::<u32>()));
        resp.send().await.unwrap();
    }
    let (text, after) = scrape(&app, Service::Auth).await;
    let series = |s: &Scrape| s.matching("hearth_http_requests_total", &[]).count();
    assert!(
        series(&after) <= series(&before) + 3,
        "1,003 hostile requests made {} new series:\n{text}",
        series(&after) - series(&before)
    );
    let unmatched = [("route", "unmatched"), ("method", "GET"), ("status", "404")];
    assert_eq!(
        moved(&before, &after, "hearth_http_requests_total", &unmatched),
        1000.0
    );
    assert_eq!(
        moved(
            &before,
            &after,
            "hearth_http_requests_total",
            &[("route", "unmatched"), ("method", "other")]
        ),
        3.0
    );
    assert!(!text.contains("PROPFIND") && !text.contains("BREW"));
}

#[tokio::test]
async fn two_servers_in_one_process_keep_their_own_series() {
    let (one, two) = (
        TestApp::builder().spawn().await,
        TestApp::builder().spawn().await,
    );
    let (_, before) = scrape(&two, Service::Auth).await;
    for _ in 0..3 {
        one.get(Service::Auth, "/").await;
    }
    let (_, after) = scrape(&two, Service::Auth).await;
    let health = [("route", "/"), ("method", "GET")];
    assert_eq!(
        moved(&before, &after, "hearth_http_requests_total", &health),
        0.0
    );
    let (_, on_one) = scrape(&one, Service::Auth).await;
    assert_eq!(on_one.value("hearth_http_requests_total", &health), 3.0);
}
