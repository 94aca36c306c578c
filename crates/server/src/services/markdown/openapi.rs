//! The markdown listener's OpenAPI document (spec 4.3). The service takes no credential, and
//! answers errors as `{"error": "<message>"}` (spec section 7).

use std::collections::BTreeMap;

use utoipa::openapi::path::{HttpMethod, OperationBuilder};
use utoipa::openapi::{ContentBuilder, ObjectBuilder, ResponseBuilder, Type};
use utoipa::{OpenApi, ToSchema};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hearth markdown conversion service",
        description = "Uploaded documents to Markdown (spec section 4.3). No credential. Errors \
            are `{\"error\": \"<message>\"}`."
    ),
    paths(super::health, super::convert),
    tags(
        (name = "markdown", description = "Conversion (spec 4.3)."),
        (name = "health", description = "Health (spec 2.2, 3.3)."),
        (name = "pages", description = "Web pages."),
    )
)]
struct MarkdownApi;

/// The markdown listener's document, before [`crate::openapi::finish`]; `/ui` is a closure in
/// the router, so its operation is built here.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = MarkdownApi::openapi();
    let html = ObjectBuilder::new().schema_type(Type::String).build();
    let page = OperationBuilder::new()
        .tag("pages")
        .operation_id(Some("ui"))
        .summary(Some("The upload page (spec 4.3)."))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The HTML page.")
                .content(
                    "text/html",
                    ContentBuilder::new().schema(Some(html)).build(),
                )
                .build(),
        )
        .build();
    doc.paths
        .add_path_operation("/ui", vec![HttpMethod::Get], page);
    doc
}

/// The multipart upload (spec 2.5).
#[derive(ToSchema)]
pub struct Upload {
    /// The document: PDF, Office, OpenDocument, EPUB, HTML, CSV, JSON, XML, RTF, e-mail,
    /// notebook, ZIP, image or text. Its file name must not be empty.
    #[schema(value_type = String, content_media_type = "application/octet-stream")]
    pub file: Vec<u8>,
}

/// The markdown service's health (spec 2.2).
#[derive(ToSchema)]
pub struct MarkdownHealth {
    /// `healthy`, or `degraded` (503) when no conversion worker can be started.
    pub status: String,
    /// The service's display name.
    pub service: String,
    /// `rust` and `axum`: the running process's versions, not an interface version.
    pub version: BTreeMap<String, String>,
    pub components: MarkdownComponents,
    /// ISO 8601 UTC.
    #[schema(format = DateTime)]
    pub server_time: String,
    /// When the service started, ISO 8601 UTC.
    #[schema(format = DateTime)]
    pub deployment_time: String,
    pub region: String,
    /// Comma-separated origins allowed to call the service from a browser.
    pub allowed_origins: String,
    pub usage: MarkdownUsage,
}

#[derive(ToSchema)]
pub struct MarkdownComponents {
    /// `up`, or `down` when no worker can be started.
    pub converter: String,
    /// The conversion worker processes.
    pub workers: WorkerHealth,
    /// The OCR engine (optional: without one the service stays healthy).
    pub ocr: OcrHealth,
}

/// The OCR engine, looked for once at startup.
#[derive(ToSchema)]
pub struct OcrHealth {
    /// `up`, or `unavailable` when no engine is installed (images then give their metadata,
    /// scanned pages a note, and `?ocr=force` answers 503).
    pub status: String,
    /// Its version line (`tesseract 5.3.0`); null when unavailable.
    pub engine: Option<String>,
    /// Its language models (`eng`, `fra`, ...), the names `?lang=` takes.
    pub languages: Vec<String>,
}

/// The pool of conversion worker processes.
#[derive(ToSchema)]
pub struct WorkerHealth {
    /// Workers the pool keeps.
    pub workers: u64,
    /// Workers running and ready.
    pub live: u64,
    /// Workers waiting for a document.
    pub idle: u64,
    /// Whether the last attempt to start a worker succeeded.
    pub can_start: bool,
    /// Why the last attempt to start a worker failed.
    pub start_error: Option<String>,
}

#[derive(ToSchema)]
pub struct MarkdownUsage {
    pub description: String,
    /// The upload page's URL.
    pub web_interface: String,
    pub example_curl: String,
    /// `GET` and `POST`, each with a description.
    pub supported_methods: BTreeMap<String, String>,
}

/// One chunk of `?chunks=` (`hearth_chunk::Chunk`).
#[derive(ToSchema)]
#[allow(dead_code)] // describes the answer; the chunker's type is what is sent
pub struct ChunkDoc {
    /// The chunk's Markdown; a piece of a long table or code block has the block's header (and
    /// closing fence) added.
    text: String,
    /// The titles of the headings it sits under, outermost first.
    headings: Vec<String>,
    /// Where its own text starts in `markdown`, in characters (Unicode scalar values).
    start: usize,
    /// Where it ends (exclusive), in characters.
    end: usize,
}
