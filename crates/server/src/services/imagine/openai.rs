//! `POST /v1/images/generations`, the OpenAI API's image route, beside the spec's `POST /`:
//! `prompt`, `model`, `n` (1), `size` (`"WxH"`), `response_format` (`b64_json`, or `url`, which
//! is a `data:` URL: Hearth keeps no files to link to), and `seed`, `steps` and
//! `negative_prompt` as extensions. The key is `Authorization: Bearer <serviceToken>`. The
//! request is checked by the spec route's validator and made and billed by the same code.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine as _;
use hearth_billing::money;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::{instrument, Span};
use utoipa::ToSchema;

use super::validate::{self, RawImageRequest};
use super::{produce, ImagineState};
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
    let token = bearer_token(&headers).ok_or_else(|| {
        ApiError::invalid_credentials(
            "no credentials: send the service token as Authorization: Bearer <serviceToken>",
        )
    })?;
    let session = st.app.authenticate(token).await?;
    Span::current().record("user", session.user_id.as_str());
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
        ..RawImageRequest::default()
    };
    let valid = validate::validate(&raw, &st.entry.limits, &st.entry.id).map_err(rename_field)?;
    let made = produce(&st, &session, &valid).await?;
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
    Ok(Json(ImagesResponse {
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
    }))
}
