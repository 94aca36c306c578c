//! RTF, read by hand: no well-kept permissively licensed crate turns RTF into structured text
//! (markitdown passes RTF through raw). A single pass over the bytes with an explicit group
//! stack (no recursion): destinations that carry no text are skipped, `\'hh` bytes decode in the
//! document's code page, `\uN` in Unicode, bold/italic become emphasis, `\outlinelevel` headings,
//! `\listtext` bullets list items and `\cell`/`\row` GitHub tables.

use encoding_rs::{Encoding, WINDOWS_1252};

use super::inline::{self, Run};
use crate::error::Result;
use crate::limits::Ctx;
use crate::md;

/// Groups deeper than this are still parsed but share the deepest state (bounded memory).
const MAX_GROUP_DEPTH: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct State {
    bold: bool,
    italic: bool,
    strike: bool,
    skip: bool,
    uc: usize,
    list_text: bool,
    field_inst: bool,
    field_result: bool,
}

impl Default for State {
    fn default() -> Self {
        State {
            bold: false,
            italic: false,
            strike: false,
            skip: false,
            uc: 1,
            list_text: false,
            field_inst: false,
            field_result: false,
        }
    }
}

/// Destinations whose text is not document content.
const SKIP_DESTINATIONS: &[&[u8]] = &[
    b"fonttbl",
    b"colortbl",
    b"stylesheet",
    b"info",
    b"pict",
    b"object",
    b"objdata",
    b"themedata",
    b"colorschememapping",
    b"datastore",
    b"latentstyles",
    b"listtable",
    b"listoverridetable",
    b"rsidtbl",
    b"generator",
    b"xmlnstbl",
    b"mmathPr",
    b"filetbl",
    b"revtbl",
    b"pgdsctbl",
    b"header",
    b"headerl",
    b"headerr",
    b"headerf",
    b"footer",
    b"footerl",
    b"footerr",
    b"footerf",
    b"bkmkstart",
    b"bkmkend",
    b"fldtype",
    b"wgrffmtfilter",
    b"xe",
    b"tc",
    b"private",
    b"nonshppict",
    b"blipuid",
    b"passwordhash",
    b"protusertbl",
    b"defchp",
    b"defpap",
    b"pnseclvl",
    b"panose",
    b"falt",
    b"leveltext",
    b"levelnumbers",
    b"fchars",
    b"lchars",
    b"docvar",
    b"atrfstart",
    b"atrfend",
    b"annotation",
    b"atnid",
    b"atnauthor",
];

struct Writer {
    runs: Vec<Run>,
    blocks: Vec<String>,
    /// Current table: finished rows, the row being built, the cell being built.
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    in_table: bool,
    heading: Option<usize>,
    bullet: bool,
    link: Option<String>,
    pending_bytes: Vec<u8>,
    encoding: &'static Encoding,
}

impl Writer {
    fn text(&mut self, st: &State, s: &str) {
        if st.skip || s.is_empty() {
            return;
        }
        if st.list_text {
            // The rendered list marker (a bullet or "1."): remember that this is a list item.
            if s.trim().chars().any(|c| !c.is_whitespace()) {
                self.bullet = true;
            }
            return;
        }
        if st.field_inst {
            if let Some(rest) = s.trim().strip_prefix("HYPERLINK") {
                let url = rest
                    .trim()
                    .trim_matches('"')
                    .split('"')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                if !url.is_empty() && !url.starts_with('\\') {
                    self.link = Some(url);
                }
            }
            return;
        }
        // A run of the same style as the last one joins it (as inline::render would merge them):
        // text arrives in many small pieces between control words.
        if let Some(last) = self.runs.last_mut() {
            if !last.raw
                && (last.bold, last.italic, last.strike) == (st.bold, st.italic, st.strike)
                && last.link == self.link
            {
                last.text.push_str(s);
                return;
            }
        }
        let run = Run {
            text: s.to_string(),
            bold: st.bold,
            italic: st.italic,
            strike: st.strike,
            link: self.link.clone(),
            raw: false,
        };
        self.runs.push(run);
    }

    fn flush_bytes(&mut self, st: &State) {
        if self.pending_bytes.is_empty() {
            return;
        }
        if st.skip {
            self.pending_bytes.clear();
            return;
        }
        let bytes = std::mem::take(&mut self.pending_bytes);
        let (text, _, _) = self.encoding.decode(&bytes);
        self.text(st, &text);
    }

    fn paragraph_text(&mut self) -> String {
        let text = inline::render(&std::mem::take(&mut self.runs));
        text.trim().to_string()
    }

    fn end_paragraph(&mut self) {
        let text = self.paragraph_text();
        if self.in_table {
            // A paragraph mark inside a cell: keep the cell's lines together.
            if !text.is_empty() {
                self.runs.push(Run::raw(format!("{text}<br>")));
            }
            return;
        }
        self.flush_table();
        if !text.is_empty() {
            let block = if let Some(level) = self.heading {
                format!("{} {}", "#".repeat(level), text)
            } else if self.bullet {
                format!("- {text}")
            } else {
                text
            };
            self.blocks.push(block);
        }
        self.bullet = false;
    }

    fn end_cell(&mut self) {
        let text = self.paragraph_text();
        self.row.push(md::cell(text.trim_end_matches("<br>")));
        self.in_table = true;
    }

    fn end_row(&mut self) {
        let _ = self.paragraph_text();
        let row = std::mem::take(&mut self.row);
        if !row.is_empty() {
            self.rows.push(row);
        }
        self.in_table = false;
    }

    fn flush_table(&mut self) {
        if !self.rows.is_empty() {
            let rows = std::mem::take(&mut self.rows);
            self.blocks.push(md::table(&rows));
        }
    }
}

fn codepage(n: i32) -> &'static Encoding {
    let label = match n {
        437 | 850 | 1252 => "windows-1252",
        10000 => "macintosh",
        874 => "windows-874",
        932 => "shift_jis",
        936 => "gbk",
        949 => "euc-kr",
        950 => "big5",
        1250..=1258 => {
            return Encoding::for_label(format!("windows-{n}").as_bytes()).unwrap_or(WINDOWS_1252)
        }
        65001 => "utf-8",
        _ => "windows-1252",
    };
    Encoding::for_label(label.as_bytes()).unwrap_or(WINDOWS_1252)
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let mut stack: Vec<State> = vec![State::default()];
    let mut overflow = 0usize;
    let mut w = Writer {
        runs: Vec::new(),
        blocks: Vec::new(),
        rows: Vec::new(),
        row: Vec::new(),
        in_table: false,
        heading: None,
        bullet: false,
        link: None,
        pending_bytes: Vec::new(),
        encoding: WINDOWS_1252,
    };
    // Characters still to skip after a \uN (its ANSI fallback).
    let mut skip_chars = 0usize;
    // True right after `{\*`: the next control word starts an ignorable destination.
    let mut star = false;
    // True right after `{`: the next control word may name a destination.
    let mut group_start = false;
    let mut i = 0usize;
    let b = bytes;
    let mut steps = 0u32;
    while i < b.len() {
        steps = steps.wrapping_add(1);
        if steps.is_multiple_of(65536) {
            ctx.check_time()?;
        }
        let c = b[i];
        match c {
            b'{' => {
                w.flush_bytes(stack.last().expect("stack never empty"));
                if stack.len() < MAX_GROUP_DEPTH {
                    let top = stack.last().copied().unwrap_or_default();
                    stack.push(top);
                } else {
                    overflow += 1;
                }
                group_start = true;
                star = false;
                i += 1;
            }
            b'}' => {
                w.flush_bytes(stack.last().expect("stack never empty"));
                if overflow > 0 {
                    overflow -= 1;
                } else if stack.len() > 1 {
                    let closed = stack.pop().unwrap_or_default();
                    // Leaving a field's result ends the link the field made.
                    if closed.field_result && !stack.last().is_some_and(|s| s.field_result) {
                        w.link = None;
                    }
                }
                group_start = false;
                i += 1;
            }
            b'\\' => {
                i += 1;
                if i >= b.len() {
                    break;
                }
                let st_skip = stack.last().is_some_and(|s| s.skip);
                let n = b[i];
                if n.is_ascii_alphabetic() {
                    let start = i;
                    while i < b.len() && b[i].is_ascii_alphabetic() && i - start < 32 {
                        i += 1;
                    }
                    let word = &b[start..i];
                    // The optional numeric parameter: `-`? digits, at most 11 bytes in all;
                    // one that does not fit an i32 counts as absent.
                    let num_start = i;
                    let negative = i < b.len() && b[i] == b'-';
                    if negative {
                        i += 1;
                    }
                    let digits_start = i;
                    let mut value: i64 = 0;
                    while i < b.len() && b[i].is_ascii_digit() && i - num_start < 11 {
                        value = value * 10 + i64::from(b[i] - b'0');
                        i += 1;
                    }
                    let param: Option<i32> = (i > digits_start)
                        .then(|| i32::try_from(if negative { -value } else { value }).ok())
                        .flatten();
                    if i < b.len() && b[i] == b' ' {
                        i += 1;
                    }
                    w.flush_bytes(stack.last().expect("stack never empty"));
                    let was_group_start = group_start;
                    group_start = false;
                    let st = stack.last_mut().expect("stack never empty");
                    if was_group_start && (star || SKIP_DESTINATIONS.contains(&word)) {
                        if word == b"fldinst" {
                            st.field_inst = true;
                        } else {
                            st.skip = true;
                        }
                        star = false;
                        continue;
                    }
                    star = false;
                    if skip_chars > 0 && word != b"u" {
                        skip_chars = 0;
                    }
                    match word {
                        b"fldinst" => st.field_inst = true,
                        b"fldrslt" => {
                            st.field_inst = false;
                            st.field_result = true;
                        }
                        b"listtext" | b"pntext" => st.list_text = true,
                        b"ansicpg" => w.encoding = codepage(param.unwrap_or(1252)),
                        b"mac" => w.encoding = codepage(10000),
                        b"uc" => st.uc = param.unwrap_or(1).clamp(0, 10) as usize,
                        b"u" => {
                            if let Some(p) = param {
                                let code = if p < 0 { p + 65536 } else { p } as u32;
                                let mut utf8 = [0u8; 4];
                                let s =
                                    char::from_u32(code).map_or("", |c| c.encode_utf8(&mut utf8));
                                let st = *st;
                                w.text(&st, s);
                                skip_chars = st.uc;
                            }
                        }
                        b"b" => st.bold = param != Some(0),
                        b"i" => st.italic = param != Some(0),
                        b"strike" | b"striked" => st.strike = param != Some(0),
                        b"plain" => {
                            st.bold = false;
                            st.italic = false;
                            st.strike = false;
                        }
                        b"pard" => {
                            w.heading = None;
                        }
                        b"outlinelevel" => w.heading = param.map(|l| (l.clamp(0, 5) + 1) as usize),
                        b"par" | b"sect" | b"page" if !st_skip => {
                            w.end_paragraph();
                            w.link = None;
                        }
                        b"line" if !st_skip => w.runs.push(Run::raw("  \n")),
                        b"tab" if !st_skip => {
                            let st = *st;
                            w.text(&st, " ");
                        }
                        b"cell" | b"nestcell" if !st_skip => w.end_cell(),
                        b"row" | b"nestrow" if !st_skip => w.end_row(),
                        b"emdash" => {
                            let st = *st;
                            w.text(&st, "—");
                        }
                        b"endash" => {
                            let st = *st;
                            w.text(&st, "–");
                        }
                        b"bullet" => {
                            let st = *st;
                            w.text(&st, "•");
                        }
                        b"lquote" => {
                            let st = *st;
                            w.text(&st, "‘");
                        }
                        b"rquote" => {
                            let st = *st;
                            w.text(&st, "’");
                        }
                        b"ldblquote" => {
                            let st = *st;
                            w.text(&st, "“");
                        }
                        b"rdblquote" => {
                            let st = *st;
                            w.text(&st, "”");
                        }
                        b"bin" => {
                            // Raw binary data of the given length follows.
                            let len = param.unwrap_or(0).max(0) as usize;
                            i = i.saturating_add(len).min(b.len());
                        }
                        _ => {}
                    }
                } else {
                    i += 1;
                    group_start = false;
                    match n {
                        b'*' => {
                            star = true;
                            group_start = true;
                        }
                        b'\'' => {
                            if i + 2 <= b.len() {
                                let hex = |c: u8| (c as char).to_digit(16);
                                if let (Some(h), Some(l)) = (hex(b[i]), hex(b[i + 1])) {
                                    if skip_chars > 0 {
                                        skip_chars -= 1;
                                    } else {
                                        w.pending_bytes.push((h * 16 + l) as u8);
                                    }
                                }
                                i += 2;
                            } else {
                                i = b.len();
                            }
                        }
                        b'~' => w.text(&stack.last().copied().unwrap_or_default(), "\u{a0}"),
                        b'_' => w.text(&stack.last().copied().unwrap_or_default(), "-"),
                        b'-' => {}
                        b'\\' | b'{' | b'}' => {
                            let s = (n as char).to_string();
                            w.text(&stack.last().copied().unwrap_or_default(), &s);
                        }
                        b'\n' | b'\r' => {
                            w.flush_bytes(stack.last().expect("stack never empty"));
                            if !st_skip {
                                w.end_paragraph();
                            }
                        }
                        _ => {}
                    }
                }
            }
            b'\r' | b'\n' => i += 1,
            _ => {
                group_start = false;
                star = false;
                // Plain text up to the next special byte.
                let start = i;
                while i < b.len() && !matches!(b[i], b'{' | b'}' | b'\\' | b'\r' | b'\n') {
                    i += 1;
                }
                let mut chunk = &b[start..i];
                while skip_chars > 0 && !chunk.is_empty() {
                    chunk = &chunk[1..];
                    skip_chars -= 1;
                }
                if !chunk.is_empty() {
                    let st = stack.last().copied().unwrap_or_default();
                    w.flush_bytes(&st);
                    // Text of a skipped destination (font tables, picture hex) is dropped
                    // unread: decoding it only to throw it away was a large share of the time.
                    if !st.skip {
                        let (text, _, _) = w.encoding.decode(chunk);
                        w.text(&st, &text);
                    }
                }
            }
        }
    }
    let st = stack.last().copied().unwrap_or_default();
    w.flush_bytes(&st);
    if !w.row.is_empty() {
        w.end_row();
    }
    w.in_table = false;
    w.end_paragraph();
    w.flush_table();
    Ok(md::join_blocks(std::mem::take(&mut w.blocks)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    fn run(rtf: &[u8]) -> String {
        let budget = Budget::new(Limits::default());
        convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            rtf,
        )
        .unwrap()
    }

    #[test]
    fn text_emphasis_and_code_page_bytes() {
        let out = run(br"{\rtf1\ansi\ansicpg1252{\fonttbl{\f0 Times;}}{\colortbl;\red0\green0\blue0;}\f0 Caf\'e9 is {\b bold} and {\i slanted}.\par Second \u8364? line.\par}");
        assert_eq!(out, "Café is **bold** and *slanted*.\n\nSecond € line.\n");
    }

    #[test]
    fn ignorable_destinations_are_skipped() {
        let out = run(br"{\rtf1{\*\generator Riched20;}{\info{\title Secret}}Visible\par}");
        assert_eq!(out, "Visible\n");
    }

    #[test]
    fn tables_become_markdown_tables() {
        let out = run(br"{\rtf1\trowd\cellx1000\cellx2000 Name\cell Qty\cell\row\trowd\cellx1000\cellx2000 apple\cell 3\cell\row\pard After\par}");
        assert!(
            out.contains("| Name | Qty |\n| --- | --- |\n| apple | 3 |"),
            "{out}"
        );
        assert!(out.contains("After"), "{out}");
    }

    #[test]
    fn headings_lists_and_links() {
        let out = run(br#"{\rtf1\pard\outlinelevel0 Title\par\pard{\listtext\'95\tab}Item one\par{\field{\*\fldinst HYPERLINK "https://example.org"}{\fldrslt site}}\par}"#);
        assert!(out.contains("# Title"), "{out}");
        assert!(out.contains("- Item one"), "{out}");
        assert!(out.contains("[site](https://example.org)"), "{out}");
    }

    #[test]
    fn unbalanced_and_deep_groups_do_not_fail() {
        let deep = format!("{{\\rtf1 {}x{}", "{".repeat(100_000), "}".repeat(10));
        assert_eq!(run(deep.as_bytes()), "x\n");
        assert_eq!(run(b"{\\rtf1 \\'"), "");
    }
}
