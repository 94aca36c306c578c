//! Resource limits and the per-conversion context that enforces them.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::{Attachments, Options};

/// Bounds on the work one conversion may do. The defaults suit a public upload service.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest input accepted, in bytes.
    pub max_input_bytes: u64,
    /// Total bytes that may be decompressed out of archives (zip members, nested archives,
    /// attachments) during one conversion, all levels together.
    pub max_unpacked_bytes: u64,
    /// Most members one archive may list.
    pub max_members: usize,
    /// Deepest nesting of archives within archives, and of XML/HTML elements walked.
    pub max_depth: usize,
    /// Deepest XML element nesting a converter follows; deeper content is flattened.
    pub max_xml_depth: usize,
    /// Wall-clock budget of one conversion, checked between pages, rows, members and elements.
    pub time_limit: Duration,
    /// Largest Markdown output, in bytes; past it the output is cut and a note added.
    pub max_output_bytes: usize,
    /// Most rows rendered per spreadsheet sheet or CSV file.
    pub max_table_rows: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: 50 * 1024 * 1024,
            max_unpacked_bytes: 512 * 1024 * 1024,
            max_members: 10_000,
            max_depth: 4,
            max_xml_depth: 256,
            time_limit: Duration::from_secs(30),
            max_output_bytes: 64 * 1024 * 1024,
            max_table_rows: 100_000,
        }
    }
}

/// How much [`Ctx::read_charged`] reads (and charges) at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Counters shared by every level of one conversion (and by the threads it may use).
#[derive(Debug)]
pub(crate) struct Budget {
    pub limits: Limits,
    /// What the conversion does beyond its limits (e-mail attachments, OCR).
    pub options: Options,
    deadline: Instant,
    unpacked: AtomicU64,
    warnings: Mutex<Vec<String>>,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        let deadline = Instant::now() + limits.time_limit;
        Budget {
            limits,
            options: Options::default(),
            deadline,
            unpacked: AtomicU64::new(0),
            warnings: Mutex::new(Vec::new()),
        }
    }

    pub fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    pub fn into_warnings(self) -> Vec<String> {
        self.warnings
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What a converter sees: the shared budget plus its own nesting depth.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub budget: &'a Budget,
    pub depth: usize,
}

impl<'a> Ctx<'a> {
    pub fn limits(&self) -> &'a Limits {
        &self.budget.limits
    }

    /// Whether e-mail attachments are converted (else listed).
    pub fn convert_attachments(&self) -> bool {
        self.budget.options.attachments == Attachments::Convert
    }

    /// Fails once the time limit has passed. Cheap: call it in every loop over input.
    pub fn check_time(&self) -> Result<()> {
        if Instant::now() > self.budget.deadline {
            Err(Error::TimedOut {
                limit: self.budget.limits.time_limit,
            })
        } else {
            Ok(())
        }
    }

    /// When the time limit passes (for work handed to other threads, which cannot share the
    /// budget itself).
    pub fn deadline(&self) -> Instant {
        self.budget.deadline
    }

    /// Whether the time limit has passed (for callbacks that cannot return our error).
    pub fn out_of_time(&self) -> bool {
        Instant::now() > self.budget.deadline
    }

    /// Accounts `bytes` of decompressed data against the unpacked-bytes limit.
    pub fn charge(&self, bytes: u64) -> Result<()> {
        let before = self
            .budget
            .unpacked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(bytes))
            })
            .unwrap_or(u64::MAX);
        let total = before.saturating_add(bytes);
        if total > self.budget.limits.max_unpacked_bytes {
            Err(Error::ExpandsTooMuch {
                limit: self.budget.limits.max_unpacked_bytes,
            })
        } else {
            Ok(())
        }
    }

    /// Reads `reader` (a decompressor) to its end into `out`, a chunk at a time, charging each
    /// chunk against the unpack budget and checking the deadline between chunks, so that a bomb
    /// stops at the budget instead of after inflating. Budget and time errors come back as the
    /// outer error; the reader's own failure (corrupt data) as the inner one, with what was read
    /// before it left in `out`.
    pub fn read_charged(
        &self,
        reader: impl Read,
        out: &mut Vec<u8>,
    ) -> Result<std::io::Result<()>> {
        self.drain_charged(reader, |chunk| out.extend_from_slice(chunk))
    }

    /// As [`Ctx::read_charged`], handing each chunk to `keep` (which may drop it: counting).
    pub fn drain_charged(
        &self,
        mut reader: impl Read,
        mut keep: impl FnMut(&[u8]),
    ) -> Result<std::io::Result<()>> {
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        loop {
            self.check_time()?;
            let n = match reader.read(&mut chunk) {
                Ok(0) => return Ok(Ok(())),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Ok(Err(e)),
            };
            self.charge(n as u64)?;
            keep(&chunk[..n]);
        }
    }

    /// Bytes that may still be unpacked.
    pub fn unpack_allowance(&self) -> u64 {
        self.budget
            .limits
            .max_unpacked_bytes
            .saturating_sub(self.budget.unpacked.load(Ordering::Relaxed))
    }

    /// A context one nesting level deeper (an archive member, an attachment).
    pub fn nested(&self) -> Result<Ctx<'a>> {
        if self.depth + 1 > self.budget.limits.max_depth {
            return Err(Error::TooDeep {
                limit: self.budget.limits.max_depth,
            });
        }
        Ok(Ctx {
            budget: self.budget,
            depth: self.depth + 1,
        })
    }

    /// Records something the user should know about a partial result.
    pub fn warn(&self, message: impl Into<String>) {
        let message = message.into();
        tracing::debug!(%message, "conversion warning");
        self.budget
            .warnings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(message);
    }
}
