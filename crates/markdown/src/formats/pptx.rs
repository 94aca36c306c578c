//! PPTX (PresentationML): a section per slide with its title, text in reading order, bulleted
//! body placeholders with their levels, tables, charts (their data as a table, `chart.rs`),
//! pictures as `![alt](Name.ext)` and speaker notes.

use std::collections::HashMap;

use super::archive::{self, Archive};
use super::chart;
use super::inline::{self, Run};
use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;
use crate::xml::Element;

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let mut ar = Archive::open(&ctx, Format::Pptx, bytes)?;
    let pres_part = archive::relationships(&ctx, &mut ar, "")?
        .into_iter()
        .find(|r| r.kind == "officeDocument")
        .map(|r| r.target)
        .unwrap_or_else(|| "ppt/presentation.xml".into());
    let pres = ar
        .xml(&ctx, &pres_part)?
        .ok_or_else(|| Error::malformed(Format::Pptx, "no presentation part"))?;
    let rels: HashMap<String, String> = archive::relationships(&ctx, &mut ar, &pres_part)?
        .into_iter()
        .map(|r| (r.id, r.target))
        .collect();
    let mut slides = Vec::new();
    if let Some(list) = pres.find("sldIdLst") {
        for id in list.children_named("sldId") {
            if let Some(target) = id
                .attr_q("r:id")
                .or_else(|| id.attr("id"))
                .and_then(|rid| rels.get(rid))
            {
                slides.push(target.clone());
            }
        }
    }
    if slides.is_empty() {
        // No slide list: fall back to the slide parts in numeric order.
        let mut names: Vec<String> = ar
            .names()
            .into_iter()
            .filter(|n| n.starts_with("ppt/slides/slide") && n.ends_with(".xml"))
            .collect();
        names.sort_by_key(|n| {
            n.trim_start_matches("ppt/slides/slide")
                .trim_end_matches(".xml")
                .parse::<u32>()
                .unwrap_or(0)
        });
        slides = names;
    }
    let mut sections = Vec::new();
    for (i, part) in slides.iter().enumerate() {
        ctx.check_time()?;
        let Some(slide) = ar.xml(&ctx, part)? else {
            continue;
        };
        let slide_rels = archive::relationships(&ctx, &mut ar, part)?;
        let links: HashMap<String, String> = slide_rels
            .iter()
            .filter(|r| r.kind == "hyperlink")
            .map(|r| (r.id.clone(), r.target.clone()))
            .collect();
        let charts = slide_charts(&ctx, &mut ar, &slide_rels, i + 1)?;
        let images: HashMap<String, String> = slide_rels
            .iter()
            .filter(|r| r.kind == "image")
            .map(|r| (r.id.clone(), image_extension(&r.target)))
            .collect();
        let refs = Refs {
            links: &links,
            charts: &charts,
            images: &images,
        };
        let (title, body) = slide_content(&ctx, &slide, &refs)?;
        let mut section = match title {
            Some(t) => format!("## Slide {}: {}", i + 1, t),
            None => format!("## Slide {}", i + 1),
        };
        if !body.trim().is_empty() {
            section.push_str("\n\n");
            section.push_str(body.trim());
        }
        if let Some(notes_part) = slide_rels.iter().find(|r| r.kind == "notesSlide") {
            if let Some(notes) = ar.xml(&ctx, &notes_part.target)? {
                let text = notes_text(&notes, &links);
                if !text.trim().is_empty() {
                    section.push_str("\n\n### Notes\n\n");
                    section.push_str(text.trim());
                }
            }
        }
        sections.push(section);
    }
    Ok(md::join_blocks(sections))
}

/// What a slide's shapes point at through its relationships: hyperlink targets, its charts'
/// Markdown and its pictures' file extensions, by relationship id.
struct Refs<'a> {
    links: &'a HashMap<String, String>,
    charts: &'a HashMap<String, String>,
    images: &'a HashMap<String, String>,
}

/// The extension a picture's reference gets from its media part (`jpeg` written `jpg`, as
/// markitdown names every picture); `jpg` when the part has none.
fn image_extension(target: &str) -> String {
    let name = target.rsplit('/').next().unwrap_or(target);
    match name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()) {
        Some(e) if e == "jpeg" => "jpg".into(),
        Some(e)
            if !e.is_empty() && e.len() <= 5 && e.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            e
        }
        _ => "jpg".into(),
    }
}

/// A picture as markitdown writes it: `![alt](Name.ext)`, the alt text being the picture's
/// description (or its shape name when it has none) on one line, and the reference its shape
/// name without spaces or punctuation.
fn picture(pic: &Element, images: &HashMap<String, String>) -> String {
    let nv = pic.find("cNvPr");
    let name = nv.and_then(|c| c.attr("name")).unwrap_or("").trim();
    let alt = nv
        .and_then(|c| c.attr("descr"))
        .filter(|d| !d.trim().is_empty())
        .unwrap_or(name);
    let alt = alt.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut file: String = name
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if file.is_empty() {
        file.push_str("image");
    }
    let ext = pic
        .find("blip")
        .and_then(|b| b.attr_q("r:embed").or_else(|| b.attr("embed")))
        .and_then(|id| images.get(id))
        .map_or("jpg", String::as_str);
    format!("![{}]({file}.{ext})", md::escape_inline(&alt))
}

/// The Markdown of each chart the slide relates to, by relationship id. A chart part that is
/// missing, does not parse or holds no chart data is a warning (the slide converts without it);
/// limits and the time limit still end the conversion.
fn slide_charts(
    ctx: &Ctx<'_>,
    ar: &mut Archive<'_>,
    rels: &[archive::Rel],
    slide: usize,
) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for rel in rels.iter().filter(|r| r.kind == "chart") {
        let why = match ar.xml(ctx, &rel.target) {
            Ok(Some(part)) => match chart::markdown(&part) {
                Some(md) => {
                    out.insert(rel.id.clone(), md);
                    continue;
                }
                None => "it holds no chart data".to_string(),
            },
            Ok(None) => "its part is missing".to_string(),
            Err(Error::Malformed { reason, .. }) => reason,
            Err(e) => return Err(e),
        };
        ctx.warn(format!("a chart on slide {slide} is left out: {why}"));
    }
    Ok(out)
}

fn placeholder_type(sp: &Element) -> Option<String> {
    let nv = sp.elements().find(|e| e.name.starts_with("nv"))?;
    let ph = nv.child("nvPr")?.child("ph")?;
    Some(ph.attr("type").unwrap_or("body").to_string())
}

fn position(shape: &Element) -> (i64, i64) {
    let off = shape
        .elements()
        .find(|e| e.name == "spPr" || e.name == "xfrm" || e.name == "grpSpPr")
        .and_then(|p| {
            if p.name == "xfrm" {
                Some(p)
            } else {
                p.child("xfrm")
            }
        })
        .and_then(|x| x.child("off"));
    let get = |k: &str| {
        off.and_then(|o| o.attr(k))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(i64::MAX / 2)
    };
    (get("y"), get("x"))
}

/// (title, body Markdown) of a slide.
fn slide_content(
    ctx: &Ctx<'_>,
    slide: &Element,
    refs: &Refs<'_>,
) -> Result<(Option<String>, String)> {
    let Some(tree) = slide.find("spTree") else {
        return Ok((None, String::new()));
    };
    let mut title = None;
    let mut blocks = Vec::new();
    shapes(ctx, tree, refs, &mut title, &mut blocks)?;
    Ok((title, md::join_blocks(blocks)))
}

fn shapes(
    ctx: &Ctx<'_>,
    tree: &Element,
    refs: &Refs<'_>,
    title: &mut Option<String>,
    blocks: &mut Vec<String>,
) -> Result<()> {
    let links = refs.links;
    let mut ordered: Vec<&Element> = tree.elements().collect();
    // Reading order: top to bottom, then left to right (stable for shapes without a position).
    ordered.sort_by_key(|s| position(s));
    for shape in ordered {
        ctx.check_time()?;
        match shape.name.as_str() {
            "sp" => {
                let ph = placeholder_type(shape);
                let Some(body) = shape.child("txBody") else {
                    continue;
                };
                if matches!(ph.as_deref(), Some("title" | "ctrTitle")) && title.is_none() {
                    let t = paragraphs(body, links, false).replace('\n', " ");
                    if !t.trim().is_empty() {
                        *title = Some(t.trim().to_string());
                        continue;
                    }
                }
                if matches!(ph.as_deref(), Some("sldNum" | "dt" | "ftr")) {
                    continue;
                }
                let bullets = matches!(ph.as_deref(), Some("body" | "obj"));
                blocks.push(paragraphs(body, links, bullets));
            }
            "graphicFrame" => {
                if let Some(tbl) = shape.find("tbl") {
                    blocks.push(table(tbl, links));
                } else if let Some(md) = shape
                    .find("chart")
                    .and_then(|c| c.attr_q("r:id").or_else(|| c.attr("id")))
                    .and_then(|id| refs.charts.get(id))
                {
                    blocks.push(md.clone());
                }
            }
            "pic" => blocks.push(picture(shape, refs.images)),
            "grpSp" => shapes(ctx, shape, refs, title, blocks)?,
            _ => {}
        }
    }
    Ok(())
}

/// The paragraphs of a text body; `bullets` renders them as a list with their levels.
fn paragraphs(body: &Element, links: &HashMap<String, String>, bullets: bool) -> String {
    let mut lines = Vec::new();
    for p in body.children_named("p") {
        let mut runs = Vec::new();
        runs_of(p, links, &mut runs);
        let text = inline::render(&runs).trim().to_string();
        if text.is_empty() {
            continue;
        }
        let ppr = p.child("pPr");
        let level = ppr
            .and_then(|x| x.attr("lvl"))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
            .min(8);
        let no_bullet = ppr.is_some_and(|x| x.child("buNone").is_some());
        let explicit_bullet =
            ppr.is_some_and(|x| x.child("buChar").is_some() || x.child("buAutoNum").is_some());
        if (bullets && !no_bullet) || explicit_bullet {
            lines.push((
                format!("{}- {}", "  ".repeat(level), text.replace('\n', " ")),
                true,
            ));
        } else {
            lines.push((text, false));
        }
    }
    let mut out = String::new();
    let mut prev_list = false;
    for (line, list) in lines {
        if !out.is_empty() {
            out.push_str(if list && prev_list { "\n" } else { "\n\n" });
        }
        out.push_str(&line);
        prev_list = list;
    }
    out
}

fn runs_of(p: &Element, links: &HashMap<String, String>, runs: &mut Vec<Run>) {
    for el in p.elements() {
        match el.name.as_str() {
            "r" | "fld" => {
                let rpr = el.child("rPr");
                let flag = |k: &str| {
                    rpr.and_then(|r| r.attr(k))
                        .is_some_and(|v| v == "1" || v == "true")
                };
                let link = rpr
                    .and_then(|r| r.child("hlinkClick"))
                    .and_then(|h| h.attr_q("r:id").or_else(|| h.attr("id")))
                    .and_then(|id| links.get(id).cloned());
                let strike = rpr
                    .and_then(|r| r.attr("strike"))
                    .is_some_and(|v| v != "noStrike");
                runs.push(Run {
                    text: el.child("t").map(|t| t.text()).unwrap_or_default(),
                    bold: flag("b"),
                    italic: flag("i"),
                    strike,
                    link,
                    raw: false,
                });
            }
            "br" => runs.push(Run::raw("  \n")),
            _ => {}
        }
    }
}

fn table(tbl: &Element, links: &HashMap<String, String>) -> String {
    let mut rows = Vec::new();
    for tr in tbl.children_named("tr") {
        let mut row = Vec::new();
        for tc in tr.children_named("tc") {
            let merged = tc.attr("hMerge").is_some() || tc.attr("vMerge").is_some();
            let text = if merged {
                String::new()
            } else {
                tc.child("txBody")
                    .map(|b| md::cell(&paragraphs(b, links, false)))
                    .unwrap_or_default()
            };
            row.push(text);
        }
        rows.push(row);
    }
    md::table(&rows)
}

fn notes_text(notes: &Element, links: &HashMap<String, String>) -> String {
    let mut out = Vec::new();
    let Some(tree) = notes.find("spTree") else {
        return String::new();
    };
    let mut sps = Vec::new();
    tree.find_all("sp", &mut sps);
    for sp in sps {
        if placeholder_type(sp).as_deref() == Some("body") {
            if let Some(body) = sp.child("txBody") {
                out.push(paragraphs(body, links, false));
            }
        }
    }
    md::join_blocks(out)
}
