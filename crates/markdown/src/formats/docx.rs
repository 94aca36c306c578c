//! DOCX (WordprocessingML): headings by style, emphasis, nested lists, tables with merged
//! cells, hyperlinks, footnotes and endnotes, image alt text.

use std::collections::HashMap;

use super::archive::{self, Archive};
use super::inline::{self, Run};
use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;
use crate::xml::Element;

#[derive(Debug, Default, Clone)]
struct Style {
    name: String,
    based_on: Option<String>,
    outline: Option<usize>,
    num: Option<(String, usize)>,
    bold: bool,
    italic: bool,
}

struct Doc {
    styles: HashMap<String, Style>,
    /// numId -> ilvl -> is the level numbered (not a bullet)?
    numbering: HashMap<String, HashMap<usize, bool>>,
    links: HashMap<String, String>,
    images: HashMap<String, String>,
    list_widths: Vec<usize>,
    note_ids: HashMap<(bool, String), usize>,
    counters: HashMap<(String, usize), usize>,
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let mut ar = Archive::open(&ctx, Format::Docx, bytes)?;
    let main = archive::relationships(&ctx, &mut ar, "")?
        .into_iter()
        .find(|r| r.kind == "officeDocument")
        .map(|r| r.target)
        .unwrap_or_else(|| "word/document.xml".into());
    let root = ar
        .xml(&ctx, &main)?
        .ok_or_else(|| Error::malformed(Format::Docx, "no main document part"))?;
    let rels = archive::relationships(&ctx, &mut ar, &main)?;
    let mut doc = Doc {
        styles: HashMap::new(),
        numbering: HashMap::new(),
        links: HashMap::new(),
        images: HashMap::new(),
        list_widths: Vec::new(),
        note_ids: HashMap::new(),
        counters: HashMap::new(),
    };
    let mut notes_parts: Vec<(bool, Element)> = Vec::new();
    for rel in &rels {
        match rel.kind.as_str() {
            "hyperlink" => {
                doc.links.insert(rel.id.clone(), rel.target.clone());
            }
            "image" => {
                doc.images.insert(rel.id.clone(), rel.target.clone());
            }
            "styles" => {
                if let Some(x) = ar.xml(&ctx, &rel.target)? {
                    doc.styles = styles(&x);
                }
            }
            "numbering" => {
                if let Some(x) = ar.xml(&ctx, &rel.target)? {
                    doc.numbering = numbering(&x);
                }
            }
            "footnotes" | "endnotes" => {
                if let Some(x) = ar.xml(&ctx, &rel.target)? {
                    notes_parts.push((rel.kind == "endnotes", x));
                }
            }
            _ => {}
        }
    }
    let body = root
        .find("body")
        .ok_or_else(|| Error::malformed(Format::Docx, "no document body"))?;
    let mut blocks = Vec::new();
    blocks_of(&ctx, &mut doc, body, &mut blocks)?;
    // Notes referenced in the text, in order of first reference.
    let mut notes_out = Vec::new();
    if !doc.note_ids.is_empty() {
        // Each notes part indexed once by note id (not searched again for every reference).
        let mut by_id: HashMap<(bool, &str), &Element> = HashMap::new();
        for (endnote, part) in &notes_parts {
            let tag = if *endnote { "endnote" } else { "footnote" };
            let mut found = Vec::new();
            part.find_all(tag, &mut found);
            for note in found {
                if let Some(id) = note.attr("id") {
                    by_id.entry((*endnote, id)).or_insert(note);
                }
            }
        }
        let mut by_number: Vec<((bool, String), usize)> =
            doc.note_ids.clone().into_iter().collect();
        by_number.sort_by_key(|(_, n)| *n);
        for ((endnote, id), n) in by_number {
            if let Some(note) = by_id.get(&(endnote, id.as_str())) {
                let mut inner = Vec::new();
                blocks_of(&ctx, &mut doc, note, &mut inner)?;
                let text = inner
                    .iter()
                    .map(|b| b.text.trim())
                    .collect::<Vec<_>>()
                    .join(" ");
                notes_out.push(format!("[^{n}]: {text}"));
            }
        }
    }
    let mut out = render_blocks(&blocks);
    if !notes_out.is_empty() {
        out.push_str("\n\n");
        out.push_str(&notes_out.join("\n"));
        out.push('\n');
    }
    Ok(out)
}

/// One rendered block and whether it is a list item (list items are not separated by blank lines).
struct Block {
    text: String,
    list: bool,
}

fn render_blocks(blocks: &[Block]) -> String {
    let mut out = String::new();
    let mut prev_list = false;
    for b in blocks {
        if b.text.trim().is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str(if b.list && prev_list { "\n" } else { "\n\n" });
        }
        out.push_str(&b.text);
        prev_list = b.list;
    }
    out.push('\n');
    out
}

fn blocks_of(ctx: &Ctx<'_>, doc: &mut Doc, parent: &Element, out: &mut Vec<Block>) -> Result<()> {
    for el in parent.elements() {
        ctx.check_time()?;
        match el.name.as_str() {
            "p" => {
                if let Some(b) = paragraph(doc, el) {
                    out.push(b);
                }
            }
            "tbl" => out.push(Block {
                text: table(ctx, doc, el)?,
                list: false,
            }),
            "sdt" => {
                if let Some(content) = el.child("sdtContent") {
                    blocks_of(ctx, doc, content, out)?;
                }
            }
            "customXml" | "ins" | "smartTag" | "txbxContent" | "footnote" | "endnote" => {
                blocks_of(ctx, doc, el, out)?
            }
            _ => {}
        }
    }
    Ok(())
}

fn style_chain<'a>(doc: &'a Doc, id: &str) -> Vec<&'a Style> {
    let mut chain = Vec::new();
    let mut cur = doc.styles.get(id);
    while let Some(s) = cur {
        if chain.len() > 16 {
            break;
        }
        chain.push(s);
        cur = s.based_on.as_deref().and_then(|b| doc.styles.get(b));
    }
    chain
}

fn heading_level(doc: &Doc, ppr: Option<&Element>) -> Option<usize> {
    let ppr = ppr?;
    if let Some(l) = ppr
        .child("outlineLvl")
        .and_then(|o| o.attr("val"))
        .and_then(|v| v.parse::<usize>().ok())
    {
        if l < 9 {
            return Some(l + 1);
        }
    }
    let id = ppr.child("pStyle")?.attr("val")?;
    for s in style_chain(doc, id) {
        let name = s.name.as_str();
        if name == "title" {
            return Some(1);
        }
        if name == "subtitle" {
            return Some(2);
        }
        if let Some(n) = name
            .strip_prefix("heading")
            .map(str::trim)
            .and_then(|n| n.parse::<usize>().ok())
        {
            return Some(n.clamp(1, 6));
        }
        if let Some(l) = s.outline {
            return Some((l + 1).min(6));
        }
    }
    None
}

/// (numId, level, numbered?) of a list paragraph.
fn list_info(doc: &Doc, ppr: Option<&Element>) -> Option<(String, usize, bool)> {
    let ppr = ppr?;
    let (num_id, ilvl) = if let Some(num) = ppr.child("numPr") {
        let id = num.child("numId").and_then(|n| n.attr("val"))?.to_string();
        let lvl = num
            .child("ilvl")
            .and_then(|n| n.attr("val"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (id, lvl)
    } else {
        let id = ppr.child("pStyle")?.attr("val")?;
        let chain = style_chain(doc, id);
        if let Some((n, l)) = chain.iter().find_map(|s| s.num.clone()) {
            (n, l)
        } else {
            let name = &chain.first()?.name;
            if name.starts_with("list bullet") || name.starts_with("list number") {
                let lvl = name
                    .rsplit(' ')
                    .next()
                    .and_then(|d| d.parse::<usize>().ok())
                    .unwrap_or(1)
                    - 1;
                return Some((name.clone(), lvl.min(8), name.starts_with("list number")));
            }
            return None;
        }
    };
    if num_id == "0" {
        return None; // numbering explicitly removed
    }
    let numbered = doc
        .numbering
        .get(&num_id)
        .and_then(|levels| levels.get(&ilvl))
        .copied()
        .unwrap_or(false);
    Some((num_id, ilvl.min(8), numbered))
}

fn paragraph(doc: &mut Doc, p: &Element) -> Option<Block> {
    let ppr = p.child("pPr");
    let style_id = ppr
        .and_then(|x| x.child("pStyle"))
        .and_then(|s| s.attr("val"))
        .map(str::to_string);
    let (style_bold, style_italic) = style_id
        .as_deref()
        .map(|id| {
            let chain = style_chain(doc, id);
            (chain.iter().any(|s| s.bold), chain.iter().any(|s| s.italic))
        })
        .unwrap_or((false, false));
    let mut runs = Vec::new();
    inline_of(doc, p, &Fmt::default(), &mut runs);
    let heading = heading_level(doc, ppr);
    if heading.is_none() && (style_bold || style_italic) {
        for r in runs.iter_mut().filter(|r| !r.raw) {
            r.bold |= style_bold;
            r.italic |= style_italic;
        }
    }
    if heading.is_some() {
        // Headings carry their own weight: no emphasis markers inside them.
        for r in runs.iter_mut() {
            r.bold = false;
            r.italic = false;
        }
    }
    let text = inline::render(&runs);
    let text = text.trim().to_string();
    if text.is_empty() {
        return None;
    }
    if let Some(level) = heading {
        return Some(Block {
            text: format!("{} {}", "#".repeat(level), text.replace('\n', " ")),
            list: false,
        });
    }
    if let Some((num_id, level, numbered)) = list_info(doc, ppr) {
        let marker = if numbered {
            // Restart deeper levels when a shallower item appears.
            doc.counters
                .retain(|(id, l), _| !(id == &num_id && *l > level));
            let n = doc.counters.entry((num_id, level)).or_insert(0);
            *n += 1;
            format!("{n}.")
        } else {
            "-".to_string()
        };
        // Indent by the widths of the markers of the enclosing items, as Markdown nests.
        doc.list_widths.resize(level + 1, 2);
        let indent: usize = doc.list_widths[..level].iter().sum();
        doc.list_widths[level] = marker.chars().count() + 1;
        return Some(Block {
            text: format!("{}{marker} {}", " ".repeat(indent), text.replace('\n', " ")),
            list: true,
        });
    }
    doc.list_widths.clear();
    Some(Block { text, list: false })
}

#[derive(Default, Clone)]
struct Fmt {
    bold: bool,
    italic: bool,
    strike: bool,
    link: Option<String>,
}

fn toggle(rpr: Option<&Element>, name: &str) -> Option<bool> {
    let e = rpr?.child(name)?;
    Some(!matches!(
        e.attr("val"),
        Some("0" | "false" | "off" | "none")
    ))
}

fn inline_of(doc: &mut Doc, parent: &Element, fmt: &Fmt, runs: &mut Vec<Run>) {
    for el in parent.elements() {
        match el.name.as_str() {
            "r" => {
                let rpr = el.child("rPr");
                let mut f = fmt.clone();
                if let Some(b) = toggle(rpr, "b") {
                    f.bold = b;
                }
                if let Some(i) = toggle(rpr, "i") {
                    f.italic = i;
                }
                if let Some(s) = toggle(rpr, "strike").or(toggle(rpr, "dstrike")) {
                    f.strike = s;
                }
                if let Some(style) = rpr
                    .and_then(|r| r.child("rStyle"))
                    .and_then(|s| s.attr("val"))
                {
                    let chain = style_chain(doc, style);
                    f.bold |= chain.iter().any(|s| s.bold);
                    f.italic |= chain.iter().any(|s| s.italic);
                }
                run_content(doc, el, &f, runs);
            }
            "hyperlink" => {
                let mut f = fmt.clone();
                f.link = el
                    .attr_q("r:id")
                    .or_else(|| el.attr("id"))
                    .and_then(|id| doc.links.get(id).cloned())
                    .or_else(|| el.attr("anchor").map(|a| format!("#{a}")));
                inline_of(doc, el, &f, runs);
            }
            "ins" | "smartTag" | "customXml" | "fldSimple" | "sdt" | "sdtContent" | "bdo"
            | "dir" => inline_of(doc, el, fmt, runs),
            _ => {}
        }
    }
}

fn run_content(doc: &mut Doc, r: &Element, f: &Fmt, runs: &mut Vec<Run>) {
    let styled = |text: String| Run {
        text,
        bold: f.bold,
        italic: f.italic,
        strike: f.strike,
        link: f.link.clone(),
        raw: false,
    };
    for c in r.elements() {
        match c.name.as_str() {
            "t" => runs.push(styled(c.text())),
            "tab" | "ptab" => runs.push(styled(" ".into())),
            "br" | "cr" => runs.push(Run::raw("  \n")),
            "noBreakHyphen" => runs.push(styled("-".into())),
            "sym" => {
                if let Some(ch) = c
                    .attr("char")
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32)
                {
                    runs.push(styled(ch.to_string()));
                }
            }
            "footnoteReference" | "endnoteReference" => {
                if let Some(id) = c.attr("id") {
                    let key = (c.name == "endnoteReference", id.to_string());
                    let next = doc.note_ids.len() + 1;
                    let n = *doc.note_ids.entry(key).or_insert(next);
                    runs.push(Run::raw(format!("[^{n}]")));
                }
            }
            "drawing" | "pict" | "object" => {
                let mut props = Vec::new();
                c.find_all("docPr", &mut props);
                let mut shapes = Vec::new();
                c.find_all("shape", &mut shapes);
                let alt = props
                    .first()
                    .and_then(|p| {
                        p.attr("descr")
                            .filter(|d| !d.is_empty())
                            .or_else(|| p.attr("title"))
                    })
                    .or_else(|| shapes.first().and_then(|s| s.attr("alt")))
                    .unwrap_or("")
                    .replace(['\n', '\r'], " ");
                let target = c
                    .find("blip")
                    .and_then(|b| b.attr("embed"))
                    .or_else(|| c.find("imagedata").and_then(|b| b.attr("id")))
                    .and_then(|id| doc.images.get(id))
                    .cloned()
                    .unwrap_or_default();
                let name = target.rsplit('/').next().unwrap_or("").to_string();
                if !alt.is_empty() || !name.is_empty() {
                    runs.push(Run::raw(format!(
                        "![{}]({})",
                        md::escape_inline(alt.trim()),
                        name
                    )));
                }
                // Text boxes inside drawings.
                let mut boxes = Vec::new();
                c.find_all("txbxContent", &mut boxes);
                for b in boxes {
                    for p in b.children_named("p") {
                        runs.push(styled(" ".into()));
                        inline_of(doc, p, f, runs);
                    }
                }
            }
            _ => {}
        }
    }
}

fn table(ctx: &Ctx<'_>, doc: &mut Doc, tbl: &Element) -> Result<String> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for tr in tbl.children_named("tr") {
        ctx.check_time()?;
        let mut row = Vec::new();
        for tc in tr.elements().filter(|e| e.name == "tc" || e.name == "sdt") {
            let tc = if tc.name == "sdt" {
                match tc.child("sdtContent").and_then(|c| c.child("tc")) {
                    Some(c) => c,
                    None => continue,
                }
            } else {
                tc
            };
            let pr = tc.child("tcPr");
            let span = pr
                .and_then(|p| p.child("gridSpan"))
                .and_then(|g| g.attr("val"))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(1)
                .clamp(1, 64);
            // A vertically merged continuation cell is left empty: its text is in the cell above.
            let continued = pr
                .and_then(|p| p.child("vMerge"))
                .is_some_and(|v| v.attr("val").is_none_or(|val| val == "continue"));
            let text = if continued {
                String::new()
            } else {
                let mut blocks = Vec::new();
                blocks_of(ctx, doc, tc, &mut blocks)?;
                blocks
                    .iter()
                    .map(|b| md::cell(&b.text))
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
                    .join("<br>")
            };
            row.push(text);
            for _ in 1..span {
                row.push(String::new());
            }
        }
        rows.push(row);
    }
    Ok(md::table(&rows))
}

fn styles(root: &Element) -> HashMap<String, Style> {
    let mut out = HashMap::new();
    let Some(styles) = root.child("styles") else {
        return out;
    };
    for s in styles.children_named("style") {
        let Some(id) = s.attr("styleId") else {
            continue;
        };
        let ppr = s.child("pPr");
        let rpr = s.child("rPr");
        out.insert(
            id.to_string(),
            Style {
                name: s
                    .child("name")
                    .and_then(|n| n.attr("val"))
                    .unwrap_or(id)
                    .to_ascii_lowercase(),
                based_on: s
                    .child("basedOn")
                    .and_then(|b| b.attr("val"))
                    .map(str::to_string),
                outline: ppr
                    .and_then(|p| p.child("outlineLvl"))
                    .and_then(|o| o.attr("val"))
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|&l| l < 9),
                num: ppr.and_then(|p| p.child("numPr")).and_then(|n| {
                    let id = n.child("numId")?.attr("val")?.to_string();
                    let lvl = n
                        .child("ilvl")
                        .and_then(|l| l.attr("val"))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    Some((id, lvl))
                }),
                bold: toggle(rpr, "b").unwrap_or(false),
                italic: toggle(rpr, "i").unwrap_or(false),
            },
        );
    }
    out
}

fn numbering(root: &Element) -> HashMap<String, HashMap<usize, bool>> {
    let mut abstracts: HashMap<String, HashMap<usize, bool>> = HashMap::new();
    let mut out = HashMap::new();
    let Some(n) = root.child("numbering") else {
        return out;
    };
    for a in n.children_named("abstractNum") {
        let Some(id) = a.attr("abstractNumId") else {
            continue;
        };
        let mut levels = HashMap::new();
        for lvl in a.children_named("lvl") {
            let i = lvl
                .attr("ilvl")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            let fmt = lvl
                .child("numFmt")
                .and_then(|f| f.attr("val"))
                .unwrap_or("bullet");
            levels.insert(i, !matches!(fmt, "bullet" | "none"));
        }
        abstracts.insert(id.to_string(), levels);
    }
    for num in n.children_named("num") {
        let (Some(id), Some(abs)) = (
            num.attr("numId"),
            num.child("abstractNumId").and_then(|a| a.attr("val")),
        ) else {
            continue;
        };
        if let Some(levels) = abstracts.get(abs) {
            out.insert(id.to_string(), levels.clone());
        }
    }
    out
}
