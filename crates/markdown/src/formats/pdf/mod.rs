//! PDF: text in content-stream (reading) order per page through pdf-extract's glyph callbacks,
//! with our own layout pass: lines and paragraphs from positions, headings from font size,
//! grid-aligned runs of lines as tables, hyphenation joined, double-printed glyphs dropped.
//! pdf_oxide is the fallback when lopdf cannot load the file.

mod forms;
mod layout;
mod scan;
mod unpack;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use pdf_extract::{MediaBox, OutputDev, OutputError, Transform};

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;
use layout::{lines, render, unligature, Glyph, Line};

struct Collector {
    /// The conversion's deadline (a plain value, so a collector can work on another thread).
    deadline: Instant,
    page_height: f64,
    glyphs: Vec<Glyph>,
    /// Finished pages, already grouped into lines (so a long document's glyphs are not all
    /// held at once).
    pages: Vec<Vec<Line>>,
    timed_out: bool,
    count: usize,
}

impl OutputDev for Collector {
    fn begin_page(
        &mut self,
        _n: u32,
        media_box: &MediaBox,
        _art: Option<(f64, f64, f64, f64)>,
    ) -> std::result::Result<(), OutputError> {
        self.page_height = media_box.ury - media_box.lly;
        self.glyphs.clear();
        Ok(())
    }

    fn end_page(&mut self) -> std::result::Result<(), OutputError> {
        self.pages.push(lines(&self.glyphs));
        self.glyphs.clear();
        Ok(())
    }

    fn output_character(
        &mut self,
        trm: &Transform,
        width: f64,
        _spacing: f64,
        font_size: f64,
        text: &str,
    ) -> std::result::Result<(), OutputError> {
        self.count += 1;
        if self.count.is_multiple_of(2048) && Instant::now() > self.deadline {
            self.timed_out = true;
            return Err(OutputError::FormatError(std::fmt::Error));
        }
        let scale = (trm.m11 * trm.m22 - trm.m12 * trm.m21).abs().sqrt();
        let size = (font_size * scale).abs().max(0.1);
        let x = trm.m31;
        let y = self.page_height - trm.m32;
        // Fake bold and shadows print the same glyph twice at (almost) the same spot.
        let dup = self.glyphs.iter().rev().take(4).any(|g| {
            g.text == text && (g.x - x).abs() < size * 0.2 && (g.y - y).abs() < size * 0.2
        });
        if dup || text.is_empty() {
            return Ok(());
        }
        self.glyphs.push(Glyph {
            x,
            y,
            end: x + width * size,
            size,
            text: unligature(text),
        });
        Ok(())
    }

    fn begin_word(&mut self) -> std::result::Result<(), OutputError> {
        Ok(())
    }
    fn end_word(&mut self) -> std::result::Result<(), OutputError> {
        Ok(())
    }
    fn end_line(&mut self) -> std::result::Result<(), OutputError> {
        Ok(())
    }
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    unpack::precheck(&ctx, bytes, true)?;
    // pdf_oxide, the fallback, cannot be bounded from outside (it concatenates and inflates
    // what a page names, however often): it reads only files lopdf cannot load at all, never
    // one our checks have seen (and perhaps pruned).
    let loaded = catch_unwind(AssertUnwindSafe(|| pdf_extract::Document::load_mem(bytes)));
    let doc = match loaded {
        Ok(Ok(doc)) => doc,
        Ok(Err(e)) => return fallback(&ctx, bytes, Error::malformed(Format::Pdf, e)),
        Err(_) => {
            let primary = Error::malformed(Format::Pdf, "the PDF reader failed on this file");
            return fallback(&ctx, bytes, primary);
        }
    };
    match catch_unwind(AssertUnwindSafe(|| extract(&ctx, doc))) {
        Ok(read) => {
            let (pages, scanned) = read?;
            Ok(render(&ctx, pages, &scanned))
        }
        Err(_) => Err(Error::malformed(
            Format::Pdf,
            "pdf-extract failed on this file",
        )),
    }
}

/// The pages' lines (pages our checks took out come back empty, with a warning), and the OCR
/// text of the pages that need it, by page index.
fn extract(ctx: &Ctx<'_>, mut doc: pdf_extract::Document) -> Result<(Vec<Vec<Line>>, Scanned)> {
    if doc.is_encrypted() && doc.decrypt("").is_err() {
        return Err(Error::Encrypted {
            format: Format::Pdf,
        });
    }
    let scans = scan::take(ctx, &mut doc);
    unpack::unpack_streams(ctx, &mut doc)?;
    forms::check_pages(ctx, &mut doc)?;
    let numbers: Vec<u32> = doc.get_pages().keys().copied().collect();
    let deadline = ctx.deadline();
    // Long documents are read in page ranges on several threads (pdf-extract keeps no state
    // from one page to the next, so the ranges are independent); short ones on this thread.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_PDF_THREADS)
        .min(numbers.len() / PAGES_PER_THREAD)
        .max(1);
    let parts: Vec<PagesRead> = if threads == 1 {
        vec![read_pages(&doc, deadline, &numbers, true)]
    } else {
        let chunk = numbers.len().div_ceil(threads);
        let doc = &doc;
        std::thread::scope(|scope| {
            let handles: Vec<_> = numbers
                .chunks(chunk)
                .map(|range| {
                    std::thread::Builder::new()
                        .name("hearth-markdown-pdf".into())
                        .stack_size(PDF_THREAD_STACK_BYTES)
                        .spawn_scoped(scope, move || read_pages(doc, deadline, range, false))
                })
                .collect();
            handles
                .into_iter()
                .zip(numbers.chunks(chunk))
                .map(|(handle, range)| match handle {
                    Ok(h) => h.join().unwrap_or_else(|_| PagesRead::failed(range)),
                    // No thread to be had: read the range here.
                    Err(_) => read_pages(doc, deadline, range, false),
                })
                .collect()
        })
    };
    let mut out = Vec::with_capacity(numbers.len());
    for part in parts {
        if part.timed_out {
            return Err(Error::TimedOut {
                limit: ctx.limits().time_limit,
            });
        }
        for n in part.failed {
            ctx.warn(format!("page {n}: could not be read completely"));
        }
        out.extend(part.pages);
    }
    let scanned = scan::read(ctx, scans, &out, &numbers)?;
    Ok((out, scanned))
}

/// OCR text by page index.
type Scanned = std::collections::HashMap<usize, String>;

/// Most threads one PDF is read on, and the fewest pages worth a thread of their own. A page
/// of text takes a millisecond or more to read, a thread well under one to start: on 2 cores a
/// 5-page paper read 36% faster on two threads and a 19-page report 30% faster (at 24 pages a
/// thread, both had been read on one).
const MAX_PDF_THREADS: usize = 4;
const PAGES_PER_THREAD: usize = 2;
/// pdf-extract recurses through form XObjects (their nesting is capped by `forms`).
const PDF_THREAD_STACK_BYTES: usize = 32 * 1024 * 1024;

/// The pages of one range, grouped into lines, and the page numbers that failed.
struct PagesRead {
    pages: Vec<Vec<Line>>,
    failed: Vec<u32>,
    timed_out: bool,
}

impl PagesRead {
    /// A range whose thread died: every page reported, none read.
    fn failed(range: &[u32]) -> Self {
        PagesRead {
            pages: vec![Vec::new(); range.len()],
            failed: range.to_vec(),
            timed_out: false,
        }
    }
}

/// Reads the pages numbered `range` (in document order). With `whole` (the range is every
/// page) the document is first read in one pass: pdf-extract's per-page entry point rebuilds
/// the page list on every call, which is quadratic in the page count. When that pass fails or
/// panics, or for a part of the document, pages are read one by one, so a bad page costs only
/// itself.
fn read_pages(
    doc: &pdf_extract::Document,
    deadline: Instant,
    range: &[u32],
    whole: bool,
) -> PagesRead {
    let mut collector = Collector {
        deadline,
        page_height: 792.0,
        glyphs: Vec::new(),
        pages: Vec::new(),
        timed_out: false,
        count: 0,
    };
    let mut read = PagesRead {
        pages: Vec::with_capacity(range.len()),
        failed: Vec::new(),
        timed_out: false,
    };
    if whole {
        let result = catch_unwind(AssertUnwindSafe(|| {
            pdf_extract::output_doc(doc, &mut collector)
        }));
        if collector.timed_out {
            read.timed_out = true;
            return read;
        }
        if matches!(result, Ok(Ok(()))) && collector.pages.len() == range.len() {
            read.pages = collector.pages;
            return read;
        }
        collector.pages.clear();
    }
    for &n in range {
        if Instant::now() > deadline {
            read.timed_out = true;
            return read;
        }
        collector.glyphs.clear();
        let before = collector.pages.len();
        let result = catch_unwind(AssertUnwindSafe(|| {
            pdf_extract::output_doc_page(doc, &mut collector, n)
        }));
        if collector.timed_out {
            read.timed_out = true;
            return read;
        }
        let page = if collector.pages.len() > before {
            collector.pages.pop().unwrap_or_default()
        } else {
            lines(&collector.glyphs)
        };
        if !matches!(result, Ok(Ok(()))) {
            read.failed.push(n);
        }
        read.pages.push(page);
    }
    read
}

/// pdf_oxide, for files lopdf cannot load: only after [`unpack::precheck`] has found its
/// input's streams within the budget and the page contents it would join within bounds.
fn fallback(ctx: &Ctx<'_>, bytes: &[u8], primary: Error) -> Result<String> {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<String> {
        unpack::precheck(ctx, bytes, false)?;
        let doc = pdf_oxide::PdfDocument::from_bytes(bytes.to_vec())
            .map_err(|e| Error::malformed(Format::Pdf, e))?;
        let count = doc
            .page_count()
            .map_err(|e| Error::malformed(Format::Pdf, e))?;
        let mut blocks = Vec::new();
        for i in 0..count {
            ctx.check_time()?;
            match doc.extract_text(i) {
                Ok(t) if !t.trim().is_empty() => blocks.push(t),
                Ok(_) => blocks.push(format!(
                    "*(page {} has no text layer; it may be a scanned image)*",
                    i + 1
                )),
                Err(e) => ctx.warn(format!("page {}: {e}", i + 1)),
            }
        }
        Ok(md::join_blocks(blocks))
    }));
    match result {
        Ok(Ok(text)) => {
            ctx.warn("read with the fallback PDF parser");
            Ok(text)
        }
        Ok(Err(e @ (Error::TimedOut { .. } | Error::ExpandsTooMuch { .. }))) => Err(e),
        _ => Err(primary),
    }
}

#[cfg(test)]
mod tests;
