//! How long chunking takes: a generated Markdown document of about SIZE_MB megabytes (prose
//! under headings, tables and code), cut at TOKENS with the tokenizer at TOKENIZER_JSON.
//!
//!     cargo run --release -p hearth-chunk --example chunk_time -- TOKENIZER_JSON SIZE_MB TOKENS

use std::time::Instant;

use hearth_chunk::{chunk, TokenCount};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("TOKENIZER_JSON");
    let mb: f64 = args.next().map_or(1.0, |v| v.parse().unwrap());
    let tokens: usize = args.next().map_or(256, |v| v.parse().unwrap());
    let mut tokenizer = tokenizers::Tokenizer::from_file(path).unwrap();
    tokenizer.with_padding(None);
    tokenizer.with_truncation(None).unwrap();
    let mut md = String::new();
    let mut section = 0;
    while (md.len() as f64) < mb * 1e6 {
        section += 1;
        md.push_str(&format!("## Section {section}\n\n"));
        for p in 0..4 {
            md.push_str(&format!(
                "Paragraph {p} of section {section}: the harbour office opens at seven, clerks \
                 record every arrival in a ledger, and the master signs each page before noon. \
                 Ferries from the islands arrive before noon when the weather allows.\n\n"
            ));
        }
        md.push_str("| day | ferry | time |\n|---|---|---|\n");
        for d in 0..30 {
            md.push_str(&format!(
                "| day {d} | island ferry {d} | {:02}:15 |\n",
                d % 24
            ));
        }
        md.push_str("\n```python\n");
        for n in 0..20 {
            md.push_str(&format!("print('arrival {n} of section {section}')\n"));
        }
        md.push_str("```\n\n");
    }
    let started = Instant::now();
    let chunks = chunk(&md, tokens, &TokenCount(&tokenizer), None).unwrap();
    let s = started.elapsed().as_secs_f64();
    println!(
        "{{\"bytes\": {}, \"tokens\": {tokens}, \"chunks\": {}, \"s\": {s:.3}, \"mb_per_s\": {:.2}}}",
        md.len(),
        chunks.len(),
        md.len() as f64 / 1e6 / s
    );
}
