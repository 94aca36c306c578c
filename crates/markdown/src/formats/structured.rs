//! JSON and XML: pretty-printed in fenced blocks; RSS and Atom feeds as articles.

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;
use crate::xml::Element;

pub fn json(_ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let text = crate::text::decode(bytes);
    let text = text.trim_start_matches('\u{feff}');
    // serde_json refuses nesting deeper than 128 levels, so hostile depth is an error, not a crash.
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::malformed(Format::Json, e))?;
    let pretty =
        serde_json::to_string_pretty(&value).map_err(|e| Error::malformed(Format::Json, e))?;
    Ok(md::fenced("json", &pretty))
}

pub fn xml(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let text = crate::text::decode(bytes);
    let text = text.trim_start_matches('\u{feff}');
    let root = crate::xml::parse_str(&ctx, Format::Xml, text)?;
    if let Some(rss) = root.child("rss").and_then(|r| r.child("channel")) {
        return Ok(feed(&ctx, rss, "item", "description"));
    }
    if let Some(atom) = root.child("feed") {
        return Ok(feed(&ctx, atom, "entry", "summary"));
    }
    Ok(md::fenced("xml", text.trim()))
}

fn feed(ctx: &Ctx<'_>, channel: &Element, item: &str, summary: &str) -> String {
    let mut blocks = Vec::new();
    if let Some(title) = channel.child("title") {
        blocks.push(format!("# {}", title.text().trim()));
    }
    if let Some(desc) = channel
        .child("description")
        .or_else(|| channel.child("subtitle"))
    {
        blocks.push(desc.text().trim().to_string());
    }
    for entry in channel.children_named(item) {
        if ctx.out_of_time() {
            break;
        }
        let title = entry.child("title").map(|t| t.text()).unwrap_or_default();
        blocks.push(format!("## {}", title.trim()));
        let link = entry
            .child("link")
            .map(|l| {
                l.attr("href")
                    .map(str::to_string)
                    .unwrap_or_else(|| l.text())
            })
            .unwrap_or_default();
        if !link.trim().is_empty() {
            blocks.push(format!("<{}>", link.trim()));
        }
        for date in ["pubDate", "updated", "published"] {
            if let Some(d) = entry.child(date) {
                blocks.push(format!("*{}*", d.text().trim()));
                break;
            }
        }
        let body = entry
            .child(summary)
            .or_else(|| entry.child("content"))
            .map(|d| d.text())
            .unwrap_or_default();
        if !body.trim().is_empty() {
            blocks.push(super::html::html_to_markdown(&body));
        }
    }
    md::join_blocks(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    #[test]
    fn rss_items_become_sections() {
        let budget = Budget::new(Limits::default());
        let ctx = Ctx {
            budget: &budget,
            depth: 0,
        };
        let out = xml(ctx, b"<?xml version=\"1.0\"?><rss><channel><title>News</title><item><title>First post</title><link>http://e.x/1</link><description>&lt;p&gt;Hello &lt;b&gt;there&lt;/b&gt;&lt;/p&gt;</description></item></channel></rss>").unwrap();
        assert!(out.contains("# News"), "{out}");
        assert!(out.contains("## First post"), "{out}");
        assert!(out.contains("Hello **there**"), "{out}");
    }

    #[test]
    fn json_is_pretty_printed_in_a_fence() {
        let budget = Budget::new(Limits::default());
        let ctx = Ctx {
            budget: &budget,
            depth: 0,
        };
        let out = json(ctx, b"{\"k\":[1,2]}").unwrap();
        assert!(out.starts_with("```json\n{\n  \"k\": ["), "{out}");
    }

    #[test]
    fn json_nested_past_the_parser_limit_is_an_error_not_a_crash() {
        let budget = Budget::new(Limits::default());
        let ctx = Ctx {
            budget: &budget,
            depth: 0,
        };
        let deep = "[".repeat(100_000);
        assert!(matches!(
            json(ctx, deep.as_bytes()),
            Err(Error::Malformed { .. })
        ));
    }
}
