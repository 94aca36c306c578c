//! The layout pass over pdf-extract's glyphs: lines and segments from positions, headings
//! from font size, tables from grid-aligned runs of lines, paragraphs with hyphenation mended.

use std::collections::HashMap;

use crate::limits::Ctx;
use crate::md;

#[derive(Debug, Clone)]
pub(super) struct Glyph {
    pub(super) x: f64,
    pub(super) y: f64,
    pub(super) end: f64,
    pub(super) size: f64,
    pub(super) text: String,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Line {
    /// Pieces separated by wide gaps: (x start, text).
    pub(super) segments: Vec<(f64, String)>,
    pub(super) size: f64,
    pub(super) y: f64,
    /// Set by the layout pass: the line is (part of) a heading.
    pub(super) heading: bool,
}

impl Line {
    pub(super) fn text(&self) -> String {
        self.segments
            .iter()
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Typographic ligatures (ﬁ, ﬂ ...) back to their letters, so words stay searchable.
pub(super) fn unligature(text: &str) -> String {
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
/// Groups glyphs, in content-stream order, into lines; wide gaps split a line into segments.
pub(super) fn lines(glyphs: &[Glyph]) -> Vec<Line> {
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

/// The document's Markdown: each page's lines, or its OCR text where `scanned` has one (a page
/// without a usable text layer, or any page with images under `?ocr=force`).
pub(super) fn render(
    ctx: &Ctx<'_>,
    mut pages: Vec<Vec<Line>>,
    scanned: &std::collections::HashMap<usize, String>,
) -> String {
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
        if let Some(text) = scanned.get(&pi) {
            blocks.push(text.trim_end().to_string());
            continue;
        }
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
pub(super) fn flush(para: &mut Vec<String>, blocks: &mut Vec<String>) {
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
