//! The one place that chooses HTTP statuses. Every failure the authentication, completion and
//! image services answer is an [`ApiError`], rendered as `{"error": {"type", "message",
//! "details"}}`; every failure of the markdown service is a [`MarkdownError`], rendered as
//! `{"error": "<message>"}` (spec section 7); on the OpenAI-compatible routes an [`ApiError`]
//! is rendered in that API's shape by [`OpenAiError`], and on Anthropic's Messages routes by
//! [`AnthropicError`] (whose one departure, an overloaded engine's 529, is that API's), and on
//! Ollama's by [`OllamaError`]. All take their status from one table,
//! [`ErrorKind::status`] (health answers take theirs from the service table,
//! `Service::health`). The typed errors of the crates below are mapped here once (`from.rs`).

mod anthropic;
mod from;
mod json;
mod markdown;
mod ollama;
mod openai;

pub use anthropic::{AnthropicError, AnthropicJson};
pub use json::{parse_json, AppJson};
pub use markdown::MarkdownError;
pub use ollama::{OllamaError, OllamaJson};
pub use openai::{OpenAiError, OpenAiJson};

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The error types of the spec's section 7, plus the few Hearth adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    InvalidCredentials,
    SessionExpired,
    InsufficientFunds,
    GatewayError,
    /// Too much work queued; retry later.
    Overloaded,
    /// The user already runs as many requests of this service as one user may (429).
    RateLimited,
    NotFound,
    /// A body over the configured limit; reported with type `InvalidRequest`.
    PayloadTooLarge,
    /// A body that stalled or trickled (`serve::BodyTimeout`); reported with type `InvalidRequest`.
    RequestTimeout,
    /// A document of a kind the markdown service does not convert (415).
    UnsupportedMediaType,
    /// A path that exists, asked with another method (405, the markdown service).
    MethodNotAllowed,
    InternalError,
}

impl ErrorKind {
    /// HTTP status for each kind; README.md "Errors" documents this table.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::InvalidCredentials | ErrorKind::SessionExpired => StatusCode::UNAUTHORIZED,
            ErrorKind::InsufficientFunds => StatusCode::PAYMENT_REQUIRED,
            ErrorKind::GatewayError => StatusCode::BAD_GATEWAY,
            ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `error.type` string on the wire.
    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::PayloadTooLarge => "InvalidRequest",
            ErrorKind::RequestTimeout
            | ErrorKind::UnsupportedMediaType
            | ErrorKind::MethodNotAllowed => "InvalidRequest",
            ErrorKind::InvalidCredentials => "InvalidCredentials",
            ErrorKind::SessionExpired => "SessionExpired",
            ErrorKind::InsufficientFunds => "InsufficientFunds",
            ErrorKind::GatewayError => "GatewayError",
            ErrorKind::Overloaded => "Overloaded",
            ErrorKind::RateLimited => "RateLimited",
            ErrorKind::NotFound => "NotFound",
            ErrorKind::InternalError => "InternalError",
        }
    }
}

/// An error as a JSON service answers it.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub details: Value,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.type_name(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            details: json!({}),
        }
    }

    /// Adds context to `details` (must be a JSON object to merge; anything else replaces).
    pub fn with_details(mut self, details: Value) -> Self {
        match (&mut self.details, details) {
            (Value::Object(into), Value::Object(from)) => into.extend(from),
            (slot, other) => *slot = other,
        }
        self
    }

    /// A client error about one field, named in the message and in `details.field`.
    pub fn invalid_request(field: &str, message: impl std::fmt::Display) -> Self {
        Self::new(ErrorKind::InvalidRequest, format!("{field}: {message}"))
            .with_details(json!({ "field": field }))
    }

    pub fn invalid_credentials(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidCredentials, message)
    }

    pub fn session_expired() -> Self {
        Self::new(ErrorKind::SessionExpired, "the service token has expired")
    }

    pub fn insufficient_funds(
        needed: impl std::fmt::Display,
        available: impl std::fmt::Display,
    ) -> Self {
        Self::new(
            ErrorKind::InsufficientFunds,
            format!("insufficient funds: {needed} needed, {available} available"),
        )
        .with_details(json!({ "needed": needed.to_string(), "available": available.to_string() }))
    }

    pub fn gateway(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::GatewayError, message)
    }

    /// `Overloaded`, retry after `after`: the figure of whoever refused (the scheduler, the image
    /// worker, the converter pool), never one chosen here. It goes in `details.retryAfterSeconds`
    /// and the `Retry-After` header, in whole seconds (rounded up, at least one).
    pub fn overloaded(message: impl Into<String>, after: Duration) -> Self {
        Self::new(ErrorKind::Overloaded, message)
            .with_details(json!({ "retryAfterSeconds": whole_seconds(after) }))
    }

    /// Too many of this user's requests already running (a per-user cap); retry after the
    /// cap's own figure (`user_slots.rs`).
    pub fn rate_limited(e: crate::user_slots::SlotsFull) -> Self {
        let secs = whole_seconds(e.retry_after);
        Self::new(ErrorKind::RateLimited, e.to_string())
            .with_details(json!({ "limit": e.limit, "retryAfterSeconds": secs }))
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// A body over the router's `DefaultBodyLimit` (`max_body_bytes`).
    pub fn payload_too_large() -> Self {
        Self::new(
            ErrorKind::PayloadTooLarge,
            "body: larger than the configured limit",
        )
        .with_details(json!({ "field": "body" }))
    }

    /// An internal failure: the cause is logged here, once; the client gets a plain message.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(ErrorKind::InternalError, "internal error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": { "type": self.kind.type_name(), "message": self.message, "details": self.details }
        });
        answer(&self, self.kind.status(), body)
    }
}

/// `body` with `status`, and `Retry-After` when `e` carries a figure: every JSON error shape's
/// answer (the spec's, OpenAI's, Anthropic's, Ollama's).
pub(crate) fn answer(e: &ApiError, status: StatusCode, body: Value) -> Response {
    let mut resp = (status, axum::Json(body)).into_response();
    set_retry_after(&mut resp, e.details["retryAfterSeconds"].as_u64());
    resp
}

/// A retry figure in the whole seconds `Retry-After` takes: rounded up, at least one.
pub(crate) fn whole_seconds(after: Duration) -> u64 {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    secs.max(1)
}

/// `Retry-After: secs` when the error carries a figure (`Overloaded` and `RateLimited` always
/// do: their constructors take one).
pub(crate) fn set_retry_after(resp: &mut Response, secs: Option<u64>) {
    if let Some(secs) = secs {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
}

/// JSON 404 and 405 answers in the [`ApiError`] shape, for the services that use it.
pub fn json_fallbacks<S: Clone + Send + Sync + 'static>(
    router: axum::Router<S>,
) -> axum::Router<S> {
    router
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorKind::InvalidRequest,
                "method not allowed on this endpoint",
            )
        })
}

#[cfg(test)]
mod tests;
