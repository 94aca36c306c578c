//! `GET /openapi.json` on every listener, checked by tools nobody here wrote
//! (`openapi-spec-validator` for the OpenAPI 3.1 schema, `jsonschema` for the bodies; installed
//! by `scripts/python-clients.sh`) through `tests/clients/openapi_check.py`: every document is
//! valid 3.1, every path it names answers, and real requests and answers (successes and
//! errors, on the spec's routes and the `/v1` ones) validate against the schemas it gives, with
//! no field the schema leaves out.

use hearth_server::Service;
use reqwest::multipart::{Form, Part};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::common::{run_client_script, spawn_all_four, TestApp};

const LISTENERS: [(&str, Service); 4] = [
    ("auth", Service::Auth),
    ("completion", Service::Completion),
    ("markdown", Service::Markdown),
    ("imagine", Service::Imagine),
];

/// A request to send: listener, method, path, bearer key, JSON body, and the status expected.
type Case<'a> = (
    Service,
    Method,
    &'a str,
    Option<&'a str>,
    Option<Value>,
    StatusCode,
);

/// One real request and its answer, as the check script takes it.
struct Exchanges {
    app: TestApp,
    list: Vec<Value>,
}

impl Exchanges {
    /// Sends `body` (JSON, or none) to `service`, records the exchange under its documented
    /// path (the template, such as `/v1/models/{id}`), and returns the status and JSON answer.
    async fn send(
        &mut self,
        service: Service,
        method: Method,
        real_path: &str,
        bearer: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let path = match real_path.strip_prefix("/v1/models/") {
            Some(_) => "/v1/models/{id}",
            None => real_path,
        };
        let mut req = self.app.client.request(
            method.clone(),
            format!("{}{real_path}", self.app.url(service)),
        );
        if let Some(key) = bearer {
            req = req.bearer_auth(key);
        }
        if let Some(body) = &body {
            req = req.json(body);
        }
        let resp = req.send().await.expect("request sent");
        self.record(service, method, path, body, resp).await
    }

    async fn record(
        &mut self,
        service: Service,
        method: Method,
        path: &str,
        request: Option<Value>,
        resp: reqwest::Response,
    ) -> (StatusCode, Value) {
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let bytes = resp.bytes().await.unwrap();
        let body: Value = if content_type.starts_with("application/json") {
            serde_json::from_slice(&bytes).expect("a JSON answer parses")
        } else {
            Value::Null
        };
        self.list.push(json!({
            "listener": service.name(),
            "method": method.as_str().to_lowercase(),
            "path": path,
            "request": request,
            "status": status.as_u16(),
            "content_type": content_type,
            "body": body,
        }));
        (status, body)
    }
}

#[tokio::test]
async fn every_listener_serves_a_valid_3_1_document_that_real_answers_match() {
    let models = tempfile::tempdir().unwrap();
    let app = spawn_all_four(crate::markdown_hostile::models(models.path())).await;

    // The documents, as served, with no credential.
    let mut documents = serde_json::Map::new();
    for (name, service) in LISTENERS {
        let resp = app
            .client
            .get(format!("{}/openapi.json", app.url(service)))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        assert!(resp.headers()[reqwest::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let doc: Value = resp.json().await.unwrap();
        assert_eq!(
            doc["servers"][0]["url"],
            app.url(service),
            "{name}: servers names this listener"
        );
        documents.insert(name.to_string(), doc);
    }

    // Every path a document names answers on its listener (not 404, not 405), each with the
    // methods documented for it; path parameters get a value that exists, except a job's id
    // (a job would have to be made first), whose own 404 must then be the route's answer, not
    // the listener's for a path it does not serve.
    for (name, service) in LISTENERS {
        for (path, item) in documents[name]["paths"].as_object().unwrap() {
            let real = path.replace("{id}", "alpha-3.3");
            assert!(!real.contains('{'), "{name}: a test value for {path}");
            for method in item.as_object().unwrap().keys() {
                let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let resp = app
                    .client
                    .request(method.clone(), format!("{}{real}", app.url(service)))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status();
                if path == "/jobs/{id}" && status == StatusCode::NOT_FOUND {
                    let body: serde_json::Value = resp.json().await.unwrap();
                    assert_eq!(body["error"]["details"]["jobId"], "alpha-3.3", "{body}");
                    continue;
                }
                assert!(
                    !matches!(
                        status,
                        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
                    ),
                    "{name}: {method} {path} is documented but answers {status}"
                );
            }
        }
    }

    let mut ex = Exchanges {
        list: Vec::new(),
        app,
    };
    let user = "openapi-user";
    let idp = ex.app.idp_token(user);
    ex.app.credit(user, "5").await;
    let token = ex.app.token(user).await;
    let chat = json!({
        "model": "alpha-3.3",
        "messages": [
            {"role": "system", "content": "Answer in JSON."},
            {"role": "user", "content": "Name a colour."}
        ],
        "max_completion_tokens": 24,
        "temperature": 0,
        "seed": 7,
        "logprobs": true,
        "top_logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "colour", "schema": {
            "type": "object",
            "properties": {"colour": {"type": "string"}},
            "required": ["colour"]
        }}},
        "user": "someone",
    });
    let tool_round = json!({
        "model": "alpha-3.3",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"celsius\": 3}"}
        ],
        "tools": [{"type": "function", "function": {"name": "weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "max_tokens": 40,
        "temperature": 0,
    });
    let spec_chat = json!({
        "serviceToken": token,
        "model": "alpha-3.3",
        "messages": [{"role": "user", "content": "Say hi."}],
        "temperature": 0.0,
        "maxOutputTokens": 4,
    });
    let image = json!({"serviceToken": token, "prompt": "a red fox", "width": 256, "height": 256, "steps": 1, "seed": 1});
    let with = |base: &Value, key: &str, value: Value| {
        let mut v = base.clone();
        v[key] = value;
        v
    };

    // (listener, method, path, bearer, body, status): successes and errors on every listener,
    // the spec's routes and the `/v1` ones. Health is `GET /` everywhere.
    let (get, post) = (Method::GET, Method::POST);
    let key = Some(token.as_str());
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        (Service::Auth, get.clone(), "/", None, None, StatusCode::OK),
        (Service::Completion, get.clone(), "/", None, None, StatusCode::OK),
        (Service::Markdown, get.clone(), "/", None, None, StatusCode::OK),
        (Service::Imagine, get.clone(), "/", None, None, StatusCode::OK),
        (Service::Auth, post.clone(), "/token", None,
            Some(json!({"userId": user, "idpToken": idp, "lifetimeSeconds": 3600})), StatusCode::OK),
        (Service::Auth, post.clone(), "/token", None,
            Some(json!({"userId": user, "idpToken": "not-a-token"})), StatusCode::UNAUTHORIZED),
        (Service::Auth, post.clone(), "/validate", None, Some(json!({"serviceToken": token})), StatusCode::OK),
        (Service::Auth, post.clone(), "/balance", None, Some(json!({"serviceToken": token})), StatusCode::OK),
        (Service::Completion, post.clone(), "/", None, Some(spec_chat.clone()), StatusCode::OK),
        (Service::Completion, post.clone(), "/", None,
            Some(with(&spec_chat, "temperature", json!("hot"))), StatusCode::BAD_REQUEST),
        (Service::Completion, get.clone(), "/v1/models", None, None, StatusCode::OK),
        (Service::Completion, get.clone(), "/v1/models/alpha-3.3", None, None, StatusCode::OK),
        (Service::Completion, get.clone(), "/v1/models/no-such-model", None, None, StatusCode::NOT_FOUND),
        (Service::Completion, post.clone(), "/v1/chat/completions", key, Some(chat.clone()), StatusCode::OK),
        (Service::Completion, post.clone(), "/v1/chat/completions", key, Some(tool_round), StatusCode::OK),
        (Service::Completion, post.clone(), "/v1/chat/completions", Some("not-a-token"),
            Some(chat.clone()), StatusCode::UNAUTHORIZED),
        (Service::Completion, post.clone(), "/v1/chat/completions", key,
            Some(with(&chat, "n", json!(3))), StatusCode::BAD_REQUEST),
        (Service::Completion, post.clone(), "/v1/completions", key,
            Some(json!({"model": "alpha-3.3", "prompt": "Once upon a time", "max_tokens": 5,
                "temperature": 0, "stop": ["\n"], "logprobs": 2})), StatusCode::OK),
        (Service::Imagine, post.clone(), "/", None, Some(image.clone()), StatusCode::OK),
        (Service::Imagine, post.clone(), "/", None, Some(with(&image, "prompt", json!(""))), StatusCode::BAD_REQUEST),
        (Service::Imagine, post.clone(), "/v1/images/generations", key,
            Some(json!({"model": "xl-lightning", "prompt": "a red fox", "size": "256x256", "n": 1,
                "response_format": "b64_json", "steps": 1, "seed": 2})), StatusCode::OK),
        (Service::Imagine, post.clone(), "/v1/images/generations", key,
            Some(json!({"prompt": "a red fox", "size": "7x7"})), StatusCode::BAD_REQUEST),
    ];
    for (service, method, path, bearer, body, expected) in cases {
        let (status, answer) = ex.send(service, method.clone(), path, bearer, body).await;
        assert_eq!(status, expected, "{service} {method} {path}: {answer}");
    }
    let forced = ex
        .list
        .iter()
        .find(|e| e["request"]["tool_choice"].is_object())
        .unwrap();
    assert!(
        forced["body"]["choices"][0]["message"]["tool_calls"].is_array(),
        "a forced tool call: {}",
        forced["body"]
    );

    // Markdown: a conversion, and the spec's refusal of an upload without a file.
    let html =
        Part::bytes(b"<h1>Title</h1><p>Some <b>bold</b> text.</p>".to_vec()).file_name("a.html");
    for (form, expected) in [
        (Form::new().part("file", html), StatusCode::OK),
        (Form::new().text("other", "x"), StatusCode::BAD_REQUEST),
    ] {
        let url = format!("{}/", ex.app.url(Service::Markdown));
        let resp = ex
            .app
            .client
            .post(url)
            .multipart(form)
            .send()
            .await
            .unwrap();
        let (status, body) = ex
            .record(Service::Markdown, Method::POST, "/", None, resp)
            .await;
        assert_eq!(status, expected, "{body}");
    }

    let input = json!({ "documents": documents, "exchanges": ex.list });
    let out = run_client_script(
        "openapi_check.py",
        Vec::new(),
        input.to_string().into_bytes(),
    )
    .await;
    assert!(
        out.status.success(),
        "the OpenAPI documents or the answers failed the check:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["checked"],
        ex.list.len(),
        "every exchange was checked"
    );
}
