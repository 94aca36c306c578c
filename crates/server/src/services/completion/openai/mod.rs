//! The OpenAI-compatible routes of the completion listener, beside the spec's (which stay as
//! they are): `GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/chat/completions` and
//! `POST /v1/completions`, whole or streamed (`data: {chunk}` ... `data: [DONE]`), and
//! `POST /v1/embeddings` (`super::embeddings`) and `POST /v1/rerank` (`super::rerank`).
//!
//! Credentials come as `Authorization: Bearer <serviceToken>`, that API's convention. A request
//! is checked into the same [`ValidRequest`](super::validate::ValidRequest) as the spec's and
//! goes down the same pipeline ([`start_valid`]): the same per-model limits, hold, admission,
//! driver and settlement. Only the answer's shape differs (`respond.rs`), and errors are in
//! that API's shape ([`OpenAiError`]).

pub(super) mod request;
pub(super) mod respond;
pub(super) mod tools;
pub(super) mod wire;

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::sync::mpsc;
use tracing::{debug, instrument, Span};

use super::start::{authenticate, start_valid};
use super::stream::{spawn_driver, DriverEvent};
use super::{CompletionState, KEEP_ALIVE, STREAM_ID_HEADER};
use crate::error::{ApiError, OpenAiError, OpenAiJson};
use crate::openapi::OpenAiErrorBody;
use crate::validate::bearer_token;
use respond::{whole, Answer as _, Chat, Head, Text};
use wire::{
    ChatChunk, ChatCompletion, ChatRequest, ModelList, ModelObject, TextCompletion, TextRequest,
};

/// The errors of `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings` and `/v1/rerank` in the OpenAPI
/// document, as that API's clients sort them (the status table is `ErrorKind::status`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // describes the answers; never built
pub(super) enum CompletionErrors {
    /// `invalid_request_error`: `param` names the field.
    #[response(status = 400)]
    BadRequest(OpenAiErrorBody),
    /// `authentication_error`: no, bad, revoked or expired service token.
    #[response(status = 401)]
    Unauthorized(OpenAiErrorBody),
    /// `insufficient_quota`: the balance cannot cover the worst case (or the inputs).
    #[response(status = 402)]
    PaymentRequired(OpenAiErrorBody),
    /// `not_found_error`, code `model_not_found`.
    #[response(status = 404)]
    NotFound(OpenAiErrorBody),
    /// `rate_limit_error`: the user's concurrent requests are at the cap (`Retry-After`).
    #[response(status = 429)]
    TooManyRequests(OpenAiErrorBody),
    /// `api_error`.
    #[response(status = 500)]
    Internal(OpenAiErrorBody),
    /// `api_error`: the model failed to load or its engine failed.
    #[response(status = 502)]
    BadGateway(OpenAiErrorBody),
    /// `server_error`, code `overloaded` (`Retry-After`).
    #[response(status = 503)]
    Unavailable(OpenAiErrorBody),
}

pub fn routes() -> Router<CompletionState> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(text))
        .route("/v1/embeddings", post(super::embeddings::create))
        .route("/v1/rerank", post(super::rerank::rerank))
        .route("/rerank", post(super::rerank::rerank))
        .route("/v2/rerank", post(super::rerank::rerank))
}

pub(super) async fn session(
    cs: &CompletionState,
    headers: &HeaderMap,
) -> Result<crate::state::Session, OpenAiError> {
    let token = bearer_token(headers).ok_or_else(|| {
        ApiError::invalid_credentials(
            "no credentials: send the service token as Authorization: Bearer <serviceToken>",
        )
    })?;
    Ok(authenticate(cs, token).await?)
}

/// 404 `model_not_found`, naming the request's `model` field.
pub(super) fn model_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("the model {id:?} does not exist"))
        .with_details(serde_json::json!({ "field": "model", "code": "model_not_found" }))
}

fn model_object(cs: &CompletionState, id: &str) -> ModelObject {
    ModelObject {
        id: id.to_string(),
        object: "model",
        created: cs.core.started_at,
        owned_by: "hearth",
    }
}

/// `GET /v1/models`: every model of the table, loaded or not (no credentials needed: the spec's
/// health answer lists them too).
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    operation_id = "listModels",
    responses((status = 200, description = "Every model of the table, loaded or not.", body = ModelList))
)]
async fn models(State(cs): State<CompletionState>) -> Json<ModelList> {
    let data = cs
        .core
        .catalog
        .now()
        .ids()
        .iter()
        .chain(&cs.core.embeddings.ids())
        .chain(&cs.core.rerankers.ids())
        .map(|id| model_object(&cs, id))
        .collect();
    Json(ModelList {
        object: "list",
        data,
    })
}

/// One model of the table (no credentials needed).
#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    tag = "openai",
    operation_id = "retrieveModel",
    params(("id" = String, Path, description = "A model id.")),
    responses(
        (status = 200, description = "The model.", body = ModelObject),
        (status = 404, description = "`not_found_error`, code `model_not_found`.", body = OpenAiErrorBody),
    )
)]
async fn model(
    State(cs): State<CompletionState>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, OpenAiError> {
    if cs.core.catalog.now().get(&id).is_some()
        || cs.core.embeddings.get(&id).is_some()
        || cs.core.rerankers.get(&id).is_some()
    {
        Ok(Json(model_object(&cs, &id)))
    } else {
        Err(model_not_found(&id).into())
    }
}

/// `POST /v1/chat/completions`.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    operation_id = "createChatCompletion",
    description = "A chat answer under the same limits, holds and billing as `POST /`. With \
        `stream: true`, server-sent events: `data: {chunk}` ... `data: [DONE]`; a stream that \
        fails after it started sends one `data: {\"error\": ...}` (the error body) before \
        `[DONE]`.",
    request_body = ChatRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The answer (`application/json`), or with `stream: true` its chunks as server-sent events.",
            content((ChatCompletion = "application/json"), (ChatChunk = "text/event-stream")),
            headers(("x-stream-id" = String, description = "On a stream: its id, for `POST /stream/shutdown`."))),
        CompletionErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn chat(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OpenAiJson(body): OpenAiJson<ChatRequest>,
) -> Result<Response, OpenAiError> {
    let session = session(&cs, &headers).await?;
    if let Some(end_user) = &body.sampling.user {
        debug!(end_user = %end_user, "request for an end user");
    }
    let checked = request::chat(body, &cs.core.catalog.now())?;
    Span::current().record("model", checked.valid.model.as_str());
    let logprobs = checked.valid.decode.logprobs.is_some();
    let started = start_valid(&cs, session, checked.valid).await?;
    let head_model = started.model.clone();
    let (stream_id, mut events) = spawn_driver(&cs, started)?;
    let head = Head::new("chatcmpl", &stream_id, &head_model);
    let mut chat = Chat::new(head, &checked.tools, logprobs, checked.include_usage);
    if !checked.stream {
        return Ok(Json(whole(chat, &mut events).await?).into_response());
    }
    let opening = chat.opening().to_string();
    Ok(sse(stream_id, vec![opening], events, unnamed, move |e| {
        chat.on_event(e)
    })?)
}

/// `POST /v1/completions`: the prompt continued as it is, no chat template.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "openai",
    operation_id = "createCompletion",
    description = "The prompt continued as it is (no chat template), under the same limits, \
        holds and billing as `POST /`. With `stream: true`, server-sent events: `data: {chunk}` \
        ... `data: [DONE]`.",
    request_body = TextRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The answer (`application/json`), or with `stream: true` its chunks (the same shape) as server-sent events.",
            content((TextCompletion = "application/json"), (TextCompletion = "text/event-stream")),
            headers(("x-stream-id" = String, description = "On a stream: its id, for `POST /stream/shutdown`."))),
        CompletionErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn text(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OpenAiJson(body): OpenAiJson<TextRequest>,
) -> Result<Response, OpenAiError> {
    let session = session(&cs, &headers).await?;
    let checked = request::text(body, &cs.core.catalog.now())?;
    Span::current().record("model", checked.valid.model.as_str());
    let logprobs = checked.valid.decode.logprobs.is_some();
    let started = start_valid(&cs, session, checked.valid).await?;
    let head_model = started.model.clone();
    let (stream_id, mut events) = spawn_driver(&cs, started)?;
    let head = Head::new("cmpl", &stream_id, &head_model);
    let mut text = Text::new(head, logprobs, checked.include_usage);
    if !checked.stream {
        return Ok(Json(whole(text, &mut events).await?).into_response());
    }
    Ok(sse(stream_id, Vec::new(), events, unnamed, move |e| {
        text.on_event(e)
    })?)
}

/// OpenAI's chat events have no names: each payload is a `data:` line.
fn unnamed(_: &str) -> Option<String> {
    None
}

/// Events named by their payload's `type` (Anthropic's and the Responses API's): read without
/// building the payload's value again, since this runs for every token.
pub(super) fn typed(data: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
    }
    serde_json::from_str::<Typed<'_>>(data)
        .ok()
        .map(|t| t.kind.to_string())
}

/// The SSE answer: `first`, then each event's payloads, each as one `data:` line under the
/// event name `name` gives it (if any). The stream's id goes in `X-Stream-Id`, for
/// `POST /stream/shutdown`. A client that closes the connection drops this stream, and with
/// it the driver's reader: generation stops and is billed for what it made.
pub(super) fn sse<F>(
    stream_id: String,
    first: Vec<String>,
    events: mpsc::Receiver<DriverEvent>,
    name: fn(&str) -> Option<String>,
    convert: F,
) -> Result<Response, ApiError>
where
    F: FnMut(DriverEvent) -> Vec<String> + Send + 'static,
{
    let queue: VecDeque<String> = first.into();
    let state = (events, convert, queue);
    let body = futures::stream::unfold(
        state,
        move |(mut events, mut convert, mut queue)| async move {
            loop {
                if let Some(data) = queue.pop_front() {
                    let mut event = Event::default();
                    if let Some(name) = name(&data) {
                        event = event.event(name);
                    }
                    let event = event.data(data);
                    return Some((Ok::<Event, Infallible>(event), (events, convert, queue)));
                }
                let event = events.recv().await?;
                queue.extend(convert(event));
            }
        },
    );
    let mut response = Sse::new(body)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    let id = HeaderValue::from_str(&stream_id).map_err(ApiError::internal)?;
    response.headers_mut().insert(STREAM_ID_HEADER, id);
    Ok(response)
}
