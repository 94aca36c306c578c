//! One stream session: the spec's wire types of a completion (the response and every SSE event,
//! typed and `Serialize`), the driver's own events ([`DriverEvent`], what every route reads,
//! turned into the spec's [`StreamEvent`] in one place), the one map of live streams (id -> how
//! to stop it and its final response; the scheduler keeps none), and the driver task that reads
//! a generation to its end, forwards it to the client, settles the hold exactly once and
//! publishes the final response.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_billing::money;
use hearth_scheduler::CancelHandle;
use hearth_types::{AbortReason, FinishReason, TokenEvent, TokenLogprob, Usage};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn, Instrument, Span};
use utoipa::ToSchema;

use super::start::Started;
use super::CompletionState;
use crate::error::ApiError;

/// Events buffered between the driver task and the HTTP response body.
const EVENT_BUFFER: usize = 32;

// ---- wire types (spec 2.4) ------------------------------------------------------------------

/// The completion response, whole or partial (spec 2.4).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompletionResponse {
    /// The model id asked for.
    pub model: String,
    /// The generated text.
    pub output: String,
    pub usage: CompletionUsage,
    /// Decimal string, 6 places.
    pub balance_before: String,
    /// Decimal string, 6 places.
    pub balance_after: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompletionUsage {
    /// Always `completion`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Decimal string, 6 places.
    pub input_cost: String,
    /// Decimal string, 6 places.
    pub output_cost: String,
}

/// One SSE event's payload on the spec's `POST /stream`: exactly one of its three shapes, and
/// nothing else. Made only from a [`DriverEvent`] (`From`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
#[schema(
    description = "One server-sent event's `data` (spec 2.4, 6): `{token}` for each piece of \
        output, then `{completed: true, response}` or `{aborted: true, response}` (partial, \
        billed)."
)]
pub enum StreamEvent {
    Token {
        /// The next piece of output.
        token: String,
    },
    Completed {
        /// Always `true`.
        completed: bool,
        response: CompletionResponse,
    },
    Aborted {
        /// Always `true`.
        aborted: bool,
        response: CompletionResponse,
    },
}

/// What the driver hands the HTTP side, in order: `Token`s, then one `Completed` or `Aborted`.
/// It carries everything any route answers with: the spec's route keeps what its wire type
/// shows ([`StreamEvent`]); the OpenAI routes also read the log-probabilities, the finish
/// reason, and an abort's reason (a one-shot answer's error, [`abort_error`]).
#[derive(Debug, Clone)]
pub enum DriverEvent {
    Token {
        text: String,
        /// Each token's log probability, when the request asked (OpenAI routes only).
        logprobs: Vec<TokenLogprob>,
    },
    Completed {
        response: CompletionResponse,
        /// Why it ended (OpenAI routes' `finish_reason`).
        finish: FinishReason,
    },
    Aborted {
        response: CompletionResponse,
        reason: AbortReason,
    },
}

/// The one conversion from the driver's events to the spec's wire shapes.
impl From<DriverEvent> for StreamEvent {
    fn from(event: DriverEvent) -> Self {
        match event {
            DriverEvent::Token { text, .. } => StreamEvent::Token { token: text },
            DriverEvent::Completed { response, .. } => StreamEvent::Completed {
                completed: true,
                response,
            },
            DriverEvent::Aborted { response, .. } => StreamEvent::Aborted {
                aborted: true,
                response,
            },
        }
    }
}

/// `/stream/shutdown`'s answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownResponse {
    pub stream_id: String,
    /// Always `terminated`.
    pub status: &'static str,
    pub response: CompletionResponse,
}

/// The error a generation that ended early answers where there is no stream to end (the
/// one-shot routes), its partial, billed response in `details.response`. A stream cut by
/// shutdown is `Overloaded` with the engine's own retry figure.
pub fn abort_error(reason: AbortReason, response: CompletionResponse) -> ApiError {
    let err = match reason {
        AbortReason::Shutdown { retry_after } => {
            ApiError::overloaded("the server is shutting down", retry_after)
        }
        AbortReason::EngineFailure(why) => {
            ApiError::gateway(format!("the model's engine failed: {why}"))
        }
        other => ApiError::internal(format!("completion aborted: {other:?}")),
    };
    err.with_details(serde_json::json!({ "response": response }))
}

// ---- the one map of live streams ------------------------------------------------------------

struct Live {
    cancel: CancelHandle,
    /// The final response, once settled.
    done: watch::Receiver<Option<CompletionResponse>>,
}

/// Live streams by id: how to stop each, and where its final response appears. The one owner
/// of "which stream has this id" (the scheduler keeps no map): it keeps ids unique, and
/// `/stream/shutdown` looks streams up here.
#[derive(Clone, Default)]
pub struct Streams(Arc<Mutex<HashMap<String, Live>>>);

/// A stream's entry in [`Streams`], removed when this is dropped: after the driver published the
/// final response, or on whatever path the driver ends.
#[must_use = "the stream leaves the map when this is dropped"]
struct Registered {
    streams: Streams,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.streams.map().remove(&self.id);
    }
}

impl Streams {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Enters a live stream; refuses an id that is already live.
    fn register(&self, id: &str, live: Live) -> Result<Registered, ApiError> {
        let mut map = self.map();
        if map.contains_key(id) {
            return Err(ApiError::internal(format!(
                "stream id {id:?} is already live"
            )));
        }
        map.insert(id.to_string(), live);
        Ok(Registered {
            streams: self.clone(),
            id: id.to_string(),
        })
    }

    /// Stops the stream `id` and returns where its final response will appear; `None` when no
    /// such stream is live (unknown, or already settled).
    pub fn stop(&self, id: &str) -> Option<watch::Receiver<Option<CompletionResponse>>> {
        let map = self.map();
        let live = map.get(id)?;
        live.cancel.cancel();
        Some(live.done.clone())
    }
}

// ---- the driver -----------------------------------------------------------------------------

/// Starts the driver task of an admitted generation and registers its stream; returns the
/// stream id and the events for the HTTP side. An id already live is refused (the generation,
/// its hold and its slot are dropped, which cancels and releases them).
pub fn spawn_driver(
    cs: &CompletionState,
    started: Started,
) -> Result<(String, mpsc::Receiver<DriverEvent>), ApiError> {
    let stream_id = started.generation.stream_id().to_string();
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let (done_tx, done_rx) = watch::channel(None);
    let live = Live {
        cancel: started.generation.cancel_handle(),
        done: done_rx,
    };
    let registered = cs.core.streams.register(&stream_id, live)?;
    let driver = drive(cs.clone(), started, tx, done_tx, registered);
    tokio::spawn(driver.instrument(Span::current()));
    Ok((stream_id, rx))
}

/// Reads the generation to its end, forwarding text to `out` while anyone listens (if `out`
/// closes, the client went away: the generation is cancelled, and billed for what it made),
/// then settles the hold exactly once and sends the final response.
async fn drive(
    cs: CompletionState,
    started: Started,
    out: mpsc::Sender<DriverEvent>,
    done: watch::Sender<Option<CompletionResponse>>,
    registered: Registered,
) {
    let Started {
        mut generation,
        hold,
        slot,
        model,
        spec,
        margin,
        input_cost,
        ..
    } = started;
    let stream_id = generation.stream_id().to_string();
    let stall = cs.core.client_stall_timeout;
    let mut output = String::new();
    let mut listening = true;
    let (usage, outcome) = loop {
        let event = tokio::select! {
            event = generation.next() => event,
            _ = out.closed(), if listening => {
                listening = false;
                generation.cancel();
                continue;
            }
        };
        match event {
            Some(TokenEvent::Token { text, logprobs, .. }) => {
                output.push_str(&text);
                let event = DriverEvent::Token { text, logprobs };
                if listening && !forward(&out, event, stall, &stream_id).await {
                    listening = false;
                    generation.cancel();
                }
            }
            Some(TokenEvent::Finished { usage, reason }) => break (usage, Ok(reason)),
            Some(TokenEvent::Aborted { usage, reason }) => {
                // A cancel we issued because the client left is a disconnect, whatever raced.
                let reason = if listening {
                    reason
                } else {
                    AbortReason::Disconnected
                };
                break (usage, Err(reason));
            }
            None => {
                let usage = Usage {
                    prompt_tokens: generation.prompt_tokens(),
                    completion_tokens: generation.generated_tokens(),
                };
                let reason = AbortReason::EngineFailure("the stream ended early".into());
                break (usage, Err(reason));
            }
        }
    };

    // At most the worst case that was held, so it cannot overflow where that did not.
    let output_cost = spec
        .output_price_per_million
        .cost(usage.completion_tokens as u64, margin)
        .unwrap_or_default();
    let user = hold.user_id().to_string();
    let (balance_before, balance_after) = match hold.settle(input_cost + output_cost).await {
        Ok(charge) => (money(charge.balance_before), money(charge.balance_after)),
        Err(e) => {
            // The hold was released instead: report the balance as the store has it.
            warn!(error = %e, %stream_id, "settling a completion failed; its hold was released");
            let now = cs.app.billing.balance(&user).await;
            let now = now.map(money).unwrap_or_default();
            (now.clone(), now)
        }
    };
    // Settled: the user's slot is free before they can see the answer and ask again.
    drop(slot);
    let response = CompletionResponse {
        model,
        output,
        usage: CompletionUsage {
            kind: "completion",
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            input_cost: money(input_cost),
            output_cost: money(output_cost),
        },
        balance_before,
        balance_after,
    };
    info!(%stream_id, prompt_tokens = usage.prompt_tokens, completion_tokens = usage.completion_tokens, ?outcome, "completion settled");
    done.send_replace(Some(response.clone()));
    drop(registered);
    let end = match outcome {
        Ok(finish) => DriverEvent::Completed { response, finish },
        Err(reason) => DriverEvent::Aborted { response, reason },
    };
    if listening {
        forward(&out, end, stall, &stream_id).await;
    }
}

/// Hands `event` to the HTTP side; false when the client is gone or has read nothing for
/// `stall` (its connection is full), after which nobody waits on it any more.
async fn forward(
    out: &mpsc::Sender<DriverEvent>,
    event: DriverEvent,
    stall: Duration,
    stream_id: &str,
) -> bool {
    match tokio::time::timeout(stall, out.send(event)).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            warn!(%stream_id, stall_secs = stall.as_secs(), "the client read nothing for too long; aborting its stream");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(t: &str) -> DriverEvent {
        DriverEvent::Token {
            text: t.into(),
            logprobs: Vec::new(),
        }
    }

    // Over HTTP a client that stops reading is only seen once its connection's buffers are full
    // (about 3 MB on loopback: more than a test generation makes), so the stall rule is tested
    // here on the channel between the driver and the response body, where it applies.
    #[tokio::test]
    async fn a_client_that_reads_nothing_is_given_up_after_the_stall_timeout() {
        let stall = Duration::from_millis(300);
        let (out, mut body) = mpsc::channel(1);
        assert!(forward(&out, token("a"), stall, "s").await);
        // The buffer is full and nobody reads: the next event waits out the stall, then gives up.
        let started = std::time::Instant::now();
        assert!(!forward(&out, token("b"), stall, "s").await);
        assert!(started.elapsed() >= stall);
        // A reader that takes an event within the stall keeps the stream going.
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let first = body.recv().await;
            (first.is_some(), body)
        });
        assert!(forward(&out, token("c"), stall, "s").await);
        let (read, body) = reader.await.unwrap();
        assert!(read);
        // A client gone altogether is seen at once.
        drop(body);
        let started = std::time::Instant::now();
        assert!(!forward(&out, token("d"), stall, "s").await);
        assert!(started.elapsed() < stall);
    }

    fn response() -> CompletionResponse {
        CompletionResponse {
            model: "m".into(),
            output: "hi".into(),
            usage: CompletionUsage {
                kind: "completion",
                prompt_tokens: 3,
                completion_tokens: 1,
                input_cost: money(Default::default()),
                output_cost: money(Default::default()),
            },
            balance_before: "1.000000".into(),
            balance_after: "1.000000".into(),
        }
    }

    #[test]
    fn every_event_serializes_to_exactly_one_spec_shape() {
        let json = |e: DriverEvent| serde_json::to_value(StreamEvent::from(e)).unwrap();
        let logprob = TokenLogprob {
            id: 7,
            token: "x".into(),
            bytes: b"x".to_vec(),
            logprob: -0.5,
            top: Vec::new(),
        };
        let with_logprobs = DriverEvent::Token {
            text: "x".into(),
            logprobs: vec![logprob],
        };
        assert_eq!(
            json(with_logprobs),
            serde_json::json!({ "token": "x" }),
            "log-probabilities stay off the spec's wire"
        );
        let done = json(DriverEvent::Completed {
            response: response(),
            finish: FinishReason::Length,
        });
        assert_eq!(done["completed"], true);
        assert_eq!(
            done.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["completed", "response"],
            "the finish reason stays off the spec's wire"
        );
        assert_eq!(done["response"]["usage"]["type"], "completion");
        assert_eq!(done["response"]["usage"]["promptTokens"], 3);
        assert_eq!(done["response"]["balanceBefore"], "1.000000");
        let aborted = json(DriverEvent::Aborted {
            response: response(),
            reason: AbortReason::Disconnected,
        });
        assert_eq!(aborted["aborted"], true);
        assert_eq!(
            aborted.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["aborted", "response"],
            "the reason stays off the wire"
        );
    }

    #[test]
    fn the_wire_type_documents_exactly_the_three_spec_shapes() {
        let schema =
            serde_json::to_value(<StreamEvent as utoipa::PartialSchema>::schema()).unwrap();
        let shapes: Vec<Vec<&str>> = schema["oneOf"]
            .as_array()
            .expect("one of three shapes")
            .iter()
            .map(|shape| {
                let mut keys: Vec<&str> = shape["properties"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(String::as_str)
                    .collect();
                keys.sort();
                keys
            })
            .collect();
        assert_eq!(
            shapes,
            [
                vec!["token"],
                vec!["completed", "response"],
                vec!["aborted", "response"]
            ],
            "{schema}"
        );
    }

    #[test]
    fn the_map_refuses_a_live_id_stops_by_id_and_forgets_a_dropped_entry() {
        let streams = Streams::default();
        let live = |cancel: &CancelHandle| Live {
            cancel: cancel.clone(),
            done: watch::channel(None).1,
        };
        let cancel = CancelHandle::default();
        let entry = streams.register("s", live(&cancel)).unwrap();
        let other = CancelHandle::default();
        assert!(
            streams.register("s", live(&other)).is_err(),
            "an id is live once"
        );
        assert!(streams.stop("other").is_none());
        assert!(streams.stop("s").is_some());
        assert!(cancel.is_cancelled(), "stop cancels the stream");
        assert!(!other.is_cancelled());
        drop(entry);
        assert!(streams.stop("s").is_none(), "an ended stream is not found");
        assert!(streams.register("s", live(&other)).is_ok());
    }
}
