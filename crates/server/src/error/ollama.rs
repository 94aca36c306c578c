//! Errors on Ollama's routes (`/api/...`), in that API's shape: `{"error": "<message>"}`, with
//! the status from the one table ([`ErrorKind::status`]) and Hearth's own type and details
//! beside it under `hearth` (the `ollama` client reads the status and `error`).

use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::{answer, ApiError, AppJson};

/// An [`ApiError`] answered in Ollama's error shape.
#[derive(Debug, Clone)]
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl OllamaError {
    /// The body (also the last line of a stream that fails after it started).
    pub fn body(&self) -> Value {
        let e = &self.0;
        json!({
            "error": e.message,
            "hearth": { "type": e.kind.type_name(), "details": e.details },
        })
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        answer(&self.0, self.0.kind.status(), self.body())
    }
}

/// [`AppJson`] whose rejections are answered in Ollama's shape. Ollama's clients send JSON
/// without always saying so, so any content type is read as JSON.
#[derive(Debug, Clone, Copy, Default)]
pub struct OllamaJson<T>(pub T);

impl<T, S> FromRequest<S> for OllamaJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = OllamaError;

    async fn from_request(mut req: Request, state: &S) -> Result<Self, Self::Rejection> {
        req.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        );
        let AppJson(value) = AppJson::<T>::from_request(req, state).await?;
        Ok(OllamaJson(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_the_error_and_the_status_the_tables() {
        let e = OllamaError(ApiError::not_found("model \"x\" not found"));
        assert_eq!(e.body()["error"], "model \"x\" not found");
        assert_eq!(e.body()["hearth"]["type"], "NotFound");
        assert_eq!(e.into_response().status(), 404);
    }
}
