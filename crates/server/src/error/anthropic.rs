//! Errors on Anthropic's Messages routes (`/v1/messages`), in that API's shape:
//! `{"type": "error", "error": {"type", "message"}}`, with that API's statuses (an overloaded
//! engine is its 529) and Hearth's own type and details beside them under `hearth`.

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::{answer, ApiError, AppJson, ErrorKind};

/// An [`ApiError`] answered in Anthropic's error shape.
#[derive(Debug, Clone)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl AnthropicError {
    /// The API's error type and status for each kind, as its clients sort errors (the
    /// `anthropic` package picks its exception class by status).
    fn type_and_status(&self) -> (&'static str, StatusCode) {
        let status = self.0.kind.status();
        let kind = match self.0.kind {
            ErrorKind::PayloadTooLarge => "request_too_large",
            ErrorKind::InvalidRequest
            | ErrorKind::RequestTimeout
            | ErrorKind::UnsupportedMediaType
            | ErrorKind::MethodNotAllowed => "invalid_request_error",
            ErrorKind::InvalidCredentials | ErrorKind::SessionExpired => "authentication_error",
            ErrorKind::InsufficientFunds => "billing_error",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Overloaded => {
                // Anthropic's own status for an overloaded service.
                let overloaded = StatusCode::from_u16(529).unwrap_or(status);
                return ("overloaded_error", overloaded);
            }
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::GatewayError | ErrorKind::InternalError => "api_error",
        };
        (kind, status)
    }

    /// The body (also sent as the `error` event of a stream that fails after it started).
    pub fn body(&self) -> Value {
        let (kind, _) = self.type_and_status();
        let e = &self.0;
        json!({
            "type": "error",
            "error": {
                "type": kind,
                "message": e.message,
                "hearth": { "type": e.kind.type_name(), "details": e.details },
            }
        })
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let (_, status) = self.type_and_status();
        answer(&self.0, status, self.body())
    }
}

/// [`AppJson`] whose rejections are answered in Anthropic's shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnthropicJson<T>(pub T);

impl<T, S> FromRequest<S> for AnthropicJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = AnthropicError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let AppJson(value) = AppJson::<T>::from_request(req, state).await?;
        Ok(AnthropicJson(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_kind_has_anthropics_type_and_status() {
        let e = AnthropicError(ApiError::invalid_request("max_tokens", "is required"));
        assert_eq!(e.body()["type"], "error");
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        assert_eq!(e.clone().into_response().status(), 400);
        let e = AnthropicError(ApiError::insufficient_funds("1", "0"));
        assert_eq!(e.body()["error"]["type"], "billing_error");
        assert_eq!(e.into_response().status(), 402);
        let resp = AnthropicError(ApiError::overloaded("busy", Duration::from_secs(7)));
        assert_eq!(resp.body()["error"]["type"], "overloaded_error");
        let resp = resp.into_response();
        assert_eq!(resp.status().as_u16(), 529);
        assert_eq!(resp.headers()["retry-after"], "7");
        let e = AnthropicError(ApiError::payload_too_large());
        assert_eq!(e.body()["error"]["type"], "request_too_large");
        assert_eq!(e.into_response().status(), 413);
    }
}
