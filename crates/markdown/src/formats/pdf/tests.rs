//! Unit tests of the PDF converter.

use super::layout::{flush, lines, Glyph};
use super::*;

fn g(x: f64, y: f64, text: &str) -> Glyph {
    Glyph {
        x,
        y,
        end: x + 6.0 * text.chars().count() as f64,
        size: 12.0,
        text: text.into(),
    }
}

#[test]
fn hyphenated_line_ends_are_joined() {
    let mut para = vec!["the conver-".to_string(), "sion works".to_string()];
    let mut blocks = Vec::new();
    flush(&mut para, &mut blocks);
    assert_eq!(blocks, vec!["the conversion works"]);
}

#[test]
fn glyphs_group_into_lines_and_segments() {
    let glyphs = vec![
        g(10.0, 100.0, "Name"),
        g(200.0, 100.0, "Qty"),
        g(10.0, 115.0, "apple"),
        g(200.0, 115.0, "3"),
    ];
    let lines = lines(&glyphs);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].segments.len(), 2);
    assert_eq!(lines[1].text(), "apple 3");
}

/// A PDF of `pages` pages showing "Hello world" in a TrueType font whose embedded program
/// is a Flate stream inflating to `font_bytes` zero bytes.
fn pdf_with_embedded_font(pages: usize, font_bytes: usize) -> Vec<u8> {
    use pdf_extract::{Dictionary, Document, Object, Stream};
    use std::io::Write;
    let mut doc = Document::with_version("1.5");
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&vec![0u8; font_bytes]).unwrap();
    let mut program = Dictionary::new();
    program.set("Filter", Object::Name(b"FlateDecode".to_vec()));
    let program = doc.add_object(Stream::new(program, z.finish().unwrap()));
    let mut descriptor = Dictionary::new();
    descriptor.set("Type", Object::Name(b"FontDescriptor".to_vec()));
    descriptor.set("FontName", Object::Name(b"Helvetica".to_vec()));
    descriptor.set("FontFile2", Object::Reference(program));
    let descriptor = doc.add_object(descriptor);
    let mut font = Dictionary::new();
    font.set("Type", Object::Name(b"Font".to_vec()));
    font.set("Subtype", Object::Name(b"TrueType".to_vec()));
    font.set("BaseFont", Object::Name(b"Helvetica".to_vec()));
    font.set("FirstChar", Object::Integer(32));
    font.set("LastChar", Object::Integer(126));
    font.set("Widths", Object::Array(vec![Object::Integer(500); 95]));
    font.set("FontDescriptor", Object::Reference(descriptor));
    let font = doc.add_object(font);
    let mut fonts = Dictionary::new();
    fonts.set("F1", Object::Reference(font));
    let mut resources = Dictionary::new();
    resources.set("Font", Object::Dictionary(fonts));
    let pages_id = doc.new_object_id();
    let mut kids = Vec::new();
    for _ in 0..pages {
        let content = doc.add_object(Stream::new(
            Dictionary::new(),
            b"BT /F1 12 Tf 72 720 Td (Hello world) Tj ET".to_vec(),
        ));
        let mut page = Dictionary::new();
        page.set("Type", Object::Name(b"Page".to_vec()));
        page.set("Parent", Object::Reference(pages_id));
        page.set("Contents", Object::Reference(content));
        page.set("Resources", Object::Dictionary(resources.clone()));
        page.set(
            "MediaBox",
            Object::Array(vec![0.into(), 0.into(), 612.into(), 792.into()]),
        );
        kids.push(Object::Reference(doc.add_object(page)));
    }
    let mut tree = Dictionary::new();
    tree.set("Type", Object::Name(b"Pages".to_vec()));
    tree.set("Count", Object::Integer(pages as i64));
    tree.set("Kids", Object::Array(kids));
    doc.objects.insert(pages_id, Object::Dictionary(tree));
    let mut catalog = Dictionary::new();
    catalog.set("Type", Object::Name(b"Catalog".to_vec()));
    catalog.set("Pages", Object::Reference(pages_id));
    let catalog = doc.add_object(catalog);
    doc.trailer.set("Root", Object::Reference(catalog));
    let mut out = Vec::new();
    doc.save_to(&mut out).unwrap();
    out
}

fn convert_with(limits: crate::Limits, bytes: &[u8]) -> Result<String> {
    let budget = crate::limits::Budget::new(limits);
    convert(
        Ctx {
            budget: &budget,
            depth: 0,
        },
        bytes,
    )
}

#[test]
fn every_page_of_a_document_with_an_embedded_font_is_read() {
    let pdf = pdf_with_embedded_font(3, 64 * 1024);
    let md = convert_with(crate::Limits::default(), &pdf).unwrap();
    assert_eq!(md.matches("Hello world").count(), 3, "{md}");
}

#[test]
fn a_font_program_inflating_past_the_unpack_limit_is_refused() {
    let pdf = pdf_with_embedded_font(1, 4 << 20);
    let limits = crate::Limits {
        max_unpacked_bytes: 1 << 20,
        ..Default::default()
    };
    assert!(matches!(
        convert_with(limits, &pdf),
        Err(Error::ExpandsTooMuch { .. })
    ));
}

#[test]
fn the_fallback_is_refused_an_array_naming_one_stream_twice() {
    let budget = crate::limits::Budget::new(crate::Limits::default());
    let ctx = Ctx {
        budget: &budget,
        depth: 0,
    };
    let repeated = b"1 0 obj << /Type /Page /Contents [4 0 R 5 0 R 4 0 R] >> endobj";
    assert!(unpack::precheck(&ctx, repeated, false).is_err());
    let distinct = b"1 0 obj << /Contents [4 0 R 5 0 R] /MediaBox [0 0 612 792] >> endobj";
    assert!(unpack::precheck(&ctx, distinct, false).is_ok());
    // lopdf's own load is not guarded by it (it never joins contents).
    assert!(unpack::precheck(&ctx, repeated, true).is_ok());
}
