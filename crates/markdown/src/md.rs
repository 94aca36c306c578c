//! Small Markdown writers shared by the converters: escaping, tables, headings.

/// Escapes characters that would turn plain text into Markdown markup inside a paragraph.
pub fn escape_inline(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    escape_inline_into(&mut out, text);
    out
}

/// As [`escape_inline`], appending to `out`.
pub fn escape_inline_into(out: &mut String, text: &str) {
    let special = |b: &u8| matches!(b, b'\\' | b'`' | b'*' | b'_' | b'[' | b']' | b'<' | b'>');
    let mut rest = text;
    // The special characters are ASCII, so the text between them is copied in slices.
    while let Some(p) = rest.as_bytes().iter().position(special) {
        out.push_str(&rest[..p]);
        out.push('\\');
        out.push(rest.as_bytes()[p] as char);
        rest = &rest[p + 1..];
    }
    out.push_str(rest);
}

/// Makes one table cell: no line breaks, pipes escaped, whitespace collapsed.
pub fn cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last_space = false;
    for c in text.trim().chars() {
        match c {
            '|' => {
                out.push_str("\\|");
                last_space = false;
            }
            '\n' | '\r' => {
                if !last_space {
                    out.push_str("<br>");
                }
                last_space = true;
            }
            c if c.is_whitespace() => {
                if !last_space {
                    out.push(' ');
                }
                last_space = true;
            }
            c => {
                out.push(c);
                last_space = false;
            }
        }
    }
    out.trim().to_string()
}

/// Renders a GitHub-style table; the first row is the header. Rows are padded to equal width.
/// Cells must already be in [`cell`] form (or contain inline Markdown without newlines).
pub fn table(rows: &[Vec<String>]) -> String {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    if width == 0 {
        return String::new();
    }
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        out.push('|');
        for c in 0..width {
            out.push(' ');
            out.push_str(row.get(c).map(String::as_str).unwrap_or(""));
            out.push_str(" |");
        }
        out.push('\n');
        if i == 0 {
            out.push('|');
            for _ in 0..width {
                out.push_str(" --- |");
            }
            out.push('\n');
        }
    }
    out
}

/// A fenced code block whose fence is longer than any backtick run inside `code`.
pub fn fenced(lang: &str, code: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in code.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    let fence = "`".repeat(longest.max(2) + 1);
    let body = code.trim_end_matches(['\n', '\r']);
    format!("{fence}{lang}\n{body}\n{fence}\n")
}

/// Joins blocks with one blank line between them, dropping empty ones, and collapses runs of
/// more than two newlines.
pub fn join_blocks<I: IntoIterator<Item = String>>(blocks: I) -> String {
    let mut out = String::new();
    for b in blocks {
        let b = b.trim_matches('\n');
        if b.trim().is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(b);
    }
    tidy(&out)
}

/// Trims trailing spaces on lines, collapses 3+ newlines to 2 and ends with one newline.
pub fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 1);
    let mut blank_run = 0;
    let mut in_fence = false;
    for line in text.split('\n') {
        let line = line.trim_end_matches([' ', '\t', '\r']);
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        if line.is_empty() && !in_fence {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    // Blank lines off both ends, then one final newline; in place, as the text can be large.
    out.truncate(out.trim_end_matches('\n').len());
    let lead = out.len() - out.trim_start_matches('\n').len();
    out.drain(..lead);
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_header_separator_and_escaped_pipes() {
        let t = table(&[
            vec!["a".into(), "b".into()],
            vec![cell("x|y"), cell("line\nbreak")],
        ]);
        assert_eq!(t, "| a | b |\n| --- | --- |\n| x\\|y | line<br>break |\n");
    }

    #[test]
    fn fence_outgrows_backticks_inside() {
        let f = fenced("md", "use ``` here");
        assert!(f.starts_with("````md\n"));
    }

    #[test]
    fn tidy_collapses_blank_runs() {
        assert_eq!(tidy("a\n\n\n\nb  \n"), "a\n\nb\n");
        assert_eq!(tidy("\n\n  \na\n\n"), "a\n");
        assert_eq!(tidy("\n \n\n"), "");
    }
}
