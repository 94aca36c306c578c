//! The markdown service's configuration (`[markdown]`): uploads, conversion limits and the
//! worker processes.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{addr, invalid, public_url, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMarkdownConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
    /// Largest uploaded file in bytes (default 50 MiB).
    pub max_upload_bytes: Option<usize>,
    /// Conversions running at once (default: the number of CPUs).
    pub max_concurrency: Option<usize>,
    /// Seconds one conversion may take (default 30).
    pub time_limit_secs: Option<u64>,
    /// E-mail attachments: `list` (default) or `convert`; a request may ask otherwise.
    pub attachments: Option<String>,
    /// When images and PDF pages are read by OCR: `auto` (default), `force` or `off`; a request
    /// may ask otherwise (`?ocr=`).
    pub ocr: Option<String>,
    /// The OCR language models, `+`-joined (`eng+fra`); default: chosen per page by the
    /// converter. A request may name others (`?lang=`).
    pub ocr_languages: Option<String>,
    /// The program run as `PROGRAM convert-worker` for each conversion worker (default: this
    /// `hearth` executable).
    pub worker_program: Option<PathBuf>,
    /// Memory each conversion worker may map beyond what it maps at startup, in MiB (default
    /// 2048, at least 256).
    pub worker_memory_mb: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct MarkdownConfig {
    pub addr: SocketAddr,
    pub public_url: Option<String>,
    pub max_upload_bytes: usize,
    pub max_concurrency: usize,
    pub time_limit: std::time::Duration,
    /// What a conversion does unless the request says otherwise: e-mail attachments, OCR mode
    /// and languages.
    pub options: hearth_markdown::Options,
    /// `None`: the running executable.
    pub worker_program: Option<PathBuf>,
    pub worker_memory_bytes: u64,
}

impl RawMarkdownConfig {
    pub(super) fn resolve(&self) -> Result<MarkdownConfig, ConfigError> {
        Ok(MarkdownConfig {
            addr: addr("markdown.addr", &self.addr, "127.0.0.1:8083")?,
            public_url: public_url("markdown.public_url", &self.public_url)?,
            max_upload_bytes: match self.max_upload_bytes.unwrap_or(50 * 1024 * 1024) {
                0 => return Err(invalid("markdown.max_upload_bytes", "must be at least 1")),
                n => n,
            },
            max_concurrency: match self.max_concurrency {
                Some(0) => return Err(invalid("markdown.max_concurrency", "must be at least 1")),
                Some(n) => n,
                None => std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(2),
            },
            time_limit: match self.time_limit_secs.unwrap_or(30) {
                0 => return Err(invalid("markdown.time_limit_secs", "must be at least 1")),
                n => std::time::Duration::from_secs(n),
            },
            options: hearth_markdown::Options {
                attachments: match self.attachments.as_deref() {
                    None => hearth_markdown::Attachments::default(),
                    Some(s) => s.parse().map_err(|e| invalid("markdown.attachments", e))?,
                },
                ocr: match self.ocr.as_deref() {
                    None => hearth_markdown::Ocr::default(),
                    Some(s) => s.parse().map_err(|e| invalid("markdown.ocr", e))?,
                },
                languages: self
                    .ocr_languages
                    .as_deref()
                    .map(str::parse)
                    .transpose()
                    .map_err(|e| invalid("markdown.ocr_languages", e))?,
            },
            worker_program: self.worker_program.clone(),
            worker_memory_bytes: match self.worker_memory_mb.unwrap_or(2048) {
                n if n < 256 => {
                    return Err(invalid("markdown.worker_memory_mb", "must be at least 256"))
                }
                n => n * 1024 * 1024,
            },
        })
    }
}
