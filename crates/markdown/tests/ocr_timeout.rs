//! OCR past the conversion's time limit: the timeout error, and no engine left running. Its own
//! test binary, so that no other test's engine is among this process's children.

use std::path::Path;
use std::time::{Duration, Instant};

use hearth_markdown::{Converter, Error, Limits, OcrEngine};

#[test]
fn ocr_past_the_time_limit_is_the_timeout_error_and_the_engine_is_stopped() {
    OcrEngine::installed().expect("tesseract is not installed (scripts/test.sh installs it)");
    let docs = std::env::var_os("HEARTH_TEST_DOCS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/test-docs"));
    let page = std::fs::read(docs.join("ocr-pages/two-columns.png"))
        .expect("the rendered pages (scripts/test.sh writes them; tests/ocr.rs too)");
    let limits = Limits {
        time_limit: Duration::from_millis(400),
        ..Limits::default()
    };
    let started = Instant::now();
    let e = Converter::new(limits)
        .convert(page, Some("page.png"))
        .unwrap_err();
    assert!(matches!(e, Error::TimedOut { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // No engine is left running for it.
    std::thread::sleep(Duration::from_millis(100));
    let me = std::process::id().to_string();
    let children = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| stat.contains("(tesseract)"))
        .filter(|stat| stat.split_whitespace().nth(3) == Some(me.as_str()))
        .count();
    assert_eq!(children, 0, "tesseract children still running");
}
