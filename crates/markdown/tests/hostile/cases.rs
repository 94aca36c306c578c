//! The hostile cases, each built only when its turn comes (some are tens of megabytes).
//!
//! Shared: the HTTP-level suite in the root `tests/` includes this file and `gen.rs` through
//! `#[path]` modules inside one of its own modules, beside its own `Case` and `Check`. So
//! siblings are named through `super::` only, never `crate::`, and the samples are read with
//! `include_bytes!` (relative to this file), not from the includer's manifest directory.

use hearth_markdown::{Conversion, Error};

use super::gen::{self, one_page, stream, text, Pdf};
use super::{Case, Check};

type Outcome<'a> = &'a Result<Conversion, Error>;

fn ok(r: Outcome<'_>) -> Result<(), String> {
    r.as_ref()
        .map(|_| ())
        .map_err(|e| format!("expected Ok, got {e}"))
}

/// Ok, and what was drawn before the hostile part survives.
fn ok_with_text(r: Outcome<'_>) -> Result<(), String> {
    match r {
        Ok(c) if c.markdown.contains("kept") => Ok(()),
        Ok(c) => Err(format!("the text is missing: {:?}", &c.markdown)),
        Err(e) => Err(format!("expected Ok, got {e}")),
    }
}

fn expands(r: Outcome<'_>) -> Result<(), String> {
    match r {
        Err(Error::ExpandsTooMuch { .. }) => Ok(()),
        _ => Err("expected ExpandsTooMuch".into()),
    }
}

/// A bomb in one stream: refused, or the stream left out (it is past the per-stream cap).
fn bounded(r: Outcome<'_>) -> Result<(), String> {
    match r {
        Ok(_) | Err(Error::ExpandsTooMuch { .. }) => Ok(()),
        Err(e) => Err(format!("expected Ok or ExpandsTooMuch, got {e}")),
    }
}

fn too_deep_or_ok(r: Outcome<'_>) -> Result<(), String> {
    match r {
        Ok(_) | Err(Error::TooDeep { .. }) => Ok(()),
        Err(e) => Err(format!("expected Ok or TooDeep, got {e}")),
    }
}

fn case(name: &'static str, filename: &'static str, bytes: Vec<u8>, check: Check) -> Case {
    Case {
        name,
        filename,
        bytes,
        check,
    }
}

type Build = fn() -> Case;

/// Every heavy case, built lazily in this order.
pub fn all() -> impl Iterator<Item = Case> {
    const CASES: &[Build] = &[
        pdf_form_drawing_itself,
        pdf_form_with_own_resources_drawing_itself,
        pdf_forms_drawing_each_other,
        pdf_form_chain_10k_deep,
        pdf_forms_doubling_40_deep,
        pdf_page_tree_parent_loop,
        pdf_page_content_bomb,
        pdf_form_content_bomb,
        pdf_object_stream_bomb,
        pdf_font_program_bomb,
        pdf_image_bomb,
        pdf_lzw_content_stream_large,
        pdf_content_array_repeating_one_stream,
        xlsx_two_far_cells,
        xlsx_far_cells_many_rows,
        ods_far_repeated_cell,
        html_span_br_2m,
        html_div_100k,
        xml_nested_1m,
        xml_billion_laughs,
        docx_billion_laughs,
        docx_document_bomb,
        pptx_slide_bomb,
        pptx_chart_bomb,
        pptx_chart_not_xml,
        pptx_chart_pointing_at_its_own_slide,
        pptx_chart_pointing_nowhere,
        zip_member_bomb,
        zip_nested_10_deep,
    ];
    CASES.iter().map(|build| build())
}

fn pdf_form_drawing_itself() -> Case {
    // The form has no resources of its own: it reads /Fm1 in the page's, which name itself.
    let pdf = one_page(
        |pdf| {
            let form = pdf.add(stream(
                "/Type /XObject /Subtype /Form /BBox [0 0 612 792]",
                b"/Fm1 Do",
            ));
            let mut content = text("kept");
            content.extend_from_slice(b"/Fm1 Do\n");
            (format!("/XObject << /Fm1 {form} 0 R >>"), content)
        },
        None,
    );
    case("pdf: form drawing itself", "self.pdf", pdf, ok)
}

fn pdf_form_with_own_resources_drawing_itself() -> Case {
    let pdf = one_page(
        |pdf| {
            let form = pdf.reserve();
            pdf.set(
                form,
                stream(
                    &format!(
                        "/Type /XObject /Subtype /Form /BBox [0 0 1 1] \
                         /Resources << /XObject << /Me {form} 0 R >> >>"
                    ),
                    b"/Me Do",
                ),
            );
            (
                format!("/XObject << /Fm1 {form} 0 R >>"),
                b"/Fm1 Do".to_vec(),
            )
        },
        None,
    );
    case(
        "pdf: form with own resources drawing itself",
        "self2.pdf",
        pdf,
        ok,
    )
}

fn pdf_forms_drawing_each_other() -> Case {
    let pdf = one_page(
        |pdf| {
            let (a, b) = (pdf.reserve(), pdf.reserve());
            let form = |other: usize| {
                stream(
                    &format!(
                        "/Type /XObject /Subtype /Form /BBox [0 0 1 1] \
                         /Resources << /XObject << /X {other} 0 R >> >>"
                    ),
                    b"/X Do",
                )
            };
            pdf.set(a, form(b));
            pdf.set(b, form(a));
            (format!("/XObject << /Fm1 {a} 0 R >>"), b"/Fm1 Do".to_vec())
        },
        None,
    );
    case("pdf: forms A->B->A", "mutual.pdf", pdf, ok)
}

/// `n` forms, each drawing the next `times` times; the page draws the first.
fn form_chain(n: usize, times: usize) -> Vec<u8> {
    one_page(
        |pdf| {
            let ids: Vec<usize> = (0..n).map(|_| pdf.reserve()).collect();
            for (i, &id) in ids.iter().enumerate() {
                let (resources, content) = match ids.get(i + 1) {
                    Some(next) => (
                        format!("/Resources << /XObject << /N {next} 0 R >> >>"),
                        "/N Do ".repeat(times),
                    ),
                    None => (String::new(), String::new()),
                };
                pdf.set(
                    id,
                    stream(
                        &format!("/Type /XObject /Subtype /Form /BBox [0 0 1 1] {resources}"),
                        content.as_bytes(),
                    ),
                );
            }
            let mut content = text("kept");
            content.extend_from_slice(b"/Fm1 Do");
            (format!("/XObject << /Fm1 {} 0 R >>", ids[0]), content)
        },
        None,
    )
}

fn pdf_form_chain_10k_deep() -> Case {
    case(
        "pdf: chain of 10,000 forms",
        "chain.pdf",
        form_chain(10_000, 1),
        ok,
    )
}

fn pdf_forms_doubling_40_deep() -> Case {
    case(
        "pdf: 40 forms each drawing the next twice",
        "doubling.pdf",
        form_chain(40, 2),
        ok,
    )
}

fn pdf_page_tree_parent_loop() -> Case {
    let mut pdf = Pdf::default();
    let pages = pdf.reserve();
    let (a, b) = (pdf.reserve(), pdf.reserve());
    let content = pdf.add(stream("", &text("kept")));
    let page = pdf.add(format!(
        "<< /Type /Page /Parent {a} 0 R /Contents {content} 0 R >>"
    ));
    pdf.set(a, format!("<< /Type /Pages /Parent {b} 0 R >>"));
    pdf.set(b, format!("<< /Type /Pages /Parent {a} 0 R >>"));
    pdf.set(
        pages,
        format!("<< /Type /Pages /Kids [{page} 0 R] /Count 1 >>"),
    );
    case(
        "pdf: page tree Parent loop",
        "loop.pdf",
        pdf.finish(pages),
        |_| Ok(()),
    )
}

const BOMB: usize = 256 << 20;

fn pdf_page_content_bomb() -> Case {
    let pdf = one_page(
        |_| (String::new(), gen::zlib_bomb(BOMB, b' ')),
        Some("FlateDecode"),
    );
    case(
        "pdf: page content inflating to 256 MB",
        "content.pdf",
        pdf,
        bounded,
    )
}

fn pdf_form_content_bomb() -> Case {
    let pdf = one_page(
        |pdf| {
            let form = pdf.add(stream(
                "/Type /XObject /Subtype /Form /BBox [0 0 1 1] /Filter /FlateDecode",
                &gen::zlib_bomb(BOMB, b' '),
            ));
            (
                format!("/XObject << /Fm1 {form} 0 R >>"),
                b"/Fm1 Do".to_vec(),
            )
        },
        None,
    );
    case(
        "pdf: form XObject inflating to 256 MB",
        "form.pdf",
        pdf,
        bounded,
    )
}

fn pdf_object_stream_bomb() -> Case {
    let pdf = one_page(
        |pdf| {
            pdf.add(stream(
                "/Type /ObjStm /N 1 /First 4 /Filter /FlateDecode",
                &gen::zlib_bomb(BOMB, b' '),
            ));
            (String::new(), text("kept"))
        },
        None,
    );
    case(
        "pdf: object stream inflating to 256 MB",
        "objstm.pdf",
        pdf,
        expands,
    )
}

fn pdf_font_program_bomb() -> Case {
    let pdf = one_page(
        |pdf| {
            let program = pdf.add(stream("/Filter /FlateDecode", &gen::zlib_bomb(BOMB, 0)));
            let descriptor = pdf.add(format!(
                "<< /Type /FontDescriptor /FontName /Bomb /FontFile2 {program} 0 R >>"
            ));
            let font = pdf.add(format!(
                "<< /Type /Font /Subtype /TrueType /BaseFont /Bomb /FontDescriptor {descriptor} 0 R >>"
            ));
            (
                format!("/Font << /F2 {font} 0 R >>"),
                b"BT /F2 12 Tf 72 700 Td (x) Tj ET".to_vec(),
            )
        },
        None,
    );
    case(
        "pdf: font program inflating to 256 MB",
        "font.pdf",
        pdf,
        bounded,
    )
}

fn pdf_image_bomb() -> Case {
    let pdf = one_page(
        |pdf| {
            let image = pdf.add(stream(
                "/Type /XObject /Subtype /Image /Width 32768 /Height 32768 /BitsPerComponent 8 \
                 /ColorSpace /DeviceGray /Filter /FlateDecode",
                &gen::zlib_bomb(BOMB, 0),
            ));
            let mut content = text("kept");
            content.extend_from_slice(b"/Im1 Do");
            (format!("/XObject << /Im1 {image} 0 R >>"), content)
        },
        None,
    );
    case(
        "pdf: drawn image inflating to 256 MB",
        "image.pdf",
        pdf,
        ok_with_text,
    )
}

fn pdf_lzw_content_stream_large() -> Case {
    // Not a valid LZW stream: what matters is that its worst case (4096 x 64 KB) is refused
    // without decoding.
    let pdf = one_page(
        |_| (String::new(), vec![0x80; 64 * 1024]),
        Some("LZWDecode"),
    );
    case(
        "pdf: 64 KB LZW content stream",
        "lzw.pdf",
        pdf,
        |r| match r {
            Ok(_) | Err(Error::ExpandsTooMuch { .. }) => Ok(()),
            Err(e) => Err(format!("expected Ok or ExpandsTooMuch, got {e}")),
        },
    )
}

fn pdf_content_array_repeating_one_stream() -> Case {
    // One 1 MB content stream named 100,000 times in the page's Contents array.
    let mut pdf = Pdf::default();
    let big = pdf.add(stream("", &vec![b' '; 1 << 20]));
    let pages = pdf.reserve();
    let refs = format!("{big} 0 R ").repeat(100_000);
    let page = pdf.add(format!(
        "<< /Type /Page /Parent {pages} 0 R /MediaBox [0 0 612 792] /Contents [{refs}] >>"
    ));
    pdf.set(
        pages,
        format!("<< /Type /Pages /Kids [{page} 0 R] /Count 1 >>"),
    );
    case(
        "pdf: one stream named 100k times in Contents",
        "contents.pdf",
        pdf.finish(pages),
        ok,
    )
}

fn xlsx_two_far_cells() -> Case {
    let xlsx = gen::xlsx(&gen::sheet_xml(&[("A1", 1), ("XFD1048576", 2)]));
    case(
        "xlsx: cells A1 and XFD1048576",
        "far.xlsx",
        xlsx,
        |r| match r {
            Ok(c) if c.markdown.contains('1') && c.markdown.contains('2') => Ok(()),
            Ok(c) => Err(format!("cells missing: {}", c.markdown)),
            Err(e) => Err(format!("expected Ok, got {e}")),
        },
    )
}

fn xlsx_far_cells_many_rows() -> Case {
    let cells: Vec<(String, u32)> = (1..=50_000u32)
        .map(|i| {
            (
                format!("{}{}", if i % 2 == 0 { "A" } else { "XFD" }, i * 20),
                i,
            )
        })
        .collect();
    let refs: Vec<(&str, u32)> = cells.iter().map(|(r, v)| (r.as_str(), *v)).collect();
    let xlsx = gen::xlsx(&gen::sheet_xml(&refs));
    case(
        "xlsx: 50k rows alternating A and XFD",
        "rows.xlsx",
        xlsx,
        ok,
    )
}

fn ods_far_repeated_cell() -> Case {
    let table = r#"<table:table table:name="S"><table:table-row><table:table-cell office:value-type="float" office:value="1"><text:p>1</text:p></table:table-cell></table:table-row><table:table-row table:number-rows-repeated="1048570"><table:table-cell table:number-columns-repeated="16384"/></table:table-row><table:table-row><table:table-cell table:number-columns-repeated="16383"/><table:table-cell office:value-type="float" office:value="2"><text:p>2</text:p></table:table-cell></table:table-row></table:table>"#;
    case(
        "ods: cell at the far corner",
        "far.ods",
        gen::ods(table),
        |_| Ok(()),
    )
}

fn html_span_br_2m() -> Case {
    let mut html = "<span></br>".repeat(2_000_000);
    html.push_str("kept");
    case(
        "html: <span></br> x 2M (22 MB)",
        "spans.html",
        html.into_bytes(),
        ok_with_text,
    )
}

fn html_div_100k() -> Case {
    let html = format!("<html><body>{}kept</body></html>", "<div>".repeat(100_000));
    case(
        "html: <div> x 100k unclosed",
        "divs.html",
        html.into_bytes(),
        ok_with_text,
    )
}

fn xml_nested_1m() -> Case {
    let xml = format!(
        "<?xml version=\"1.0\"?>{}kept{}",
        "<a>".repeat(1_000_000),
        "</a>".repeat(1_000_000)
    );
    case(
        "xml: 1M nested elements",
        "deep.xml",
        xml.into_bytes(),
        ok_with_text,
    )
}

fn xml_billion_laughs() -> Case {
    let xml = gen::billion_laughs("<r>kept &lol9;</r>");
    case(
        "xml: billion laughs",
        "lol.xml",
        xml.into_bytes(),
        |r| match r {
            Ok(c) if c.markdown.len() < 100_000 => Ok(()),
            Ok(c) => Err(format!("expanded to {} bytes", c.markdown.len())),
            Err(_) => Ok(()),
        },
    )
}

fn docx_billion_laughs() -> Case {
    let body = gen::billion_laughs(
        r#"<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>kept &lol9;</w:t></w:r></w:p></w:body></w:document>"#,
    );
    case(
        "docx: billion laughs in document.xml",
        "lol.docx",
        gen::docx(body.as_bytes()),
        |r| match r {
            Ok(c) if c.markdown.len() < 100_000 => Ok(()),
            Ok(c) => Err(format!("expanded to {} bytes", c.markdown.len())),
            Err(_) => Ok(()),
        },
    )
}

/// An XML part of `size` bytes, almost all of it white space inside one text run.
fn xml_bomb_part(size: usize, head: &str, tail: &str) -> Vec<u8> {
    let mut part = head.as_bytes().to_vec();
    part.resize(size - tail.len(), b' ');
    part.extend_from_slice(tail.as_bytes());
    part
}

fn docx_document_bomb() -> Case {
    let part = xml_bomb_part(
        128 << 20,
        r#"<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>"#,
        "</w:t></w:r></w:p></w:body></w:document>",
    );
    case(
        "docx: document.xml of 128 MB",
        "bomb.docx",
        gen::docx(&part),
        expands,
    )
}

fn pptx_slide_bomb() -> Case {
    let part = xml_bomb_part(
        128 << 20,
        r#"<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><p:cSld><p:spTree><p:sp><p:txBody><a:p><a:r><a:t>"#,
        "</a:t></a:r></a:p></p:txBody></p:sp></p:spTree></p:cSld></p:sld>",
    );
    case(
        "pptx: slide of 128 MB",
        "bomb.pptx",
        gen::pptx(&part),
        expands,
    )
}

fn pptx_chart_bomb() -> Case {
    let part = xml_bomb_part(
        128 << 20,
        r#"<c:chartSpace xmlns:c="http://schemas.openxmlformats.org/drawingml/2006/chart"><c:chart><c:plotArea><c:barChart><c:ser><c:tx><c:v>"#,
        "</c:v></c:tx></c:ser></c:barChart></c:plotArea></c:chart></c:chartSpace>",
    );
    let rels = gen::chart_rels("../charts/chart1.xml");
    let pptx = gen::pptx_with(
        &gen::slide_with_chart(),
        &[
            ("ppt/slides/_rels/slide1.xml.rels", &rels),
            ("ppt/charts/chart1.xml", &part),
        ],
    );
    case("pptx: chart part of 128 MB", "bomb.pptx", pptx, expands)
}

/// A chart part that is not XML: the slide converts without it, with a warning.
fn pptx_chart_not_xml() -> Case {
    let rels = gen::chart_rels("../charts/chart1.xml");
    let pptx = gen::pptx_with(
        &gen::slide_with_chart(),
        &[
            ("ppt/slides/_rels/slide1.xml.rels", &rels),
            (
                "ppt/charts/chart1.xml",
                b"<c:chartSpace><c:chart></c:oops>\xff",
            ),
        ],
    );
    case(
        "pptx: a chart part that is not XML",
        "chart.pptx",
        pptx,
        ok_with_text_and_chart_warning,
    )
}

/// Ok, the slide's text kept, and a warning that names the chart left out.
fn ok_with_text_and_chart_warning(r: Outcome<'_>) -> Result<(), String> {
    ok_with_text(r)?;
    match r {
        Ok(c) if c.warnings.iter().any(|w| w.contains("chart")) => Ok(()),
        Ok(c) => Err(format!("no warning names the chart: {:?}", c.warnings)),
        Err(e) => Err(format!("expected Ok, got {e}")),
    }
}

/// A chart relationship to the slide itself (which is no chart).
fn pptx_chart_pointing_at_its_own_slide() -> Case {
    let rels = gen::chart_rels("slide1.xml");
    let pptx = gen::pptx_with(
        &gen::slide_with_chart(),
        &[("ppt/slides/_rels/slide1.xml.rels", &rels)],
    );
    case(
        "pptx: a chart relationship to its own slide",
        "chart.pptx",
        pptx,
        ok_with_text_and_chart_warning,
    )
}

/// A chart relationship to a part the archive does not hold.
fn pptx_chart_pointing_nowhere() -> Case {
    let rels = gen::chart_rels("../charts/missing.xml");
    let pptx = gen::pptx_with(
        &gen::slide_with_chart(),
        &[("ppt/slides/_rels/slide1.xml.rels", &rels)],
    );
    case(
        "pptx: a chart relationship to a missing part",
        "chart.pptx",
        pptx,
        ok_with_text_and_chart_warning,
    )
}

fn zip_member_bomb() -> Case {
    let member = vec![0u8; 256 << 20];
    let zip = gen::zip(&[("readme.txt", b"kept"), ("zeros.txt", &member)]);
    case("zip: 256 MB member of zeros", "bomb.zip", zip, expands)
}

fn zip_nested_10_deep() -> Case {
    let mut inner = gen::zip(&[("readme.txt", b"kept")]);
    for i in 0..10 {
        let name = format!("level{i}.zip");
        inner = gen::zip(&[(name.as_str(), &inner)]);
    }
    case("zip: nested 10 deep", "nested.zip", inner, too_deep_or_ok)
}

/// Valid samples of every format, for cutting short.
pub fn samples() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("sample.pdf", one_page(|_| (String::new(), text("Hello world")), None)),
        (
            "sample-flate.pdf",
            one_page(
                |_| (String::new(), gen::zlib(&text("Hello world"))),
                Some("FlateDecode"),
            ),
        ),
        ("sample.xlsx", gen::xlsx(&gen::sheet_xml(&[("A1", 1), ("B2", 2)]))),
        (
            "sample.ods",
            gen::ods(r#"<table:table table:name="S"><table:table-row><table:table-cell office:value-type="float" office:value="1"><text:p>1</text:p></table:table-cell></table:table-row></table:table>"#),
        ),
        ("sample.docx", gen::docx(&gen::docx_body("Hello world"))),
        ("sample.pptx", gen::pptx(br#"<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><p:cSld><p:spTree><p:sp><p:txBody><a:p><a:r><a:t>Hello</a:t></a:r></a:p></p:txBody></p:sp></p:spTree></p:cSld></p:sld>"#)),
        ("seed-tiny.docx", include_bytes!("../../../../fuzz/corpus/convert/seed-tiny.docx").to_vec()),
        ("seed-bundle.zip", include_bytes!("../../../../fuzz/corpus/convert/seed-bundle.zip").to_vec()),
        ("seed-page.html", include_bytes!("../../../../fuzz/corpus/convert/seed-page.html").to_vec()),
        ("seed-mail.eml", include_bytes!("../../../../fuzz/corpus/convert/seed-mail.eml").to_vec()),
        ("seed-nb.ipynb", include_bytes!("../../../../fuzz/corpus/convert/seed-nb.ipynb").to_vec()),
        ("seed-styles.rtf", include_bytes!("../../../../fuzz/corpus/convert/seed-styles.rtf").to_vec()),
        ("seed-data.json", include_bytes!("../../../../fuzz/corpus/convert/seed-data.json").to_vec()),
        ("seed-semicolon.csv", include_bytes!("../../../../fuzz/corpus/convert/seed-semicolon.csv").to_vec()),
        ("sample.xml", b"<?xml version=\"1.0\"?><a><b>text</b></a>".to_vec()),
    ]
}

/// Where each sample is cut: the first bytes only, then fractions, then all but the last byte.
pub fn cuts(len: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = [1, 2, 7, len / 4, len / 3, len / 2, 2 * len / 3, len - 1]
        .into_iter()
        .filter(|&c| c > 0 && c < len)
        .collect();
    cuts.dedup();
    cuts
}

/// Every sample cut short at every [`cuts`] point, as cases: any answer but a crash will do
/// (and the runner's time limit). Named `"<sample> cut at <n>"` (leaked: test-only strings).
pub fn truncated() -> Vec<Case> {
    let mut out = Vec::new();
    for (filename, sample) in samples() {
        for cut in cuts(sample.len()) {
            let name = format!("{filename} cut at {cut}");
            out.push(case(
                Box::leak(name.into_boxed_str()),
                filename,
                sample[..cut].to_vec(),
                not_crashed,
            ));
        }
    }
    out
}

fn not_crashed(r: Outcome<'_>) -> Result<(), String> {
    match r {
        Err(Error::Crashed { message, .. }) => Err(format!("crashed: {message}")),
        _ => Ok(()),
    }
}
