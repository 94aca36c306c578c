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

use crate::common::{run_client_script, TestApp};

const LISTENERS: [(&str, Service); 4] = [
    ("auth", Service::Auth),
    ("completion", Service::Completion),
    ("markdown", Service::Markdown),
    ("imagine", Service::Imagine),
];

/// One real request and its answer, as the check script takes it.
struct Exchanges {
    app: TestApp,
    list: Vec<Value>,
}

impl Exchanges {
    /// Sends `body` (JSON, or none) to `service`, records the exchange under the documented
    /// `path` (a template such as `/v1/models/{id}`), and returns the status and JSON answer.
    async fn send(
        &mut self,
        service: Service,
        method: Method,
        path: &str,
        real_path: &str,
        bearer: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
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
    let table = crate::markdown_hostile::models(models.path());
    let app = TestApp::builder()
        .services(&[
            Service::Auth,
            Service::Completion,
            Service::Markdown,
            Service::Imagine,
        ])
        .configure(|raw| raw.models = Some(table))
        .spawn()
        .await;

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
    // methods documented for it; path parameters get a value that exists.
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
                assert!(
                    !matches!(
                        resp.status(),
                        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
                    ),
                    "{name}: {method} {path} is documented but answers {}",
                    resp.status()
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

    // Health on every listener (`GET /`); auth: a token, a refused token, the balance, validate.
    for (_, service) in LISTENERS {
        let (status, _) = ex.send(service, Method::GET, "/", "/", None, None).await;
        assert_eq!(status, StatusCode::OK, "{service} health");
    }
    let (status, body) = ex
        .send(
            Service::Auth,
            Method::POST,
            "/token",
            "/token",
            None,
            Some(json!({"userId": user, "idpToken": idp, "lifetimeSeconds": 3600})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let token = body["serviceToken"].as_str().unwrap().to_string();
    let (status, _) = ex
        .send(
            Service::Auth,
            Method::POST,
            "/token",
            "/token",
            None,
            Some(json!({"userId": user, "idpToken": "not-a-token"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = ex
        .send(
            Service::Auth,
            Method::POST,
            "/validate",
            "/validate",
            None,
            Some(json!({"serviceToken": token})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = ex
        .send(
            Service::Auth,
            Method::POST,
            "/balance",
            "/balance",
            None,
            Some(json!({"serviceToken": token})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // Completion: the spec's route, then the OpenAI ones, answers and errors.
    let completion = json!({
        "serviceToken": token,
        "model": "alpha-3.3",
        "messages": [{"role": "user", "content": "Say hi."}],
        "temperature": 0.0,
        "maxOutputTokens": 4,
    });
    let (status, body) = ex
        .send(
            Service::Completion,
            Method::POST,
            "/",
            "/",
            None,
            Some(completion.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut bad = completion.clone();
    bad["temperature"] = json!("hot");
    let (status, _) = ex
        .send(Service::Completion, Method::POST, "/", "/", None, Some(bad))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = ex
        .send(
            Service::Completion,
            Method::GET,
            "/v1/models",
            "/v1/models",
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = ex
        .send(
            Service::Completion,
            Method::GET,
            "/v1/models/{id}",
            "/v1/models/alpha-3.3",
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = ex
        .send(
            Service::Completion,
            Method::GET,
            "/v1/models/{id}",
            "/v1/models/no-such-model",
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
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
    let (status, body) = ex
        .send(
            Service::Completion,
            Method::POST,
            "/v1/chat/completions",
            "/v1/chat/completions",
            Some(&token),
            Some(chat.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tools = json!({
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
    let (status, body) = ex
        .send(
            Service::Completion,
            Method::POST,
            "/v1/chat/completions",
            "/v1/chat/completions",
            Some(&token),
            Some(tools),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["choices"][0]["message"]["tool_calls"].is_array(),
        "{body}"
    );
    let (status, _) = ex
        .send(
            Service::Completion,
            Method::POST,
            "/v1/chat/completions",
            "/v1/chat/completions",
            Some("not-a-token"),
            Some(chat.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let mut bad = chat.clone();
    bad["n"] = json!(3);
    let (status, _) = ex
        .send(
            Service::Completion,
            Method::POST,
            "/v1/chat/completions",
            "/v1/chat/completions",
            Some(&token),
            Some(bad),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = ex
        .send(
            Service::Completion,
            Method::POST,
            "/v1/completions",
            "/v1/completions",
            Some(&token),
            Some(
                json!({"model": "alpha-3.3", "prompt": "Once upon a time", "max_tokens": 5,
                "temperature": 0, "stop": ["\n"], "logprobs": 2}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Markdown: a conversion and the spec's two refusals.
    let form = Form::new().part(
        "file",
        Part::bytes(b"<h1>Title</h1><p>Some <b>bold</b> text.</p>".to_vec()).file_name("a.html"),
    );
    let resp = ex
        .app
        .client
        .post(format!("{}/", ex.app.url(Service::Markdown)))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (status, _) = ex
        .record(Service::Markdown, Method::POST, "/", None, resp)
        .await;
    assert_eq!(status, StatusCode::OK);
    let form = Form::new().text("other", "x");
    let resp = ex
        .app
        .client
        .post(format!("{}/", ex.app.url(Service::Markdown)))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (status, _) = ex
        .record(Service::Markdown, Method::POST, "/", None, resp)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Images: the spec's route and the OpenAI one, an answer and an error each.
    let (status, body) = ex
        .send(
            Service::Imagine,
            Method::POST,
            "/",
            "/",
            None,
            Some(json!({"serviceToken": token, "prompt": "a red fox", "width": 256, "height": 256, "steps": 1, "seed": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = ex
        .send(
            Service::Imagine,
            Method::POST,
            "/",
            "/",
            None,
            Some(json!({"serviceToken": token, "prompt": "", "width": 256, "height": 256})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = ex
        .send(
            Service::Imagine,
            Method::POST,
            "/v1/images/generations",
            "/v1/images/generations",
            Some(&token),
            Some(
                json!({"model": "xl-lightning", "prompt": "a red fox", "size": "256x256", "n": 1,
                "response_format": "b64_json", "steps": 1, "seed": 2}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = ex
        .send(
            Service::Imagine,
            Method::POST,
            "/v1/images/generations",
            "/v1/images/generations",
            Some(&token),
            Some(json!({"prompt": "a red fox", "size": "7x7"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

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
