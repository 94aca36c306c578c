//! Ollama's API on the completion listener, beside the spec's, OpenAI's and Anthropic's routes:
//! `POST /api/chat` and `POST /api/generate` (NDJSON lines by default, one object with
//! `stream: false`), `POST /api/embed`, and the model routes `GET /api/tags`, `POST /api/show`,
//! `GET /api/ps`, `GET /api/version`.
//!
//! A front end, not a pipeline: chat and generate are checked into the same
//! [`ValidRequest`](super::validate::ValidRequest) and go down the same start pipeline (limits,
//! hold, admission, driver, settlement, `/stream/shutdown`, cancellation when the client goes);
//! embed goes through the embeddings route's own core. Credentials: the service token as
//! `Authorization: Bearer` (the `ollama` client's `headers=`); Ollama's clients send none by
//! default, and a request without one is 401 saying how to send it (money is spent here). The
//! model routes need none, as `GET /v1/models` needs none. Errors are in Ollama's shape
//! ([`OllamaError`]).

mod request;
mod respond;

use std::time::{Instant, SystemTime};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::{instrument, Span};
use utoipa::ToSchema;

use super::embeddings::{embed as embed_texts, Embedded, EmbeddingRequest};
use super::front::Checked;
use super::openai::respond::{whole, Answer as _};
use super::start::{authenticate, start_valid};
use super::stream::{spawn_driver, DriverEvent};
use super::{CompletionState, STREAM_ID_HEADER};
use crate::error::{ApiError, OllamaError, OllamaJson};
use crate::models::KeepAlive;
use crate::validate::bearer_token;
use request::{ChatBody, GenerateBody};
use respond::{Ollama, Route};

/// The errors of the routes that spend, `{"error": "<message>"}`, in the OpenAPI document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // describes the answers; never built
enum OllamaErrors {
    /// A bad field.
    #[response(status = 400)]
    BadRequest,
    /// No, bad or expired service token.
    #[response(status = 401)]
    Unauthorized,
    /// The balance cannot cover the worst case.
    #[response(status = 402)]
    PaymentRequired,
    /// No such model.
    #[response(status = 404)]
    NotFound,
    /// A body over the limit.
    #[response(status = 413)]
    TooLarge,
    /// The user's concurrent requests are at the cap (`Retry-After`).
    #[response(status = 429)]
    TooManyRequests,
    /// Overloaded (`Retry-After`).
    #[response(status = 503)]
    Unavailable,
}

pub fn routes() -> Router<CompletionState> {
    Router::new()
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/embed", post(embed))
        .route("/api/tags", get(tags))
        .route("/api/show", post(show))
        .route("/api/ps", get(ps))
        .route("/api/version", get(version))
}

/// The session of the bearer token.
async fn session(
    cs: &CompletionState,
    headers: &HeaderMap,
) -> Result<crate::state::Session, ApiError> {
    let token = bearer_token(headers).ok_or_else(|| {
        ApiError::invalid_credentials(
            "no credentials: send the service token as Authorization: Bearer <serviceToken> \
             (the ollama client: Client(host=..., headers={'Authorization': 'Bearer ...'}))",
        )
    })?;
    authenticate(cs, token).await
}

/// `POST /api/chat`.
#[utoipa::path(
    post,
    path = "/api/chat",
    tag = "ollama",
    operation_id = "ollamaChat",
    description = "Ollama's chat: NDJSON lines `{model, created_at, message, done}` (the last \
        `done: true` with `done_reason` and counts), or one object with `stream: false`. No \
        messages: the model is loaded (`done_reason: \"load\"`). Billed as `POST /`.",
    request_body = ChatBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The answer, or its lines (`application/x-ndjson`)."),
        OllamaErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn chat(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OllamaJson(body): OllamaJson<ChatBody>,
) -> Result<Response, OllamaError> {
    let model = body.model.clone();
    let keep = request::keep_alive(body.keep_alive.as_ref())?;
    Ok(respond(&cs, &headers, model, keep, Route::Chat, |c| {
        request::chat(body, c)
    })
    .await?)
}

/// `POST /api/generate`.
#[utoipa::path(
    post,
    path = "/api/generate",
    tag = "ollama",
    operation_id = "ollamaGenerate",
    description = "Ollama's generate: the prompt (with `system`) through the chat template, or \
        as it is with `raw`; NDJSON lines `{model, created_at, response, done}`, or one object \
        with `stream: false`. No prompt: the model is loaded. Billed as `POST /`.",
    request_body = GenerateBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The answer, or its lines (`application/x-ndjson`)."),
        OllamaErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn generate(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OllamaJson(body): OllamaJson<GenerateBody>,
) -> Result<Response, OllamaError> {
    let model = body.model.clone();
    let keep = request::keep_alive(body.keep_alive.as_ref())?;
    Ok(respond(&cs, &headers, model, keep, Route::Generate, |c| {
        request::generate(body, c)
    })
    .await?)
}

/// A chat or generate request: the caller's session, the request checked (`None`: only its
/// `model` to load, or with `keep_alive` 0 to unload), the model's keep-alive set, then the
/// generation started and answered whole or as lines.
async fn respond(
    cs: &CompletionState,
    headers: &HeaderMap,
    model: Option<String>,
    keep: Option<KeepAlive>,
    route: Route,
    check: impl FnOnce(&super::catalog::Catalog) -> Result<Option<Checked>, ApiError>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let session = session(cs, headers).await?;
    let Some(checked) = check(&cs.core.catalog.now())? else {
        return load(cs, model.as_deref().unwrap_or_default(), keep, route).await;
    };
    Span::current().record("model", checked.valid.model.as_str());
    if let Some(keep) = keep {
        cs.core
            .engines
            .models()
            .set_keep_alive(&checked.valid.model, keep);
    }
    let generation = start_valid(cs, session, checked.valid).await?;
    let model = generation.model.clone();
    let (stream_id, mut events) = spawn_driver(cs, generation)?;
    let mut answer = Ollama::new(route, &model, &checked.tools, started);
    if !checked.stream {
        return Ok(Json(whole(answer, &mut events).await?).into_response());
    }
    ndjson(stream_id, events, move |e| answer.on_event(e))
}

/// A request with nothing to generate: the model loaded (Ollama's answer says `load`), or with
/// `keep_alive` 0 unloaded once idle (`unload`), as `ollama stop` asks.
async fn load(
    cs: &CompletionState,
    model: &str,
    keep: Option<KeepAlive>,
    route: Route,
) -> Result<Response, ApiError> {
    Span::current().record("model", model);
    let models = cs.core.engines.models();
    if keep == Some(KeepAlive::For(std::time::Duration::ZERO)) {
        models
            .unload(model)
            .unwrap_or_else(|| Err(crate::models::ModelError::Unknown(model.into())))?;
        return Ok(Json(Ollama::loaded(route, model, "unload")).into_response());
    }
    drop(cs.core.engines.get(model).await?);
    if let Some(keep) = keep {
        models.set_keep_alive(model, keep);
    }
    Ok(Json(Ollama::loaded(route, model, "load")).into_response())
}

/// The NDJSON answer: each event's objects, one a line. The stream's id goes in
/// `X-Stream-Id`, for `POST /stream/shutdown`. A client that closes the connection drops this
/// body, and with it the driver's reader: generation stops and is billed for what it made.
fn ndjson<F>(
    stream_id: String,
    events: mpsc::Receiver<DriverEvent>,
    mut convert: F,
) -> Result<Response, ApiError>
where
    F: FnMut(DriverEvent) -> Vec<String> + Send + 'static,
{
    let lines = futures::stream::unfold(events, |mut events| async move {
        let event = events.recv().await?;
        Some((event, events))
    })
    .map(move |event| {
        let text: String = convert(event).into_iter().map(|l| l + "\n").collect();
        Ok::<_, std::convert::Infallible>(text)
    });
    let mut response = Response::new(Body::from_stream(lines));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    let id = HeaderValue::from_str(&stream_id).map_err(ApiError::internal)?;
    headers.insert(STREAM_ID_HEADER, id);
    Ok(response)
}

/// `POST /api/embed`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = OllamaEmbedRequest)]
pub struct EmbedBody {
    /// An `[embedding."id"]` model.
    #[schema(value_type = String, required = true)]
    model: Option<String>,
    /// A string or strings.
    #[schema(value_type = Object, required = true)]
    input: Option<Value>,
    /// Cut inputs longer than the model reads (the default, as Ollama); `false` refuses them.
    truncate: Option<bool>,
    /// Cut each vector to this many dimensions and normalise it again (models trained for it).
    dimensions: Option<usize>,
}

#[utoipa::path(
    post,
    path = "/api/embed",
    tag = "ollama",
    operation_id = "ollamaEmbed",
    description = "Ollama's embeddings: `{model, embeddings, prompt_eval_count}`, billed as \
        `POST /v1/embeddings` (per input token); `options` and `keep_alive` are ignored.",
    request_body = EmbedBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One vector per input, in order."),
        OllamaErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn embed(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OllamaJson(body): OllamaJson<EmbedBody>,
) -> Result<Json<Value>, OllamaError> {
    let started = Instant::now();
    let session = session(&cs, &headers).await?;
    let model = body
        .model
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid_request("model", "model is required"))?;
    let texts = match body.input {
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) if !items.is_empty() => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid_request("input", "must be strings")),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::invalid_request("input", "must be a string or strings").into()),
    };
    let request =
        EmbeddingRequest::texts(model, texts, body.dimensions, body.truncate.unwrap_or(true));
    let Embedded {
        model,
        vectors,
        tokens,
    } = embed_texts(&cs, &session.user_id, request).await?;
    Ok(Json(json!({
        "model": model,
        "embeddings": vectors,
        "total_duration": started.elapsed().as_nanos() as u64,
        "load_duration": 0,
        "prompt_eval_count": tokens,
    })))
}

/// A model's file: its size and when it last changed (`None` for a hub model not fetched).
fn file_facts(cs: &CompletionState, id: &str) -> (u64, String) {
    let path = cs
        .core
        .catalog
        .now()
        .entry(id)
        .and_then(|e| match &e.load.source {
            hearth_infer::WeightSource::Local { path } => Some(path.clone()),
            _ => None,
        });
    let meta = path.and_then(|p| std::fs::metadata(p).ok());
    let size = meta.as_ref().map_or(0, |m| m.len());
    let modified = meta
        .and_then(|m| m.modified().ok())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let modified = chrono::DateTime::<chrono::Utc>::from(modified)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    (size, modified)
}

/// A model's `details`, as far as Hearth knows them without reading the file.
fn details(format: &str) -> Value {
    json!({ "format": format, "family": "", "families": null, "parameter_size": "", "quantization_level": "" })
}

fn format_of(cs: &CompletionState, id: &str) -> &'static str {
    let gguf = cs
        .core
        .catalog
        .now()
        .entry(id)
        .is_some_and(|e| match &e.load.source {
            hearth_infer::WeightSource::Local { path } => path
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf")),
            hearth_infer::WeightSource::HfHub { file, .. } => file.is_some(),
        });
    if gguf {
        "gguf"
    } else {
        "safetensors"
    }
}

/// `GET /api/tags`: every chat model of the table, and the embedding models.
#[utoipa::path(
    get,
    path = "/api/tags",
    tag = "ollama",
    operation_id = "ollamaTags",
    responses((status = 200, description = "`{models: [{name, model, modified_at, size, details}]}`: the chat models of the table, loaded or not, and the embedding models."))
)]
async fn tags(State(cs): State<CompletionState>) -> Json<Value> {
    let mut models: Vec<Value> = cs
        .core
        .catalog
        .now()
        .ids()
        .iter()
        .map(|id| {
            let (size, modified) = file_facts(&cs, id);
            json!({ "name": id, "model": id, "modified_at": modified, "size": size,
                    "details": details(format_of(&cs, id)) })
        })
        .collect();
    models.extend(cs.core.embeddings.ids().into_iter().map(|id| {
        json!({ "name": id, "model": id, "modified_at": "1970-01-01T00:00:00Z", "size": 0,
                "details": details("safetensors") })
    }));
    Json(json!({ "models": models }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = OllamaShowRequest)]
pub struct ShowBody {
    #[schema(value_type = String, required = true)]
    model: Option<String>,
    /// The older name of `model`.
    name: Option<String>,
}

/// `POST /api/show`.
#[utoipa::path(
    post,
    path = "/api/show",
    tag = "ollama",
    operation_id = "ollamaShow",
    request_body = ShowBody,
    responses(
        (status = 200, description = "`{modelfile, parameters, template, details, model_info, capabilities}`; the template and context length once the model is loaded."),
        (status = 404, description = "No such model."),
    )
)]
async fn show(
    State(cs): State<CompletionState>,
    OllamaJson(body): OllamaJson<ShowBody>,
) -> Result<Json<Value>, OllamaError> {
    let id = body.model.or(body.name).unwrap_or_default();
    if cs.core.embeddings.get(&id).is_some() {
        return Ok(Json(json!({
            "modelfile": "", "parameters": "", "template": "",
            "details": details("safetensors"), "model_info": {}, "capabilities": ["embedding"],
        })));
    }
    let catalog = cs.core.catalog.now();
    let spec = super::front::model(Some(&id), &catalog)?;
    let ready = cs
        .core
        .engines
        .status()
        .get(&id)
        .is_some_and(|s| s == "ready");
    let (template, context) = if ready {
        let engine = cs.core.engines.get(&id).await.map_err(ApiError::from)?;
        (
            engine.tokenizer().chat_template().to_string(),
            Some(engine.context_length()),
        )
    } else {
        (String::new(), None)
    };
    let (_, modified) = file_facts(&cs, &id);
    Ok(Json(json!({
        "modelfile": "",
        "parameters": format!(
            "temperature {}\nnum_predict {}",
            spec.default_temperature, spec.default_max_output_tokens
        ),
        "template": template,
        "details": details(format_of(&cs, &id)),
        "model_info": { "context_length": context },
        "capabilities": ["completion", "tools"],
        "modified_at": modified,
    })))
}

/// `GET /api/ps`: the chat models loaded now, each with when its keep-alive lets it go.
#[utoipa::path(
    get,
    path = "/api/ps",
    tag = "ollama",
    operation_id = "ollamaPs",
    responses((status = 200, description = "`{models: [{name, model, size, details, expires_at, size_vram}]}`: the chat models loaded now; `expires_at` is when an idle model leaves (far off for a model kept forever or pinned)."))
)]
async fn ps(State(cs): State<CompletionState>) -> Json<Value> {
    let models: Vec<Value> = cs
        .core
        .engines
        .rows()
        .into_iter()
        .filter(|r| r.state == crate::models::Phase::Ready)
        .map(|r| {
            let expires = match crate::models::KeepAlive::parse(&r.keep_alive) {
                Ok(crate::models::KeepAlive::For(d)) if !r.pinned && r.in_flight == 0 => r
                    .last_used
                    .as_deref()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .and_then(|t| t.checked_add_signed(chrono::Duration::from_std(d).ok()?))
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                _ => None,
            };
            let gpu = r.device.starts_with("cuda");
            json!({ "name": r.id, "model": r.id, "size": r.memory_bytes,
                    "size_vram": if gpu { r.memory_bytes } else { 0 },
                    "expires_at": expires.unwrap_or_else(|| "9999-12-31T23:59:59Z".into()),
                    "details": details(format_of(&cs, &r.id)) })
        })
        .collect();
    Json(json!({ "models": models }))
}

/// `GET /api/version`: Hearth's version.
#[utoipa::path(
    get,
    path = "/api/version",
    tag = "ollama",
    operation_id = "ollamaVersion",
    responses((status = 200, description = "`{version}`: Hearth's version."))
)]
async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
