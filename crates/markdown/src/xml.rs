//! A small read-only XML tree over quick-xml, for the zip-based formats.
//!
//! Safety properties the converters rely on: entity references are resolved only for the XML
//! predefined entities, numeric character references and the fixed HTML5 entity table; entities
//! declared in a DTD are never expanded (so "billion laughs" documents stay small), and elements
//! nested deeper than [`crate::Limits::max_xml_depth`] are flattened into their deepest allowed
//! ancestor, so walking the tree recursively is bounded.

use compact_str::CompactString;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;

/// An element: its local name (namespace prefix dropped), attributes and children.
///
/// Names and attributes are small strings kept inline (no heap allocation up to 24 bytes):
/// office documents are millions of tiny elements, and allocating each name and value on its
/// own was most of the time spent reading a large DOCX.
#[derive(Debug, Default, Clone)]
pub struct Element {
    pub name: CompactString,
    /// (qualified name, value)
    pub attrs: Vec<(CompactString, CompactString)>,
    pub children: Vec<Node>,
}

#[derive(Debug, Clone)]
pub enum Node {
    Element(Element),
    Text(String),
}

impl Element {
    /// The value of the attribute whose local name is `local` (`w:val` answers `val`).
    pub fn attr(&self, local: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k.rsplit(':').next() == Some(local))
            .map(|(_, v)| v.as_str())
    }

    /// The value of the attribute with exactly this qualified name (`r:id`).
    pub fn attr_q(&self, qname: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == qname)
            .map(|(_, v)| v.as_str())
    }

    /// Child elements.
    pub fn elements(&self) -> impl Iterator<Item = &Element> {
        self.children.iter().filter_map(|n| match n {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        })
    }

    /// The first child element named `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.elements().find(|e| e.name == name)
    }

    /// Child elements named `name`.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.elements().filter(move |e| e.name == name)
    }

    /// The first descendant (depth first, self excluded) named `name`.
    pub fn find(&self, name: &str) -> Option<&Element> {
        for e in self.elements() {
            if e.name == name {
                return Some(e);
            }
            if let Some(found) = e.find(name) {
                return Some(found);
            }
        }
        None
    }

    /// All descendants named `name`, in document order (not descending into matches).
    pub fn find_all<'a>(&'a self, name: &str, out: &mut Vec<&'a Element>) {
        for e in self.elements() {
            if e.name == name {
                out.push(e);
            } else {
                e.find_all(name, out);
            }
        }
    }

    /// All text below this element, concatenated.
    pub fn text(&self) -> String {
        let mut s = String::new();
        self.collect_text(&mut s);
        s
    }

    fn collect_text(&self, out: &mut String) {
        for c in &self.children {
            match c {
                Node::Text(t) => out.push_str(t),
                Node::Element(e) => e.collect_text(out),
            }
        }
    }
}

/// Parses `bytes` into a tree under a synthetic root element named `#document`.
pub fn parse(ctx: &Ctx<'_>, format: Format, bytes: &[u8]) -> Result<Element> {
    let text = crate::text::decode(bytes);
    parse_str(ctx, format, &text)
}

/// As [`parse`], for text already decoded.
pub fn parse_str(ctx: &Ctx<'_>, format: Format, text: &str) -> Result<Element> {
    let max_depth = ctx.limits().max_xml_depth.max(1);
    let mut reader = Reader::from_str(text);
    let config = reader.config_mut();
    config.check_end_names = false;
    config.allow_unmatched_ends = true;
    config.allow_dangling_amp = true;
    let mut stack: Vec<Element> = vec![Element {
        name: "#document".into(),
        ..Default::default()
    }];
    // How many opened elements were flattened (not pushed) because the tree was too deep.
    let mut flattened = 0usize;
    let mut events = 0u32;
    loop {
        events = events.wrapping_add(1);
        if events.is_multiple_of(4096) {
            ctx.check_time()?;
        }
        let event = match reader.read_event() {
            Ok(e) => e,
            Err(e) => {
                // Keep what was read when the document was cut short; fail when nothing was.
                if stack.len() > 1 || !stack[0].children.is_empty() {
                    ctx.warn(format!(
                        "{format}: XML error, content after it dropped: {e}"
                    ));
                    break;
                }
                return Err(Error::malformed(format, e));
            }
        };
        match event {
            Event::Start(start) => {
                if stack.len() > max_depth {
                    flattened += 1;
                    continue;
                }
                stack.push(element(&start));
            }
            Event::Empty(start) => {
                let el = element(&start);
                if let Some(top) = stack.last_mut() {
                    top.children.push(Node::Element(el));
                }
            }
            Event::End(_) => {
                if flattened > 0 {
                    flattened -= 1;
                    continue;
                }
                if stack.len() > 1 {
                    let done = stack.pop().unwrap_or_default();
                    if let Some(top) = stack.last_mut() {
                        top.children.push(Node::Element(done));
                    }
                }
            }
            Event::Text(t) => push_text(&mut stack, &t.xml10_content()),
            Event::CData(t) => push_text(&mut stack, &t.xml10_content()),
            Event::GeneralRef(r) => {
                let name = r.xml10_content();
                let resolved: Option<String> = if r.is_char_ref() {
                    r.resolve_char_ref().ok().flatten().map(String::from)
                } else {
                    resolve_predefined_entity(&name)
                        .or_else(|| html_entity(&name))
                        .map(str::to_string)
                };
                if let Some(s) = resolved {
                    push_text(&mut stack, &s);
                }
            }
            Event::Eof => break,
            // Declarations, DTDs (never expanded), comments and processing instructions.
            _ => {}
        }
    }
    while stack.len() > 1 {
        let done = stack.pop().unwrap_or_default();
        if let Some(top) = stack.last_mut() {
            top.children.push(Node::Element(done));
        }
    }
    Ok(stack.pop().unwrap_or_default())
}

/// The HTML entities that turn up in XHTML (EPUB chapters, feeds) without a DTD to declare them.
fn html_entity(name: &str) -> Option<&'static str> {
    Some(match name {
        "nbsp" => "\u{a0}",
        "mdash" => "—",
        "ndash" => "–",
        "hellip" => "…",
        "lsquo" => "‘",
        "rsquo" => "’",
        "ldquo" => "“",
        "rdquo" => "”",
        "laquo" => "«",
        "raquo" => "»",
        "copy" => "©",
        "reg" => "®",
        "trade" => "™",
        "deg" => "°",
        "middot" => "·",
        "bull" => "•",
        "eacute" => "é",
        "egrave" => "è",
        "agrave" => "à",
        "auml" => "ä",
        "ouml" => "ö",
        "uuml" => "ü",
        "szlig" => "ß",
        "ccedil" => "ç",
        "euro" => "€",
        "pound" => "£",
        "times" => "×",
        "shy" => "\u{ad}",
        _ => return None,
    })
}

fn push_text(stack: &mut [Element], s: &str) {
    if s.is_empty() {
        return;
    }
    if let Some(top) = stack.last_mut() {
        if let Some(Node::Text(prev)) = top.children.last_mut() {
            prev.push_str(s);
        } else {
            top.children.push(Node::Text(s.to_string()));
        }
    }
}

fn element(start: &BytesStart<'_>) -> Element {
    let name = CompactString::from(start.local_name().into_inner());
    let mut attrs = Vec::new();
    for attr in start.attributes().with_checks(false).flatten() {
        let key = CompactString::from(attr.key.into_inner());
        let value = match attr.normalized_value(quick_xml::XmlVersion::Implicit1_0) {
            Ok(v) => CompactString::from(v.as_ref()),
            Err(_) => CompactString::from(attr.value.as_ref()),
        };
        attrs.push((key, value));
    }
    Element {
        name,
        attrs,
        children: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    fn parse_test(xml: &str) -> Element {
        let budget = Budget::new(Limits::default());
        let ctx = Ctx {
            budget: &budget,
            depth: 0,
        };
        parse_str(&ctx, Format::Xml, xml).expect("parses")
    }

    #[test]
    fn billion_laughs_entities_are_not_expanded() {
        let mut xml = String::from("<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\">");
        for i in 1..10 {
            let prev = if i == 1 {
                "lol".to_string()
            } else {
                format!("lol{}", i - 1)
            };
            xml.push_str(&format!(
                "<!ENTITY lol{i} \"{}\">",
                format!("&{prev};").repeat(10)
            ));
        }
        xml.push_str("]><lolz>&lol9;</lolz>");
        let root = parse_test(&xml);
        assert!(root.text().len() < 100, "entity expansion must not happen");
    }

    #[test]
    fn deep_nesting_is_flattened_not_recursed() {
        let depth = 100_000;
        let xml = format!("{}x{}", "<a>".repeat(depth), "</a>".repeat(depth));
        let root = parse_test(&xml);
        assert_eq!(root.text(), "x");
    }

    #[test]
    fn predefined_and_numeric_references_resolve() {
        let root = parse_test("<p a=\"x &amp; y\">1 &lt; 2 &#233; &nbsp;</p>");
        let p = root.child("p").expect("p");
        assert_eq!(p.attr("a"), Some("x & y"));
        assert_eq!(p.text(), "1 < 2 é \u{a0}");
    }
}
