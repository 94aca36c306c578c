//! Hostile documents, generated here: each must come back (Ok with sane output, or the right
//! error) within the time limit plus a second, and the process's peak memory must stay bounded.
//! The heavy cases run one after another in one test so that the peak (`VmHWM`) means
//! something.

#[path = "hostile/cases.rs"]
mod cases;
#[path = "hostile/gen.rs"]
mod gen;

use std::time::{Duration, Instant};

use hearth_markdown::{Conversion, Converter, Error, Limits};

/// The limits every case runs under: a modest budget, so a bomb shows quickly.
fn limits() -> Limits {
    Limits {
        max_unpacked_bytes: 64 * 1024 * 1024,
        time_limit: Duration::from_secs(5),
        max_table_rows: 10_000,
        ..Limits::default()
    }
}

/// Most memory the whole test process may have held at its peak.
const MAX_PEAK_RSS_BYTES: u64 = 1536 * 1024 * 1024;

/// What a case must come back with.
pub type Check = fn(&Result<Conversion, Error>) -> Result<(), String>;

pub struct Case {
    pub name: &'static str,
    pub filename: &'static str,
    pub bytes: Vec<u8>,
    pub check: Check,
}

/// Peak resident memory of this process so far (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Runs `cases` one after another; returns the failures.
fn run(converter: &Converter, cases: impl Iterator<Item = Case>) -> Vec<String> {
    let mut failures = Vec::new();
    let allowed = converter.limits().time_limit + Duration::from_secs(1);
    for case in cases {
        let size = case.bytes.len();
        let start = Instant::now();
        let result = converter.convert(case.bytes, Some(case.filename));
        let took = start.elapsed();
        let outcome = match &result {
            Ok(c) => format!("Ok ({} bytes of Markdown)", c.markdown.len()),
            Err(e) => format!("Err({e})"),
        };
        println!(
            "{:<44} {size:>9} B in  {:>7.3} s  peak {:>5} MB  {outcome}",
            case.name,
            took.as_secs_f64(),
            peak_rss() >> 20
        );
        if took > allowed {
            failures.push(format!("{}: took {took:?}", case.name));
        }
        if let Err(why) = (case.check)(&result) {
            failures.push(format!("{}: {why} (got {outcome})", case.name));
        }
    }
    failures
}

#[test]
fn hostile_documents_return_in_time_within_memory() {
    let converter = Converter::new(limits());
    let mut failures = run(&converter, cases::all());
    let peak = peak_rss();
    if peak > MAX_PEAK_RSS_BYTES {
        failures.push(format!("peak RSS {} MB", peak >> 20));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn truncated_documents_of_every_format_fail_cleanly() {
    let converter = Converter::new(limits());
    let mut failures = Vec::new();
    // The whole sample must convert, else cutting it proves nothing.
    for (name, sample) in cases::samples() {
        if let Err(e) = converter.convert(sample, Some(name)) {
            failures.push(format!("{name}: the uncut sample fails: {e}"));
        }
    }
    failures.extend(run(&converter, cases::truncated().into_iter()));
    assert!(failures.is_empty(), "{failures:#?}");
}
