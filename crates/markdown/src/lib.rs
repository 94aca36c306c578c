//! Document bytes to Markdown: one converter per format and a registry that sniffs content.
//!
//! This crate owns format detection ([`detect`]), one converter module per format under
//! `formats/`, and the limits that keep hostile files harmless ([`Limits`]: input size, bytes
//! unpacked from archives, archive members, nesting depth, a time budget, output size). Every
//! conversion runs on a thread with a large stack (kept for reuse), and a panic inside a
//! third-party parser is caught and returned as [`Error::Crashed`]. It deliberately knows
//! nothing of HTTP, JSON wire shapes, concurrency limits or async runtimes: the server crate
//! wraps it.

mod detect;
mod error;
mod formats;
mod limits;
mod md;
mod ocr;
mod text;
mod workers;
mod xml;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

pub use bytes::Bytes;

pub use detect::{detect, Detected, Format};
pub use error::{Error, Result};
pub use limits::Limits;
pub use ocr::{Languages, Ocr, OcrEngine};
pub use text::decode as decode_text;

use limits::{Budget, Ctx};
use workers::Workers;

/// The compiler that built this library (`rustc 1.95.0 (...)`), for health reports.
pub const RUSTC_VERSION: &str = env!("HEARTH_MARKDOWN_RUSTC_VERSION");

/// Stack given to each conversion thread: parsers of nested documents recurse.
pub(crate) const CONVERSION_STACK_BYTES: usize = 64 * 1024 * 1024;

/// The result of one conversion.
#[derive(Debug, Clone)]
pub struct Conversion {
    /// The document as Markdown.
    pub markdown: String,
    /// The format the registry chose.
    pub format: Format,
    /// Notes on anything left out (a page without a text layer, an over-limit archive member).
    pub warnings: Vec<String>,
}

/// What the e-mail converters (`.eml`, `.msg`) do with attached files and messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Attachments {
    /// The message's headers and body, then a list of its attachments: name, the format their
    /// content looks like, size. Their content is left out, as markitdown leaves it out.
    #[default]
    List,
    /// Each attachment converted under its own heading, recursively, within the limits.
    Convert,
}

impl std::str::FromStr for Attachments {
    type Err = String;
    /// Parses `list` or `convert`.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "list" => Ok(Attachments::List),
            "convert" => Ok(Attachments::Convert),
            other => Err(format!(
                "attachments must be \"list\" or \"convert\", not {other:?}"
            )),
        }
    }
}

/// What a conversion does beyond its [`Limits`]: with e-mail attachments, and with pages that
/// only OCR can read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// E-mail attachments listed or converted.
    pub attachments: Attachments,
    /// When images and PDF pages are read by OCR.
    pub ocr: Ocr,
    /// The OCR languages; `None`: [`Languages::default_for`] the engine.
    pub languages: Option<Languages>,
}

/// Converts documents under a fixed set of [`Limits`], on conversion threads it keeps for reuse.
/// Cheap to clone: clones share those threads.
#[derive(Debug, Clone)]
pub struct Converter {
    limits: Limits,
    options: Options,
    workers: Arc<Workers>,
}

impl Default for Converter {
    fn default() -> Self {
        Converter::new(Limits::default())
    }
}

impl Converter {
    /// A converter enforcing `limits` that lists e-mail attachments. It keeps as many idle
    /// conversion threads as the machine has cores.
    pub fn new(limits: Limits) -> Self {
        let keep = std::thread::available_parallelism().map_or(1, |n| n.get());
        Converter {
            limits,
            options: Options::default(),
            workers: Arc::new(Workers::new(keep)),
        }
    }

    /// The same converter, doing `attachments` with e-mail attachments.
    pub fn with_attachments(mut self, attachments: Attachments) -> Self {
        self.options.attachments = attachments;
        self
    }

    /// The same converter, with these options (attachments, OCR).
    pub fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// The limits this converter enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What this converter does with e-mail attachments.
    pub fn attachments(&self) -> Attachments {
        self.options.attachments
    }

    /// What this converter does beyond its limits.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Converts `bytes`; `filename` (if known) breaks ties the content leaves open.
    ///
    /// Runs on one of the converter's threads, which have a large stack; blocks the caller until
    /// done. `bytes` is owned (a `Vec<u8>` or `Bytes` moves in without a copy) because that
    /// thread outlives the call.
    pub fn convert(&self, bytes: impl Into<Bytes>, filename: Option<&str>) -> Result<Conversion> {
        let bytes: Bytes = bytes.into();
        if bytes.len() as u64 > self.limits.max_input_bytes {
            return Err(Error::TooLarge {
                size: bytes.len() as u64,
                limit: self.limits.max_input_bytes,
            });
        }
        if bytes.is_empty() {
            return Err(Error::Empty);
        }
        let (limits, options) = (self.limits.clone(), self.options.clone());
        let filename = filename.map(str::to_owned);
        let job = move || convert_here(limits, options, &bytes, filename.as_deref());
        match self.workers.run(job) {
            Ok(Some(result)) => result,
            Ok(None) => Err(Error::Crashed {
                format: Format::Text,
                message: "the conversion thread panicked".into(),
            }),
            // No thread to be had: convert on the caller's own thread instead.
            Err(job) => job(),
        }
    }

    /// Converts built-in samples of several formats and checks the output: the health check's
    /// notion of "the converter works".
    pub fn self_test(&self) -> Result<()> {
        formats::self_test(self)
    }
}

fn convert_here(
    limits: Limits,
    options: Options,
    bytes: &[u8],
    filename: Option<&str>,
) -> Result<Conversion> {
    let format = match detect(bytes, filename) {
        Detected::Known(f) => f,
        Detected::Refused(what) => {
            return Err(Error::Unsupported {
                what: what.to_string(),
            })
        }
        Detected::Unknown => {
            return Err(Error::Unsupported {
                what: match filename.and_then(|n| n.rsplit_once('.')) {
                    Some((_, ext)) => format!("binary content with extension .{ext}"),
                    None => "unrecognised binary content".to_string(),
                },
            })
        }
    };
    let budget = Budget::new(limits).with_options(options);
    let ctx = Ctx {
        budget: &budget,
        depth: 0,
    };
    let markdown = convert_format(ctx, format, bytes, filename)?;
    let markdown = cap_output(markdown, budget.limits.max_output_bytes, &ctx);
    Ok(Conversion {
        markdown,
        format,
        warnings: budget.into_warnings(),
    })
}

/// Runs one format's converter with panics contained. Used for the top level and for nested
/// documents (archive members, attachments).
pub(crate) fn convert_format(
    ctx: Ctx<'_>,
    format: Format,
    bytes: &[u8],
    filename: Option<&str>,
) -> Result<String> {
    ctx.check_time()?;
    let run = AssertUnwindSafe(|| formats::convert(ctx, format, bytes, filename));
    match catch_unwind(run) {
        Ok(result) => result.map(|md| md::tidy(&md)),
        Err(panic) => {
            let message = panic_message(panic.as_ref());
            tracing::warn!(%format, %message, "converter panicked; contained");
            Err(Error::Crashed { format, message })
        }
    }
}

fn cap_output(mut markdown: String, max: usize, ctx: &Ctx<'_>) -> String {
    if markdown.len() > max {
        let mut cut = max;
        while !markdown.is_char_boundary(cut) {
            cut -= 1;
        }
        markdown.truncate(cut);
        markdown.push_str("\n\n*(output cut at the size limit)*\n");
        ctx.warn(format!("output cut at {max} bytes"));
    }
    markdown
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "internal parser error".to_string()
    }
}

/// Entry points into the hand-written parsers, for the fuzz targets in `fuzz/` and the
/// stress tests. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::limits::{Budget, Ctx};
    use crate::{Limits, Result};

    fn with_ctx<T>(f: impl FnOnce(Ctx<'_>) -> T) -> T {
        let budget = Budget::new(Limits::default());
        f(Ctx {
            budget: &budget,
            depth: 0,
        })
    }

    /// The RTF reader.
    pub fn rtf(data: &[u8]) -> Result<String> {
        with_ctx(|ctx| crate::formats::rtf::convert(ctx, data))
    }

    /// The MS-OXRTFCP decompressor of `.msg` bodies.
    pub fn compressed_rtf(data: &[u8]) -> Result<Vec<u8>> {
        with_ctx(|ctx| crate::formats::msg::decompress_rtf(&ctx, data))
    }

    /// The XML tree builder: returns the length of the text it kept.
    pub fn xml(data: &[u8]) -> Result<usize> {
        with_ctx(|ctx| {
            crate::xml::parse(&ctx, crate::Format::Xml, data).map(|root| root.text().len())
        })
    }

    /// Delimiter sniffing and the CSV table writer.
    pub fn csv(data: &[u8]) -> Result<String> {
        with_ctx(|ctx| crate::formats::csv::convert(ctx, crate::Format::Csv, data))
    }

    /// Format detection.
    pub fn detect(data: &[u8]) -> crate::Detected {
        crate::detect(data, None)
    }

    /// Limits of the whole-converter entry points below: small enough that a bomb the fuzzer
    /// finds shows as an error long before the fuzzer's own memory limit.
    fn converter_limits() -> Limits {
        Limits {
            max_unpacked_bytes: 64 * 1024 * 1024,
            time_limit: std::time::Duration::from_secs(10),
            max_table_rows: 10_000,
            ..Limits::default()
        }
    }

    /// Runs one format's converter on a thread with the conversion stack, as
    /// [`crate::Converter`] does; panics are not contained (the fuzzer should see them).
    fn convert_as(format: crate::Format, data: &[u8]) -> Result<String> {
        std::thread::scope(|scope| {
            let job = std::thread::Builder::new()
                .stack_size(crate::CONVERSION_STACK_BYTES)
                .spawn_scoped(scope, || {
                    let budget = Budget::new(converter_limits());
                    let ctx = Ctx {
                        budget: &budget,
                        depth: 0,
                    };
                    crate::formats::convert(ctx, format, data, None)
                })
                .expect("a conversion thread");
            job.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// The PDF converter (our stream unpacking and page checks, then pdf-extract).
    pub fn pdf(data: &[u8]) -> Result<String> {
        convert_as(crate::Format::Pdf, data)
    }

    /// The spreadsheet converter (xlsx, xlsb, xls, ods: calamine sniffs which).
    pub fn sheet(data: &[u8]) -> Result<String> {
        convert_as(crate::Format::Xlsx, data)
    }

    /// The HTML converter (tree depth check, then htmd).
    pub fn html(data: &[u8]) -> Result<String> {
        convert_as(crate::Format::Html, data)
    }
}
