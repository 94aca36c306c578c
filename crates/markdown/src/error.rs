//! The one error type of the converter library.

use std::time::Duration;

use crate::detect::Format;

/// Why a conversion failed. Every variant is something a caller can act on or show to a user;
/// none of them is a crash: converter panics are caught and reported as [`Error::Crashed`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is empty.
    #[error("the file is empty")]
    Empty,
    /// Neither the content nor the file name match a format this library converts.
    #[error("unsupported file type: {what}")]
    Unsupported { what: String },
    /// The input is larger than [`crate::Limits::max_input_bytes`].
    #[error("the file is {size} bytes; the limit is {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    /// The file claims to be `format` but could not be read as one.
    #[error("could not read the {format} file: {reason}")]
    Malformed { format: Format, reason: String },
    /// The document is encrypted and no password is known.
    #[error("the {format} file is encrypted")]
    Encrypted { format: Format },
    /// Archives (zip-based formats, nested archives, attachments) expand past the limit.
    #[error("the archive expands to more than {limit} bytes (zip bomb?)")]
    ExpandsTooMuch { limit: u64 },
    /// An archive holds more members than allowed.
    #[error("the archive holds {count} members; the limit is {limit}")]
    TooManyMembers { count: usize, limit: usize },
    /// Archives or documents nest deeper than allowed.
    #[error("the document nests deeper than {limit} levels")]
    TooDeep { limit: usize },
    /// The conversion ran past [`crate::Limits::time_limit`].
    #[error("the conversion took longer than the limit of {limit:?}")]
    TimedOut { limit: Duration },
    /// An image declares more pixels than a page may have (a decompression bomb says so in its
    /// header); refused before any pixel is decoded.
    #[error("the image is {width}x{height} pixels; a page may have at most {limit_pixels} pixels")]
    ImageTooLarge {
        width: u64,
        height: u64,
        limit_pixels: u64,
    },
    /// A multi-page image has more pages than allowed.
    #[error("the image has more than {limit} pages")]
    TooManyPages { limit: usize },
    /// The request names OCR languages the engine does not have.
    #[error("no OCR model for {languages}; this machine has: {available}")]
    UnknownLanguage {
        languages: String,
        available: String,
    },
    /// OCR was needed and could not run (no engine on the machine, or the engine failed).
    #[error("OCR failed: {reason}")]
    Ocr { reason: String },
    /// A converter (usually a third-party parser) panicked on this input; the panic was contained.
    #[error("the {format} converter failed on this file: {message}")]
    Crashed { format: Format, message: String },
}

impl Error {
    pub(crate) fn malformed(format: Format, reason: impl std::fmt::Display) -> Self {
        Error::Malformed {
            format,
            reason: reason.to_string(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
