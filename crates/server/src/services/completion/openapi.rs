//! The completion listener's OpenAPI document: the spec's routes (4.2), which take
//! `serviceToken` in the body, and the OpenAI-compatible routes (`/v1/...`), which take it as a
//! bearer token.

use std::collections::BTreeMap;

use utoipa::{OpenApi, ToSchema};

use crate::openapi::{AnthropicErrorBody, ApiKeyAuth, BearerAuth, ErrorObject};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hearth completion service",
        description = "Chat completions from local weights (spec section 4.2), one-shot or as \
            server-sent events, billed against the user's balance; and the same through the \
            OpenAI API's routes (`/v1/...`) and Anthropic's Messages API (`/v1/messages`). The \
            spec's routes take the service token in the body's `serviceToken` field; the `/v1` \
            routes take it as `Authorization: Bearer` (`/v1/messages` also as `x-api-key`). \
            Any route that reads a body may also answer 408 (the body came too slowly) or 413 \
            (too large) in its error shape."
    ),
    paths(
        super::health,
        super::complete,
        super::stream,
        super::shutdown_stream,
        super::ui,
        super::openai::models,
        super::openai::model,
        super::openai::chat,
        super::openai::text,
        super::embeddings::create,
        super::rerank::rerank,
        super::responses::create,
        super::anthropic::messages,
        super::anthropic::count_tokens,
        super::ollama::chat,
        super::ollama::generate,
        super::ollama::embed,
        super::ollama::tags,
        super::ollama::show,
        super::ollama::ps,
        super::ollama::version,
    ),
    components(schemas(AnthropicErrorBody)),
    modifiers(&BearerAuth, &ApiKeyAuth),
    tags(
        (name = "completion", description = "The spec's completion routes (4.2): `serviceToken` in the body."),
        (name = "openai", description = "The OpenAI API's routes: `Authorization: Bearer <serviceToken>`."),
        (name = "anthropic", description = "Anthropic's Messages API: `x-api-key: <serviceToken>` (or a bearer token)."),
        (name = "ollama", description = "Ollama's API: `Authorization: Bearer <serviceToken>` on the routes that spend."),
        (name = "health", description = "Health (spec 2.1, 3.3)."),
        (name = "pages", description = "Web pages."),
    )
)]
struct CompletionApi;

/// The completion listener's document, before [`crate::openapi::finish`].
pub fn document() -> utoipa::openapi::OpenApi {
    CompletionApi::openapi()
}

/// A message of the spec's completion request (spec 2.4).
#[derive(ToSchema)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// The spec's roles, and `assistant` for earlier answers.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// The completion service's health (spec 2.1, with `models`).
#[derive(ToSchema)]
pub struct CompletionHealth {
    /// `healthy`, or `failing` (500) when the store fails its round trip.
    pub status: String,
    pub env: String,
    /// The chat page's URL.
    pub ui: String,
    /// Each model id: `ready`, `loading`, `unloaded` (its next request loads it), `unloading`
    /// or `unavailable: <why>`. A model that failed to load does not fail the health check: its
    /// requests answer `GatewayError`.
    pub models: BTreeMap<String, String>,
    /// Why the check failed (only when failing).
    pub error: Option<ErrorObject>,
}
