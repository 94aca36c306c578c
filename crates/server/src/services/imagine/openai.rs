//! `POST /v1/images/generations`, the OpenAI API's image route, beside the spec's `POST /`:
//! `prompt`, `model`, `n` (1), `size` (`"WxH"`), `response_format` (`b64_json`, or `url`, which
//! is a `data:` URL: Hearth keeps no files to link to), and `seed`, `steps` and
//! `negative_prompt` as extensions. The key is `Authorization: Bearer <serviceToken>`. The
//! request is checked by the spec route's validator and made and billed by the same code.
//!
//! `POST /v1/images/edits` takes the same fields as multipart form data, with the picture to
//! change as the file `image` (or `image[]`, one), an optional `mask` by OpenAI's rule (its fully
//! transparent pixels repaint; a mask without alpha: white repaints), and `strength` as an
//! extension.

use axum::extract::multipart::{Field, MultipartError};
use axum::extract::{Multipart, State};
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine as _;
use hearth_billing::money;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::{instrument, Span};
use utoipa::ToSchema;

use super::edit::{self, EditBytes, MaskRule};
use super::validate::{RawImageRequest, ValidImageRequest};
use super::{produce, validated, ImagineState, Made};
use crate::error::{ApiError, OpenAiError, OpenAiJson};
use crate::openapi::OpenAiErrorBody;
use crate::validate::{bearer_token, FieldError};

/// `POST /v1/images/generations`. Fields are checked by the spec route's validator, so each
/// bad one is named (`param`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = CreateImageRequest)]
pub struct ImagesRequest {
    /// What to draw: a non-empty string of at most 4,000 characters.
    #[schema(value_type = String, required = true, min_length = 1, max_length = 4000)]
    prompt: Option<Value>,
    /// The served model's id (`xl-lightning`) when given.
    #[schema(value_type = Option<String>)]
    model: Option<Value>,
    /// 1 only.
    n: Option<u64>,
    /// `WIDTHxHEIGHT` (each a multiple of 64 within the model's bounds), or `auto` (the default
    /// size, 1024x1024).
    #[schema(pattern = "^([0-9]+x[0-9]+|auto)$")]
    size: Option<String>,
    /// `b64_json` (the default) or `url`, which is a `data:` URL: Hearth keeps no files.
    response_format: Option<String>,
    /// Extension: for reproducible output; random when absent.
    #[schema(value_type = Option<u32>)]
    seed: Option<Value>,
    /// Extension: denoising steps, 1 to the model's maximum (default 8); default 4.
    #[schema(value_type = Option<u32>, minimum = 1)]
    steps: Option<Value>,
    /// Extension: things to avoid.
    #[schema(value_type = Option<String>, max_length = 4000)]
    negative_prompt: Option<Value>,
    /// Extension: recorded in the ledger.
    #[schema(value_type = Option<String>, max_length = 256)]
    developer_id: Option<Value>,
    /// Extension: recorded in the ledger.
    #[schema(value_type = Option<String>, max_length = 256)]
    application_id: Option<Value>,
    /// Extension: LoRAs to apply, `[{name, scale}]` (as `POST /`).
    #[schema(value_type = Option<Vec<super::validate::LoraChoice>>)]
    loras: Option<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ImagesResponse {
    /// Unix seconds.
    created: u64,
    /// One image.
    data: Vec<ImageData>,
    hearth: ImageCost,
}

/// One image: `b64_json` or `url`, as `response_format` asked.
#[derive(Debug, Serialize, ToSchema)]
struct ImageData {
    /// The PNG, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    b64_json: Option<String>,
    /// `data:image/png;base64,<data>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// The prompt used.
    revised_prompt: String,
}

/// Hearth's extra fields: the cost, the balance before and after, and what was made.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HearthImageCost)]
struct ImageCost {
    /// Decimal string, 6 places.
    cost: String,
    /// Decimal string, 6 places.
    balance_before: String,
    /// Decimal string, 6 places.
    balance_after: String,
    seed: u64,
    steps: usize,
    width: usize,
    height: usize,
}

/// The API's names for the fields the spec's validator names.
fn rename_field(mut e: FieldError) -> ApiError {
    let renamed = match e.field.as_str() {
        "width" | "height" => "size",
        "negativePrompt" => "negative_prompt",
        "developerId" => "developer_id",
        "applicationId" => "application_id",
        _ => return e.into(),
    };
    if let Some(what) = e.message.strip_prefix(&format!("{}: ", e.field)) {
        e.message = format!("{renamed}: {what}");
    }
    e.details["field"] = json!(renamed);
    e.into()
}

fn bad(field: &str, message: impl std::fmt::Display) -> OpenAiError {
    ApiError::invalid_request(field, message).into()
}

/// An image, the OpenAI API's way; made and billed as `POST /` makes and bills them.
#[utoipa::path(
    post,
    path = "/v1/images/generations",
    tag = "openai",
    operation_id = "createImage",
    request_body = ImagesRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The image, billed.", body = ImagesResponse),
        (status = 400, description = "`invalid_request_error`: `param` names the field.", body = OpenAiErrorBody),
        (status = 401, description = "`authentication_error`: no, bad, revoked or expired service token.", body = OpenAiErrorBody),
        (status = 402, description = "`insufficient_quota`: the balance cannot cover the image.", body = OpenAiErrorBody),
        (status = 429, description = "`rate_limit_error`: the user's concurrent images are at the cap (`Retry-After`).", body = OpenAiErrorBody),
        (status = 500, description = "`api_error`: generation failed.", body = OpenAiErrorBody),
        (status = 502, description = "`api_error`: the model failed to load.", body = OpenAiErrorBody),
        (status = 503, description = "`server_error`, code `overloaded`: the model's queue is full (`Retry-After`).", body = OpenAiErrorBody),
    )
)]
#[instrument(skip_all, fields(user, seed))]
pub async fn generations(
    State(st): State<ImagineState>,
    headers: HeaderMap,
    OpenAiJson(req): OpenAiJson<ImagesRequest>,
) -> Result<Json<ImagesResponse>, OpenAiError> {
    let session = authenticated(&st, &headers).await?;
    let (raw, as_url) = spec_request(req)?;
    let valid = validated(&st, raw, None).await.map_err(rename_field)?;
    let made = produce(&st, &session, &valid).await?;
    Ok(Json(answer(&valid, &made, as_url)))
}

/// The bearer token's session.
async fn authenticated(
    st: &ImagineState,
    headers: &HeaderMap,
) -> Result<crate::state::Session, OpenAiError> {
    let token = bearer_token(headers).ok_or_else(|| {
        ApiError::invalid_credentials(
            "no credentials: send the service token as Authorization: Bearer <serviceToken>",
        )
    })?;
    let session = st.app.authenticate(token).await?;
    Span::current().record("user", session.user_id.as_str());
    Ok(session)
}

/// The spec route's request from the API's, and whether to answer with a `url`.
fn spec_request(req: ImagesRequest) -> Result<(RawImageRequest, bool), OpenAiError> {
    if req.n.is_some_and(|n| n != 1) {
        return Err(bad("n", "n must be 1: one image per request"));
    }
    let as_url = match req.response_format.as_deref() {
        None | Some("b64_json") => false,
        Some("url") => true,
        Some(other) => {
            return Err(bad(
                "response_format",
                format!("response_format {other:?}: expected b64_json or url"),
            ))
        }
    };
    let (width, height) = match req.size.as_deref() {
        None | Some("auto") => (None, None),
        Some(size) => {
            let parsed = size
                .split_once('x')
                .and_then(|(w, h)| Some((w.parse::<u64>().ok()?, h.parse::<u64>().ok()?)));
            match parsed {
                Some((w, h)) => (Some(json!(w)), Some(json!(h))),
                None => return Err(bad("size", format!("size {size:?}: expected WIDTHxHEIGHT"))),
            }
        }
    };
    let raw = RawImageRequest {
        prompt: req.prompt,
        negative_prompt: req.negative_prompt,
        seed: req.seed,
        steps: req.steps,
        width,
        height,
        model: req.model,
        developer_id: req.developer_id,
        application_id: req.application_id,
        loras: req.loras,
        ..RawImageRequest::default()
    };
    Ok((raw, as_url))
}

/// `POST /v1/images/edits` as multipart form data: the files `image` and `mask`, and
/// `/v1/images/generations`' fields as text, `strength` among them.
#[derive(Debug, ToSchema)]
#[schema(as = CreateImageEditRequest)]
#[allow(dead_code)] // The schema of a multipart body; the handler reads its parts one by one.
pub struct EditsRequest {
    /// The picture to change: PNG, JPEG or WebP, at most `[imagine] max_upload_bytes`. Without
    /// `size` the output keeps its aspect, scaled into the model's bounds.
    #[schema(value_type = String, format = Binary, required = true)]
    image: Vec<u8>,
    /// Where to repaint, the image's size: fully transparent pixels repaint (a mask without
    /// alpha: white repaints).
    #[schema(value_type = Option<String>, format = Binary)]
    mask: Option<Vec<u8>>,
    /// What the result should show.
    #[schema(required = true)]
    prompt: String,
    /// Extension: how much of the schedule runs, 0 < s <= 1 (0.75; 1 with a mask).
    strength: Option<f64>,
    /// As `/v1/images/generations`.
    model: Option<String>,
    n: Option<u64>,
    size: Option<String>,
    response_format: Option<String>,
    seed: Option<u32>,
    steps: Option<u32>,
    negative_prompt: Option<String>,
    /// Extension: LoRAs to apply, as JSON text: `[{"name": "ink", "scale": 0.8}]`.
    loras: Option<String>,
}

/// An edit, the OpenAI API's way; made and billed as `POST /` makes and bills them.
#[utoipa::path(
    post,
    path = "/v1/images/edits",
    tag = "openai",
    operation_id = "createImageEdit",
    request_body(content = EditsRequest, content_type = "multipart/form-data"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The edited image, billed for the steps that ran.", body = ImagesResponse),
        (status = 400, description = "`invalid_request_error`: `param` names the field (a corrupt, oversized or unreadable picture, a mask of another size, a strength that leaves no step).", body = OpenAiErrorBody),
        (status = 401, description = "`authentication_error`: no, bad, revoked or expired service token.", body = OpenAiErrorBody),
        (status = 402, description = "`insufficient_quota`: the balance cannot cover the image.", body = OpenAiErrorBody),
        (status = 413, description = "`invalid_request_error`: the body is over the limit.", body = OpenAiErrorBody),
        (status = 429, description = "`rate_limit_error`: the user's concurrent images are at the cap (`Retry-After`).", body = OpenAiErrorBody),
        (status = 500, description = "`api_error`: generation failed.", body = OpenAiErrorBody),
        (status = 502, description = "`api_error`: the model failed to load.", body = OpenAiErrorBody),
        (status = 503, description = "`server_error`, code `overloaded`: the model's queue is full (`Retry-After`).", body = OpenAiErrorBody),
    )
)]
#[instrument(skip_all, fields(user, seed))]
pub async fn edits(
    State(st): State<ImagineState>,
    headers: HeaderMap,
    mut multipart: Multipart,
) -> Result<Json<ImagesResponse>, OpenAiError> {
    let session = authenticated(&st, &headers).await?;
    let max = st.max_upload_bytes;
    let mut text = serde_json::Map::new();
    let (mut image, mut mask) = (None, None);
    while let Some(field) = multipart.next_field().await.map_err(malformed)? {
        let name = field.name().unwrap_or_default().to_string();
        match name.as_str() {
            "image" | "image[]" if image.is_some() => {
                return Err(bad("image", "one image per edit"))
            }
            "image" | "image[]" => image = Some(read_file(field, "image", max).await?),
            "mask" => mask = Some(read_file(field, "mask", max).await?),
            "prompt" | "model" | "size" | "response_format" | "negative_prompt"
            | "developer_id" | "application_id" => {
                let value = field.text().await.map_err(malformed)?;
                text.insert(name, Value::String(value));
            }
            "n" | "seed" | "steps" | "strength" | "loras" => {
                // Form fields are text: a number stays a number (and `loras` an array),
                // anything else a string that the checks name.
                let value = field.text().await.map_err(malformed)?;
                let parsed = serde_json::from_str::<Value>(value.trim())
                    .ok()
                    .filter(|v| v.is_number() || v.is_array())
                    .unwrap_or(Value::String(value));
                text.insert(name, parsed);
            }
            // OpenAI's other fields (quality, background, user, ...) change nothing here.
            _ => {}
        }
    }
    let image = image.ok_or_else(|| bad("image", "the file `image` is required"))?;
    let strength = match text.remove("strength") {
        None => None,
        Some(v) => Some(
            v.as_f64()
                .ok_or_else(|| bad("strength", "strength must be a number"))?,
        ),
    };
    if text.get("n").is_some_and(|n| n.as_u64().is_none()) {
        return Err(bad("n", "n must be 1: one image per request"));
    }
    let req: ImagesRequest =
        serde_json::from_value(Value::Object(text)).map_err(|e| bad("body", e))?;
    let (raw, as_url) = spec_request(req)?;
    let files = EditBytes {
        image,
        mask,
        strength,
        rule: MaskRule::Transparent,
    };
    let valid = validated(&st, raw, Some(files))
        .await
        .map_err(rename_field)?;
    let made = produce(&st, &session, &valid).await?;
    Ok(Json(answer(&valid, &made, as_url)))
}

/// A file part, refused past `max` bytes as soon as it is.
async fn read_file(mut field: Field<'_>, name: &str, max: usize) -> Result<Vec<u8>, OpenAiError> {
    let mut data = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(malformed)? {
        if data.len() + chunk.len() > max {
            return Err(rename_field(edit::too_large(name, max)).into());
        }
        data.extend_from_slice(&chunk);
    }
    edit::check_length(name, &data, max).map_err(rename_field)?;
    Ok(data)
}

fn malformed(e: MultipartError) -> OpenAiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::payload_too_large().into()
    } else {
        bad(
            "body",
            format!("malformed multipart body: {}", e.body_text()),
        )
    }
}

/// The API's answer for an image made and paid for.
fn answer(valid: &ValidImageRequest, made: &Made, as_url: bool) -> ImagesResponse {
    let encoded = base64::engine::general_purpose::STANDARD.encode(&made.image.png);
    let data = if as_url {
        ImageData {
            b64_json: None,
            url: Some(format!("data:image/png;base64,{encoded}")),
            revised_prompt: valid.prompt.clone(),
        }
    } else {
        ImageData {
            b64_json: Some(encoded),
            url: None,
            revised_prompt: valid.prompt.clone(),
        }
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    ImagesResponse {
        created,
        data: vec![data],
        hearth: ImageCost {
            cost: money(made.charge.cost),
            balance_before: money(made.charge.balance_before),
            balance_after: money(made.charge.balance_after),
            seed: made.seed,
            steps: valid.steps,
            width: made.image.width,
            height: made.image.height,
        },
    }
}
