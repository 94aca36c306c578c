//! Converts files with the hearth-markdown library and reports, per file, a tab-separated line:
//! `path  format  bytes  milliseconds  words  status`. With `--out DIR` the Markdown is written
//! to `DIR/<file name>.md`; `--attachments convert` converts e-mail attachments instead of
//! listing them; `--repeat N` converts each file N times in this process and reports the
//! fastest (as the benchmark times markitdown). Used by scripts/bench-markdown.sh.

use std::path::PathBuf;
use std::time::Instant;

use hearth_markdown::{Attachments, Bytes, Converter};

/// mimalloc instead of the system allocator: measurably faster on the large documents (the
/// converters allocate millions of small strings and nodes). A binary embedding the library
/// can make the same one-line choice.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut out_dir: Option<PathBuf> = None;
    let mut attachments = Attachments::default();
    let mut repeat = 1usize;
    let mut files = Vec::new();
    while let Some(a) = args.next() {
        if a == "--out" {
            out_dir = args.next().map(PathBuf::from);
        } else if a == "--attachments" {
            let value = args.next().unwrap_or_default();
            attachments = value.parse().unwrap_or_else(|e| {
                eprintln!("--attachments: {e}");
                std::process::exit(2)
            });
        } else if a == "--repeat" {
            repeat = match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n > 0 => n,
                _ => {
                    eprintln!("--repeat takes a positive whole number");
                    std::process::exit(2)
                }
            };
        } else {
            files.push(PathBuf::from(a));
        }
    }
    let converter = Converter::default().with_attachments(attachments);
    for path in files {
        let Ok(bytes) = std::fs::read(&path) else {
            eprintln!("cannot read {}", path.display());
            continue;
        };
        let bytes = Bytes::from(bytes);
        let size = bytes.len();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let timed = || {
            let start = Instant::now();
            let result = converter.convert(bytes.clone(), name.as_deref());
            (result, start.elapsed().as_secs_f64() * 1000.0)
        };
        let (mut result, mut ms) = timed();
        for _ in 1..repeat {
            let (again, t) = timed();
            (result, ms) = (again, ms.min(t));
        }
        let (format, words, status, markdown) = match result {
            Ok(c) => (
                c.format.name().to_string(),
                c.markdown.split_whitespace().count(),
                "ok".to_string(),
                c.markdown,
            ),
            Err(e) => ("-".to_string(), 0, format!("error: {e}"), String::new()),
        };
        if let (Some(dir), Some(name)) = (&out_dir, &name) {
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(dir.join(format!("{name}.md")), &markdown);
        }
        println!(
            "{}\t{format}\t{}\t{ms:.3}\t{words}\t{status}",
            path.display(),
            size
        );
    }
}
