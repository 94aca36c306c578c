//! The completion service (spec sections 2.4, 3.2, 4.2): chat completions from local weights,
//! one-shot (`POST /`) or streamed as server-sent events (`POST /stream`), stoppable by id
//! (`POST /stream/shutdown`), and the same through the OpenAI API's routes (`/v1/...`,
//! `openai/`), billed against the user's balance through a hold placed before
//! generating and settled exactly once after; health with a real store round-trip; a chat page.
//!
//! A request's path: credentials -> validation -> the model's engine -> chat template and
//! tokenization -> prompt-length check -> hold of the worst-case cost -> scheduler admission ->
//! a driver task that forwards events to the client and settles the hold at the end, whatever
//! the end (finished, stopped, client gone, engine failure, shutdown).

mod anthropic;
mod catalog;
mod control;
mod embeddings;
mod encoders;
mod engines;
mod front;
mod grammar;
mod ollama;
mod openai;
pub mod openapi;
mod peers;
mod rerank;
mod responses;
mod start;
mod stream;
mod validate;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::{info, warn};
use utoipa::ToSchema;

use crate::error::{json_fallbacks, ApiError, AppJson};
use crate::openapi::ErrorBody;
use crate::pages;
use crate::service::{Service, ServiceInitError};
use crate::state::AppState;
use crate::user_slots::UserSlots;

pub use catalog::{Catalog, TextModelSpec};
use start::start;
use stream::{
    abort_error, spawn_driver, CompletionResponse, DriverEvent, ShutdownResponse, StreamEvent,
    Streams,
};
use validate::RawCompletionRequest;

/// Header carrying the id `/stream/shutdown` takes.
pub const STREAM_ID_HEADER: &str = "x-stream-id";
/// How long `/stream/shutdown` waits for the stream's final (partial) response.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
/// SSE comment interval, so proxies and clients keep a long prefill's connection open.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The service's own state beside the shared [`AppState`].
#[derive(Clone)]
pub struct CompletionState {
    app: AppState,
    core: Arc<Core>,
}

struct Core {
    /// The `[text."id"]` rows, swapped by a reload.
    catalog: crate::models::Current<Catalog>,
    /// `models.toml`, where a reload reads the table again.
    table_path: std::path::PathBuf,
    hub: crate::models::Hub,
    /// The `[embedding."id"]` models, each loaded on its first request.
    embeddings: encoders::EncoderModels<hearth_embed::EmbeddingModel>,
    /// The `[rerank."id"]` models, each loaded on its first request.
    rerankers: encoders::EncoderModels<hearth_embed::Reranker>,
    engines: engines::Engines,
    /// Each user's running completions, against `completion.max_concurrent_per_user`.
    user_slots: UserSlots,
    /// How long a stream waits on a client that reads nothing before it is aborted.
    client_stall_timeout: Duration,
    /// Live streams: how to stop each, and its final response once settled.
    streams: Streams,
    /// Each model's vocabulary compiled for grammars (structured output, forced tool calls).
    grammars: grammar::GrammarCache,
    /// When the service started (Unix seconds), the `created` of `/v1/models`.
    started_at: u64,
}

/// Builds the completion router: reads the model table, starts loading every model in the
/// background (requests wait for a model still loading; a failed load answers `GatewayError`),
/// and drains the engines when the server shuts down.
pub async fn router(state: AppState) -> Result<Router, ServiceInitError> {
    let catalog = catalog::resolve(&state.model_table, &state.config.models)
        .map_err(|e| ServiceInitError::new(Service::Completion, e))?;
    let embeddings = embeddings::resolve(&state.model_table, &state.config.models)
        .map_err(|e| ServiceInitError::new(Service::Completion, e))?;
    let rerankers = rerank::resolve(&state.model_table, &state.config.models)
        .map_err(|e| ServiceInitError::new(Service::Completion, e))?;
    let engines = engines::Engines::start(
        &catalog,
        &state.hub,
        (state.config.completion.retry_after, state.config.kernel),
        state.config.loading.hub.clone(),
    );
    let core = Arc::new(Core {
        catalog: crate::models::Current::new(catalog),
        table_path: state.config.models.clone(),
        hub: state.hub.clone(),
        embeddings: encoders::EncoderModels::start("embedding", embeddings, &state.hub),
        rerankers: encoders::EncoderModels::start("rerank", rerankers, &state.hub),
        engines,
        user_slots: UserSlots::new(state.config.completion.max_concurrent_per_user),
        client_stall_timeout: state.config.completion.client_stall_timeout,
        streams: Streams::default(),
        grammars: grammar::GrammarCache::default(),
        started_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
    });
    state
        .hub
        .register(Arc::new(control::CompletionModels(Arc::clone(&core))));
    peers::announce(&state).await;
    let (token, drain, app) = (state.shutdown.clone(), Arc::clone(&core), state.clone());
    tokio::spawn(async move {
        token.cancelled().await;
        peers::withdraw(&app).await;
        info!("draining the text engines");
        drain.engines.shutdown().await;
    });
    let state = CompletionState { app: state, core };
    Ok(json_fallbacks(
        Router::new()
            .route("/", get(health).post(complete))
            .route("/stream", post(stream))
            .route("/stream/shutdown", post(shutdown_stream))
            .route("/ui", get(ui))
            .route(
                "/metrics",
                crate::metrics::route(
                    &state.app,
                    Service::Completion,
                    (
                        (
                            state.core.engines.metrics(),
                            // One collector for the listener's three kinds: each family once.
                            crate::metrics::ModelStates::new(state.app.hub.clone(), "text")
                                .and("embedding")
                                .and("rerank"),
                        ),
                        crate::metrics::EncoderEngines::new({
                            let core = Arc::clone(&state.core);
                            Arc::new(move || {
                                let mut stats = core.embeddings.stats();
                                stats.extend(core.rerankers.stats());
                                stats
                            })
                        }),
                    ),
                ),
            )
            .route(
                "/openapi.json",
                crate::openapi::route(openapi::document(), state.app.urls.get(Service::Completion)),
            )
            .merge(openai::routes())
            .merge(anthropic::routes())
            .merge(ollama::routes())
            .merge(responses::routes())
            .with_state(state),
    ))
}

// ---------------------------------------------------------------------------------------------
// Health and page

/// `{status, env, ui}` plus `models` (each text, embedding and rerank id `ready`, `loading`,
/// `unloaded` or `unavailable: <why>`).
/// 200 when a write-then-read round trip on the store succeeds, 500 with `status: "failing"`
/// when it does not. A model that failed to load does not fail the health check: requests for
/// it answer `GatewayError`, and `models` says why.
#[utoipa::path(
    get,
    path = "/",
    tag = "health",
    responses(
        (status = 200, description = "Healthy: the store answered a write-then-read round trip.", body = openapi::CompletionHealth),
        (status = 500, description = "Failing: the store check failed (`status` is `failing`, `error` says so).", body = openapi::CompletionHealth),
    )
)]
async fn health(State(cs): State<CompletionState>) -> Response {
    let failure = match cs.app.store.health_check().await {
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    };
    let (word, status) = Service::Completion.health(failure.is_none());
    let mut models = cs.core.engines.status();
    models.extend(cs.core.embeddings.status());
    models.extend(cs.core.rerankers.status());
    let mut body = json!({
        "status": word,
        "env": cs.app.config.env,
        "ui": cs.app.urls.ui(Service::Completion),
        "models": models,
    });
    if let Some(why) = &failure {
        warn!(error = %why, "health check: the store failed its round trip");
        body["error"] =
            json!({ "type": "InternalError", "message": "database check failed", "details": {} });
    }
    (status, Json(body)).into_response()
}

const CHAT_PAGE: &str = include_str!("completion/chat.html");

/// The chat page, with the model table's bounds and prices.
#[utoipa::path(
    get,
    path = "/ui",
    tag = "pages",
    responses((status = 200, description = "The HTML page.", content_type = "text/html", body = String))
)]
async fn ui(State(cs): State<CompletionState>) -> Html<String> {
    let states = cs.core.engines.status();
    let models: Vec<Value> = cs
        .core
        .catalog
        .now()
        .entries()
        .map(|e| {
            let s = &e.spec;
            json!({
                "id": s.id,
                "state": states.get(&s.id),
                "temperatureMax": s.temperature_max,
                "defaultTemperature": s.default_temperature,
                "maxOutputTokens": s.max_output_tokens,
                "defaultMaxOutputTokens": s.default_max_output_tokens,
                "inputPrice": s.input_price_per_million.amount().to_string(),
                "outputPrice": s.output_price_per_million.amount().to_string(),
            })
        })
        .collect();
    Html(pages::render(
        &cs.app,
        pages::Page {
            title: "Chat",
            service: Service::Completion,
            body: CHAT_PAGE,
            config: json!({ "models": models }),
        },
    ))
}

// ---------------------------------------------------------------------------------------------
// Handlers

/// `POST /`: the whole completion in one response. An abort (engine failure, server shutdown)
/// answers an error whose `details.response` holds the partial, billed response.
#[utoipa::path(
    post,
    path = "/",
    tag = "completion",
    request_body = RawCompletionRequest,
    responses(
        (status = 200, description = "The whole completion, billed.", body = CompletionResponse),
        (status = 400, description = "`InvalidRequest`: a bad field (`details.field`), or a prompt too long for the model.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials` or `SessionExpired`: the `serviceToken`.", body = ErrorBody),
        (status = 402, description = "`InsufficientFunds`: the balance cannot cover the worst case (`details.needed`, `details.available`).", body = ErrorBody),
        (status = 429, description = "`RateLimited`: the user's concurrent requests are at the cap (`Retry-After`).", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
        (status = 502, description = "`GatewayError`: the model failed to load or its engine failed (`details.response` holds a partial, billed answer).", body = ErrorBody),
        (status = 503, description = "`Overloaded`: the queue is full or the server is shutting down (`Retry-After`).", body = ErrorBody),
    )
)]
async fn complete(
    State(cs): State<CompletionState>,
    AppJson(raw): AppJson<RawCompletionRequest>,
) -> Result<Json<CompletionResponse>, ApiError> {
    let started = start(&cs, raw).await?;
    let (_id, mut events) = spawn_driver(&cs, started)?;
    while let Some(event) = events.recv().await {
        match event {
            DriverEvent::Token { .. } => {}
            DriverEvent::Completed { response, .. } => return Ok(Json(response)),
            DriverEvent::Aborted { response, reason } => return Err(abort_error(reason, response)),
        }
    }
    Err(ApiError::internal(
        "the completion driver stopped without an answer",
    ))
}

/// `POST /stream`: errors before the stream as JSON with their status; then `{token}` events,
/// and `{completed, response}` or `{aborted, response}`.
#[utoipa::path(
    post,
    path = "/stream",
    tag = "completion",
    request_body = RawCompletionRequest,
    responses(
        (status = 200, description = "Server-sent events, each `data:` one `StreamEvent`; `X-Stream-Id` names the stream for `POST /stream/shutdown`.",
            content_type = "text/event-stream", body = StreamEvent,
            headers(("x-stream-id" = String, description = "The stream's id, for `POST /stream/shutdown`."))),
        (status = 400, description = "`InvalidRequest`, before the stream starts.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials` or `SessionExpired`.", body = ErrorBody),
        (status = 402, description = "`InsufficientFunds`.", body = ErrorBody),
        (status = 429, description = "`RateLimited` (`Retry-After`).", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
        (status = 502, description = "`GatewayError`: the model failed to load.", body = ErrorBody),
        (status = 503, description = "`Overloaded` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn stream(
    State(cs): State<CompletionState>,
    AppJson(raw): AppJson<RawCompletionRequest>,
) -> Result<Response, ApiError> {
    let started = start(&cs, raw).await?;
    let (stream_id, events) = spawn_driver(&cs, started)?;
    let events = futures::stream::unfold(events, |mut events| async move {
        let event = StreamEvent::from(events.recv().await?);
        let sse = Event::default().json_data(&event).unwrap_or_default();
        Some((Ok::<Event, Infallible>(sse), events))
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    let id = HeaderValue::from_str(&stream_id).map_err(ApiError::internal)?;
    response.headers_mut().insert(STREAM_ID_HEADER, id);
    Ok(response)
}

/// Stream shutdown request (spec 2.4).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ShutdownRequest {
    /// The `X-Stream-Id` of a `POST /stream` answer (or of a streamed `/v1` answer).
    stream_id: String,
}

/// `POST /stream/shutdown`: stops an active stream and answers, once it has stopped and been
/// billed, `200 {"streamId", "status": "terminated", "response": <partial response>}`. Unknown or
/// already finished ids answer 404 `NotFound`; a stream that does not stop within 10 s, 500.
/// With a shared store, a stream another node runs is stopped there and its answer relayed
/// (`peers.rs`).
#[utoipa::path(
    post,
    path = "/stream/shutdown",
    tag = "completion",
    request_body = ShutdownRequest,
    responses(
        (status = 200, description = "Terminated: the stream stopped and was billed for what it made.", body = ShutdownResponse),
        (status = 400, description = "`InvalidRequest`: the body is not `{streamId}`.", body = ErrorBody),
        (status = 404, description = "`NotFound`: no active stream has this id.", body = ErrorBody),
        (status = 500, description = "`InternalError`: the stream did not stop in time.", body = ErrorBody),
    )
)]
async fn shutdown_stream(
    State(cs): State<CompletionState>,
    headers: axum::http::HeaderMap,
    AppJson(body): AppJson<ShutdownRequest>,
) -> Result<Response, ApiError> {
    let id = body.stream_id;
    let Some(mut done) = cs.core.streams.stop(&id) else {
        if !headers.contains_key(peers::FORWARDED_HEADER) {
            if let Some((status, answer)) =
                peers::forward_shutdown(&cs.app, &id, SHUTDOWN_WAIT).await
            {
                return Ok((status, Json(answer)).into_response());
            }
        }
        return Err(ApiError::not_found(format!("no active stream {id:?}"))
            .with_details(json!({ "streamId": id })));
    };
    let waited = tokio::time::timeout(SHUTDOWN_WAIT, done.wait_for(Option::is_some)).await;
    match waited {
        Ok(Ok(response)) => {
            let response = response.clone().expect("waited for Some");
            Ok(Json(ShutdownResponse {
                stream_id: id,
                status: "terminated",
                response,
            })
            .into_response())
        }
        Ok(Err(_)) => Err(ApiError::internal(format!(
            "stream {id} lost its driver while stopping"
        ))),
        Err(_) => Err(ApiError::internal(format!(
            "stream {id} did not stop within {}s",
            SHUTDOWN_WAIT.as_secs()
        ))),
    }
}
