//! ODT (OpenDocument text): headings by outline level, paragraphs with emphasis from automatic
//! styles, nested lists, tables, links and footnotes.

use std::collections::HashMap;

use super::archive::Archive;
use super::inline::{self, Run};
use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;
use crate::xml::{Element, Node};

struct Odt {
    /// style name -> (bold, italic)
    styles: HashMap<String, (bool, bool)>,
    notes: Vec<String>,
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let mut ar = Archive::open(&ctx, Format::Odt, bytes)?;
    let content = ar
        .xml(&ctx, "content.xml")?
        .ok_or_else(|| Error::malformed(Format::Odt, "no content.xml"))?;
    let mut odt = Odt {
        styles: HashMap::new(),
        notes: Vec::new(),
    };
    for part in [ar.xml(&ctx, "styles.xml")?, Some(content.clone())]
        .into_iter()
        .flatten()
    {
        let mut styles = Vec::new();
        part.find_all("style", &mut styles);
        for s in styles {
            let Some(name) = s.attr("name") else { continue };
            let props = s.child("text-properties");
            let bold = props
                .and_then(|p| p.attr("font-weight"))
                .is_some_and(|w| w == "bold" || w.parse::<u32>().is_ok_and(|n| n >= 600));
            let italic = props
                .and_then(|p| p.attr("font-style"))
                .is_some_and(|w| w == "italic" || w == "oblique");
            odt.styles.insert(name.to_string(), (bold, italic));
        }
    }
    let text = content
        .find("text")
        .filter(|t| t.name == "text")
        .ok_or_else(|| Error::malformed(Format::Odt, "no office:text body"))?;
    let mut blocks = Vec::new();
    body(&ctx, &mut odt, text, &mut blocks, 0)?;
    let mut out = md::join_blocks(blocks);
    if !odt.notes.is_empty() {
        out.push('\n');
        for (i, n) in odt.notes.iter().enumerate() {
            out.push_str(&format!("[^{}]: {}\n", i + 1, n));
        }
    }
    Ok(out)
}

fn body(
    ctx: &Ctx<'_>,
    odt: &mut Odt,
    parent: &Element,
    blocks: &mut Vec<String>,
    list_level: usize,
) -> Result<()> {
    for el in parent.elements() {
        ctx.check_time()?;
        match el.name.as_str() {
            "h" => {
                let level = el
                    .attr("outline-level")
                    .and_then(|l| l.parse::<usize>().ok())
                    .unwrap_or(1)
                    .clamp(1, 6);
                let t = para(odt, el, true);
                if !t.is_empty() {
                    blocks.push(format!("{} {}", "#".repeat(level), t));
                }
            }
            "p" => {
                let t = para(odt, el, false);
                if !t.is_empty() {
                    blocks.push(t);
                }
            }
            "list" => {
                let mut items = Vec::new();
                list(odt, el, &mut items, list_level);
                blocks.push(items.join("\n"));
            }
            "table" => blocks.push(table(odt, el)),
            "section" | "soft-page-break" | "index-body" | "table-of-content" => {
                body(ctx, odt, el, blocks, list_level)?
            }
            _ => {}
        }
    }
    Ok(())
}

fn list(odt: &mut Odt, l: &Element, items: &mut Vec<String>, level: usize) {
    for item in l
        .elements()
        .filter(|e| e.name == "list-item" || e.name == "list-header")
    {
        for child in item.elements() {
            match child.name.as_str() {
                "p" | "h" => {
                    let t = para(odt, child, false);
                    if !t.is_empty() {
                        items.push(format!("{}- {}", "  ".repeat(level), t));
                    }
                }
                "list" => list(odt, child, items, (level + 1).min(8)),
                _ => {}
            }
        }
    }
}

fn para(odt: &mut Odt, p: &Element, heading: bool) -> String {
    let (b, i) = p
        .attr("style-name")
        .and_then(|s| odt.styles.get(s))
        .copied()
        .unwrap_or((false, false));
    let mut runs = Vec::new();
    spans(
        odt,
        p,
        if heading { (false, false) } else { (b, i) },
        None,
        &mut runs,
        heading,
    );
    inline::render(&runs).trim().to_string()
}

fn spans(
    odt: &mut Odt,
    el: &Element,
    fmt: (bool, bool),
    link: Option<&str>,
    runs: &mut Vec<Run>,
    heading: bool,
) {
    for c in &el.children {
        match c {
            Node::Text(t) => runs.push(Run {
                text: t.clone(),
                bold: fmt.0,
                italic: fmt.1,
                strike: false,
                link: link.map(str::to_string),
                raw: false,
            }),
            Node::Element(e) => match e.name.as_str() {
                "span" => {
                    let f = e
                        .attr("style-name")
                        .and_then(|s| odt.styles.get(s))
                        .copied()
                        .unwrap_or((false, false));
                    let f = if heading {
                        (false, false)
                    } else {
                        (fmt.0 || f.0, fmt.1 || f.1)
                    };
                    spans(odt, e, f, link, runs, heading);
                }
                "a" => spans(odt, e, fmt, e.attr("href"), runs, heading),
                "s" => {
                    let n = e
                        .attr("c")
                        .and_then(|c| c.parse::<usize>().ok())
                        .unwrap_or(1)
                        .min(100);
                    runs.push(Run::plain(" ".repeat(n)));
                }
                "tab" => runs.push(Run::plain(" ")),
                "line-break" => runs.push(Run::raw("  \n")),
                "note" => {
                    let text = e.child("note-body").map(|b| b.text()).unwrap_or_default();
                    odt.notes
                        .push(text.split_whitespace().collect::<Vec<_>>().join(" "));
                    runs.push(Run::raw(format!("[^{}]", odt.notes.len())));
                }
                "bookmark" | "bookmark-start" | "bookmark-end" | "annotation"
                | "annotation-end" => {}
                _ => spans(odt, e, fmt, link, runs, heading),
            },
        }
    }
}

fn table(odt: &mut Odt, t: &Element) -> String {
    let mut rows = Vec::new();
    let mut trs = Vec::new();
    t.find_all("table-row", &mut trs);
    for tr in trs {
        let mut row = Vec::new();
        for c in tr.elements() {
            let repeat = c
                .attr("number-columns-repeated")
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(1)
                .min(64);
            let text = if c.name == "table-cell" {
                c.elements()
                    .filter(|e| e.name == "p" || e.name == "h")
                    .map(|p| md::cell(&para(odt, p, false)))
                    .collect::<Vec<_>>()
                    .join("<br>")
            } else if c.name == "covered-table-cell" {
                String::new()
            } else {
                continue;
            };
            for _ in 0..repeat {
                row.push(text.clone());
            }
        }
        while row.last().is_some_and(String::is_empty) {
            row.pop();
        }
        rows.push(row);
    }
    md::table(&rows)
}
