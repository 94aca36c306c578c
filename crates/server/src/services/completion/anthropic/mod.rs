//! Anthropic's Messages API on the completion listener, beside the spec's and OpenAI's routes:
//! `POST /v1/messages` (whole, or streamed as Anthropic's named events) and
//! `POST /v1/messages/count_tokens`.
//!
//! A front end, not a pipeline: a request is checked into the same
//! [`ValidRequest`](super::validate::ValidRequest) as every other route's and goes down the
//! same start pipeline (limits, hold, admission, driver, settlement, `/stream/shutdown`,
//! cancellation when the client goes). Credentials are the service token, sent as
//! `x-api-key` (the `anthropic` client's header) or `Authorization: Bearer`; the
//! `anthropic-version` header is accepted whatever it says. Errors are in Anthropic's shape
//! ([`AnthropicError`]).

mod request;
mod respond;
pub(super) mod wire;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use tracing::{instrument, Span};

use super::openai::respond::{whole, Answer as _};
use super::openai::{sse, typed};
use super::start::{authenticate, count_prompt_tokens, start_valid};
use super::stream::spawn_driver;
use super::CompletionState;
use crate::error::{AnthropicError, AnthropicJson, ApiError};
use crate::openapi::AnthropicErrorBody;
use crate::validate::bearer_token;
use respond::Messages;
use wire::{CountRequest, Message, MessagesRequest, TokenCount};

/// The errors of `/v1/messages` in the OpenAPI document, as that API's clients sort them.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // describes the answers; never built
pub(super) enum MessagesErrors {
    /// `invalid_request_error`.
    #[response(status = 400)]
    BadRequest(AnthropicErrorBody),
    /// `authentication_error`: no, bad, revoked or expired service token.
    #[response(status = 401)]
    Unauthorized(AnthropicErrorBody),
    /// `billing_error`: the balance cannot cover the worst case.
    #[response(status = 402)]
    PaymentRequired(AnthropicErrorBody),
    /// `not_found_error`: no such model.
    #[response(status = 404)]
    NotFound(AnthropicErrorBody),
    /// `request_too_large`.
    #[response(status = 413)]
    TooLarge(AnthropicErrorBody),
    /// `rate_limit_error`: the user's concurrent requests are at the cap (`Retry-After`).
    #[response(status = 429)]
    TooManyRequests(AnthropicErrorBody),
    /// `api_error`.
    #[response(status = 500)]
    Internal(AnthropicErrorBody),
    /// `api_error`: the model failed to load or its engine failed.
    #[response(status = 502)]
    BadGateway(AnthropicErrorBody),
    /// `overloaded_error` (`Retry-After`).
    #[response(status = 529)]
    Overloaded(AnthropicErrorBody),
}

pub fn routes() -> Router<CompletionState> {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
}

/// The session of the service token in `x-api-key` or `Authorization: Bearer`.
async fn session(
    cs: &CompletionState,
    headers: &HeaderMap,
) -> Result<crate::state::Session, ApiError> {
    let token = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .or_else(|| bearer_token(headers))
        .ok_or_else(|| {
            ApiError::invalid_credentials(
                "no credentials: send the service token as x-api-key (or Authorization: Bearer)",
            )
        })?;
    authenticate(cs, token).await
}

/// `POST /v1/messages`.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "anthropic",
    operation_id = "createMessage",
    description = "Anthropic's Messages API: a chat answer under the same limits, holds and \
        billing as `POST /`. With `stream: true`, Anthropic's named server-sent events \
        (`message_start`, `ping`, `content_block_start`, `content_block_delta`, \
        `content_block_stop`, `message_delta`, `message_stop`); a stream that fails after it \
        started sends an `error` event.",
    request_body = MessagesRequest,
    security(("x-api-key" = []), ("bearer" = [])),
    responses(
        (status = 200, description = "The answer (`application/json`), or with `stream: true` its events.",
            content((Message = "application/json"), (String = "text/event-stream")),
            headers(("x-stream-id" = String, description = "On a stream: its id, for `POST /stream/shutdown`."))),
        MessagesErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn messages(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    AnthropicJson(body): AnthropicJson<MessagesRequest>,
) -> Result<Response, AnthropicError> {
    let session = session(&cs, &headers).await?;
    let checked = request::messages_request(body, &cs.core.catalog.now())?;
    Span::current().record("model", checked.valid.model.as_str());
    let stops = checked.valid.decode.stop.clone();
    let started = start_valid(&cs, session, checked.valid).await?;
    let (model, prompt_tokens) = (started.model.clone(), started.prompt_tokens);
    let (stream_id, mut events) = spawn_driver(&cs, started)?;
    let mut answer = Messages::new(&stream_id, &model, &checked.tools, stops, prompt_tokens);
    if !checked.stream {
        return Ok(Json(whole(answer, &mut events).await?).into_response());
    }
    let opening = answer.opening();
    Ok(sse(stream_id, opening, events, typed, move |e| {
        answer.on_event(e)
    })?)
}

/// `POST /v1/messages/count_tokens`.
#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    tag = "anthropic",
    operation_id = "countMessageTokens",
    description = "How many tokens a messages request's prompt is, as its model reads it \
        (template, system and tools included). Nothing is generated, held or billed; the \
        model is loaded if it is not.",
    request_body = CountRequest,
    security(("x-api-key" = []), ("bearer" = [])),
    responses(
        (status = 200, description = "The count.", body = TokenCount),
        MessagesErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn count_tokens(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    AnthropicJson(body): AnthropicJson<CountRequest>,
) -> Result<Json<TokenCount>, AnthropicError> {
    session(&cs, &headers).await?;
    let valid = request::count_request(body, &cs.core.catalog.now())?;
    Span::current().record("model", valid.model.as_str());
    Ok(Json(TokenCount {
        input_tokens: count_prompt_tokens(&cs, &valid).await?,
    }))
}
