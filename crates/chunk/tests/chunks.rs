//! Chunks of Markdown under a real tokenizer (the generated cross-encoder's, a BERT WordPiece
//! vocabulary, in tests/fixtures/rerank): within the limit, the document's words all there once
//! and in order, tables and code kept whole when they fit and cut with their header repeated
//! when they do not, the headings each chunk sits under, and offsets into the document.

use std::path::PathBuf;

use hearth_chunk::{chunk, Chunk, TokenCount};
use text_splitter::ChunkSizer;
use tokenizers::Tokenizer;

fn tokenizer() -> Tokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/rerank/tokenizer.json");
    Tokenizer::from_file(path).unwrap()
}

fn document() -> String {
    let mut md = String::from("# Harbour guide\n\nThe harbour office opens at seven. ");
    md.push_str(&"Clerks record every arrival in a ledger beside the window. ".repeat(20));
    md.push_str("\n\n## Fees\n\nFees are paid at the desk.\n\n| vessel | fee |\n|---|---:|\n| ferry | 12 |\n| yacht | 30 |\n\n");
    md.push_str("## Timetable\n\n| day | ferry | time | note |\n|---|---|---|---|\n");
    for day in 0..60 {
        md.push_str(&format!(
            "| day {day} | island ferry {day} | {:02}:15 | weather permitting |\n",
            day % 24
        ));
    }
    md.push_str("\n### Scripts\n\n```python\n");
    for n in 0..80 {
        md.push_str(&format!("print('arrival number {n} logged')\n"));
    }
    md.push_str("```\n\nCafé crème at the kiosk — à bientôt.\n");
    md
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == '|')
        .filter(|w| !w.is_empty() && !w.chars().all(|c| c == '-' || c == ':' || c == '`'))
        .map(str::to_string)
        .collect()
}

fn chunks(max: usize) -> (String, Vec<Chunk>) {
    let md = document();
    let t = tokenizer();
    let out = chunk(&md, max, &TokenCount(&t), None).unwrap();
    (md, out)
}

#[test]
fn every_chunk_fits_and_the_words_come_back_once_in_order() {
    let t = tokenizer();
    for max in [32, 64, 128, 256] {
        let (md, out) = chunks(max);
        assert!(out.len() > 3, "{max}: {} chunks", out.len());
        for c in &out {
            let n = TokenCount(&t).size(&c.text);
            assert!(n <= max, "{max}: a chunk of {n} tokens:\n{}", c.text);
        }
        // Header rows repeated atop table pieces, fences atop code pieces: read past them.
        let mut got = Vec::new();
        for c in &out {
            let own: String = md.chars().skip(c.start).take(c.end - c.start).collect();
            got.extend(words(&own));
        }
        assert_eq!(got, words(&md), "{max}");
    }
}

#[test]
fn small_tables_stay_whole_and_long_ones_repeat_their_header() {
    let (_, out) = chunks(128);
    let fees = out
        .iter()
        .find(|c| c.text.contains("| ferry | 12 |"))
        .unwrap();
    assert!(fees
        .text
        .contains("| vessel | fee |\n|---|---:|\n| ferry | 12 |\n| yacht | 30 |"));
    let timetable: Vec<&Chunk> = out
        .iter()
        .filter(|c| c.text.contains("island ferry"))
        .collect();
    assert!(timetable.len() > 2, "{} pieces", timetable.len());
    let mut rows = 0;
    for piece in &timetable {
        assert!(
            piece
                .text
                .starts_with("| day | ferry | time | note |\n|---|---|---|---|\n"),
            "{}",
            piece.text
        );
        assert_eq!(piece.headings, ["Harbour guide", "Timetable"]);
        rows += piece.text.lines().count() - 2;
    }
    assert_eq!(rows, 60);
}

#[test]
fn long_code_is_cut_by_lines_inside_its_fences() {
    let (_, out) = chunks(96);
    let code: Vec<&Chunk> = out.iter().filter(|c| c.text.contains("print(")).collect();
    assert!(code.len() > 2);
    let mut lines = 0;
    for piece in &code {
        assert!(piece.text.starts_with("```python\n"), "{}", piece.text);
        assert!(piece.text.ends_with("\n```"), "{}", piece.text);
        assert_eq!(piece.headings, ["Harbour guide", "Timetable", "Scripts"]);
        lines += piece.text.lines().count() - 2;
    }
    assert_eq!(lines, 80);
}

#[test]
fn headings_and_character_offsets_locate_each_chunk() {
    let (md, out) = chunks(256);
    assert_eq!(out[0].headings, ["Harbour guide"]);
    assert_eq!(out[0].start, 0);
    assert!(
        out[0].text.starts_with("# Harbour guide"),
        "{}",
        out[0].text
    );
    // A title followed by a short paragraph goes with it.
    let t = tokenizer();
    let short = chunk(
        "# Title\n\nA short paragraph.\n\n## Next\n\nMore.",
        16,
        &TokenCount(&t),
        None,
    )
    .unwrap();
    assert!(
        short[0].text.starts_with("# Title\n\nA short"),
        "{:?}",
        short[0]
    );
    assert_eq!(
        short.last().unwrap().headings,
        ["Title", "Next"],
        "{short:?}"
    );
    // The last chunk follows "é" and "—": offsets count characters, not bytes.
    let last = out.last().unwrap();
    let chars: Vec<char> = md.chars().collect();
    let own: String = chars[last.start..last.end].iter().collect();
    assert_eq!(own, last.text);
    assert!(last.text.ends_with("à bientôt."));
    assert_eq!(last.end, md.trim_end().chars().count());
}

#[test]
fn an_empty_document_has_no_chunks_and_a_word_longer_than_a_chunk_still_comes_out() {
    let t = tokenizer();
    assert!(chunk("", 64, &TokenCount(&t), None).unwrap().is_empty());
    assert!(chunk("\n\n  \n", 64, &TokenCount(&t), None)
        .unwrap()
        .is_empty());
    let long = "x".repeat(5000);
    let out = chunk(&long, 16, &TokenCount(&t), None).unwrap();
    let joined: String = out.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(joined, long);
}

#[test]
fn a_deadline_stops_chunking() {
    let t = tokenizer();
    let md = document().repeat(20);
    let passed = std::time::Instant::now();
    assert_eq!(
        chunk(&md, 64, &TokenCount(&t), Some(passed)),
        Err(hearth_chunk::TimedOut)
    );
}
