//! OpenAI's Responses API on the completion listener, stateless: `POST /v1/responses`, whole or
//! streamed as its named events.
//!
//! A front end, not a pipeline: a request is checked into the same
//! [`ValidRequest`](super::validate::ValidRequest) as every other route's and goes down the
//! same start pipeline (limits, hold, admission, driver, settlement, `/stream/shutdown`,
//! cancellation when the client goes). Credentials and errors are the OpenAI routes'
//! (`Authorization: Bearer`, [`OpenAiError`]).

mod request;
mod respond;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use tracing::{instrument, Span};

use super::openai::respond::{whole, Answer as _};
use super::openai::{sse, typed};
use super::start::start_valid;
use super::stream::spawn_driver;
use super::CompletionState;
use crate::error::{OpenAiError, OpenAiJson};
use request::ResponsesBody;
use respond::Responses;

pub fn routes() -> Router<CompletionState> {
    Router::new().route("/v1/responses", post(create))
}

/// `POST /v1/responses`.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    operation_id = "createResponse",
    description = "OpenAI's Responses API, stateless: `input` as a string or items (messages, \
        `function_call`, `function_call_output`), `instructions`, function `tools`, \
        `text.format`, `max_output_tokens`, under the same limits, holds and billing as \
        `POST /`. With `stream: true`, the `response.*` events, each named by its `type`. \
        `store: true`, `previous_response_id` and `conversation` are refused: Hearth keeps no \
        responses.",
    request_body = ResponsesBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The `response` object (`application/json`), or with `stream: true` its events.",
            headers(("x-stream-id" = String, description = "On a stream: its id, for `POST /stream/shutdown`."))),
        super::openai::CompletionErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
async fn create(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OpenAiJson(body): OpenAiJson<ResponsesBody>,
) -> Result<Response, OpenAiError> {
    let session = super::openai::session(&cs, &headers).await?;
    let (checked, echo) = request::check(body, &cs.core.catalog.now())?;
    Span::current().record("model", checked.valid.model.as_str());
    let started = start_valid(&cs, session, checked.valid).await?;
    let model = started.model.clone();
    let (stream_id, mut events) = spawn_driver(&cs, started)?;
    let mut answer = Responses::new(&stream_id, &model, &checked.tools, echo);
    if !checked.stream {
        return Ok(Json(whole(answer, &mut events).await?).into_response());
    }
    let opening = answer.opening();
    Ok(sse(stream_id, opening, events, typed, move |e| {
        answer.on_event(e)
    })?)
}
