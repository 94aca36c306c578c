//! The markdown service's errors. Spec section 7 gives this service its own body shape,
//! `{"error": "<message>"}`; the statuses come from the same table as every other error
//! ([`ErrorKind::status`]).

use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_isolate::{ConvertErrorKind, Error as IsolateError};
use serde_json::json;

use std::time::Duration;

use super::{set_retry_after, whole_seconds, ErrorKind};

/// Every way a markdown request can fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkdownError {
    /// The multipart body has no `file` part.
    NoFile,
    /// The `file` part has an empty file name (a form submitted with nothing chosen).
    NoFileSelected,
    /// The upload is over `max_upload_bytes`, declared or read.
    TooLarge {
        limit: usize,
    },
    /// The multipart framing is broken.
    Malformed(String),
    /// A query parameter with a value the service does not know.
    BadQuery(String),
    /// A document of a kind that is not converted (executables, legacy Office, encrypted).
    Unsupported(String),
    /// A document with nothing in it.
    Empty(String),
    /// A document whose content unpacks past the limits.
    ContentTooLarge(String),
    /// The conversion failed: a malformed file, the time limit, a worker that died.
    Failed(String),
    /// No worker came free in time, or none can start; retry after the pool's figure.
    Unavailable {
        why: String,
        retry_after: Duration,
    },
    /// OCR was needed (`?ocr=force`) and could not run: no engine on this machine, or the
    /// engine failed. No `Retry-After`: waiting does not install one.
    OcrUnavailable(String),
    /// The body stalled or trickled (`serve::BodyTimeout`).
    BodyTimeout(String),
    NotFound,
    MethodNotAllowed,
}

impl MarkdownError {
    /// Its row in the one status table.
    pub fn kind(&self) -> ErrorKind {
        use MarkdownError as M;
        match self {
            M::NoFile | M::NoFileSelected | M::Malformed(_) | M::BadQuery(_) | M::Empty(_) => {
                ErrorKind::InvalidRequest
            }
            M::TooLarge { .. } | M::ContentTooLarge(_) => ErrorKind::PayloadTooLarge,
            M::Unsupported(_) => ErrorKind::UnsupportedMediaType,
            M::Failed(_) => ErrorKind::InternalError,
            M::Unavailable { .. } | M::OcrUnavailable(_) => ErrorKind::Overloaded,
            M::BodyTimeout(_) => ErrorKind::RequestTimeout,
            M::NotFound => ErrorKind::NotFound,
            M::MethodNotAllowed => ErrorKind::MethodNotAllowed,
        }
    }

    /// The `error` string.
    pub fn message(&self) -> String {
        use MarkdownError as M;
        match self {
            M::NoFile => "No file provided".into(),
            M::NoFileSelected => "No file selected".into(),
            M::TooLarge { limit } => format!("File too large: the limit is {limit} bytes"),
            M::Malformed(why) => format!("Malformed multipart body: {why}"),
            M::BadQuery(why) => why.clone(),
            M::Unsupported(what) => format!("Unsupported file type: {what}"),
            M::Empty(why) | M::ContentTooLarge(why) | M::Failed(why) => {
                format!("Conversion failed: {why}")
            }
            M::Unavailable { why, .. } | M::OcrUnavailable(why) => {
                format!("The converter is unavailable: {why}")
            }
            M::BodyTimeout(why) => format!("body: {why}"),
            M::NotFound => "No such endpoint".into(),
            M::MethodNotAllowed => "Method not allowed on this endpoint".into(),
        }
    }
}

impl IntoResponse for MarkdownError {
    fn into_response(self) -> Response {
        let kind = self.kind();
        let retry_after = match &self {
            MarkdownError::Unavailable { retry_after, .. } => Some(whole_seconds(*retry_after)),
            _ => None,
        };
        let mut resp = (kind.status(), Json(json!({ "error": self.message() }))).into_response();
        set_retry_after(&mut resp, retry_after);
        resp
    }
}

impl From<&IsolateError> for MarkdownError {
    fn from(e: &IsolateError) -> Self {
        match e {
            IsolateError::Convert { kind, message } => match kind {
                ConvertErrorKind::Unsupported { what } => MarkdownError::Unsupported(what.clone()),
                ConvertErrorKind::Empty => MarkdownError::Empty(message.clone()),
                ConvertErrorKind::TooLarge => MarkdownError::ContentTooLarge(message.clone()),
                // A language the request named and this machine lacks: the query's mistake.
                ConvertErrorKind::UnknownLanguage => MarkdownError::BadQuery(message.clone()),
                ConvertErrorKind::Ocr => MarkdownError::OcrUnavailable(message.clone()),
                // Bombs and broken files, as a zip bomb (`ExpandsTooMuch`) is: the document
                // could not be converted (500, spec section 7).
                ConvertErrorKind::Malformed
                | ConvertErrorKind::Encrypted
                | ConvertErrorKind::ExpandsTooMuch
                | ConvertErrorKind::TooManyMembers
                | ConvertErrorKind::TooDeep
                | ConvertErrorKind::TimedOut
                | ConvertErrorKind::ImageTooLarge
                | ConvertErrorKind::TooManyPages
                | ConvertErrorKind::Crashed => MarkdownError::Failed(message.clone()),
            },
            IsolateError::Crashed { cause } => MarkdownError::Failed(cause.to_string()),
            IsolateError::Busy { .. } | IsolateError::Unavailable { .. } => {
                MarkdownError::Unavailable {
                    why: e.to_string(),
                    retry_after: e.retry_after().unwrap_or(hearth_isolate::RETRY_AFTER),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    /// The library's OCR errors: a missing model the request named is the request's fault
    /// (400, naming what is there), a missing engine the service's (503, no Retry-After), an
    /// image bomb a failed conversion like a zip bomb (500). Messages are the library's.
    #[test]
    fn ocr_errors_map_to_the_request_the_service_or_the_document() {
        let map = |e: hearth_markdown::Error| {
            let message = e.to_string();
            let mapped = MarkdownError::from(&IsolateError::from(e));
            assert!(mapped.message().ends_with(&message), "{mapped:?}");
            let response = mapped.clone().into_response();
            assert!(response.headers().get("retry-after").is_none());
            (response.status(), mapped.message())
        };
        let (status, message) = map(hearth_markdown::Error::UnknownLanguage {
            languages: "xyz".into(),
            available: "eng, fra".into(),
        });
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(message, "no OCR model for xyz; this machine has: eng, fra");
        let (status, message) = map(hearth_markdown::Error::Ocr {
            reason: "no OCR engine on this machine (tesseract is not installed)".into(),
        });
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(message.starts_with("The converter is unavailable: OCR failed"));
        let bombs = [
            hearth_markdown::Error::ImageTooLarge {
                width: 100_000,
                height: 100_000,
                limit_pixels: 1 << 28,
            },
            hearth_markdown::Error::TooManyPages { limit: 500 },
            hearth_markdown::Error::ExpandsTooMuch { limit: 1 << 29 },
        ];
        for bomb in bombs {
            let (status, message) = map(bomb);
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
            assert!(message.starts_with("Conversion failed: "), "{message}");
        }
    }

    #[test]
    fn each_failure_has_its_status_and_the_spec_shape() {
        let cases = [
            (
                MarkdownError::NoFile,
                StatusCode::BAD_REQUEST,
                "No file provided",
            ),
            (
                MarkdownError::TooLarge { limit: 5 },
                StatusCode::PAYLOAD_TOO_LARGE,
                "File too large",
            ),
            (
                MarkdownError::Unsupported("an executable".into()),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported file type",
            ),
            (
                MarkdownError::Failed("truncated".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "Conversion failed",
            ),
            (
                MarkdownError::Unavailable {
                    why: "busy".into(),
                    retry_after: Duration::from_secs(2),
                },
                StatusCode::SERVICE_UNAVAILABLE,
                "The converter is unavailable",
            ),
            (
                MarkdownError::BodyTimeout("no data arrived for 2 s".into()),
                StatusCode::REQUEST_TIMEOUT,
                "body: no data arrived",
            ),
            (
                MarkdownError::MethodNotAllowed,
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
            ),
        ];
        for (error, status, starts) in cases {
            assert_eq!(error.kind().status(), status, "{error:?}");
            assert!(error.message().starts_with(starts), "{error:?}");
            assert_eq!(error.into_response().status(), status);
        }
    }
}
