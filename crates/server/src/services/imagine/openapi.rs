//! The image listener's OpenAPI document: the spec's `POST /` (4.4), which takes `serviceToken`
//! in the body, and the OpenAI API's `POST /v1/images/generations` and `/v1/images/edits`, which
//! take it as a bearer token.

use utoipa::{OpenApi, ToSchema};

use crate::openapi::{BearerAuth, ErrorObject};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hearth image generation service",
        description = "Images from a text prompt with SDXL (spec section 4.4), billed against \
            the user's balance, and edits of a given picture (image-to-image and inpainting); \
            and the same through the OpenAI API's image routes. `POST /` takes the service \
            token in the body's `serviceToken` field; `/v1/images/generations` and \
            `/v1/images/edits` take it as `Authorization: Bearer`. Any route that reads \
            a body may also answer 408 (the body came too slowly) or 413 (too large) in its \
            error shape."
    ),
    paths(
        super::health,
        super::generate,
        super::ui,
        super::openai::generations,
        super::openai::edits,
        super::jobs::stream,
        super::jobs::shutdown,
        super::jobs::state,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "imagine", description = "The spec's image route (4.4) and its jobs (`/stream`, `/jobs/...`): `serviceToken` in the body of the requests that spend."),
        (name = "openai", description = "The OpenAI API's image routes: `Authorization: Bearer <serviceToken>`."),
        (name = "health", description = "Health (spec 2.1, 3.3)."),
        (name = "pages", description = "Web pages."),
    )
)]
struct ImagineApi;

/// The image listener's document, before [`crate::openapi::finish`].
pub fn document() -> utoipa::openapi::OpenApi {
    ImagineApi::openapi()
}

/// The image service's health (spec 2.1, with `model`).
#[derive(ToSchema)]
pub struct ImagineHealth {
    /// `healthy`, or `failing` (500).
    pub status: String,
    pub env: String,
    /// The image page's URL.
    pub ui: String,
    pub model: ImageModelHealth,
    /// Why the check failed (only when failing).
    pub error: Option<ErrorObject>,
}

/// The served image model.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageModelHealth {
    pub id: String,
    /// `ready`, `loading`, `unloaded` (idle past its keep-alive, unloaded by hand or for another
    /// model: the next request loads it), `unloading` or `failed`.
    pub status: String,
    /// Where the weights came from (when ready): `tiny-test-model`, `local` or `huggingface`.
    pub weights: Option<String>,
    /// Whether it is the tiny test model with random weights (when ready).
    pub test_model: Option<bool>,
    /// Requests waiting for the model (when ready).
    pub queued: Option<u64>,
    /// The LoRAs `models.toml` declares for it (when ready).
    pub loras: Option<Vec<LoraHealth>>,
    /// Why it failed (when failed).
    pub error: Option<String>,
}

/// A declared LoRA: bound to the model, or why not.
#[derive(ToSchema)]
pub struct LoraHealth {
    pub name: String,
    /// `ready` or `failed`.
    pub status: String,
    /// Why it could not be bound (when failed).
    pub error: Option<String>,
}
