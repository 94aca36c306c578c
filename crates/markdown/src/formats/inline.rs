//! Runs of styled text -> inline Markdown, merging neighbours with the same style.

use crate::md::escape_inline;

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
    // Merge neighbours of the same style first, so `**a****b**` becomes `**ab**`.
    let mut merged: Vec<Run> = Vec::new();
    for r in runs {
        if r.text.is_empty() {
            continue;
        }
        match merged.last_mut() {
            Some(last) if last.same_style(r) => last.text.push_str(&r.text),
            _ => merged.push(r.clone()),
        }
    }
    // Group by link so a link spanning styled runs stays one link.
    let mut out = String::new();
    let mut i = 0;
    while i < merged.len() {
        let link = merged[i].link.clone();
        let mut j = i;
        let mut inner = String::new();
        while j < merged.len() && merged[j].link == link {
            inner.push_str(&styled(&merged[j]));
            j += 1;
        }
        match link {
            Some(url) if !inner.trim().is_empty() => {
                let (lead, core, trail) = split_ws(&inner);
                out.push_str(lead);
                out.push_str(&format!(
                    "[{core}]({})",
                    url.replace(' ', "%20").replace(')', "%29")
                ));
                out.push_str(trail);
            }
            _ => out.push_str(&inner),
        }
        i = j;
    }
    out
}

fn styled(run: &Run) -> String {
    if run.raw {
        return run.text.clone();
    }
    let escaped = escape_inline(&run.text);
    let (lead, core, trail) = split_ws(&escaped);
    if core.is_empty() {
        return escaped;
    }
    let mut marker = String::new();
    if run.bold {
        marker.push_str("**");
    }
    if run.italic {
        marker.push('*');
    }
    if run.strike {
        marker.push_str("~~");
    }
    let closing: String = marker.chars().rev().collect();
    format!("{lead}{marker}{core}{closing}{trail}")
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
