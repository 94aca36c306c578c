//! The markdown conversion service (spec sections 2.2, 2.5, 4.3, 7): `POST /` converts an
//! uploaded file with `hearth-markdown`; `GET /` health with the state of the conversion
//! workers; `GET /ui` an upload page.
//!
//! Unlike the other services, errors are `{"error": "<message>"}` (spec section 7), built here.
//! Parsers never run in this process: each conversion goes to one of `max_concurrency` warm
//! worker processes (`hearth-isolate`, `hearth convert-worker`) under memory and CPU limits,
//! killed at the time limit and replaced when they die, so a hostile upload costs that upload
//! alone. A request waits for a free worker at most `time_limit`, then gets 503.

mod chunks;
pub mod openapi;

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
use hearth_isolate::{Attachments, Limits, Ocr, Options, Pool, PoolConfig};
use hearth_markdown::OcrEngine;
use serde::Serialize;
use serde_json::json;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::{info, instrument, warn};
use utoipa::ToSchema;

use crate::error::MarkdownError;
use crate::metrics::{conversion_outcome, Conversions};
use crate::openapi::MarkdownErrorBody;
use crate::pages;
use crate::service::Service;
use crate::state::AppState;

const PAGE: &str = include_str!("markdown/markdown.html");
/// The axum this build links, as its health check reports it (recorded by `build.rs`).
const AXUM_VERSION: &str = concat!("axum ", env!("HEARTH_AXUM_VERSION"));

/// State of the markdown service.
#[derive(Clone)]
pub struct MarkdownState {
    pool: Pool,
    /// What a conversion does unless the request says otherwise (`[markdown] attachments`,
    /// `ocr`, `ocr_languages`; `?attachments=`, `?ocr=`, `?lang=`).
    options: Options,
    /// The OCR engine as health reports it, looked for once at startup.
    ocr: OcrHealth,
    max_upload_bytes: usize,
    started: DateTime<Utc>,
    region: String,
    allowed_origins: Vec<String>,
    public_url: String,
    /// Conversions by format and outcome, for `/metrics`.
    conversions: Conversions,
    /// The tokenizers `?chunks=` counts with (the model table's embedding and rerank rows).
    tokenizers: Arc<chunks::Tokenizers>,
    /// How long chunking may take, as a conversion may.
    time_limit: Duration,
}

/// Builds the markdown router and starts its conversion workers.
pub async fn router(state: AppState) -> Router {
    let config = &state.config;
    let md = &config.markdown;
    let limits = Limits {
        max_input_bytes: md.max_upload_bytes as u64,
        time_limit: md.time_limit,
        ..Limits::default()
    };
    let program = md
        .worker_program
        .clone()
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| "hearth".into());
    let mut workers = PoolConfig::new(program);
    workers.workers = md.max_concurrency;
    workers.time_limit = md.time_limit;
    workers.memory_limit_bytes = md.worker_memory_bytes;
    workers.limits = limits;
    let ocr = OcrHealth::find(&md.options).await;
    let service = MarkdownState {
        pool: Pool::start(workers).await,
        options: md.options.clone(),
        ocr,
        max_upload_bytes: md.max_upload_bytes,
        started: Utc::now(),
        region: config.region.clone(),
        allowed_origins: config.allowed_origins.clone(),
        public_url: state.urls.get(Service::Markdown).to_string(),
        conversions: Conversions::default(),
        tokenizers: Arc::new(chunks::Tokenizers::from_table(
            &state.model_table,
            &config.models,
        )),
        time_limit: md.time_limit,
    };
    let metrics = crate::metrics::route(&state, Service::Markdown, service.conversions.clone());
    let origins: Vec<HeaderValue> = config
        .allowed_origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok())
        .collect();

    // The page depends on nothing that changes while the server runs: rendered once.
    let page = Html(pages::render(
        &state,
        pages::Page {
            title: "Documents to Markdown",
            service: Service::Markdown,
            body: PAGE,
            config: json!({}),
        },
    ));
    let router = Router::new()
        .route("/", get(health).post(convert))
        .route("/ui", get(move || async move { page }))
        .route("/metrics", metrics)
        .route(
            "/openapi.json",
            crate::openapi::route(openapi::document(), state.urls.get(Service::Markdown)),
        )
        .fallback(|| async { MarkdownError::NotFound })
        .method_not_allowed_fallback(|| async { MarkdownError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(body_limit(md.max_upload_bytes)))
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

/// `healthy` (200) while conversion workers run or can be started; `degraded` (503) only when
/// no worker can be started (`components.workers` says why). `components.ocr` reports the OCR
/// engine; without one the service stays healthy (images give their metadata, scanned pages a
/// note, `?ocr=force` answers 503).
#[utoipa::path(
    get,
    path = "/",
    tag = "health",
    responses(
        (status = 200, description = "Healthy: conversion workers run or can be started.", body = openapi::MarkdownHealth),
        (status = 503, description = "Degraded: no conversion worker can be started (`components.converter` is `down`).", body = openapi::MarkdownHealth),
    )
)]
async fn health(State(state): State<MarkdownState>) -> Response {
    let workers = state.pool.health();
    let up = !workers.is_degraded();
    if !up {
        warn!(error = ?workers.start_error, "markdown health: no conversion worker can be started");
    }
    let base = if state.public_url.is_empty() {
        "http://127.0.0.1:8083".to_string()
    } else {
        state.public_url.clone()
    };
    let (word, status) = Service::Markdown.health(up);
    let body = json!({
        "status": word,
        "service": "Hearth Markdown Conversion",
        "version": {
            "rust": hearth_markdown::RUSTC_VERSION,
            "axum": AXUM_VERSION,
        },
        "components": {
            "converter": if up { "up" } else { "down" },
            "workers": workers,
            "ocr": state.ocr,
        },
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
                    "multipart/form-data with a part named 'file' (at most {} bytes); answers {{\"markdown\", \"original_filename\"}}. {} Scanned pages and images are read by OCR: ?ocr=auto|force|off (default {}), ?lang=eng+fra names the language models.",
                    state.max_upload_bytes,
                    match state.options.attachments {
                        Attachments::List => "E-mail attachments are listed; ?attachments=convert converts them.",
                        Attachments::Convert => "E-mail attachments are converted; ?attachments=list only lists them.",
                    },
                    state.options.ocr.name(),
                ),
            },
        },
    });
    (status, Json(body)).into_response()
}

/// What a conversion request asks beyond the file.
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    options: Options,
    chunks: Option<chunks::Ask>,
}

/// The configured options with the query's overrides: `?attachments=list|convert` (e-mail
/// attachments), `?ocr=auto|force|off` and `?lang=eng+fra` (OCR languages); and `?chunks=N`
/// with `?tokenizer=ID` (`chunks.rs`). A value the library's parser refuses is 400 with its
/// message. `lang` may come as `eng+fra` (a `+` that form decoding turns into a space),
/// `eng%2Bfra` or `eng fra`.
fn requested(query: Option<&str>, defaults: &Options) -> Result<Asked, MarkdownError> {
    let mut options = defaults.clone();
    let Some(query) = query else {
        return Ok(Asked {
            options,
            chunks: None,
        });
    };
    let (mut max_tokens, mut tokenizer) = (None, None);
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "attachments" => {
                options.attachments = value.parse().map_err(MarkdownError::BadQuery)?
            }
            "ocr" => options.ocr = value.parse::<Ocr>().map_err(MarkdownError::BadQuery)?,
            "lang" => {
                let value = value.replace(' ', "+");
                options.languages = Some(value.parse().map_err(MarkdownError::BadQuery)?);
            }
            "chunks" => max_tokens = Some(chunks::max_tokens(&value)?),
            "tokenizer" => tokenizer = Some(value.into_owned()),
            _ => {}
        }
    }
    let chunks = match (max_tokens, tokenizer) {
        (Some(max_tokens), tokenizer) => Some(chunks::Ask {
            max_tokens,
            tokenizer,
        }),
        (None, Some(_)) => {
            return Err(MarkdownError::BadQuery(
                "tokenizer names what counts the tokens of ?chunks=, which is missing".into(),
            ))
        }
        (None, None) => None,
    };
    Ok(Asked { options, chunks })
}

/// The OCR engine as `components.ocr` reports it: `up` with its version and language models,
/// or `unavailable` (the service stays healthy).
#[derive(Debug, Clone, Serialize)]
struct OcrHealth {
    status: &'static str,
    /// The engine's version line (`tesseract 5.3.0`).
    engine: Option<String>,
    /// Its language models (`eng`, `fra`, ...).
    languages: Vec<String>,
}

impl OcrHealth {
    /// Looks for the engine once (that runs it, so off the async threads) and says at startup
    /// what is missing: no engine at all, or configured languages it lacks.
    async fn find(options: &Options) -> OcrHealth {
        let engine = tokio::task::spawn_blocking(OcrEngine::installed)
            .await
            .ok()
            .flatten();
        let Some(engine) = engine else {
            warn!("no OCR engine (tesseract) on this machine: images give their metadata, scanned PDF pages a note, and ?ocr=force answers 503");
            return OcrHealth {
                status: "unavailable",
                engine: None,
                languages: Vec::new(),
            };
        };
        if let Some(languages) = options.languages.as_ref().filter(|l| !engine.has(l)) {
            warn!(
                configured = %languages,
                available = engine.languages.join(", "),
                "[markdown] ocr_languages names models the OCR engine lacks; OCR requests without ?lang= will fail"
            );
        }
        info!(engine = %engine.version, languages = engine.languages.join(", "), "OCR engine found");
        OcrHealth {
            status: "up",
            engine: Some(engine.version.clone()),
            languages: engine.languages.clone(),
        }
    }
}

/// The room to reserve for an upload: the request's declared length (the file is most of a
/// multipart body), at most the upload limit.
fn upload_size_hint(headers: &HeaderMap, max_upload_bytes: usize) -> usize {
    declared_length(headers).unwrap_or(0).min(max_upload_bytes)
}

/// Conversion response (spec 2.5).
#[derive(Debug, Serialize, ToSchema)]
struct ConversionResponse {
    /// The document as Markdown.
    markdown: String,
    /// The uploaded file's name.
    original_filename: String,
    /// Only with `?chunks=`: the Markdown in pieces of at most that many tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<openapi::ChunkDoc>>)]
    chunks: Option<Vec<hearth_chunk::Chunk>>,
}

/// Converts an uploaded document to Markdown (spec 4.3). No credential.
#[utoipa::path(
    post,
    path = "/",
    tag = "markdown",
    params(
        ("attachments" = Option<String>, Query, description = "E-mail attachments: `list` them, or `convert` them too (default: `[markdown] attachments`)."),
        ("ocr" = Option<String>, Query, description = "OCR of images and scanned PDF pages: `auto` (images that look like text, pages without a text layer), `force` (every image and image-bearing page; 503 without an OCR engine), or `off` (default: `[markdown] ocr`)."),
        ("lang" = Option<String>, Query, description = "OCR language models, `+`-joined (`eng+fra`); a model this machine lacks is 400 naming those it has (default: `[markdown] ocr_languages`, else chosen per page)."),
        ("chunks" = Option<usize>, Query, description = "Also answer `chunks`: the Markdown cut on its own structure into pieces of at most this many tokens (16 to 65536), special tokens included, tables and code blocks kept whole when they fit and cut with their header repeated when not. Without it the answer is the spec's exactly."),
        ("tokenizer" = Option<String>, Query, description = "Whose tokens `chunks` counts: an `[embedding]` or `[rerank]` model of the model table (default: the first embedding model)."),
    ),
    request_body(content = openapi::Upload, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The Markdown.", body = ConversionResponse),
        (status = 400, description = "`No file provided` (no `file` part), `No file selected` (an empty file name), a malformed body or query, an OCR language model this machine lacks, or an empty document.", body = MarkdownErrorBody),
        (status = 408, description = "The body came too slowly.", body = MarkdownErrorBody),
        (status = 413, description = "The file is over `[markdown] max_upload_bytes`, or unpacks past the limits.", body = MarkdownErrorBody),
        (status = 415, description = "A kind of document that is not converted.", body = MarkdownErrorBody),
        (status = 500, description = "The conversion failed (malformed file, zip or image bomb, time limit, a worker that died).", body = MarkdownErrorBody),
        (status = 503, description = "No conversion worker came free in time, or `?ocr=force` and OCR cannot run.", body = MarkdownErrorBody),
    )
)]
#[instrument(skip_all, fields(file, bytes, format))]
async fn convert(
    State(state): State<MarkdownState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    mut multipart: Multipart,
) -> Result<Response, MarkdownError> {
    let Asked { options, chunks } = requested(query.as_deref(), &state.options)?;
    let too_large = |limit: usize| MarkdownError::TooLarge { limit };
    // Refused from its declared length, before a byte of the body is read.
    if declared_length(&headers).is_some_and(|n| n > body_limit(state.max_upload_bytes)) {
        return Err(too_large(state.max_upload_bytes));
    }
    let multipart_error = |e: MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large(state.max_upload_bytes)
        } else {
            MarkdownError::Malformed(e.body_text())
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
        return Err(MarkdownError::NoFile);
    };
    if name.trim().is_empty() {
        return Err(MarkdownError::NoFileSelected);
    }
    if data.len() > state.max_upload_bytes {
        return Err(too_large(state.max_upload_bytes));
    }
    tracing::Span::current()
        .record("file", name.as_str())
        .record("bytes", data.len());

    let started = std::time::Instant::now();
    match state.pool.convert(data, Some(name.clone()), &options).await {
        Ok(conversion) => {
            let format = conversion.format.name();
            state.conversions.record(format, "ok", started.elapsed());
            tracing::Span::current().record("format", format);
            info!(
                ms = started.elapsed().as_millis() as u64,
                warnings = conversion.warnings.len(),
                "converted"
            );
            let (markdown, chunks) = match chunks {
                Some(ask) => {
                    let tokenizers = Arc::clone(&state.tokenizers);
                    let (markdown, chunks) =
                        chunks::chunks(tokenizers, conversion.markdown, ask, state.time_limit)
                            .await?;
                    (markdown, Some(chunks))
                }
                None => (conversion.markdown, None),
            };
            Ok(Json(ConversionResponse {
                markdown,
                original_filename: name,
                chunks,
            })
            .into_response())
        }
        Err(e) => {
            // The worker names no format when it fails.
            let outcome = conversion_outcome(&e);
            state
                .conversions
                .record("unknown", outcome, started.elapsed());
            warn!(error = %e, ms = started.elapsed().as_millis() as u64, "conversion failed");
            Err(MarkdownError::from(&e))
        }
    }
}

/// The request's `Content-Length`, if it declares one.
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The largest request body: the file plus room for the multipart framing around it.
fn body_limit(max_upload_bytes: usize) -> usize {
    max_upload_bytes + 64 * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_overrides_the_configured_options_and_bad_values_are_400() {
        let defaults = Options {
            attachments: Attachments::Convert,
            ..Options::default()
        };
        assert_eq!(
            requested(None, &defaults).map(|a| a.options),
            Ok(defaults.clone())
        );
        assert_eq!(
            requested(Some("x=1"), &defaults).map(|a| a.options),
            Ok(defaults.clone())
        );
        let asked = requested(Some("attachments=list&ocr=force&lang=eng+fra"), &defaults)
            .expect("valid values")
            .options;
        assert_eq!(asked.attachments, Attachments::List);
        assert_eq!(asked.ocr, Ocr::Force);
        assert_eq!(
            asked.languages.as_ref().map(|l| l.as_str()),
            Some("eng+fra")
        );
        for encoded in ["lang=eng%2Bfra", "lang=eng%20fra"] {
            let asked = requested(Some(encoded), &defaults).expect(encoded).options;
            assert_eq!(
                asked.languages.map(|l| l.to_string()).as_deref(),
                Some("eng+fra")
            );
        }
        let asked = requested(Some("chunks=256&tokenizer=minilm"), &defaults).unwrap();
        assert_eq!(
            asked.chunks,
            Some(chunks::Ask {
                max_tokens: 256,
                tokenizer: Some("minilm".into())
            })
        );
        for bad in [
            "ocr=always",
            "lang=../x",
            "lang=",
            "attachments=all",
            "chunks=0",
            "chunks=15",
            "chunks=65537",
            "chunks=-5",
            "chunks=many",
            "tokenizer=minilm",
        ] {
            let error = requested(Some(bad), &defaults).expect_err(bad);
            assert!(
                matches!(error, MarkdownError::BadQuery(_)),
                "{bad}: {error:?}"
            );
            assert_eq!(error.kind().status(), axum::http::StatusCode::BAD_REQUEST);
        }
    }
}
