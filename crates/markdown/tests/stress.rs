//! Bounded, deterministic stress tests: mutated and hostile inputs for the parsers this project
//! wrote itself (RTF, compressed RTF, the XML tree, CSV sniffing) and for the whole pipeline.
//! The same inputs every run (fixed seed); `fuzz/` holds the open-ended cargo-fuzz targets.

use std::io::Write;
use std::time::Duration;

use hearth_markdown::{fuzzing, Converter, Error, Limits};

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const SPECIAL: &[u8] = b"{}\\'*<>&;\"|,\t\n\r0u-#";

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(8) {
        let len = v.len().max(1);
        match rng.below(6) {
            0 => {
                let i = rng.below(len);
                if i < v.len() {
                    v[i] ^= 1 << rng.below(8);
                }
            }
            1 => v.truncate(rng.below(len)),
            2 => {
                let i = rng.below(len).min(v.len());
                v.insert(i, SPECIAL[rng.below(SPECIAL.len())]);
            }
            3 => {
                let a = rng.below(len).min(v.len());
                let b = (a + rng.below(64)).min(v.len());
                let chunk = v[a..b].to_vec();
                let at = rng.below(len).min(v.len());
                for (k, c) in chunk.into_iter().enumerate() {
                    v.insert(at + k, c);
                }
            }
            4 => {
                let i = rng.below(len).min(v.len());
                let b = rng.next() as u8;
                v.insert(i, b);
            }
            _ => {
                let a = rng.below(len).min(v.len());
                let b = (a + rng.below(16)).min(v.len());
                v.drain(a..b);
            }
        }
    }
    v
}

const RTF_SEED: &[u8] = br#"{\rtf1\ansi\ansicpg1252\deff0{\fonttbl{\f0 Times;}}{\*\generator x;}\uc1\pard\outlinelevel0 Title\par
\pard{\listtext\'95\tab}Item \b bold\b0 \i it\i0 \u8364? caf\'e9\par
{\field{\*\fldinst HYPERLINK "https://e.x"}{\fldrslt link}}\line next\par
\trowd\cellx1000\cellx2000 a\cell b\cell\row\pard end\bin3 xyz\par}"#;

const XML_SEED: &[u8] = br#"<?xml version="1.0"?><!DOCTYPE d [<!ENTITY e "x&e;">]><w:document xmlns:w="u"><w:body><w:p><w:r><w:t xml:space="preserve">a &amp; b &#233; &e; &nbsp;</w:t></w:r></w:p><![CDATA[<x>]]><!-- c --><w:tbl><w:tr><w:tc>1</w:tc></w:tr></w:tbl></w:body></w:document>"#;

const CSV_SEED: &[u8] = b"name;qty;note\n\"a;b\";1;\"multi\nline\"\nM\xfcnchen;2;x\n";

#[test]
fn rtf_reader_survives_mutated_documents() {
    let mut rng = Rng(0x5eed_0001);
    for _ in 0..3000 {
        let input = mutate(&mut rng, RTF_SEED);
        // Never a panic; the reader takes any bytes.
        let out = fuzzing::rtf(&input).expect("the RTF reader accepts any input");
        assert!(
            out.len() <= input.len() * 8 + 64,
            "output grew out of proportion"
        );
    }
}

#[test]
fn compressed_rtf_decompressor_survives_mutations_and_respects_declared_size() {
    let mut rng = Rng(0x5eed_0002);
    // A valid stream (the MS-OXRTFCP example) as the seed.
    let seed: [u8; 49] = [
        0x2d, 0x00, 0x00, 0x00, 0x2b, 0x00, 0x00, 0x00, 0x4c, 0x5a, 0x46, 0x75, 0xf1, 0xc5, 0xc7,
        0xa7, 0x03, 0x00, 0x0a, 0x00, 0x72, 0x63, 0x70, 0x67, 0x31, 0x32, 0x35, 0x42, 0x32, 0x0a,
        0xf3, 0x20, 0x68, 0x65, 0x6c, 0x09, 0x00, 0x20, 0x62, 0x77, 0x05, 0xb0, 0x6c, 0x64, 0x7d,
        0x0a, 0x80, 0x0f, 0xa0,
    ];
    for _ in 0..5000 {
        let input = mutate(&mut rng, &seed);
        if let Ok(out) = fuzzing::compressed_rtf(&input) {
            let declared = u32::from_le_bytes([input[4], input[5], input[6], input[7]]) as usize;
            assert!(out.len() <= declared);
        }
    }
}

#[test]
fn xml_tree_survives_mutations_without_expanding_entities() {
    let mut rng = Rng(0x5eed_0003);
    for _ in 0..3000 {
        let input = mutate(&mut rng, XML_SEED);
        if let Ok(text_len) = fuzzing::xml(&input) {
            assert!(
                text_len <= input.len() * 4 + 16,
                "text grew: entities expanded?"
            );
        }
    }
}

#[test]
fn csv_writer_survives_mutations() {
    let mut rng = Rng(0x5eed_0004);
    for _ in 0..3000 {
        let input = mutate(&mut rng, CSV_SEED);
        let _ = fuzzing::csv(&input);
        let _ = fuzzing::detect(&input);
    }
}

fn small_docx() -> Vec<u8> {
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default();
        z.start_file("[Content_Types].xml", opts).unwrap();
        z.write_all(b"<Types/>").unwrap();
        z.start_file("word/document.xml", opts).unwrap();
        z.write_all(br#"<w:document xmlns:w="w"><w:body><w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr><w:r><w:t>Head</w:t></w:r></w:p><w:p><w:r><w:rPr><w:b/></w:rPr><w:t>Body text</w:t></w:r></w:p></w:body></w:document>"#).unwrap();
        z.finish().unwrap();
    }
    buf.into_inner()
}

#[test]
fn whole_pipeline_answers_every_mutated_input_with_a_result_or_a_typed_error() {
    let converter = Converter::new(Limits {
        time_limit: Duration::from_secs(5),
        ..Limits::default()
    });
    let seeds: Vec<Vec<u8>> = vec![
        RTF_SEED.to_vec(),
        XML_SEED.to_vec(),
        CSV_SEED.to_vec(),
        small_docx(),
        b"<html><body><h1>T</h1><table><tr><td>x</td></tr></table><script>s</script></body></html>".to_vec(),
        br#"{"cells":[{"cell_type":"code","source":"x","outputs":[]}],"nbformat":4}"#.to_vec(),
        b"From: a@b.c\r\nSubject: s\r\nDate: Mon, 1 Jan 2024 00:00:00 +0000\r\n\r\nbody\r\n".to_vec(),
        b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF".to_vec(),
    ];
    let mut rng = Rng(0x5eed_0005);
    for round in 0..400 {
        let seed = &seeds[round % seeds.len()];
        let input = mutate(&mut rng, seed);
        match converter.convert(input, None) {
            Ok(_) => {}
            Err(Error::TimedOut { .. }) => panic!("mutated input {round} ran into the time limit"),
            Err(_) => {}
        }
    }
}

#[test]
fn zip_bomb_is_stopped_by_the_unpack_limit() {
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        z.start_file("zeros.txt", opts).unwrap();
        let block = vec![b'0'; 1 << 20];
        for _ in 0..8 {
            z.write_all(&block).unwrap();
        }
        z.finish().unwrap();
    }
    let bomb = buf.into_inner();
    assert!(bomb.len() < 64 * 1024, "the test archive should be small");
    let converter = Converter::new(Limits {
        max_unpacked_bytes: 4 << 20,
        ..Limits::default()
    });
    let err = converter.convert(bomb, Some("bomb.zip")).unwrap_err();
    assert!(matches!(err, Error::ExpandsTooMuch { .. }), "{err}");
}

#[test]
fn nested_archives_stop_at_the_depth_limit() {
    let mut inner = small_docx();
    for level in 0..6 {
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            z.start_file(
                format!("level{level}.zip"),
                zip::write::SimpleFileOptions::default(),
            )
            .unwrap();
            z.write_all(&inner).unwrap();
            z.finish().unwrap();
        }
        inner = buf.into_inner();
    }
    let out = Converter::default()
        .convert(inner, Some("nested.zip"))
        .expect("partial result");
    assert!(
        out.markdown
            .contains("not converted: the document nests deeper than"),
        "{}",
        out.markdown
    );
}

#[test]
fn too_many_members_are_refused() {
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        for i in 0..50 {
            z.start_file(
                format!("f{i}.txt"),
                zip::write::SimpleFileOptions::default(),
            )
            .unwrap();
            z.write_all(b"x").unwrap();
        }
        z.finish().unwrap();
    }
    let converter = Converter::new(Limits {
        max_members: 10,
        ..Limits::default()
    });
    let err = converter
        .convert(buf.into_inner(), Some("many.zip"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooManyMembers {
                count: 50,
                limit: 10
            }
        ),
        "{err}"
    );
}

#[test]
fn deeply_nested_html_and_json_do_not_overflow_the_stack() {
    let converter = Converter::default();
    let html = format!(
        "<html><body>{}deep{}</body></html>",
        "<div><span>".repeat(200_000),
        "</span></div>".repeat(10)
    );
    let out = converter
        .convert(html.into_bytes(), Some("deep.html"))
        .expect("converts");
    assert!(out.markdown.contains("deep"));
    let json = format!("{}1{}", "[".repeat(500_000), "]".repeat(500_000));
    assert!(converter
        .convert(json.into_bytes(), Some("deep.json"))
        .is_err());
}

#[test]
fn oversized_input_is_refused_before_parsing() {
    let converter = Converter::new(Limits {
        max_input_bytes: 10,
        ..Limits::default()
    });
    let err = converter
        .convert(&b"01234567890123"[..], Some("a.txt"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                size: 14,
                limit: 10
            }
        ),
        "{err}"
    );
}
