//! Images as jobs people can watch and stop, beside the spec's `POST /` (which stays as it is):
//! `POST /stream` answers server-sent events (`queued {position}` whenever the job's place in
//! the queue changes, `step {step, steps, preview?}` after each denoising step, then
//! `completed {response}` in the spec's response shape or `aborted {reason}`), with the job's
//! id in `X-Job-Id`; `POST /jobs/shutdown {jobId}` stops it (a waiting job at once, a running
//! one before its next step), as a client that goes away does; `GET /jobs/{id}` says where it
//! stands.
//!
//! Billing (docs/decisions.md): a job pays its price when its image is made; a job stopped or
//! abandoned before that pays nothing, as `POST /` does when its client leaves. The hold ends
//! either way, settled or released, by the task that owns it.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use hearth_imagine::{JobEvent, JobSpec, JobState};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::{info, instrument, warn, Instrument, Span};
use utoipa::ToSchema;

use super::validate::{self, RawImageRequest};
use super::{prepare, response, validated, ImagineState, Prepared};
use crate::error::{ApiError, AppJson};
use crate::openapi::ErrorBody;

/// The header naming a streamed job, for `POST /jobs/shutdown` and `GET /jobs/{id}`.
pub const JOB_ID_HEADER: &str = "x-job-id";

/// How long `POST /jobs/shutdown` waits for a running job to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// At most one preview every this many steps is the finest asked for.
const MAX_PREVIEW_EVERY: u64 = 64;

/// `POST /stream`: the spec's image request and how often to send a preview.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ImageStreamRequest)]
pub struct StreamRequest {
    #[serde(flatten)]
    request: RawImageRequest,
    /// A small PNG preview (decoded from the latents) every this many steps; none when absent
    /// or 0.
    #[schema(value_type = Option<u64>, maximum = 64)]
    preview_every: Option<Value>,
}

/// `POST /stream`.
#[utoipa::path(
    post,
    path = "/stream",
    tag = "imagine",
    request_body = StreamRequest,
    responses(
        (status = 200, description = "Server-sent events, each `data:` one JSON object: `{\"queued\": {\"position\"}}` when the job's place changes (0: next), `{\"step\": {\"step\", \"steps\", \"preview\"?}}` after each denoising step (`preview` a PNG data URL), then `{\"completed\": true, \"response\"}` (the spec's image response) or `{\"aborted\": true, \"reason\"}`. `X-Job-Id` names the job.",
            headers(("x-job-id" = String, description = "The job's id, for `POST /jobs/shutdown` and `GET /jobs/{id}`."))),
        (status = 400, description = "`InvalidRequest`: a bad field (`details.field`).", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials` or `SessionExpired`.", body = ErrorBody),
        (status = 402, description = "`InsufficientFunds`.", body = ErrorBody),
        (status = 429, description = "`RateLimited` (`Retry-After`).", body = ErrorBody),
        (status = 502, description = "`GatewayError`: the model failed to load.", body = ErrorBody),
        (status = 503, description = "`Overloaded`: the queue is full (`Retry-After`).", body = ErrorBody),
    )
)]
#[instrument(skip_all, fields(user, seed, job))]
pub async fn stream(
    State(st): State<ImagineState>,
    AppJson(body): AppJson<StreamRequest>,
) -> Result<Response, ApiError> {
    let preview_every = match &body.preview_every {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_PREVIEW_EVERY => n as usize,
            _ => {
                return Err(ApiError::invalid_request(
                    "previewEvery",
                    format!("must be an integer from 0 to {MAX_PREVIEW_EVERY}"),
                ))
            }
        },
    };
    let raw = body.request;
    let token = crate::validate::service_token_field(&raw.service_token)?;
    let session = st.app.authenticate(token).await?;
    Span::current().record("user", session.user_id.as_str());
    let valid = validated(&st, raw, None).await?;
    let (prepared, params) = prepare(&st, &session, &valid).await?;
    let job = prepared.model.worker.submit(JobSpec {
        user: session.user_id.clone(),
        params,
        preview_every,
    });
    let job = match job {
        Ok(job) => job,
        Err(e) => {
            if let Err(release) = prepared.hold.release().await {
                warn!(error = %release, "releasing the hold of a refused image failed");
            }
            return Err(e.into());
        }
    };
    Span::current().record("job", job.id.as_str());
    let id = job.id.clone();
    let (tx, rx) = mpsc::channel::<Value>(16);
    tokio::spawn(drive(st.clone(), prepared, valid, job, tx).instrument(Span::current()));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let value = rx.recv().await?;
        Some((
            Ok::<Event, Infallible>(Event::default().data(value.to_string())),
            rx,
        ))
    });
    let mut answer = Sse::new(body)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    let header = HeaderValue::from_str(&id).map_err(ApiError::internal)?;
    answer.headers_mut().insert(JOB_ID_HEADER, header);
    Ok(answer)
}

/// Forwards the job's events to its stream until its image comes, then settles (or releases)
/// the hold and sends the last event. A stream whose client has gone drops the job, which the
/// worker then stops; the hold is released.
async fn drive(
    st: ImagineState,
    prepared: Prepared,
    valid: validate::ValidImageRequest,
    mut job: hearth_imagine::Submitted,
    tx: mpsc::Sender<Value>,
) {
    let Prepared {
        hold,
        slot,
        cost,
        seed,
        ..
    } = prepared;
    let outcome = loop {
        tokio::select! {
            biased;
            event = job.events.recv() => match event {
                Some(event) => {
                    if tx.send(event_json(event)).await.is_err() {
                        break None;
                    }
                }
                None => break (&mut job.result).await.ok(),
            },
            result = &mut job.result => {
                // Every event was sent before the image: any still queued goes out first.
                while let Ok(event) = job.events.try_recv() {
                    if tx.send(event_json(event)).await.is_err() {
                        break;
                    }
                }
                break result.ok();
            }
            _ = tx.closed() => break None,
        }
    };
    let last = match outcome {
        Some(Ok(image)) => match hold.settle(cost).await {
            Ok(charge) => {
                let answer = response(&st, &valid, &image, &charge, seed);
                json!({ "completed": true, "response": answer })
            }
            Err(e) => json!({ "aborted": true, "reason": ApiError::from(e).message }),
        },
        other => {
            if let Err(e) = hold.release().await {
                warn!(error = %e, "releasing the hold of an unfinished image failed");
            }
            match other {
                Some(Err(hearth_imagine::Error::Cancelled)) => {
                    info!("image job stopped: hold released");
                    json!({ "aborted": true, "reason": "cancelled" })
                }
                Some(Err(e)) => json!({ "aborted": true, "reason": ApiError::from(e).message }),
                _ => {
                    info!("client disconnected: image job dropped, hold released");
                    return;
                }
            }
        }
    };
    drop(slot);
    let _ = tx.send(last).await;
}

fn event_json(event: JobEvent) -> Value {
    match event {
        JobEvent::Queued { position } => json!({ "queued": { "position": position } }),
        JobEvent::Step {
            step,
            steps,
            preview,
        } => {
            let mut step = json!({ "step": step, "steps": steps });
            if let Some(png) = preview {
                step["preview"] = json!(format!(
                    "data:image/png;base64,{}",
                    base64::engine::general_purpose::STANDARD.encode(png)
                ));
            }
            json!({ "step": step })
        }
    }
}

/// `POST /jobs/shutdown`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobShutdownRequest {
    /// The `X-Job-Id` of a `POST /stream` answer.
    job_id: String,
}

/// `POST /jobs/shutdown`: stops a job and answers once it has stopped (its hold released).
#[utoipa::path(
    post,
    path = "/jobs/shutdown",
    tag = "imagine",
    request_body = JobShutdownRequest,
    responses(
        (status = 200, description = "`{jobId, status: \"terminated\", state}`: the job stopped (a job that finished first says `completed`)."),
        (status = 400, description = "`InvalidRequest`: the body is not `{jobId}`.", body = ErrorBody),
        (status = 404, description = "`NotFound`: no waiting or running job has this id.", body = ErrorBody),
        (status = 500, description = "`InternalError`: the job did not stop in time.", body = ErrorBody),
    )
)]
pub async fn shutdown(
    State(st): State<ImagineState>,
    AppJson(body): AppJson<JobShutdownRequest>,
) -> Result<Json<Value>, ApiError> {
    let id = body.job_id;
    let not_found = || {
        ApiError::not_found(format!("no active job {id:?}")).with_details(json!({ "jobId": id }))
    };
    let model = st.models.loaded(&st.entry().id).ok_or_else(not_found)?;
    if !model.worker.cancel(&id) {
        return Err(not_found());
    }
    let stopped = tokio::time::timeout(SHUTDOWN_WAIT, async {
        loop {
            match model.worker.state(&id) {
                Some(state) if state.is_final() => return state,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .map_err(|_| ApiError::internal(format!("job {id} did not stop in time")))?;
    Ok(Json(
        json!({ "jobId": id, "status": "terminated", "state": state_name(&stopped) }),
    ))
}

fn state_name(state: &JobState) -> &'static str {
    match state {
        JobState::Queued { .. } => "queued",
        JobState::Running { .. } => "running",
        JobState::Completed => "completed",
        JobState::Cancelled => "cancelled",
        JobState::Failed(_) => "failed",
    }
}

/// `GET /jobs/{id}`: where a job stands.
#[utoipa::path(
    get,
    path = "/jobs/{id}",
    tag = "imagine",
    params(("id" = String, Path, description = "A job's `X-Job-Id`.")),
    responses(
        (status = 200, description = "`{jobId, state}` (`queued`, `running`, `completed`, `cancelled`, `failed`), with `position` while queued, `step` and `steps` while running, `error` when failed. Finished jobs are remembered a while."),
        (status = 404, description = "`NotFound`: no such job (or finished long ago).", body = ErrorBody),
    )
)]
pub async fn state(
    State(st): State<ImagineState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let state = st
        .models
        .loaded(&st.entry().id)
        .and_then(|m| m.worker.state(&id))
        .ok_or_else(|| {
            ApiError::not_found(format!("no job {id:?}")).with_details(json!({ "jobId": id }))
        })?;
    let mut answer = json!({ "jobId": id, "state": state_name(&state) });
    match state {
        JobState::Queued { position } => answer["position"] = json!(position),
        JobState::Running { step, steps } => {
            answer["step"] = json!(step);
            answer["steps"] = json!(steps);
        }
        JobState::Failed(why) => answer["error"] = json!(why),
        JobState::Completed | JobState::Cancelled => {}
    }
    Ok(Json(answer))
}
