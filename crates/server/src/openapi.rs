//! OpenAPI 3.1 documents: `GET /openapi.json` on every listener describes that listener's routes.
//!
//! Each service keeps its document beside its handlers (`services/<name>/openapi.rs`: a
//! `#[derive(OpenApi)]` naming the handlers, each of which carries its `#[utoipa::path]`). The
//! schemas come from the wire types' `#[derive(ToSchema)]`; a request read as raw JSON values
//! (so that every bad value gets an error naming its field) says on each field what it takes
//! (`#[schema(value_type = ...)]`). Answers built as JSON values (health) are described by a
//! schema type beside the document, and the integration test checks real answers against it.
//!
//! This module holds what the four documents share: the error bodies, the bearer scheme of the
//! OpenAI-compatible routes, the `/metrics` and `/openapi.json` operations, and [`route`],
//! which names the listener in `servers`, renders the document once and serves it.
//!
//! **No credential.** A document describes routes and types, never a user's data, so it is open
//! like health and `/metrics` (docs/decisions.md, "OpenAPI documents"). `info.version` is the
//! server's crate version; `servers` holds the listener's public URL (`[<service>] public_url`,
//! else `http://` + the bound address).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, MethodRouter};
use utoipa::openapi::path::{HttpMethod, OperationBuilder};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::server::ServerBuilder;
use utoipa::openapi::{ContentBuilder, ObjectBuilder, OpenApi, ResponseBuilder, Type};
use utoipa::{Modify, OpenApi as _, ToSchema};

/// The name of the bearer security scheme (`components.securitySchemes`).
pub const BEARER: &str = "bearer";

/// `GET /openapi.json` for a listener whose public URL is `server_url`: `doc` with the shared
/// operations and `servers` filled in, rendered once.
pub fn route<S>(doc: OpenApi, server_url: &str) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    let doc = finish(doc, server_url);
    let body = Bytes::from(serde_json::to_vec(&doc).expect("an OpenAPI document serializes"));
    get(document).with_state(body)
}

/// `doc` as a listener serves it: the operations every listener has (`/openapi.json`,
/// `/metrics`), the crate's version and the listener's URL.
pub fn finish(mut doc: OpenApi, server_url: &str) -> OpenApi {
    doc.merge(Shared::openapi());
    doc.paths
        .add_path_operation("/metrics", vec![HttpMethod::Get], metrics_operation());
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc.servers = Some(vec![ServerBuilder::new()
        .url(server_url)
        .description(Some("this listener"))
        .build()]);
    doc
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(document),
    tags((name = "operations", description = "What every listener serves to run it: its OpenAPI document and its metrics."))
)]
struct Shared;

/// This listener's OpenAPI 3.1 document.
///
/// Needs no credential: it describes routes and types, never a user's data.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    operation_id = "openapi",
    responses((status = 200, description = "This document.", content_type = "application/json", body = Object))
)]
async fn document(State(body): State<Bytes>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], body)
}

/// `GET /metrics` (`crate::metrics`): Prometheus text, no credential.
fn metrics_operation() -> utoipa::openapi::path::Operation {
    let text = ObjectBuilder::new().schema_type(Type::String).build();
    OperationBuilder::new()
        .tag("operations")
        .operation_id(Some("metrics"))
        .summary(Some("This listener's Prometheus metrics."))
        .description(Some(
            "The Prometheus text exposition format 0.0.4, every series labelled with this \
             listener's service. Needs no credential: it holds no user data.",
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("Prometheus text format 0.0.4.")
                .content(
                    "text/plain",
                    ContentBuilder::new().schema(Some(text)).build(),
                )
                .build(),
        )
        .build()
}

/// Adds the bearer scheme of the OpenAI-compatible routes to a document's components.
pub struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .description(Some(
                "A service token (`POST /token` on the auth listener) as `Authorization: Bearer \
                 <serviceToken>`: the OpenAI API's convention, used on the `/v1` routes only. \
                 The spec's routes take the token in the body's `serviceToken` field instead.",
            ))
            .build();
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

/// Adds the `x-api-key` scheme of Anthropic's Messages routes to a document's components.
pub struct ApiKeyAuth;

impl Modify for ApiKeyAuth {
    fn modify(&self, doc: &mut OpenApi) {
        let key = ApiKeyValue::with_description(
            "x-api-key",
            "A service token (`POST /token` on the auth listener) as `x-api-key`: Anthropic's \
             convention, on `/v1/messages` (which also takes it as `Authorization: Bearer`).",
        );
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme("x-api-key", SecurityScheme::ApiKey(ApiKey::Header(key)));
    }
}

// ---- error bodies -----------------------------------------------------------------------------

/// The error body of the auth, completion and image services (spec section 7).
#[derive(ToSchema)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(ToSchema)]
pub struct ErrorObject {
    #[schema(rename = "type")]
    pub kind: ErrorType,
    /// What went wrong; a field error starts with the field's name.
    pub message: String,
    /// Extra context: `field` (the request field at fault), `needed`/`available`
    /// (`InsufficientFunds`), `retryAfterSeconds` (`Overloaded`, `RateLimited`), ...
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// The error types (`error.type`): the spec's and the few Hearth adds. Statuses: README.md,
/// "Errors".
#[derive(ToSchema)]
pub enum ErrorType {
    InvalidRequest,
    InvalidCredentials,
    SessionExpired,
    InsufficientFunds,
    GatewayError,
    Overloaded,
    RateLimited,
    NotFound,
    InternalError,
}

/// The markdown service's error body (spec section 7).
#[derive(ToSchema)]
pub struct MarkdownErrorBody {
    /// `No file provided`, `No file selected`, or what failed.
    pub error: String,
}

/// The error body of the OpenAI-compatible routes (`/v1/...`).
#[derive(ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorObject,
}

#[derive(ToSchema)]
pub struct OpenAiErrorObject {
    pub message: String,
    #[schema(rename = "type")]
    pub kind: OpenAiErrorType,
    /// The request field at fault.
    #[schema(required = true)]
    pub param: Option<String>,
    /// `invalid_api_key`, `expired_api_key`, `insufficient_quota`, `rate_limit_exceeded`,
    /// `overloaded`, `model_not_found`, ...
    #[schema(required = true)]
    pub code: Option<String>,
    pub hearth: OpenAiErrorHearth,
}

/// The OpenAI API's error types, as its clients sort them.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum OpenAiErrorType {
    InvalidRequestError,
    AuthenticationError,
    InsufficientQuota,
    RateLimitError,
    NotFoundError,
    ServerError,
    ApiError,
}

/// The same error in Hearth's terms.
#[derive(ToSchema)]
pub struct OpenAiErrorHearth {
    #[schema(rename = "type")]
    pub kind: ErrorType,
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// The error body of Anthropic's Messages routes (`/v1/messages`).
#[derive(ToSchema)]
pub struct AnthropicErrorBody {
    /// Always `error`.
    #[schema(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorObject,
}

#[derive(ToSchema)]
pub struct AnthropicErrorObject {
    #[schema(rename = "type")]
    pub kind: AnthropicErrorType,
    pub message: String,
    pub hearth: OpenAiErrorHearth,
}

/// Anthropic's error types, as its clients sort them.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum AnthropicErrorType {
    InvalidRequestError,
    AuthenticationError,
    BillingError,
    NotFoundError,
    RequestTooLarge,
    RateLimitError,
    ApiError,
    OverloadedError,
}

#[cfg(test)]
mod tests;
