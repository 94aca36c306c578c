//! HTML: the main content (or the body) through htmd, without scripts, styles or forms.

use std::rc::Rc;

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
    let (markdown, flattened) = convert_bounded(html);
    if flattened {
        ctx.warn("HTML nests too deeply for structure; only its text was kept");
    }
    Ok(markdown)
}

/// Converts an HTML fragment or document to Markdown.
pub fn html_to_markdown(html: &str) -> String {
    convert_bounded(html).0
}

/// htmd's conversion when the tree the HTML parser builds is shallow enough for htmd's
/// recursive walk; else the text alone (and `true`). The depth is measured on the parsed tree,
/// not the tags: the parser's error recovery nests elements the markup never opened inside
/// each other (`<span></br>` repeated is a chain of spans a million deep).
fn convert_bounded(html: &str) -> (String, bool) {
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
    // html5ever's tree builder checks scopes by walking its stack of open elements: on deep
    // input that is quadratic (100,000 unclosed `<div>`s took two minutes) and cannot be
    // stopped from outside. So the depth is estimated from the tags first.
    if nesting_estimate(html) > MAX_TAG_DEPTH {
        return (strip_tags(html), true);
    }
    let Ok(tree) = converter.html_to_tree(html) else {
        return (strip_tags(html), false);
    };
    if tree_depth(&tree) > MAX_TAG_DEPTH {
        return (strip_tags(html), true);
    }
    (converter.tree_to_markdown(&tree), false)
}

/// The depth of a parsed tree, walked with a stack of our own (the tree may be deeper than
/// any thread's stack).
fn tree_depth(root: &Rc<htmd::Node>) -> usize {
    let mut max = 0;
    let mut stack = vec![(Rc::clone(root), 0usize)];
    while let Some((node, depth)) = stack.pop() {
        max = max.max(depth);
        if max > MAX_TAG_DEPTH {
            break;
        }
        for child in node.children.borrow().iter() {
            stack.push((Rc::clone(child), depth + 1));
        }
    }
    max
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

/// How deep the parser's stack of open elements may grow, from one scan of the tags (stopping
/// once past [`MAX_TAG_DEPTH`]): a start tag opens an element, an end tag closes the nearest
/// open element of its name and is ignored when there is none (as the parser ignores `</br>`
/// after `<span>`). Void elements and those the parser closes implicitly (`p`, `li`, `td`..)
/// open nothing; comments and the text of raw-text elements (`script`, `style`..) are skipped.
fn nesting_estimate(html: &str) -> usize {
    const OPEN_NOTHING: [&str; 29] = [
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr", "param", "keygen", "p", "li", "option", "optgroup", "dt", "dd", "td", "th",
        "tr", "tbody", "thead", "tfoot", "colgroup", "caption",
    ];
    const RAW_TEXT: [&str; 6] = ["script", "style", "textarea", "title", "xmp", "plaintext"];
    let b = html.as_bytes();
    let mut open: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < b.len() && open.len() <= MAX_TAG_DEPTH {
        let Some(lt) = memchr(b'<', &b[i..]).map(|p| i + p) else {
            break;
        };
        if b[lt..].starts_with(b"<!--") {
            i = html[lt..].find("-->").map_or(b.len(), |p| lt + p + 3);
            continue;
        }
        let closing = b.get(lt + 1) == Some(&b'/');
        let name_start = lt + 1 + usize::from(closing);
        let mut j = name_start;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'-') {
            j += 1;
        }
        if j == name_start {
            i = lt + 1;
            continue;
        }
        let name = &html[name_start..j];
        let end = memchr(b'>', &b[j..]).map_or(b.len(), |p| j + p);
        i = end + 1;
        if closing {
            if let Some(at) = open.iter().rposition(|o| o.eq_ignore_ascii_case(name)) {
                open.truncate(at);
            }
        } else if let Some(raw) = RAW_TEXT.iter().find(|r| r.eq_ignore_ascii_case(name)) {
            // Its text runs to its end tag (searched in ASCII lower case).
            let close = format!("</{raw}");
            i = b[i.min(b.len())..]
                .windows(close.len())
                .position(|w| w.eq_ignore_ascii_case(close.as_bytes()))
                .map_or(b.len(), |p| i + p);
        } else if b[end.saturating_sub(1)] != b'/'
            && !OPEN_NOTHING.iter().any(|v| v.eq_ignore_ascii_case(name))
        {
            open.push(name);
        }
    }
    open.len()
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
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
    fn unbalanced_markup_that_parses_deep_keeps_the_text() {
        let html = format!("{}end", "<span></br>".repeat(20_000));
        assert_eq!(run(&html).trim(), "end");
    }

    #[test]
    fn single_main_element_is_preferred() {
        let out = run("<body><nav>Menu Home About</nav><main><p>Body text</p></main><footer>Footer</footer></body>");
        assert!(out.contains("Body text"));
        assert!(!out.contains("Menu"));
    }
}
