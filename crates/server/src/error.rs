//! The one place that chooses HTTP statuses: every failure a JSON service answers with is an
//! [`ApiError`], rendered as `{"error": {"type", "message", "details"}}`.

use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_billing::money;
use serde::de::DeserializeOwned;
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
            ErrorKind::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `error.type` string on the wire.
    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::PayloadTooLarge => "InvalidRequest",
            ErrorKind::RequestTimeout => "InvalidRequest",
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

/// Seconds a client is told to wait after `Overloaded`.
pub const RETRY_AFTER_SECS: u32 = 1;

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

    /// A client error not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
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

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Overloaded, message)
            .with_details(json!({ "retryAfterSeconds": RETRY_AFTER_SECS }))
    }

    /// Too many of this user's requests already running (a per-user cap); retry shortly.
    pub fn rate_limited(e: crate::user_slots::SlotsFull) -> Self {
        Self::new(ErrorKind::RateLimited, e.to_string())
            .with_details(json!({ "limit": e.limit, "retryAfterSeconds": RETRY_AFTER_SECS }))
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            ErrorKind::PayloadTooLarge,
            format!("body: larger than the {limit}-byte limit"),
        )
        .with_details(json!({ "field": "body", "limitBytes": limit }))
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
        let mut resp = (self.kind.status(), axum::Json(body)).into_response();
        if matches!(self.kind, ErrorKind::Overloaded | ErrorKind::RateLimited) {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        resp
    }
}

impl From<hearth_store::Error> for ApiError {
    fn from(e: hearth_store::Error) -> Self {
        use hearth_store::Error as E;
        match e {
            E::InsufficientFunds { needed, available } => {
                ApiError::insufficient_funds(money(needed), money(available))
            }
            E::UnknownUser(u) => ApiError::not_found(format!("unknown user {u:?}")),
            E::InvalidUserId(why) => ApiError::invalid_request("userId", why),
            E::NonPositiveAmount(a) => {
                ApiError::invalid_request("amount", format!("must be positive, got {a}"))
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<hearth_billing::Error> for ApiError {
    fn from(e: hearth_billing::Error) -> Self {
        use hearth_billing::Error as E;
        match e {
            E::InsufficientFunds { needed, available } => {
                ApiError::insufficient_funds(money(needed), money(available))
            }
            // A signed-in user always has an account; without one the token outlived the data.
            E::UnknownUser(u) => {
                ApiError::invalid_credentials(format!("user {u:?} has no account; sign in again"))
                    .with_details(json!({ "userId": u }))
            }
            E::Store(e) => e.into(),
            // Margins are parsed at validation and prices at load: these are Hearth's faults.
            E::Margin(_) | E::Price(_) | E::Overflow | E::Task(_) => ApiError::internal(e),
        }
    }
}

impl From<crate::models::ModelError> for ApiError {
    fn from(e: crate::models::ModelError) -> Self {
        use crate::models::ModelError as E;
        match e {
            // Requests name validated ids: an id the registry lacks is Hearth's fault.
            E::Unknown(_) => ApiError::internal(e),
            E::StillLoading(_) | E::Unavailable { .. } => ApiError::gateway(e.to_string()),
        }
    }
}

/// JSON body extractor whose every rejection is an [`ApiError`] of type `InvalidRequest` naming
/// the field (or `body`), never axum's plain text. The body size limit is the router's
/// `DefaultBodyLimit`; exceeding it answers 413 with type `InvalidRequest`.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppJson<T>(pub T);

impl<T, S> FromRequest<S> for AppJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json"
                    || (mime.starts_with("application/") && mime.ends_with("+json"))
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::invalid_request(
                "Content-Type",
                "expected application/json",
            ));
        }
        let bytes = match axum::body::Bytes::from_request(req, state).await {
            Ok(b) => b,
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(ApiError::new(
                    ErrorKind::PayloadTooLarge,
                    "body: larger than the configured limit",
                )
                .with_details(json!({ "field": "body" })));
            }
            Err(rejection) => return Err(ApiError::invalid_request("body", rejection.body_text())),
        };
        parse_json(&bytes).map(AppJson)
    }
}

/// Parses JSON, naming the failing field: `messages[2].role: unknown variant ...`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde reads a struct from a JSON array too; every request body of ours is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::invalid_request(
            "body",
            "body: expected a JSON object, found an array",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(v) => v,
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            let field = if inner.is_syntax() || inner.is_eof() {
                "body".to_string()
            } else if path == "." || path.is_empty() {
                missing_field(&inner.to_string()).unwrap_or_else(|| "body".to_string())
            } else {
                path
            };
            return Err(json_error(&field, &inner));
        }
    };
    de.end().map_err(|e| json_error("body", &e))?;
    Ok(value)
}

fn json_error(field: &str, e: &serde_json::Error) -> ApiError {
    if e.is_syntax() || e.is_eof() {
        ApiError::invalid_request(field, format!("malformed JSON ({e})"))
    } else {
        ApiError::invalid_request(field, e)
    }
}

fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest[..rest.find('`')?].to_string())
}

impl<T: serde::Serialize> IntoResponse for AppJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Req {
        user_id: String,
        lifetime_seconds: Option<u64>,
    }

    #[test]
    fn a_missing_field_is_named() {
        let err = parse_json::<Req>(br#"{"lifetimeSeconds": 5}"#).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidRequest);
        assert_eq!(err.details["field"], "userId");
    }

    #[test]
    fn a_wrong_type_names_its_field() {
        let err = parse_json::<Req>(br#"{"userId": "a", "lifetimeSeconds": "x"}"#).unwrap_err();
        assert_eq!(err.details["field"], "lifetimeSeconds");
        assert!(
            err.message.starts_with("lifetimeSeconds:"),
            "{}",
            err.message
        );
    }

    #[test]
    fn malformed_json_is_an_invalid_request_about_the_body() {
        let err = parse_json::<Req>(br#"{"userId": "#).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidRequest);
        assert!(err.message.contains("malformed JSON"), "{}", err.message);
        let err = parse_json::<Req>(br#"{"userId": "a"} trailing"#).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidRequest);
    }

    #[test]
    fn every_kind_has_its_status_and_413_keeps_a_spec_type() {
        assert_eq!(ErrorKind::SessionExpired.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            ErrorKind::InsufficientFunds.status(),
            StatusCode::PAYMENT_REQUIRED
        );
        assert_eq!(ErrorKind::PayloadTooLarge.type_name(), "InvalidRequest");
        let resp = ApiError::overloaded("busy").into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        let resp =
            ApiError::rate_limited(crate::user_slots::SlotsFull { limit: 2 }).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }
}
