//! HTML: the main content (or the body) through htmd, without scripts, styles or forms.

use crate::error::Result;
use crate::limits::Ctx;

/// Elements nested deeper than this make the tree walk too deep to be safe: such documents
/// are reduced to their text instead.
const MAX_TAG_DEPTH: usize = 1_000;

const SKIPPED: [&str; 9] = [
    "script", "style", "noscript", "template", "head", "iframe", "object", "svg", "canvas",
];

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let text = crate::text::decode(bytes);
    let html = main_content(&text).unwrap_or(&text);
    if nesting_depth(html) > MAX_TAG_DEPTH {
        ctx.warn("HTML nests too deeply for structure; only its text was kept");
        return Ok(strip_tags(html));
    }
    Ok(through_htmd(html))
}

/// Converts an HTML fragment or document to Markdown.
pub fn html_to_markdown(html: &str) -> String {
    if nesting_depth(html) > MAX_TAG_DEPTH {
        return strip_tags(html);
    }
    through_htmd(html)
}

/// htmd's conversion, for HTML whose nesting was already checked.
fn through_htmd(html: &str) -> String {
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(SKIPPED.to_vec())
        .options(htmd::options::Options {
            bullet_list_marker: htmd::options::BulletListMarker::Dash,
            ul_bullet_spacing: 1,
            ol_number_spacing: 1,
            hr_style: htmd::options::HrStyle::Dashes,
            ..Default::default()
        })
        .build();
    match converter.convert(html) {
        Ok(md) => md,
        Err(_) => strip_tags(html),
    }
}

/// The inside of the page's single `<main>` element, when there is exactly one.
fn main_content(html: &str) -> Option<&str> {
    let lower = html.to_ascii_lowercase();
    let start = lower.find("<main")?;
    if lower[start + 5..].contains("<main") {
        return None;
    }
    let open_end = start + lower[start..].find('>')? + 1;
    let close = lower.rfind("</main")?;
    (close > open_end).then(|| &html[open_end..close])
}

/// An upper estimate of element nesting, from a linear scan of the tags.
fn nesting_depth(html: &str) -> usize {
    const VOID: [&str; 16] = [
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr", "p", "li", "option",
    ];
    let b = html.as_bytes();
    let (mut depth, mut max) = (0usize, 0usize);
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'<' {
            i += 1;
            continue;
        }
        if b[i..].starts_with(b"<!--") {
            i = match html[i..].find("-->") {
                Some(p) => i + p + 3,
                None => b.len(),
            };
            continue;
        }
        let closing = b.get(i + 1) == Some(&b'/');
        let name_start = if closing { i + 2 } else { i + 1 };
        let mut j = name_start;
        while j < b.len() && b[j].is_ascii_alphanumeric() {
            j += 1;
        }
        if j == name_start {
            i += 1;
            continue;
        }
        let name = &html[name_start..j];
        let end = html[j..].find('>').map(|p| j + p).unwrap_or(b.len());
        let self_closing = end > 0 && b.get(end - 1) == Some(&b'/');
        if closing {
            depth = depth.saturating_sub(1);
        } else if !self_closing && !VOID.iter().any(|v| v.eq_ignore_ascii_case(name)) {
            depth += 1;
            max = max.max(depth);
        }
        i = end.max(i + 1);
    }
    max
}

/// Text of an HTML document with tags removed: the fallback for pathological nesting.
fn strip_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    fn run(html: &str) -> String {
        let budget = Budget::new(Limits::default());
        convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            html.as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn structure_survives_and_scripts_do_not() {
        let out = run("<html><head><style>p{}</style></head><body><h2>Title</h2><ul><li>one<ul><li>inner</li></ul></li></ul>\
             <table><tr><th>k</th><th>v</th></tr><tr><td>a</td><td>1</td></tr></table>\
             <p>See <a href=\"https://x.org\">x</a> and <em>this</em>.</p><script>alert(1)</script></body></html>");
        assert!(out.contains("## Title"), "{out}");
        assert!(out.contains("- one"), "{out}");
        assert!(out.contains("  - inner"), "{out}");
        assert!(out.contains("| k | v |"), "{out}");
        assert!(out.contains("[x](https://x.org)"), "{out}");
        assert!(out.contains("_this_") || out.contains("*this*"), "{out}");
        assert!(!out.contains("alert"), "{out}");
        assert!(!out.contains("p{}"), "{out}");
    }

    #[test]
    fn pathological_nesting_keeps_the_text() {
        let html = format!(
            "{}deep text{}",
            "<div>".repeat(50_000),
            "</div>".repeat(50_000)
        );
        assert_eq!(run(&html).trim(), "deep text");
    }

    #[test]
    fn single_main_element_is_preferred() {
        let out = run("<body><nav>Menu Home About</nav><main><p>Body text</p></main><footer>Footer</footer></body>");
        assert!(out.contains("Body text"));
        assert!(!out.contains("Menu"));
    }
}
