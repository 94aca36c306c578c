//! Builders of hostile documents: PDFs written object by object, zip containers, deflate bombs,
//! image headers claiming more pixels than they hold.

use std::io::Write;

/// A PDF written object by object, with a classic cross-reference table.
#[derive(Default)]
pub struct Pdf {
    objects: Vec<Vec<u8>>,
}

impl Pdf {
    /// Adds an object (its body, without `N 0 obj`); returns its number.
    pub fn add(&mut self, body: impl AsRef<[u8]>) -> usize {
        self.objects.push(body.as_ref().to_vec());
        self.objects.len()
    }

    /// A number for an object whose body comes later, through [`Pdf::set`].
    pub fn reserve(&mut self) -> usize {
        self.add(b"null")
    }

    pub fn set(&mut self, number: usize, body: impl AsRef<[u8]>) {
        self.objects[number - 1] = body.as_ref().to_vec();
    }

    /// The file, its catalog's page tree rooted at object `pages`.
    pub fn finish(mut self, pages: usize) -> Vec<u8> {
        let catalog = self.add(format!("<< /Type /Catalog /Pages {pages} 0 R >>"));
        let mut out = b"%PDF-1.5\n%\xe2\xe3\xcf\xd3\n".to_vec();
        let mut offsets = Vec::new();
        for (i, body) in self.objects.iter().enumerate() {
            offsets.push(out.len());
            out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
            out.extend_from_slice(body);
            out.extend_from_slice(b"\nendobj\n");
        }
        let xref = out.len();
        out.extend_from_slice(format!("xref\n0 {}\n", offsets.len() + 1).as_bytes());
        out.extend_from_slice(b"0000000000 65535 f \n");
        for o in offsets {
            out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
        }
        out.extend_from_slice(
            format!(
                "trailer\n<< /Size {} /Root {catalog} 0 R >>\nstartxref\n{xref}\n%%EOF\n",
                self.objects.len() + 1
            )
            .as_bytes(),
        );
        out
    }
}

/// A stream object's body: `dict` entries (without `<< >>` or `/Length`) and its bytes.
pub fn stream(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut out = format!("<< {dict} /Length {} >>\nstream\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\nendstream");
    out
}

/// zlib data inflating to `size` bytes of `byte`.
pub fn zlib_bomb(size: usize, byte: u8) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![byte; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len());
        z.write_all(&block[..n]).unwrap();
        left -= n;
    }
    z.finish().unwrap()
}

/// `data`, zlib-compressed.
pub fn zlib(data: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(data).unwrap();
    z.finish().unwrap()
}

/// A one-page PDF: `resources` (dictionary entries) and the page's content stream (plain),
/// with `extra` objects added first by the caller through `build`.
pub fn one_page(
    build: impl FnOnce(&mut Pdf) -> (String, Vec<u8>),
    content_filter: Option<&str>,
) -> Vec<u8> {
    let mut pdf = Pdf::default();
    let font = pdf.add("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>");
    let (resources, content) = build(&mut pdf);
    let content = pdf.add(stream(
        &content_filter
            .map(|f| format!("/Filter /{f}"))
            .unwrap_or_default(),
        &content,
    ));
    let pages = pdf.reserve();
    let page = pdf.add(format!(
        "<< /Type /Page /Parent {pages} 0 R /MediaBox [0 0 612 792] /Contents {content} 0 R \
         /Resources << /Font << /F1 {font} 0 R >> {resources} >> >>"
    ));
    pdf.set(
        pages,
        format!("<< /Type /Pages /Kids [{page} 0 R] /Count 1 >>"),
    );
    pdf.finish(pages)
}

/// Text drawn on a page in the core Helvetica font.
pub fn text(s: &str) -> Vec<u8> {
    format!("BT /F1 12 Tf 72 720 Td ({s}) Tj ET\n").into_bytes()
}

/// A PNG whose header claims `w` × `h` pixels, the body an 8×8 white image's (the header's
/// checksum no longer matches; a size check comes before any decoding). Used by `ocr.rs` and
/// the HTTP suite, not by `hostile.rs`.
#[allow(dead_code)]
pub fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let small = image::GrayImage::from_pixel(8, 8, image::Luma([255]));
    let mut out = std::io::Cursor::new(Vec::new());
    small.write_to(&mut out, image::ImageFormat::Png).unwrap();
    let mut out = out.into_inner();
    // IHDR's data starts at byte 16: width, height.
    out[16..20].copy_from_slice(&w.to_be_bytes());
    out[20..24].copy_from_slice(&h.to_be_bytes());
    out
}

/// A zip of `(name, bytes)` members, deflated.
pub fn zip(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(false);
    for (name, data) in members {
        w.start_file(*name, options).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// A minimal XLSX holding one sheet whose XML is `sheet`.
pub fn xlsx(sheet: &str) -> Vec<u8> {
    zip(&[
        (
            "[Content_Types].xml",
            br#"<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/></Types>"#,
        ),
        (
            "_rels/.rels",
            br#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>"#,
        ),
        (
            "xl/workbook.xml",
            br#"<?xml version="1.0"?><workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets><sheet name="Data" sheetId="1" r:id="rId1"/></sheets></workbook>"#,
        ),
        (
            "xl/_rels/workbook.xml.rels",
            br#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/></Relationships>"#,
        ),
        ("xl/worksheets/sheet1.xml", sheet.as_bytes()),
    ])
}

/// A sheet's XML with `cells` (`(reference, number)`) in one row each.
pub fn sheet_xml(cells: &[(&str, u32)]) -> String {
    let mut rows = String::new();
    for (r, v) in cells {
        let row: String = r.chars().filter(char::is_ascii_digit).collect();
        rows.push_str(&format!(
            r#"<row r="{row}"><c r="{r}"><v>{v}</v></c></row>"#
        ));
    }
    format!(
        r#"<?xml version="1.0"?><worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>{rows}</sheetData></worksheet>"#
    )
}

/// A minimal ODS whose `content.xml` body (inside `<office:spreadsheet>`) is `table`.
pub fn ods(table: &str) -> Vec<u8> {
    let content = format!(
        r#"<?xml version="1.0"?><office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.2"><office:body><office:spreadsheet>{table}</office:spreadsheet></office:body></office:document-content>"#
    );
    let manifest = br#"<?xml version="1.0"?><manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"><manifest:file-entry manifest:full-path="/" manifest:media-type="application/vnd.oasis.opendocument.spreadsheet"/><manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/></manifest:manifest>"#;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    w.start_file("mimetype", stored).unwrap();
    w.write_all(b"application/vnd.oasis.opendocument.spreadsheet")
        .unwrap();
    let deflated = zip::write::SimpleFileOptions::default();
    w.start_file("META-INF/manifest.xml", deflated).unwrap();
    w.write_all(manifest).unwrap();
    w.start_file("content.xml", deflated).unwrap();
    w.write_all(content.as_bytes()).unwrap();
    w.finish().unwrap().into_inner()
}

/// A DOCX whose `word/document.xml` is `document`.
pub fn docx(document: &[u8]) -> Vec<u8> {
    zip(&[
        (
            "[Content_Types].xml",
            br#"<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>"#,
        ),
        (
            "_rels/.rels",
            br#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>"#,
        ),
        ("word/document.xml", document),
    ])
}

/// A PPTX whose one slide is `slide`.
pub fn pptx(slide: &[u8]) -> Vec<u8> {
    pptx_with(slide, &[])
}

/// A PPTX whose one slide is `slide`, with more parts (the slide's relationships, charts).
pub fn pptx_with(slide: &[u8], parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut members: Vec<(&str, &[u8])> = vec![
        (
            "[Content_Types].xml",
            br#"<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/ppt/presentation.xml" ContentType="application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml"/></Types>"#,
        ),
        (
            "_rels/.rels",
            br#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="ppt/presentation.xml"/></Relationships>"#,
        ),
        (
            "ppt/presentation.xml",
            br#"<?xml version="1.0"?><p:presentation xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><p:sldIdLst><p:sldId id="256" r:id="rId2"/></p:sldIdLst></p:presentation>"#,
        ),
        (
            "ppt/_rels/presentation.xml.rels",
            br#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/slide" Target="slides/slide1.xml"/></Relationships>"#,
        ),
        ("ppt/slides/slide1.xml", slide),
    ];
    members.extend_from_slice(parts);
    zip(&members)
}

/// A slide with the text "kept" and a graphic frame showing the chart of relationship `rId3`.
pub fn slide_with_chart() -> Vec<u8> {
    br#"<?xml version="1.0"?><p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" xmlns:c="http://schemas.openxmlformats.org/drawingml/2006/chart" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><p:cSld><p:spTree><p:sp><p:txBody><a:p><a:r><a:t>kept</a:t></a:r></a:p></p:txBody></p:sp><p:graphicFrame><a:graphic><a:graphicData uri="http://schemas.openxmlformats.org/drawingml/2006/chart"><c:chart r:id="rId3"/></a:graphicData></a:graphic></p:graphicFrame></p:spTree></p:cSld></p:sld>"#.to_vec()
}

/// The slide's relationships: `rId3` a chart at `target` (relative to the slide).
pub fn chart_rels(target: &str) -> Vec<u8> {
    format!(r#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/chart" Target="{target}"/></Relationships>"#).into_bytes()
}

/// A word-processing document body of one paragraph of `text`.
pub fn docx_body(text: &str) -> Vec<u8> {
    format!(
        r#"<?xml version="1.0"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:body></w:document>"#
    )
    .into_bytes()
}

/// The billion-laughs entity chain ahead of `root`.
pub fn billion_laughs(root: &str) -> String {
    let mut dtd = String::from("<!DOCTYPE lolz [<!ENTITY lol \"lol\">");
    for i in 1..10 {
        let prev = if i == 1 {
            "lol".to_string()
        } else {
            format!("lol{}", i - 1)
        };
        dtd.push_str(&format!(
            "<!ENTITY lol{i} \"{}\">",
            format!("&{prev};").repeat(10)
        ));
    }
    dtd.push(']');
    dtd.push('>');
    format!("<?xml version=\"1.0\"?>{dtd}{root}")
}
