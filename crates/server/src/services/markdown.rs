//! The markdown conversion service (spec sections 2.2, 2.5, 4.3, 7): `POST /` converts an
//! uploaded file with `hearth-markdown`; `GET /` health with a live self-test of the converter;
//! `GET /ui` an upload page.
//!
//! Unlike the other services, errors are `{"error": "<message>"}` (spec section 7), built here.
//! Conversions run on blocking threads, at most `max_concurrency` at once (a semaphore; a
//! request waits for a slot at most `time_limit`, then gets 503), each bounded by the library's
//! own time limit and, as a backstop, a timer here. A conversion that outlives the timer keeps
//! its slot until its thread ends, so runaway work can never exceed the concurrency limit.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::multipart::MultipartError;
use axum::extract::{DefaultBodyLimit, Multipart, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, SecondsFormat, Utc};
use hearth_markdown::{Attachments, Converter, Error as ConvertError, Limits};
use serde_json::json;
use tokio::sync::Semaphore;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::{info, instrument, warn};

use crate::app::AppState;
use crate::services::Service;

const PAGE: &str = include_str!("markdown/markdown.html");
const CARGO_LOCK: &str = include_str!("../../../../Cargo.lock");

/// State of the markdown service.
#[derive(Clone)]
pub struct MarkdownState {
    converter: Converter,
    slots: Arc<Semaphore>,
    time_limit: Duration,
    max_upload_bytes: usize,
    started: DateTime<Utc>,
    region: String,
    allowed_origins: Vec<String>,
    public_url: String,
    axum_version: String,
}

/// The `{"error": "..."}` answer of this service.
struct MdError(StatusCode, String);

impl IntoResponse for MdError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

/// The version of a package as resolved in the workspace's lock file.
fn locked_version(package: &str) -> Option<String> {
    let mut lines = CARGO_LOCK.lines();
    while let Some(line) = lines.next() {
        if line.trim() == format!("name = \"{package}\"") {
            let v = lines
                .next()?
                .trim()
                .strip_prefix("version = \"")?
                .trim_end_matches('"');
            return Some(v.to_string());
        }
    }
    None
}

/// Builds the markdown router.
pub fn router(state: AppState) -> Router {
    let config = &state.config;
    let md = &config.markdown;
    let limits = Limits {
        max_input_bytes: md.max_upload_bytes as u64,
        time_limit: md.time_limit,
        ..Limits::default()
    };
    let service = MarkdownState {
        converter: Converter::new(limits).with_attachments(md.attachments),
        slots: Arc::new(Semaphore::new(md.max_concurrency)),
        time_limit: md.time_limit,
        max_upload_bytes: md.max_upload_bytes,
        started: Utc::now(),
        region: config.region.clone(),
        allowed_origins: config.allowed_origins.clone(),
        public_url: state.urls.get(Service::Markdown).to_string(),
        axum_version: locked_version("axum")
            .map(|v| format!("axum {v}"))
            .unwrap_or_else(|| "axum 0.8".into()),
    };
    let origins: Vec<HeaderValue> = config
        .allowed_origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok())
        .collect();
    // Multipart framing on top of the file itself.
    let body_limit = md.max_upload_bytes + 64 * 1024;
    let router = Router::new()
        .route("/", get(health).post(convert))
        .route("/ui", get(page))
        .fallback(|| async { MdError(StatusCode::NOT_FOUND, "No such endpoint".into()) })
        .method_not_allowed_fallback(|| async {
            MdError(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed on this endpoint".into(),
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(service);
    if origins.is_empty() {
        router
    } else {
        let any = config.allowed_origins.iter().any(|o| o == "*");
        let cors = CorsLayer::new()
            .allow_origin(if any {
                AllowOrigin::any()
            } else {
                AllowOrigin::list(origins)
            })
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([axum::http::header::CONTENT_TYPE])
            .max_age(Duration::from_secs(3600));
        router.layer(cors)
    }
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// Runs the converter's self-test on a blocking thread.
async fn converter_works(state: &MarkdownState) -> bool {
    let converter = state.converter.clone();
    match tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || converter.self_test()),
    )
    .await
    {
        Ok(Ok(Ok(()))) => true,
        Ok(Ok(Err(e))) => {
            warn!(error = %e, "markdown self-test failed");
            false
        }
        _ => false,
    }
}

async fn health(State(state): State<MarkdownState>) -> Response {
    let up = converter_works(&state).await;
    let base = if state.public_url.is_empty() {
        "http://127.0.0.1:8083".to_string()
    } else {
        state.public_url.clone()
    };
    let body = json!({
        "status": if up { "healthy" } else { "degraded" },
        "service": "Hearth Markdown Conversion",
        "version": {
            "rust": hearth_markdown::RUSTC_VERSION,
            "axum": state.axum_version,
        },
        "components": { "converter": if up { "up" } else { "down" } },
        "server_time": Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
        "deployment_time": state.started.to_rfc3339_opts(SecondsFormat::Millis, true),
        "region": state.region,
        "allowed_origins": state.allowed_origins.join(","),
        "usage": {
            "description": "Converts an uploaded document (PDF, DOCX, PPTX, XLSX, XLS, ODS, ODT, EPUB, HTML, CSV, JSON, XML, RTF, MSG, EML, IPYNB, ZIP, images, text) to Markdown.",
            "web_interface": format!("{base}/ui"),
            "example_curl": format!("curl -F 'file=@document.pdf' {base}/"),
            "supported_methods": {
                "GET": "Health and usage information (this document).",
                "POST": format!(
                    "multipart/form-data with a part named 'file' (at most {} bytes); answers {{\"markdown\", \"original_filename\"}}. {}",
                    state.max_upload_bytes,
                    match state.converter.attachments() {
                        Attachments::List => "E-mail attachments are listed; ?attachments=convert converts them.",
                        Attachments::Convert => "E-mail attachments are converted; ?attachments=list only lists them.",
                    }
                ),
            },
        },
    });
    let status = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// `?attachments=list|convert` overrides the configured handling of e-mail attachments.
fn requested_attachments(query: Option<&str>) -> Result<Option<Attachments>, MdError> {
    let Some(query) = query else { return Ok(None) };
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "attachments" {
            return value
                .parse()
                .map(Some)
                .map_err(|e| MdError(StatusCode::BAD_REQUEST, e));
        }
    }
    Ok(None)
}

/// The room to reserve for an upload: the request's declared length (the file is most of a
/// multipart body), at most the upload limit.
fn upload_size_hint(headers: &HeaderMap, max_upload_bytes: usize) -> usize {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(0)
        .min(max_upload_bytes)
}

#[instrument(skip_all, fields(file, bytes, format))]
async fn convert(
    State(state): State<MarkdownState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    mut multipart: Multipart,
) -> Result<Response, MdError> {
    let attachments = requested_attachments(query.as_deref())?;
    let too_large = |limit: usize| {
        MdError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("File too large: the limit is {limit} bytes"),
        )
    };
    let multipart_error = |e: MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large(state.max_upload_bytes)
        } else {
            MdError(
                StatusCode::BAD_REQUEST,
                format!("Malformed multipart body: {}", e.body_text()),
            )
        }
    };
    let mut upload: Option<(String, Bytes)> = None;
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        if field.name() != Some("file") {
            continue;
        }
        let name = field.file_name().unwrap_or_default().to_string();
        // Read into one buffer sized from the request's length: growing it chunk by chunk
        // copied a large upload several times over, into fresh memory each time.
        let mut data = Vec::with_capacity(upload_size_hint(&headers, state.max_upload_bytes));
        while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
            data.extend_from_slice(&chunk);
        }
        upload = Some((name, Bytes::from(data)));
        break;
    }
    let Some((name, data)) = upload else {
        return Err(MdError(StatusCode::BAD_REQUEST, "No file provided".into()));
    };
    if name.trim().is_empty() {
        return Err(MdError(StatusCode::BAD_REQUEST, "No file selected".into()));
    }
    if data.len() > state.max_upload_bytes {
        return Err(too_large(state.max_upload_bytes));
    }
    tracing::Span::current()
        .record("file", name.as_str())
        .record("bytes", data.len());

    let permit = tokio::time::timeout(state.time_limit, state.slots.clone().acquire_owned())
        .await
        .map_err(|_| {
            MdError(
                StatusCode::SERVICE_UNAVAILABLE,
                "The converter is busy; try again shortly".into(),
            )
        })?
        .map_err(|_| {
            MdError(
                StatusCode::SERVICE_UNAVAILABLE,
                "The converter is shutting down".into(),
            )
        })?;
    let mut converter = state.converter.clone();
    if let Some(a) = attachments {
        converter = converter.with_attachments(a);
    }
    let file_name = name.clone();
    let job = tokio::task::spawn_blocking(move || {
        let result = converter.convert(data, Some(&file_name));
        drop(permit);
        result
    });
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(state.time_limit + Duration::from_secs(2), job).await;
    let result = match outcome {
        Err(_) => {
            return Err(MdError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Conversion failed: it took longer than the limit of {} s",
                    state.time_limit.as_secs()
                ),
            ))
        }
        Ok(Err(join)) => {
            return Err(MdError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Conversion failed: {join}"),
            ))
        }
        Ok(Ok(r)) => r,
    };
    match result {
        Ok(conversion) => {
            tracing::Span::current().record("format", conversion.format.name());
            info!(
                ms = started.elapsed().as_millis() as u64,
                warnings = conversion.warnings.len(),
                "converted"
            );
            Ok(
                Json(json!({ "markdown": conversion.markdown, "original_filename": name }))
                    .into_response(),
            )
        }
        Err(e) => {
            let status = match e {
                ConvertError::Unsupported { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ConvertError::Empty => StatusCode::BAD_REQUEST,
                ConvertError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            warn!(error = %e, "conversion failed");
            let message = match &e {
                ConvertError::Unsupported { what } => format!("Unsupported file type: {what}"),
                _ => format!("Conversion failed: {e}"),
            };
            Err(MdError(status, message))
        }
    }
}
