//! [`AppJson`], the JSON body extractor of the authentication, completion and image services.

use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::ApiError;

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
                return Err(ApiError::payload_too_large());
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
