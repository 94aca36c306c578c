//! The image generation service (spec sections 2.6, 4.4): `POST /` turns a prompt into a PNG
//! with SDXL (`hearth-imagine`), billed against the user's balance; `GET /` health;
//! `GET /ui` a page to try it.
//!
//! A request's path: credentials -> validation -> price (`price_per_image` x pixels / 1024² x
//! steps / 4, with the margin) -> hold of that price (`InsufficientFunds` before any work) ->
//! the model's worker queue (full: `Overloaded`, 503) -> generation -> settle the hold. The
//! generation and the settlement run in their own task: if the client disconnects, the task
//! notices, the worker drops the job (before it starts, or before its next denoising step) and
//! the hold is released, so an abandoned request costs nothing.

mod catalog;
mod edit;
mod jobs;
mod models;
mod openai;
pub mod openapi;
mod validate;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use hearth_imagine::lora::ActiveLora;
use hearth_imagine::{GeneratedImage, ImageParams, JobSpec, Provenance};
use hearth_store::LedgerMeta;
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::json;
use tokio::sync::oneshot;
use tracing::{info, instrument, warn, Instrument, Span};
use utoipa::ToSchema;

use crate::error::{json_fallbacks, ApiError, AppJson};
use crate::metrics::ImageMetrics;
use crate::models::{Availability, Current, Lease, Models};
use crate::openapi::ErrorBody;
use crate::pages;
use crate::service::{Service, ServiceInitError};
use crate::state::{AppState, Session};
use crate::user_slots::UserSlots;
use hearth_billing::{money, Charge, Margin};

pub use catalog::{ImageModelEntry, Limits, REFERENCE_PIXELS, REFERENCE_STEPS};
use models::{ImageKey, Ready};
use validate::{RawImageRequest, ValidImageRequest};

/// The service's own state beside the shared [`AppState`].
#[derive(Clone)]
pub struct ImagineState {
    app: AppState,
    /// The served row (limits, prices, weights), swapped by a reload.
    entry: Arc<Current<ImageModelEntry>>,
    /// The served model, under the entry's id.
    models: Models<Arc<Ready>, ImageKey>,
    /// Makes each load's step observer (`/metrics`).
    observers: Arc<dyn Fn() -> hearth_imagine::StepObserver + Send + Sync>,
    /// Each user's queued or running images, against `imagine.max_concurrent_per_user`.
    user_slots: UserSlots,
    /// `[imagine] max_upload_bytes`: the largest picture an edit may send.
    max_upload_bytes: usize,
}

/// Builds the image router: reads the model table, loads the model in the background (requests
/// wait for it; health says `loading`), and starts the model's worker.
pub async fn router(state: AppState) -> Result<Router, ServiceInitError> {
    let entries = catalog::resolve(&state.model_table, &state.config.models)
        .map_err(|e| ServiceInitError::new(Service::Imagine, e))?;
    // The spec's image model id; the table may name others, the first is served otherwise.
    let entry = models::chosen(entries)
        .ok_or_else(|| ServiceInitError::new(Service::Imagine, "no image model configured"))?;
    // `/metrics`: the step times from the worker, the queue read at scrape time.
    let image_metrics = ImageMetrics::new(&entry.id);
    let models = Models::new("image", &state.hub);
    let st = ImagineState {
        user_slots: UserSlots::new(state.config.imagine.max_concurrent_per_user),
        max_upload_bytes: state.config.imagine.max_upload_bytes,
        app: state.clone(),
        entry: Arc::new(Current::new(entry)),
        models,
        observers: Arc::new(image_metrics.step_observers()),
    };
    st.apply();
    state.hub.register(Arc::new(st.clone()));
    let served = st.clone();
    let image_metrics = image_metrics.with_queue(Arc::new(move || {
        served
            .models
            .loaded(&served.entry().id)
            .map(|r| r.worker.waiting())
    }));
    let metrics = crate::metrics::route(
        &state,
        Service::Imagine,
        (
            image_metrics,
            crate::metrics::ModelStates::new(state.hub.clone(), "image"),
        ),
    );
    let max_upload_bytes = st.max_upload_bytes;
    Ok(json_fallbacks(
        Router::new()
            .route("/", get(health).post(generate))
            .route("/ui", get(ui))
            .route("/metrics", metrics)
            .route("/v1/images/generations", post(openai::generations))
            .route("/stream", post(jobs::stream))
            .route("/jobs/shutdown", post(jobs::shutdown))
            .route("/jobs/{id}", get(jobs::state))
            .route("/v1/images/edits", post(openai::edits))
            .route(
                "/openapi.json",
                crate::openapi::route(openapi::document(), st.app.urls.get(Service::Imagine)),
            )
            .with_state(st)
            // An edit carries its image and mask base64-encoded (4/3 of their size) in JSON.
            .layer(DefaultBodyLimit::max(3 * max_upload_bytes + (64 << 10))),
    ))
}

fn weights_kind(p: &Provenance) -> &'static str {
    match p {
        Provenance::Tiny(_) => "tiny-test-model",
        Provenance::Local(_) => "local",
        Provenance::Hub(_) => "huggingface",
    }
}

/// `{status, env, ui}` plus `model` (`id`, `status` ready/loading/failed, `weights`
/// tiny-test-model/local/huggingface, `testModel`, `queued`). 500 with `status: "failing"` when
/// the store fails its round trip, the model failed to load or its worker stopped.
#[utoipa::path(
    get,
    path = "/",
    tag = "health",
    responses(
        (status = 200, description = "Healthy (the model may still be loading).", body = openapi::ImagineHealth),
        (status = 500, description = "Failing: the store check failed, or the model failed to load or its worker stopped.", body = openapi::ImagineHealth),
    )
)]
async fn health(State(st): State<ImagineState>) -> Response {
    let mut failure = match st.app.store.health_check().await {
        Ok(()) => None,
        Err(e) => Some(format!("database check failed: {e}")),
    };
    let id = &st.entry().id;
    let availability = st.models.status().remove(id);
    let model = match (availability, st.models.loaded(id)) {
        (Some(Availability::Ready), Some(r)) => json!({
            "id": id,
            "status": "ready",
            "weights": weights_kind(&r.provenance),
            "testModel": r.provenance.is_tiny(),
            "queued": r.worker.waiting(),
            "loras": r.loras.iter().map(|(name, bound)| match bound {
                Ok(_) => json!({ "name": name, "status": "ready" }),
                Err(why) => json!({ "name": name, "status": "failed", "error": why }),
            }).collect::<Vec<_>>(),
        }),
        (Some(Availability::Loading), _) => json!({ "id": id, "status": "loading" }),
        // Out of memory by choice (keep-alive, by hand, for another model): the next request
        // loads it again, so the service is healthy.
        (Some(a @ (Availability::Unloaded | Availability::Unloading)), _) => {
            json!({ "id": id, "status": a.describe() })
        }
        (other, _) => {
            let why = match other {
                Some(Availability::Unavailable(why)) => why,
                _ => "not loaded".to_string(),
            };
            failure.get_or_insert_with(|| format!("image model unusable: {why}"));
            json!({ "id": id, "status": "failed", "error": why })
        }
    };
    let (word, status) = Service::Imagine.health(failure.is_none());
    let mut body = json!({
        "status": word,
        "env": st.app.config.env,
        "ui": st.app.urls.ui(Service::Imagine),
        "model": model,
    });
    if let Some(why) = &failure {
        warn!(error = %why, "image health check failing");
        body["error"] = json!({ "type": "InternalError", "message": why, "details": {} });
    }
    (status, Json(body)).into_response()
}

const PAGE: &str = include_str!("imagine/imagine.html");

/// The image page, with the model's bounds and price.
#[utoipa::path(
    get,
    path = "/ui",
    tag = "pages",
    responses((status = 200, description = "The HTML page.", content_type = "text/html", body = String))
)]
async fn ui(State(st): State<ImagineState>) -> Html<String> {
    let l = &st.entry().limits;
    let config = json!({
        "model": st.entry().id,
        "minSize": l.min_size, "maxSize": l.max_size, "defaultSize": l.default_size,
        "maxPixels": l.max_pixels, "maxSteps": l.max_steps, "defaultSteps": l.default_steps,
        "sizeMultiple": catalog::SIZE_MULTIPLE, "maxSeed": validate::MAX_SEED,
        "pricePerImage": st.entry().price_per_image.amount().to_string(),
    });
    Html(pages::render(
        &st.app,
        pages::Page {
            title: "Images",
            service: Service::Imagine,
            body: PAGE,
            config,
        },
    ))
}

/// The price of one image: `price_per_image × (w·h / 1024²) × (steps / 4)`, divided by
/// `1 − margin/100`, rounded once to 6 decimals.
pub fn image_cost(
    entry: &ImageModelEntry,
    width: usize,
    height: usize,
    steps: usize,
    margin: Margin,
) -> Result<Decimal, ApiError> {
    let pixel_steps = width as u64 * height as u64 * steps as u64;
    Ok(entry.price_per_image.cost(pixel_steps, margin)?)
}

/// Image response (spec 2.6).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ImageResponse {
    /// `data:image/png;base64,<data>`.
    image_url: String,
    /// The prompt used.
    prompt: String,
    /// The model id (`xl-lightning`).
    model: String,
    metadata: ImageMetadata,
    usage: ImageUsage,
    /// Decimal string, 6 places.
    balance_before: String,
    /// Decimal string, 6 places.
    balance_after: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ImageMetadata {
    /// The seed used (drawn at random when the request had none).
    seed: u64,
    steps: usize,
    width: usize,
    height: usize,
    negative_prompt: String,
    /// `true` when the tiny test model (random weights) drew it; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    test_model: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
struct ImageUsage {
    /// Always `imagine`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// Decimal string, 6 places.
    cost: String,
}

/// `POST /`: one image, as a PNG data URL, with the seed used and the cost.
#[utoipa::path(
    post,
    path = "/",
    tag = "imagine",
    request_body = RawImageRequest,
    responses(
        (status = 200, description = "The image, billed.", body = ImageResponse),
        (status = 400, description = "`InvalidRequest`: a bad field (`details.field`).", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials` or `SessionExpired`: the `serviceToken`.", body = ErrorBody),
        (status = 402, description = "`InsufficientFunds`: the balance cannot cover the image (`details.needed`, `details.available`).", body = ErrorBody),
        (status = 429, description = "`RateLimited`: the user's concurrent images are at the cap (`Retry-After`).", body = ErrorBody),
        (status = 500, description = "`InternalError`: generation failed.", body = ErrorBody),
        (status = 502, description = "`GatewayError`: the model failed to load.", body = ErrorBody),
        (status = 503, description = "`Overloaded`: the model's queue is full (`Retry-After`).", body = ErrorBody),
    )
)]
#[instrument(skip_all, fields(user, seed))]
async fn generate(
    State(st): State<ImagineState>,
    AppJson(raw): AppJson<RawImageRequest>,
) -> Result<Json<ImageResponse>, ApiError> {
    let token = crate::validate::service_token_field(&raw.service_token)?;
    let session = st.app.authenticate(token).await?;
    Span::current().record("user", session.user_id.as_str());
    let valid = validated(&st, raw, None).await?;
    let made = produce(&st, &session, &valid).await?;
    Ok(Json(response(
        &st,
        &valid,
        &made.image,
        &made.charge,
        made.seed,
    )))
}

/// [`validate::validate`] (or, with `files`, [`validate::validate_with`]) on a blocking thread:
/// an edit decodes its pictures there.
async fn validated(
    st: &ImagineState,
    raw: RawImageRequest,
    files: Option<edit::EditBytes>,
) -> Result<ValidImageRequest, crate::validate::FieldError> {
    let (entry, max_bytes) = (st.entry(), st.max_upload_bytes);
    tokio::task::spawn_blocking(move || match files {
        None => validate::validate(&raw, &entry.limits, &entry.id, max_bytes),
        Some(files) => validate::validate_with(&raw, Some(&files), &entry.limits, &entry.id),
    })
    .await
    .unwrap_or_else(|e| {
        warn!(error = %e, "image request validation panicked");
        Err(crate::validate::FieldError::new(
            "image",
            "could not be read",
        ))
    })
}

/// The spec's answer for an image made and paid for.
fn response(
    st: &ImagineState,
    valid: &ValidImageRequest,
    image: &GeneratedImage,
    charge: &Charge,
    seed: u64,
) -> ImageResponse {
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&image.png)
    );
    ImageResponse {
        image_url: url,
        metadata: ImageMetadata {
            seed,
            steps: valid.steps,
            width: image.width,
            height: image.height,
            test_model: model_is_tiny(st).then_some(true),
            negative_prompt: valid.negative_prompt.clone(),
        },
        prompt: valid.prompt.clone(),
        model: st.entry().id.clone(),
        usage: ImageUsage {
            kind: "imagine",
            cost: money(charge.cost),
        },
        balance_before: money(charge.balance_before),
        balance_after: money(charge.balance_after),
    }
}

/// An image made and paid for.
struct Made {
    image: GeneratedImage,
    charge: Charge,
    seed: u64,
}

/// A validated request priced and held: what generation needs, and what it owes. Dropping it
/// gives the user's slot back; its hold must be settled or released.
struct Prepared {
    cost: Decimal,
    slot: crate::user_slots::UserSlot,
    model: Lease<Arc<Ready>>,
    hold: hearth_billing::HeldFunds,
    seed: u64,
}

/// From a validated request to a held price and the job's parameters (moved, not copied, into the
/// worker: an edit's picture is megabytes), for every front end: price, the user's slot, the
/// model, the seed, the hold.
async fn prepare(
    st: &ImagineState,
    session: &Session,
    valid: &ValidImageRequest,
) -> Result<(Prepared, ImageParams), ApiError> {
    let billing = st.app.billing.clone();
    let margin = billing.margin(valid.margin);
    let cost = image_cost(
        &st.entry(),
        valid.width,
        valid.height,
        valid.steps_to_run(),
        margin,
    )?;
    let slot = st
        .user_slots
        .take(&session.user_id)
        .map_err(ApiError::rate_limited)?;
    let model = st.models.get(&st.entry().id).await?;
    let loras = valid
        .loras
        .iter()
        .map(|(name, scale)| match model.loras.get(name) {
            Some(Ok(lora)) => Ok(ActiveLora::new(Arc::clone(lora), *scale)),
            Some(Err(why)) => Err(ApiError::invalid_request(
                "loras",
                format!("loras: {name:?} could not be loaded: {why}"),
            )),
            None => Err(ApiError::invalid_request(
                "loras",
                format!("loras: {name:?} is not a LoRA of this model"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let seed = valid.seed.unwrap_or_else(|| rand::random::<u32>() as u64);
    Span::current().record("seed", seed);
    let meta = LedgerMeta {
        reason: format!(
            "imagine{} {} {}x{} {} steps",
            if valid.init.is_some() { " edit" } else { "" },
            st.entry().id,
            valid.width,
            valid.height,
            valid.steps_to_run()
        ),
        developer_id: valid.developer_id.clone(),
        application_id: valid.application_id.clone(),
    };
    let hold = billing.hold(&session.user_id, cost, meta).await?;
    let params = ImageParams {
        prompt: valid.prompt.clone(),
        negative_prompt: valid.negative_prompt.clone(),
        seed,
        steps: valid.steps,
        width: valid.width,
        height: valid.height,
        guidance_scale: st.entry().guidance_scale,
        init: valid.init.clone(),
        loras,
    };
    let prepared = Prepared {
        cost,
        slot,
        model,
        hold,
        seed,
    };
    Ok((prepared, params))
}

/// From a validated request on, for the spec's `POST /` and `/v1/images/generations`: the held
/// price, generation on the worker (in the user's turn), settlement.
async fn produce(
    st: &ImagineState,
    session: &Session,
    valid: &ValidImageRequest,
) -> Result<Made, ApiError> {
    let (
        Prepared {
            cost,
            slot,
            model,
            hold,
            seed,
        },
        params,
    ) = prepare(st, session, valid).await?;
    let spec = JobSpec {
        user: session.user_id.clone(),
        params,
        preview_every: 0,
    };
    // Generation and settlement outlive this handler if the client leaves: see the module docs.
    // The task owns the hold and the user's slot: however it ends, dropping them gives both back.
    let (mut tx, rx) = oneshot::channel::<Result<(GeneratedImage, Charge), ApiError>>();
    tokio::spawn(
        async move {
            let outcome = match model.worker.submit(spec) {
                Ok(job) => tokio::select! {
                    r = job.result => Some(r.unwrap_or(Err(hearth_imagine::Error::WorkerStopped))),
                    _ = tx.closed() => None,
                },
                Err(e) => Some(Err(e)),
            };
            let answer = match outcome {
                Some(Ok(image)) => hold
                    .settle(cost)
                    .await
                    .map(|charge| (image, charge))
                    .map_err(ApiError::from),
                other => {
                    if let Err(e) = hold.release().await {
                        warn!(error = %e, "releasing the hold of an unfinished image failed");
                    }
                    match other {
                        Some(Err(e)) => Err(e.into()),
                        _ => {
                            info!("client disconnected: image request dropped, hold released");
                            return;
                        }
                    }
                }
            };
            // Settled or released: the slot is free before the user sees the answer.
            drop(slot);
            let _ = tx.send(answer);
        }
        .instrument(Span::current()),
    );
    let (image, charge) = rx
        .await
        .map_err(|_| ApiError::internal("image task ended without an answer"))??;
    Ok(Made {
        image,
        charge,
        seed,
    })
}

fn model_is_tiny(st: &ImagineState) -> bool {
    st.models
        .loaded(&st.entry().id)
        .is_some_and(|r| r.provenance.is_tiny())
}
