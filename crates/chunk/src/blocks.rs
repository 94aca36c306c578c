//! The few things of a Markdown document the chunker must see for itself: its lines, its fenced
//! code blocks and tables (which may need cutting with their header repeated) and its ATX
//! headings (the path each chunk sits under). Everything else is text-splitter's to read.

/// A line's bytes in the document, its line break left out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Line {
    pub start: usize,
    pub end: usize,
}

/// What kind of block runs over some lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A pipe table: a header row and a delimiter row, then body rows.
    Table,
    /// A fenced code block: the opening fence, the code, and the closing fence when there is
    /// one (`closed`).
    Code { closed: bool },
}

/// A table or a fenced code block: `first..last` are indexes into the lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub kind: Kind,
    pub first: usize,
    pub last: usize,
}

impl Block {
    /// How many lines head it (repeated atop every piece) and how many close it.
    pub fn frame(&self) -> (usize, usize) {
        match self.kind {
            Kind::Table => (2, 0),
            Kind::Code { closed } => (1, usize::from(closed)),
        }
    }
}

/// An ATX heading (`## Title`) outside code.
#[derive(Debug, Clone)]
pub(crate) struct Heading {
    pub at: usize,
    pub level: usize,
    pub text: String,
}

/// The document's lines.
pub(crate) fn lines(md: &str) -> Vec<Line> {
    let mut out = Vec::new();
    let mut start = 0;
    for piece in md.split_inclusive('\n') {
        let body = piece.trim_end_matches(['\n', '\r']);
        out.push(Line {
            start,
            end: start + body.len(),
        });
        start += piece.len();
    }
    out
}

/// A fence's character and length, if the line opens one (at most three spaces in).
fn fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let c = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = trimmed.chars().take_while(|x| *x == c).count();
    // A backtick fence's info string may not hold a backtick.
    (n >= 3 && (c == '~' || !trimmed[n..].contains('`'))).then_some((c, n))
}

fn closes(line: &str, c: char, n: usize) -> bool {
    let t = line.trim();
    t.len() >= n && t.chars().all(|x| x == c)
}

fn is_row(line: &str) -> bool {
    line.trim_start().starts_with('|')
}

/// `|---|:--:|` and the like.
fn is_delimiter(line: &str) -> bool {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t.strip_suffix('|').unwrap_or(t);
    !t.is_empty()
        && t.split('|').all(|cell| {
            let c = cell.trim();
            let c = c.strip_prefix(':').unwrap_or(c);
            let c = c.strip_suffix(':').unwrap_or(c);
            !c.is_empty() && c.chars().all(|x| x == '-')
        })
}

/// The heading a line is, if it is one.
fn heading(line: &str) -> Option<(usize, String)> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let level = trimmed.chars().take_while(|c| *c == '#').count();
    let rest = &trimmed[level..];
    if !(1..=6).contains(&level) || !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    // A closing run of `#` is not part of the title.
    let text = rest.trim();
    let text = match text.trim_end_matches('#') {
        t if t.is_empty() || t.ends_with([' ', '\t']) => t.trim_end(),
        _ => text,
    };
    Some((level, text.to_string()))
}

/// The tables, fenced code blocks and headings of the document, in order.
pub(crate) fn parse(md: &str, lines: &[Line]) -> (Vec<Block>, Vec<Heading>) {
    let text = |i: usize| &md[lines[i].start..lines[i].end];
    let (mut blocks, mut headings) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let line = text(i);
        if let Some((c, n)) = fence(line) {
            let close = (i + 1..lines.len()).find(|&j| closes(text(j), c, n));
            let last = close.unwrap_or(lines.len() - 1);
            blocks.push(Block {
                kind: Kind::Code {
                    closed: close.is_some(),
                },
                first: i,
                last,
            });
            i = last + 1;
        } else if is_row(line) && i + 1 < lines.len() && is_delimiter(text(i + 1)) {
            let mut last = i + 1;
            while last + 1 < lines.len() && is_row(text(last + 1)) {
                last += 1;
            }
            blocks.push(Block {
                kind: Kind::Table,
                first: i,
                last,
            });
            i = last + 1;
        } else {
            if let Some((level, title)) = heading(line) {
                headings.push(Heading {
                    at: lines[i].start,
                    level,
                    text: title,
                });
            }
            i += 1;
        }
    }
    (blocks, headings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_tables_and_fences_are_found_and_code_hides_headings() {
        let md = "# Top\n\ntext\n\n| a | b |\n|---|:-:|\n| 1 | 2 |\n\n```sh\n# not a heading\n```\n\n## Sub ##\n#hashtag\n~~~\nopen";
        let lines = lines(md);
        let (blocks, headings) = parse(md, &lines);
        let found: Vec<(usize, &str)> = headings
            .iter()
            .map(|h| (h.level, h.text.as_str()))
            .collect();
        assert_eq!(found, vec![(1, "Top"), (2, "Sub")]);
        let kinds: Vec<(Kind, usize, usize)> =
            blocks.iter().map(|b| (b.kind, b.first, b.last)).collect();
        assert_eq!(
            kinds,
            vec![
                (Kind::Table, 4, 6),
                (Kind::Code { closed: true }, 8, 10),
                (Kind::Code { closed: false }, 14, 15),
            ]
        );
    }

    #[test]
    fn a_pipe_line_without_a_delimiter_row_is_no_table() {
        let md = "| just text |\nmore\n";
        let (blocks, _) = parse(md, &lines(md));
        assert!(blocks.is_empty());
    }
}
