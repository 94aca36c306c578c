//! EPUB: the book's metadata, then its chapters in spine order, each through the HTML converter.

use std::collections::HashMap;

use super::archive::{self, Archive};
use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let mut ar = Archive::open(&ctx, Format::Epub, bytes)?;
    let container = ar
        .xml(&ctx, "META-INF/container.xml")?
        .ok_or_else(|| Error::malformed(Format::Epub, "no META-INF/container.xml"))?;
    let opf_path = container
        .find("rootfile")
        .and_then(|r| r.attr("full-path"))
        .ok_or_else(|| Error::malformed(Format::Epub, "no rootfile in container.xml"))?
        .to_string();
    let opf = ar.xml(&ctx, &opf_path)?.ok_or_else(|| {
        Error::malformed(
            Format::Epub,
            format!("package document {opf_path} is missing"),
        )
    })?;
    let package = opf.child("package").unwrap_or(&opf);
    let mut blocks = Vec::new();
    if let Some(meta) = package.child("metadata") {
        let get_all = |name: &str| -> Vec<String> {
            meta.children_named(name)
                .map(|e| e.text().trim().to_string())
                .filter(|t| !t.is_empty())
                .collect()
        };
        if let Some(title) = get_all("title").first() {
            blocks.push(format!("# {title}"));
        }
        let mut lines = Vec::new();
        for (label, key) in [
            ("Authors", "creator"),
            ("Publisher", "publisher"),
            ("Date", "date"),
            ("Language", "language"),
            ("Identifier", "identifier"),
            ("Subjects", "subject"),
            ("Description", "description"),
        ] {
            let values = get_all(key);
            if !values.is_empty() {
                let joined = values.join(", ");
                let value = if key == "description" {
                    super::html::html_to_markdown(&joined)
                } else {
                    joined
                };
                lines.push(format!("**{label}:** {}", value.trim().replace('\n', " ")));
            }
        }
        if !lines.is_empty() {
            blocks.push(lines.join("  \n"));
        }
    }
    let mut manifest: HashMap<String, (String, String)> = HashMap::new();
    if let Some(m) = package.child("manifest") {
        for item in m.children_named("item") {
            if let (Some(id), Some(href)) = (item.attr("id"), item.attr("href")) {
                let href = percent_decode(href);
                manifest.insert(
                    id.to_string(),
                    (
                        archive::resolve(&opf_path, &href),
                        item.attr("media-type").unwrap_or("").to_string(),
                    ),
                );
            }
        }
    }
    let spine: Vec<String> = package
        .child("spine")
        .map(|s| {
            s.children_named("itemref")
                .filter_map(|i| i.attr("idref").map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for idref in spine {
        ctx.check_time()?;
        let Some((path, media)) = manifest.get(&idref) else {
            continue;
        };
        if !(media.contains("html") || media.is_empty()) {
            continue;
        }
        let Some(bytes) = ar.read(&ctx, path)? else {
            ctx.warn(format!("chapter {path} is missing"));
            continue;
        };
        let html = crate::text::decode(&bytes);
        let chapter = super::html::html_to_markdown(&html);
        if !chapter.trim().is_empty() {
            blocks.push(chapter);
        }
    }
    Ok(md::join_blocks(blocks))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
