//! The completion service (spec sections 2.4, 3.2, 4.2): chat completions from local weights,
//! one-shot (`POST /`) or streamed as server-sent events (`POST /stream`), stoppable by id
//! (`POST /stream/shutdown`), billed against the user's balance through a hold placed before
//! generating and settled exactly once after; health with a real store round-trip; a chat page.
//!
//! A request's path: credentials -> validation -> the model's engine -> chat template and
//! tokenization -> prompt-length check -> hold of the worst-case cost -> scheduler admission ->
//! a driver task that forwards events to the client and settles the hold at the end, whatever
//! the end (finished, stopped, client gone, engine failure, shutdown).

mod catalog;
mod engines;
mod validate;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hearth_infer::SamplingParams;
use hearth_scheduler::{Generation, Request};
use hearth_store::LedgerMeta;
use hearth_types::{AbortReason, TokenEvent, Usage};
use rust_decimal::Decimal;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tracing::{info, instrument, warn, Instrument, Span};

use crate::app::{json_fallbacks, AppState, Session};
use crate::error::{health_status, ApiError, AppJson, ErrorKind};
use crate::pages;
use crate::services::{Service, ServiceInitError};
use crate::user_slots::{UserSlot, UserSlots};
use hearth_billing::{money, HeldFunds, Margin};

pub use catalog::{Catalog, TextModelSpec};
use validate::{FieldError, RawCompletionRequest};

/// Header carrying the id `/stream/shutdown` takes.
pub const STREAM_ID_HEADER: &str = "x-stream-id";
/// How long `/stream/shutdown` waits for the stream's final (partial) response.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
/// SSE comment interval, so proxies and clients keep a long prefill's connection open.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Pieces buffered between the driver task and the HTTP response body.
const PIECE_BUFFER: usize = 32;

/// The service's own state beside the shared [`AppState`].
#[derive(Clone)]
pub struct CompletionState {
    app: AppState,
    core: Arc<Core>,
}

struct Core {
    catalog: Catalog,
    engines: engines::Engines,
    /// Each user's running completions, against `completion.max_concurrent_per_user`.
    user_slots: UserSlots,
    /// How long a stream waits on a client that reads nothing before it is aborted.
    client_stall_timeout: Duration,
    /// Live streams: id -> the final response once settled (for `/stream/shutdown` to return).
    streams: Mutex<HashMap<String, watch::Receiver<Option<Value>>>>,
}

impl Core {
    fn streams(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<Option<Value>>>> {
        self.streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Builds the completion router: reads the model table, starts loading every model in the
/// background (requests wait for a model still loading; a failed load answers `GatewayError`),
/// and drains the engines when the server shuts down.
pub async fn router(state: AppState) -> Result<Router, ServiceInitError> {
    let catalog = catalog::load(&state.config.models)
        .map_err(|e| ServiceInitError::new(Service::Completion, e))?;
    let engines = engines::Engines::start(&catalog);
    let core = Arc::new(Core {
        catalog,
        engines,
        user_slots: UserSlots::new(state.config.completion.max_concurrent_per_user),
        client_stall_timeout: state.config.completion.client_stall_timeout,
        streams: Mutex::new(HashMap::new()),
    });
    let (token, drain) = (state.shutdown.clone(), Arc::clone(&core));
    tokio::spawn(async move {
        token.cancelled().await;
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
            .with_state(state),
    ))
}

// ---------------------------------------------------------------------------------------------
// Health and page

/// `{status, env, ui}` plus `models` (each id `ready`, `loading` or `unavailable: <why>`).
/// 200 when a write-then-read round trip on the store succeeds, 500 with `status: "failing"`
/// when it does not. A model that failed to load does not fail the health check: requests for
/// it answer `GatewayError`, and `models` says why.
async fn health(State(cs): State<CompletionState>) -> Response {
    let store = cs.app.store.clone();
    let checked = tokio::task::spawn_blocking(move || store.health_check()).await;
    let failure = match checked {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    let mut body = json!({
        "status": if failure.is_none() { "healthy" } else { "failing" },
        "env": cs.app.config.env,
        "ui": cs.app.urls.ui(Service::Completion),
        "models": cs.core.engines.status(),
    });
    if let Some(why) = &failure {
        warn!(error = %why, "health check: the store failed its round trip");
        body["error"] =
            json!({ "type": "InternalError", "message": "database check failed", "details": {} });
    }
    let status = health_status(Service::Completion, failure.is_none());
    (status, Json(body)).into_response()
}

const CHAT_PAGE: &str = include_str!("completion/chat.html");

/// The chat page, with the model table's bounds and the sign-in page's address baked in.
async fn ui(State(cs): State<CompletionState>) -> Html<String> {
    let models: Vec<Value> = cs
        .core
        .catalog
        .entries()
        .map(|e| {
            let s = &e.spec;
            json!({
                "id": s.id,
                "temperatureMax": s.temperature_max,
                "defaultTemperature": s.default_temperature,
                "maxOutputTokens": s.max_output_tokens,
                "defaultMaxOutputTokens": s.default_max_output_tokens,
                "inputPrice": s.input_price_per_million.amount().to_string(),
                "outputPrice": s.output_price_per_million.amount().to_string(),
            })
        })
        .collect();
    Html(
        CHAT_PAGE
            .replace("__SIGNIN_JS__", pages::SIGNIN_JS)
            .replace(
                "__MODELS_JSON__",
                &pages::json_island(&Value::Array(models)),
            )
            .replace(
                "__AUTH_UI_JSON__",
                &pages::json_island(&json!(cs.app.urls.ui(Service::Auth))),
            ),
    )
}

// ---------------------------------------------------------------------------------------------
// Starting a generation

/// A validated, paid-for (held), admitted generation. Its hold and its user slot are owned
/// values: whatever ends the generation, dropping them releases both.
struct Started {
    generation: Generation,
    hold: HeldFunds,
    _slot: UserSlot,
    model: String,
    spec: TextModelSpec,
    margin: Margin,
    input_cost: Decimal,
}

fn field_error(e: FieldError) -> ApiError {
    ApiError::new(ErrorKind::InvalidRequest, e.message).with_details(e.details)
}

#[instrument(skip_all, fields(model, user))]
async fn start(cs: &CompletionState, raw: RawCompletionRequest) -> Result<Started, ApiError> {
    let token = validate::service_token(&raw)
        .ok_or_else(|| ApiError::invalid_credentials("serviceToken is required"))?;
    // The completion service's error types (spec section 7) have no SessionExpired: an expired
    // token is InvalidCredentials here, with the reason in the message.
    let session: Session = cs.app.authenticate(token).map_err(|e| match e.kind {
        ErrorKind::SessionExpired => ApiError::invalid_credentials("the service token has expired"),
        _ => e,
    })?;
    Span::current().record("user", session.user_id.as_str());
    let valid = validate::validate(&raw, &cs.core.catalog).map_err(field_error)?;
    Span::current().record("model", valid.model.as_str());
    let spec = cs.core.catalog.get(&valid.model).cloned().ok_or_else(|| {
        ApiError::internal(format!("validated model {} left the catalog", valid.model))
    })?;
    let margin = cs.app.billing.margin(valid.margin);
    let slot = cs
        .core
        .user_slots
        .take(&session.user_id)
        .map_err(ApiError::rate_limited)?;
    let engine = cs.core.engines.get(&valid.model).await?;
    // From here until the submit, an idle engine gathering a burst waits for this request.
    let announced = engine.announce();

    let tokenizer = engine.tokenizer();
    let messages = valid.messages.clone();
    let prompt_ids = tokio::task::spawn_blocking(move || {
        tokenizer
            .apply_chat_template(&messages)
            .and_then(|text| tokenizer.encode(&text))
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| ApiError::invalid_request("messages", e))?;
    let context = spec
        .context_length
        .map_or(engine.context_length(), |c| c.min(engine.context_length()));
    validate::check_prompt_length(prompt_ids.len(), valid.max_output_tokens, &spec, context)
        .map_err(field_error)?;

    let input_cost = spec
        .input_price_per_million
        .cost(prompt_ids.len() as u64, margin)?;
    let worst_output = spec
        .output_price_per_million
        .cost(valid.max_output_tokens as u64, margin)?;
    let meta = LedgerMeta {
        reason: format!("completion {}", valid.model),
        developer_id: valid.developer_id.clone(),
        application_id: valid.application_id.clone(),
    };
    let hold = cs
        .app
        .billing
        .hold(&session.user_id, input_cost + worst_output, meta)
        .await?;

    let stream_id = uuid::Uuid::new_v4();
    let params = SamplingParams {
        temperature: valid.temperature,
        max_tokens: valid.max_output_tokens,
        seed: stream_id.as_u64_pair().0,
        ..SamplingParams::default()
    };
    let request = Request {
        prompt_ids,
        params,
        stream_id: stream_id.to_string(),
        span: Span::current(),
        ignore_eos: false,
    };
    drop(announced);
    match engine.submit(request).await {
        Ok(generation) => Ok(Started {
            generation,
            hold,
            _slot: slot,
            model: valid.model,
            spec,
            margin,
            input_cost,
        }),
        Err(e) => {
            if let Err(release) = hold.release().await {
                warn!(error = %release, "releasing the hold of a refused request failed");
            }
            Err(e.into())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Driving a generation to its end and settling

/// What the driver hands the HTTP side.
enum Piece {
    Token(String),
    /// The terminal response: `Ok` finished, `Err` aborted (partial).
    End(Result<Value, Value>, Option<AbortReason>),
}

/// Reads the generation to its end, forwarding text to `out` while anyone listens (if `out`
/// closes, the client went away: the generation is cancelled, and billed for what it made),
/// then settles the hold exactly once and sends the final response.
async fn drive(
    cs: CompletionState,
    started: Started,
    out: mpsc::Sender<Piece>,
    done: watch::Sender<Option<Value>>,
) {
    let Started {
        mut generation,
        hold,
        _slot: slot,
        model,
        spec,
        margin,
        input_cost,
    } = started;
    let stream_id = generation.stream_id().to_string();
    let stall = cs.core.client_stall_timeout;
    let mut output = String::new();
    let mut listening = true;
    let (usage, abort) = loop {
        let event = tokio::select! {
            event = generation.next() => event,
            _ = out.closed(), if listening => {
                listening = false;
                generation.cancel();
                continue;
            }
        };
        match event {
            Some(TokenEvent::Token { text, .. }) => {
                output.push_str(&text);
                if listening && !forward(&out, Piece::Token(text), stall, &stream_id).await {
                    listening = false;
                    generation.cancel();
                }
            }
            Some(TokenEvent::Finished { usage, .. }) => break (usage, None),
            Some(TokenEvent::Aborted { usage, reason }) => {
                // A cancel we issued because the client left is a disconnect, whatever raced.
                let reason = if listening {
                    reason
                } else {
                    AbortReason::Disconnected
                };
                break (usage, Some(reason));
            }
            None => {
                let usage = Usage {
                    prompt_tokens: generation.prompt_tokens(),
                    completion_tokens: generation.generated_tokens(),
                };
                break (
                    usage,
                    Some(AbortReason::EngineFailure("the stream ended early".into())),
                );
            }
        }
    };

    let billing = &cs.app.billing;
    // At most the worst case that was held, so it cannot overflow where that did not.
    let output_cost = spec
        .output_price_per_million
        .cost(usage.completion_tokens as u64, margin)
        .unwrap_or(Decimal::ZERO);
    let user = hold.user_id().to_string();
    let (balance_before, balance_after) = match hold.settle(input_cost + output_cost).await {
        Ok(charge) => (money(charge.balance_before), money(charge.balance_after)),
        Err(e) => {
            // The hold was released instead: report the balance as the store has it.
            warn!(error = %e, %stream_id, "settling a completion failed; its hold was released");
            let now = billing.balance(&user).await.map(money).unwrap_or_default();
            (now.clone(), now)
        }
    };
    // Settled: the user's slot is free before they can see the answer and ask again.
    drop(slot);
    let response = json!({
        "model": model,
        "output": output,
        "usage": {
            "type": "completion",
            "promptTokens": usage.prompt_tokens,
            "completionTokens": usage.completion_tokens,
            "inputCost": money(input_cost),
            "outputCost": money(output_cost),
        },
        "balanceBefore": balance_before,
        "balanceAfter": balance_after,
    });
    info!(%stream_id, prompt_tokens = usage.prompt_tokens, completion_tokens = usage.completion_tokens, aborted = ?abort, "completion settled");
    done.send_replace(Some(response.clone()));
    cs.core.streams().remove(&stream_id);
    let end = match &abort {
        None => Ok(response),
        Some(_) => Err(response),
    };
    if listening {
        forward(&out, Piece::End(end, abort), stall, &stream_id).await;
    }
}

/// Hands `piece` to the HTTP side; false when the client is gone or has read nothing for
/// `stall` (its connection is full), after which nobody waits on it any more.
async fn forward(
    out: &mpsc::Sender<Piece>,
    piece: Piece,
    stall: Duration,
    stream_id: &str,
) -> bool {
    match tokio::time::timeout(stall, out.send(piece)).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            warn!(%stream_id, stall_secs = stall.as_secs(), "the client read nothing for too long; aborting its stream");
            false
        }
    }
}

/// Starts the driver task and registers the stream for `/stream/shutdown`.
fn spawn_driver(cs: &CompletionState, started: Started) -> (String, mpsc::Receiver<Piece>) {
    let stream_id = started.generation.stream_id().to_string();
    let (tx, rx) = mpsc::channel(PIECE_BUFFER);
    let (done_tx, done_rx) = watch::channel(None);
    cs.core.streams().insert(stream_id.clone(), done_rx);
    tokio::spawn(drive(cs.clone(), started, tx, done_tx).instrument(Span::current()));
    (stream_id, rx)
}

// ---------------------------------------------------------------------------------------------
// Handlers

/// `POST /`: the whole completion in one response. An abort (engine failure, server shutdown)
/// answers an error whose `details.response` holds the partial, billed response.
async fn complete(
    State(cs): State<CompletionState>,
    AppJson(raw): AppJson<RawCompletionRequest>,
) -> Result<Json<Value>, ApiError> {
    let started = start(&cs, raw).await?;
    let (_id, mut rx) = spawn_driver(&cs, started);
    while let Some(piece) = rx.recv().await {
        if let Piece::End(end, reason) = piece {
            return match end {
                Ok(response) => Ok(Json(response)),
                Err(partial) => {
                    let err = match reason {
                        Some(AbortReason::Shutdown) => {
                            ApiError::overloaded("the server is shutting down")
                        }
                        Some(AbortReason::EngineFailure(why)) => {
                            ApiError::gateway(format!("the model's engine failed: {why}"))
                        }
                        other => ApiError::internal(format!("completion aborted: {other:?}")),
                    };
                    Err(err.with_details(json!({ "response": partial })))
                }
            };
        }
    }
    Err(ApiError::internal(
        "the completion driver stopped without an answer",
    ))
}

/// `POST /stream`: errors before the stream as JSON with their status; then `{token}` events,
/// and `{completed, response}` or `{aborted, response}`.
async fn stream(
    State(cs): State<CompletionState>,
    AppJson(raw): AppJson<RawCompletionRequest>,
) -> Result<Response, ApiError> {
    let started = start(&cs, raw).await?;
    let (stream_id, rx) = spawn_driver(&cs, started);
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let piece = rx.recv().await?;
        let data = match piece {
            Piece::Token(token) => json!({ "token": token }),
            Piece::End(Ok(response), _) => json!({ "completed": true, "response": response }),
            Piece::End(Err(response), _) => json!({ "aborted": true, "response": response }),
        };
        Some((
            Ok::<Event, Infallible>(Event::default().data(data.to_string())),
            rx,
        ))
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    let id = HeaderValue::from_str(&stream_id).map_err(ApiError::internal)?;
    response.headers_mut().insert(STREAM_ID_HEADER, id);
    Ok(response)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShutdownRequest {
    stream_id: String,
}

/// `POST /stream/shutdown`: stops an active stream and answers, once it has stopped and been
/// billed, `200 {"streamId", "status": "terminated", "response": <partial response>}`. Unknown or
/// already finished ids answer 404 `NotFound`; a stream that does not stop within 10 s, 500.
async fn shutdown_stream(
    State(cs): State<CompletionState>,
    AppJson(body): AppJson<ShutdownRequest>,
) -> Result<Json<Value>, ApiError> {
    let id = body.stream_id;
    let not_found = || {
        ApiError::not_found(format!("no active stream {id:?}"))
            .with_details(json!({ "streamId": id }))
    };
    let Some(mut done) = cs.core.streams().get(&id).cloned() else {
        return Err(not_found());
    };
    if !cs.core.engines.registry().cancel(&id) {
        // Finished (or being stopped by another call) in the meantime.
        return Err(not_found());
    }
    let waited = tokio::time::timeout(SHUTDOWN_WAIT, done.wait_for(Option::is_some)).await;
    match waited {
        Ok(Ok(response)) => {
            let response = response.clone();
            Ok(Json(
                json!({ "streamId": id, "status": "terminated", "response": response }),
            ))
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

#[cfg(test)]
mod tests {
    use super::*;

    // Over HTTP a client that stops reading is only seen once its connection's buffers are full
    // (about 3 MB on loopback: more than a test generation makes), so the stall rule is tested
    // here on the channel between the driver and the response body, where it applies.
    #[tokio::test]
    async fn a_client_that_reads_nothing_is_given_up_after_the_stall_timeout() {
        let stall = Duration::from_millis(300);
        let (out, mut body) = mpsc::channel(1);
        assert!(forward(&out, Piece::Token("a".into()), stall, "s").await);
        // The buffer is full and nobody reads: the next piece waits out the stall, then gives up.
        let started = std::time::Instant::now();
        assert!(!forward(&out, Piece::Token("b".into()), stall, "s").await);
        assert!(started.elapsed() >= stall);
        // A reader that takes a piece within the stall keeps the stream going.
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let first = body.recv().await;
            (first.is_some(), body)
        });
        assert!(forward(&out, Piece::Token("c".into()), stall, "s").await);
        let (read, body) = reader.await.unwrap();
        assert!(read);
        // A client gone altogether is seen at once.
        drop(body);
        let started = std::time::Instant::now();
        assert!(!forward(&out, Piece::Token("d".into()), stall, "s").await);
        assert!(started.elapsed() < stall);
    }
}
