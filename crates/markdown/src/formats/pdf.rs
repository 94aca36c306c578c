//! PDF: text in content-stream (reading) order per page through pdf-extract's glyph callbacks,
//! with our own layout pass: lines and paragraphs from positions, headings from font size,
//! grid-aligned runs of lines as tables, hyphenation joined, double-printed glyphs dropped.
//! pdf_oxide is the fallback when pdf-extract cannot open the file.

use std::collections::HashMap;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use pdf_extract::{MediaBox, OutputDev, OutputError, Transform};

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

#[derive(Debug, Clone)]
struct Glyph {
    x: f64,
    y: f64,
    end: f64,
    size: f64,
    text: String,
}

#[derive(Debug, Clone, Default)]
struct Line {
    /// Pieces separated by wide gaps: (x start, text).
    segments: Vec<(f64, String)>,
    size: f64,
    y: f64,
    /// Set by the layout pass: the line is (part of) a heading.
    heading: bool,
}

impl Line {
    fn text(&self) -> String {
        self.segments
            .iter()
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

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

/// Typographic ligatures (ﬁ, ﬂ ...) back to their letters, so words stay searchable.
fn unligature(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\u{fb00}' => out.push_str("ff"),
            '\u{fb01}' => out.push_str("fi"),
            '\u{fb02}' => out.push_str("fl"),
            '\u{fb03}' => out.push_str("ffi"),
            '\u{fb04}' => out.push_str("ffl"),
            '\u{fb05}' | '\u{fb06}' => out.push_str("st"),
            c => out.push(c),
        }
    }
    out
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let pages = match catch_unwind(AssertUnwindSafe(|| extract(&ctx, bytes))) {
        Ok(Ok(pages)) => pages,
        Ok(Err(
            e @ (Error::Encrypted { .. } | Error::TimedOut { .. } | Error::ExpandsTooMuch { .. }),
        )) => return Err(e),
        Ok(Err(primary)) => return fallback(&ctx, bytes, primary),
        Err(_) => {
            return fallback(
                &ctx,
                bytes,
                Error::malformed(Format::Pdf, "pdf-extract failed on this file"),
            )
        }
    };
    if pages
        .iter()
        .all(|p| p.iter().all(|l| l.text().trim().is_empty()))
        && !pages.is_empty()
    {
        // No text at all: maybe a font pdf-extract cannot decode; see whether pdf_oxide can.
        if let Ok(text) = fallback(&ctx, bytes, Error::malformed(Format::Pdf, "no text")) {
            if !text.trim().is_empty() && !text.contains("has no text layer") {
                return Ok(text);
            }
        }
    }
    Ok(render(&ctx, pages))
}

fn extract(ctx: &Ctx<'_>, bytes: &[u8]) -> Result<Vec<Vec<Line>>> {
    let mut doc =
        pdf_extract::Document::load_mem(bytes).map_err(|e| Error::malformed(Format::Pdf, e))?;
    if doc.is_encrypted() && doc.decrypt("").is_err() {
        return Err(Error::Encrypted {
            format: Format::Pdf,
        });
    }
    prepare_font_streams(ctx, &mut doc)?;
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
    Ok(out)
}

/// Most threads one PDF is read on, and the fewest pages worth a thread of their own. A page
/// of text takes a millisecond or more to read, a thread well under one to start: on 2 cores a
/// 5-page paper read 36% faster on two threads and a 19-page report 30% faster (at 24 pages a
/// thread, both had been read on one).
const MAX_PDF_THREADS: usize = 4;
const PAGES_PER_THREAD: usize = 2;
/// pdf-extract recurses through form XObjects.
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

/// pdf-extract builds its fonts afresh on every page, and each time it inflates the font's
/// streams again: the embedded font program (a TrueType program it reads and then discards,
/// Type 1 and CFF programs it parses for their encodings) and the ToUnicode map. On a long
/// document with large embedded fonts that repeated inflation was most of the conversion time
/// (a specification of several hundred pages: a third of the CPU samples were in zlib). Inflating those streams once,
/// here, in place, leaves each page a copy of plain bytes; the text that comes out is the same.
fn prepare_font_streams(ctx: &Ctx<'_>, doc: &mut pdf_extract::Document) -> Result<()> {
    use pdf_extract::Object;
    let mut ids = Vec::new();
    for obj in doc.objects.values() {
        let Ok(dict) = obj.as_dict() else { continue };
        let keys: &[&[u8]] = match dict.get(b"Type").and_then(Object::as_name) {
            Ok(b"FontDescriptor") => &[b"FontFile", b"FontFile2", b"FontFile3"],
            Ok(b"Font") => &[b"ToUnicode"],
            _ => continue,
        };
        for key in keys {
            if let Ok(Object::Reference(id)) = dict.get(key) {
                ids.push(*id);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        let Ok(Object::Stream(stream)) = doc.get_object_mut(id) else {
            continue;
        };
        // Only plain Flate streams (what font programs and maps use) are inflated here, bounded
        // by the unpack allowance; anything else, or a stream that does not inflate cleanly, is
        // left for pdf-extract to handle as before.
        let flate_only = matches!(stream.filters().as_deref(), Ok([b"FlateDecode"]))
            && stream.dict.get(b"DecodeParms").is_err();
        if !flate_only {
            continue;
        }
        let allowance = ctx.unpack_allowance();
        let mut plain = Vec::new();
        let inflated = flate2::read::ZlibDecoder::new(stream.content.as_slice())
            .take(allowance.saturating_add(1))
            .read_to_end(&mut plain);
        if inflated.is_err() {
            continue;
        }
        ctx.charge(plain.len() as u64)?;
        stream.set_plain_content(plain);
    }
    Ok(())
}

/// Groups glyphs, in content-stream order, into lines; wide gaps split a line into segments.
fn lines(glyphs: &[Glyph]) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    let mut cur = Line::default();
    let mut last: Option<&Glyph> = None;
    for g in glyphs {
        if let Some(p) = last {
            let dy = (g.y - p.y).abs();
            let size = p.size.max(g.size);
            let new_line = dy > size * 1.5
                || (g.x < p.end - size * 0.5 && dy > size * 0.5)
                || (g.x < p.x - size * 5.0);
            if new_line {
                if !cur.segments.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            } else {
                let gap = g.x - p.end;
                if gap > size * 1.5 {
                    cur.segments.push((g.x, String::new()));
                } else if gap > size * 0.15 && !p.text.ends_with(' ') && !g.text.starts_with(' ') {
                    if let Some(seg) = cur.segments.last_mut() {
                        seg.1.push(' ');
                    }
                }
            }
        }
        if cur.segments.is_empty() {
            cur.segments.push((g.x, String::new()));
            cur.y = g.y;
        }
        if let Some(seg) = cur.segments.last_mut() {
            seg.1.push_str(&g.text);
        }
        if g.text.trim().is_empty() {
            // Spaces do not set the size of a line.
        } else {
            cur.size = cur.size.max(g.size);
        }
        last = Some(g);
    }
    if !cur.segments.is_empty() {
        out.push(cur);
    }
    out.retain(|l| !l.text().is_empty());
    out
}

fn round(size: f64) -> i64 {
    (size * 2.0).round() as i64
}

fn render(ctx: &Ctx<'_>, mut pages: Vec<Vec<Line>>) -> String {
    // Body size: the size carrying the most characters.
    let mut weight: HashMap<i64, usize> = HashMap::new();
    for l in pages.iter().flatten() {
        *weight.entry(round(l.size)).or_default() += l.text().chars().count();
    }
    let body = weight
        .iter()
        .max_by_key(|(s, w)| (**w, -**s))
        .map(|(s, _)| *s)
        .unwrap_or(24);
    let large = |l: &Line| {
        let t = l.text();
        round(l.size) as f64 >= body as f64 * 1.15
            && t.chars().count() <= 150
            && t.chars().any(char::is_alphabetic)
    };
    // A heading is a short run (at most three lines) of large text of one size; longer runs of
    // large text (cover pages, call-outs) stay paragraphs.
    for page in pages.iter_mut() {
        let mut i = 0;
        while i < page.len() {
            if !large(&page[i]) {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < page.len() && large(&page[j]) && round(page[j].size) == round(page[i].size) {
                j += 1;
            }
            if j - i <= 3 {
                page[i..j].iter_mut().for_each(|l| l.heading = true);
            }
            i = j;
        }
    }
    let pages = &pages;
    let is_heading = |l: &Line| l.heading;
    let mut heading_sizes: Vec<i64> = pages
        .iter()
        .flatten()
        .filter(|l| is_heading(l))
        .map(|l| round(l.size))
        .collect();
    heading_sizes.sort_unstable_by(|a, b| b.cmp(a));
    heading_sizes.dedup();
    let level_of = |size: i64| {
        heading_sizes
            .iter()
            .position(|&s| s == size)
            .map(|p| (p + 1).min(4))
            .unwrap_or(4)
    };

    let mut blocks: Vec<String> = Vec::new();
    for (pi, page) in pages.iter().enumerate() {
        if page.is_empty() {
            blocks.push(format!(
                "*(page {} has no text layer; it may be a scanned image)*",
                pi + 1
            ));
            ctx.warn(format!("page {} has no text layer", pi + 1));
            continue;
        }
        let mut i = 0;
        let mut para: Vec<String> = Vec::new();
        let mut prev: Option<&Line> = None;
        while i < page.len() {
            let line = &page[i];
            // A table: three or more consecutive lines with the same number (2+) of wide-gap segments.
            let cols = line.segments.len();
            if cols >= 2 {
                let mut j = i;
                while j < page.len() && page[j].segments.len() == cols && !is_heading(&page[j]) {
                    j += 1;
                }
                if j - i >= 3 {
                    flush(&mut para, &mut blocks);
                    let rows: Vec<Vec<String>> = page[i..j]
                        .iter()
                        .map(|l| l.segments.iter().map(|(_, t)| md::cell(t)).collect())
                        .collect();
                    blocks.push(md::table(&rows));
                    i = j;
                    prev = None;
                    continue;
                }
            }
            let text = line.text();
            if is_heading(line) {
                flush(&mut para, &mut blocks);
                let level = level_of(round(line.size));
                // Consecutive lines of the same heading size are one wrapped heading.
                match (prev, blocks.last_mut()) {
                    (Some(p), Some(last))
                        if is_heading(p)
                            && round(p.size) == round(line.size)
                            && last.starts_with('#') =>
                    {
                        last.push(' ');
                        last.push_str(&text);
                    }
                    _ => blocks.push(format!("{} {}", "#".repeat(level), text)),
                }
            } else {
                let bullet = bullet_item(&text);
                let gap = prev.map(|p| (line.y - p.y).abs()).unwrap_or(0.0);
                let new_para = prev.is_none_or(|p| {
                    is_heading(p) || gap > p.size.max(line.size) * 1.9 || line.y < p.y
                });
                if bullet.is_some() || new_para {
                    flush(&mut para, &mut blocks);
                }
                para.push(bullet.unwrap_or(text));
            }
            prev = Some(line);
            i += 1;
        }
        flush(&mut para, &mut blocks);
    }
    md::join_blocks(blocks)
}

fn bullet_item(text: &str) -> Option<String> {
    let t = text.trim_start();
    for b in ["•", "◦", "▪", "●", "○", "■", "–", "", "·"] {
        if let Some(rest) = t.strip_prefix(b) {
            if rest.starts_with(' ') || rest.starts_with('\t') {
                return Some(format!("- {}", rest.trim()));
            }
        }
    }
    None
}

/// Joins a paragraph's lines, mending words hyphenated across line ends.
fn flush(para: &mut Vec<String>, blocks: &mut Vec<String>) {
    if para.is_empty() {
        return;
    }
    let mut text = String::new();
    for line in para.drain(..) {
        let line = line.trim();
        if text.is_empty() {
            text.push_str(line);
            continue;
        }
        let hyphenated = text.ends_with('-')
            && text[..text.len() - 1]
                .chars()
                .last()
                .is_some_and(char::is_lowercase)
            && line.chars().next().is_some_and(char::is_lowercase);
        if hyphenated {
            text.pop();
            text.push_str(line);
        } else {
            text.push(' ');
            text.push_str(line);
        }
    }
    blocks.push(text);
}

/// pdf_oxide, for files pdf-extract cannot open.
fn fallback(ctx: &Ctx<'_>, bytes: &[u8], primary: Error) -> Result<String> {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<String> {
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
        Ok(Err(e @ Error::TimedOut { .. })) => Err(e),
        _ => Err(primary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(x: f64, y: f64, text: &str) -> Glyph {
        Glyph {
            x,
            y,
            end: x + 6.0 * text.chars().count() as f64,
            size: 12.0,
            text: text.into(),
        }
    }

    #[test]
    fn hyphenated_line_ends_are_joined() {
        let mut para = vec!["the conver-".to_string(), "sion works".to_string()];
        let mut blocks = Vec::new();
        flush(&mut para, &mut blocks);
        assert_eq!(blocks, vec!["the conversion works"]);
    }

    #[test]
    fn glyphs_group_into_lines_and_segments() {
        let glyphs = vec![
            g(10.0, 100.0, "Name"),
            g(200.0, 100.0, "Qty"),
            g(10.0, 115.0, "apple"),
            g(200.0, 115.0, "3"),
        ];
        let lines = lines(&glyphs);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].segments.len(), 2);
        assert_eq!(lines[1].text(), "apple 3");
    }

    /// A PDF of `pages` pages showing "Hello world" in a TrueType font whose embedded program
    /// is a Flate stream inflating to `font_bytes` zero bytes.
    fn pdf_with_embedded_font(pages: usize, font_bytes: usize) -> Vec<u8> {
        use pdf_extract::{Dictionary, Document, Object, Stream};
        use std::io::Write;
        let mut doc = Document::with_version("1.5");
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&vec![0u8; font_bytes]).unwrap();
        let mut program = Dictionary::new();
        program.set("Filter", Object::Name(b"FlateDecode".to_vec()));
        let program = doc.add_object(Stream::new(program, z.finish().unwrap()));
        let mut descriptor = Dictionary::new();
        descriptor.set("Type", Object::Name(b"FontDescriptor".to_vec()));
        descriptor.set("FontName", Object::Name(b"Helvetica".to_vec()));
        descriptor.set("FontFile2", Object::Reference(program));
        let descriptor = doc.add_object(descriptor);
        let mut font = Dictionary::new();
        font.set("Type", Object::Name(b"Font".to_vec()));
        font.set("Subtype", Object::Name(b"TrueType".to_vec()));
        font.set("BaseFont", Object::Name(b"Helvetica".to_vec()));
        font.set("FirstChar", Object::Integer(32));
        font.set("LastChar", Object::Integer(126));
        font.set("Widths", Object::Array(vec![Object::Integer(500); 95]));
        font.set("FontDescriptor", Object::Reference(descriptor));
        let font = doc.add_object(font);
        let mut fonts = Dictionary::new();
        fonts.set("F1", Object::Reference(font));
        let mut resources = Dictionary::new();
        resources.set("Font", Object::Dictionary(fonts));
        let pages_id = doc.new_object_id();
        let mut kids = Vec::new();
        for _ in 0..pages {
            let content = doc.add_object(Stream::new(
                Dictionary::new(),
                b"BT /F1 12 Tf 72 720 Td (Hello world) Tj ET".to_vec(),
            ));
            let mut page = Dictionary::new();
            page.set("Type", Object::Name(b"Page".to_vec()));
            page.set("Parent", Object::Reference(pages_id));
            page.set("Contents", Object::Reference(content));
            page.set("Resources", Object::Dictionary(resources.clone()));
            page.set(
                "MediaBox",
                Object::Array(vec![0.into(), 0.into(), 612.into(), 792.into()]),
            );
            kids.push(Object::Reference(doc.add_object(page)));
        }
        let mut tree = Dictionary::new();
        tree.set("Type", Object::Name(b"Pages".to_vec()));
        tree.set("Count", Object::Integer(pages as i64));
        tree.set("Kids", Object::Array(kids));
        doc.objects.insert(pages_id, Object::Dictionary(tree));
        let mut catalog = Dictionary::new();
        catalog.set("Type", Object::Name(b"Catalog".to_vec()));
        catalog.set("Pages", Object::Reference(pages_id));
        let catalog = doc.add_object(catalog);
        doc.trailer.set("Root", Object::Reference(catalog));
        let mut out = Vec::new();
        doc.save_to(&mut out).unwrap();
        out
    }

    fn convert_with(limits: crate::Limits, bytes: &[u8]) -> Result<String> {
        let budget = crate::limits::Budget::new(limits);
        convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            bytes,
        )
    }

    #[test]
    fn every_page_of_a_document_with_an_embedded_font_is_read() {
        let pdf = pdf_with_embedded_font(3, 64 * 1024);
        let md = convert_with(crate::Limits::default(), &pdf).unwrap();
        assert_eq!(md.matches("Hello world").count(), 3, "{md}");
    }

    #[test]
    fn a_font_program_inflating_past_the_unpack_limit_is_refused() {
        let pdf = pdf_with_embedded_font(1, 4 << 20);
        let limits = crate::Limits {
            max_unpacked_bytes: 1 << 20,
            ..Default::default()
        };
        assert!(matches!(
            convert_with(limits, &pdf),
            Err(Error::ExpandsTooMuch { .. })
        ));
    }
}
