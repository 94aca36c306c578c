//! Runs of styled text -> inline Markdown, merging neighbours with the same style.

use std::borrow::Cow;

use crate::md::escape_inline_into;

/// A piece of text with its character formatting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    pub text: String,
    pub bold: bool,
    pub italic: bool,
    pub strike: bool,
    /// Link target when the run is inside a hyperlink.
    pub link: Option<String>,
    /// Already Markdown (footnote references, images, line breaks): not escaped or styled.
    pub raw: bool,
}

impl Run {
    pub fn plain(text: impl Into<String>) -> Self {
        Run {
            text: text.into(),
            ..Default::default()
        }
    }

    pub fn raw(text: impl Into<String>) -> Self {
        Run {
            text: text.into(),
            raw: true,
            ..Default::default()
        }
    }

    fn same_style(&self, other: &Run) -> bool {
        self.bold == other.bold
            && self.italic == other.italic
            && self.strike == other.strike
            && self.link == other.link
            && self.raw == other.raw
    }
}

/// Renders runs as one line of inline Markdown.
pub fn render(runs: &[Run]) -> String {
    // Merge neighbours of the same style first, so `**a****b**` becomes `**ab**`. A merged run
    // borrows its first run's style and (until a neighbour joins it) its text.
    let mut merged: Vec<(&Run, Cow<'_, str>)> = Vec::with_capacity(runs.len());
    let mut total = 0;
    for r in runs {
        if r.text.is_empty() {
            continue;
        }
        total += r.text.len();
        match merged.last_mut() {
            Some((style, text)) if style.same_style(r) => text.to_mut().push_str(&r.text),
            _ => merged.push((r, Cow::Borrowed(r.text.as_str()))),
        }
    }
    // Group by link so a link spanning styled runs stays one link.
    let mut out = String::with_capacity(total + total / 8);
    let mut inner = String::new();
    let mut escaped = String::new();
    let mut i = 0;
    while i < merged.len() {
        let link = merged[i].0.link.as_deref();
        let mut j = i;
        inner.clear();
        while j < merged.len() && merged[j].0.link.as_deref() == link {
            styled(&mut inner, &mut escaped, merged[j].0, &merged[j].1);
            j += 1;
        }
        match link {
            Some(url) if !inner.trim().is_empty() => {
                let (lead, core, trail) = split_ws(&inner);
                out.push_str(lead);
                out.push('[');
                out.push_str(core);
                out.push_str("](");
                for c in url.chars() {
                    match c {
                        ' ' => out.push_str("%20"),
                        ')' => out.push_str("%29"),
                        c => out.push(c),
                    }
                }
                out.push(')');
                out.push_str(trail);
            }
            _ => out.push_str(&inner),
        }
        i = j;
    }
    out
}

/// Appends `text` in `run`'s style to `out`: escaped, with emphasis markers around its
/// non-blank core. `escaped` is scratch space.
fn styled(out: &mut String, escaped: &mut String, run: &Run, text: &str) {
    if run.raw {
        out.push_str(text);
        return;
    }
    escaped.clear();
    escape_inline_into(escaped, text);
    let (lead, core, trail) = split_ws(escaped);
    if core.is_empty() || !(run.bold || run.italic || run.strike) {
        out.push_str(escaped);
        return;
    }
    // Opened outermost first, closed in the reverse order.
    let marks = [(run.bold, "**"), (run.italic, "*"), (run.strike, "~~")];
    out.push_str(lead);
    for &(on, mark) in &marks {
        if on {
            out.push_str(mark);
        }
    }
    out.push_str(core);
    for &(on, mark) in marks.iter().rev() {
        if on {
            out.push_str(mark);
        }
    }
    out.push_str(trail);
}

fn split_ws(s: &str) -> (&str, &str, &str) {
    let start = s.len() - s.trim_start().len();
    let end = s.trim_end().len().max(start);
    (&s[..start], &s[start..end], &s[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_bold_runs_merge_and_spaces_stay_outside() {
        let runs = vec![
            Run {
                text: "Hello ".into(),
                bold: true,
                ..Default::default()
            },
            Run {
                text: "world".into(),
                bold: true,
                ..Default::default()
            },
            Run::plain(" and "),
            Run {
                text: "link".into(),
                italic: true,
                link: Some("http://x".into()),
                ..Default::default()
            },
        ];
        assert_eq!(render(&runs), "**Hello world** and [*link*](http://x)");
    }

    #[test]
    fn markdown_characters_in_text_are_escaped() {
        assert_eq!(render(&[Run::plain("a*b_c")]), "a\\*b\\_c");
    }
}
