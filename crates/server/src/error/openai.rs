//! Errors on the OpenAI-compatible routes (`/v1/...`), in that API's shape:
//! `{"error": {"message", "type", "param", "code"}}`, with the status from the one table
//! ([`ErrorKind::status`]) and Hearth's own type and details beside them under `hearth`.

use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::{answer, ApiError, AppJson, ErrorKind};

/// An [`ApiError`] answered in the OpenAI API's error shape.
#[derive(Debug, Clone)]
pub struct OpenAiError(pub ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        OpenAiError(e)
    }
}

impl OpenAiError {
    /// The API's `type` and `code` for each kind, as its clients sort errors (the `openai`
    /// package picks its exception class by status; `type` and `code` are for people).
    fn type_and_code(&self) -> (&'static str, Option<&'static str>) {
        match self.0.kind {
            ErrorKind::InvalidRequest
            | ErrorKind::PayloadTooLarge
            | ErrorKind::RequestTimeout
            | ErrorKind::UnsupportedMediaType
            | ErrorKind::MethodNotAllowed => ("invalid_request_error", None),
            ErrorKind::InvalidCredentials => ("authentication_error", Some("invalid_api_key")),
            ErrorKind::SessionExpired => ("authentication_error", Some("expired_api_key")),
            ErrorKind::InsufficientFunds => ("insufficient_quota", Some("insufficient_quota")),
            ErrorKind::RateLimited => ("rate_limit_error", Some("rate_limit_exceeded")),
            ErrorKind::Overloaded => ("server_error", Some("overloaded")),
            ErrorKind::NotFound => ("not_found_error", None),
            ErrorKind::GatewayError | ErrorKind::InternalError => ("api_error", None),
        }
    }

    /// The body (also sent as the last event of a stream that fails after it started).
    pub fn body(&self) -> Value {
        let (kind, code) = self.type_and_code();
        let e = &self.0;
        let code = e.details["code"].as_str().or(code);
        json!({
            "error": {
                "message": e.message,
                "type": kind,
                "param": e.details.get("field"),
                "code": code,
                "hearth": { "type": e.kind.type_name(), "details": e.details },
            }
        })
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        answer(&self.0, self.0.kind.status(), self.body())
    }
}

/// [`AppJson`] whose rejections are answered in the OpenAI shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiJson<T>(pub T);

impl<T, S> FromRequest<S> for OpenAiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = OpenAiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let AppJson(value) = AppJson::<T>::from_request(req, state).await?;
        Ok(OpenAiJson(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_kind_keeps_its_status_and_names_the_field() {
        let e = OpenAiError(ApiError::invalid_request("max_tokens", "too many"));
        let body = e.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "max_tokens");
        assert_eq!(body["error"]["hearth"]["type"], "InvalidRequest");
        let resp = OpenAiError(ApiError::insufficient_funds("1", "0")).into_response();
        assert_eq!(resp.status(), 402);
        let resp = OpenAiError(ApiError::overloaded("busy", Duration::from_secs(7)));
        let resp = resp.into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "7");
        let e = OpenAiError(ApiError::invalid_credentials("no key"));
        assert_eq!(e.body()["error"]["code"], "invalid_api_key");
        assert_eq!(e.body()["error"]["param"], Value::Null);
    }
}
