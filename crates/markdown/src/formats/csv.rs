//! CSV and TSV: delimiter and charset detected, rendered as one table with a header row.

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

const CANDIDATES: [u8; 4] = [b',', b'\t', b';', b'|'];

/// Guesses the delimiter from the first lines: the candidate that appears the same non-zero
/// number of times (outside quotes) on most lines. `None` when nothing is consistent.
pub fn sniff_delimiter(text: &str) -> Option<u8> {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(30)
        .collect();
    if lines.len() < 2 {
        return None;
    }
    // Drop the last line: the sample may have cut it short.
    let lines = if lines.len() > 3 {
        &lines[..lines.len() - 1]
    } else {
        &lines[..]
    };
    let mut best: Option<(u8, usize, usize)> = None; // (delim, agreeing lines, count)
    for &d in &CANDIDATES {
        let counts: Vec<usize> = lines.iter().map(|l| count_unquoted(l, d)).collect();
        let first = counts[0];
        if first == 0 {
            continue;
        }
        let agree = counts.iter().filter(|&&c| c == first).count();
        if agree * 10 < lines.len() * 8 {
            continue;
        }
        let better = match best {
            None => true,
            Some((_, a, c)) => agree > a || (agree == a && first > c),
        };
        if better {
            best = Some((d, agree, first));
        }
    }
    best.map(|(d, _, _)| d)
}

fn count_unquoted(line: &str, delim: u8) -> usize {
    let mut quoted = false;
    let mut n = 0;
    for &b in line.as_bytes() {
        if b == b'"' {
            quoted = !quoted;
        } else if b == delim && !quoted {
            n += 1;
        }
    }
    n
}

pub fn convert(ctx: Ctx<'_>, format: Format, bytes: &[u8]) -> Result<String> {
    let text = crate::text::decode(bytes);
    let text = text.trim_start_matches('\u{feff}');
    let delim = sniff_delimiter(text).unwrap_or(if format == Format::Tsv { b'\t' } else { b',' });
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delim)
        .from_reader(text.as_bytes());
    let max_rows = ctx.limits().max_table_rows;
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut cut = false;
    for (i, record) in reader.records().enumerate() {
        if i % 1024 == 0 {
            ctx.check_time()?;
        }
        if rows.len() >= max_rows {
            cut = true;
            break;
        }
        let record = record.map_err(|e| Error::malformed(format, e))?;
        rows.push(record.iter().map(md::cell).collect());
    }
    if rows.is_empty() {
        return Ok(String::new());
    }
    let mut out = md::table(&rows);
    if cut {
        out.push_str(&format!("\n*(only the first {max_rows} rows are shown)*\n"));
        ctx.warn(format!("table cut at {max_rows} rows"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    fn run(bytes: &[u8], format: Format) -> String {
        let budget = Budget::new(Limits::default());
        convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            format,
            bytes,
        )
        .expect("converts")
    }

    #[test]
    fn semicolon_latin1_csv_becomes_a_table_without_mojibake() {
        let out = run(
            b"Stadt;Einwohner\nM\xfcnchen;1488202\nK\xf6ln;1073096\n",
            Format::Csv,
        );
        assert!(
            out.starts_with("| Stadt | Einwohner |\n| --- | --- |\n"),
            "{out}"
        );
        assert!(out.contains("| München | 1488202 |"), "{out}");
        assert!(out.contains("| Köln | 1073096 |"), "{out}");
    }

    #[test]
    fn quoted_commas_and_ragged_rows_survive() {
        let out = run(b"a,b,c\n\"x, y\",2\n", Format::Csv);
        assert!(out.contains("| x, y | 2 |  |"), "{out}");
    }

    #[test]
    fn tab_delimiter_is_detected() {
        assert_eq!(sniff_delimiter("a\tb\n1\t2\n3\t4\n"), Some(b'\t'));
        assert_eq!(sniff_delimiter("just one line"), None);
    }
}
