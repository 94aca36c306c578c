//! Spreadsheets (XLSX, XLSB, XLS, ODS) through calamine: a `##` section per sheet and a table of
//! its used range, dates and numbers as a spreadsheet shows them.

use std::io::Cursor;

use calamine::{Data, Reader};

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

pub fn convert(ctx: Ctx<'_>, format: Format, bytes: &[u8]) -> Result<String> {
    if format != Format::Xls {
        // calamine unpacks the zip itself: check the declared sizes against our limits first.
        super::archive::precheck(&ctx, format, bytes)?;
    }
    let mut book = calamine::open_workbook_auto_from_rs(Cursor::new(bytes)).map_err(|e| {
        let msg = e.to_string();
        if msg.to_ascii_lowercase().contains("password")
            || msg.to_ascii_lowercase().contains("encrypt")
        {
            Error::Encrypted { format }
        } else {
            Error::malformed(format, msg)
        }
    })?;
    let max_rows = ctx.limits().max_table_rows;
    let mut sections = Vec::new();
    for name in book.sheet_names() {
        ctx.check_time()?;
        let range = match book.worksheet_range(&name) {
            Ok(r) => r,
            Err(e) => {
                ctx.warn(format!("sheet {name}: {e}"));
                sections.push(format!(
                    "## {}\n\n*(this sheet could not be read: {e})*",
                    md::cell(&name)
                ));
                continue;
            }
        };
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut cut = false;
        for (i, row) in range.rows().enumerate() {
            if i % 4096 == 0 {
                ctx.check_time()?;
            }
            if rows.len() >= max_rows {
                cut = true;
                break;
            }
            let cells: Vec<String> = row.iter().map(|c| md::cell(&display(c))).collect();
            if cells.iter().all(String::is_empty) {
                continue;
            }
            rows.push(cells);
        }
        trim_empty_columns(&mut rows);
        let mut section = format!("## {}", md::cell(&name));
        if rows.is_empty() {
            section.push_str("\n\n*(empty sheet)*");
        } else {
            section.push_str("\n\n");
            section.push_str(&md::table(&rows));
        }
        if cut {
            section.push_str(&format!("\n*(only the first {max_rows} rows are shown)*"));
            ctx.warn(format!("sheet {name} cut at {max_rows} rows"));
        }
        sections.push(section);
    }
    Ok(md::join_blocks(sections))
}

fn trim_empty_columns(rows: &mut [Vec<String>]) {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let used: Vec<bool> = (0..width)
        .map(|c| rows.iter().any(|r| r.get(c).is_some_and(|v| !v.is_empty())))
        .collect();
    let last = used.iter().rposition(|&u| u).map(|p| p + 1).unwrap_or(0);
    let first = used.iter().position(|&u| u).unwrap_or(0);
    for r in rows.iter_mut() {
        r.truncate(last);
        if first > 0 && r.len() >= first {
            r.drain(..first);
        }
    }
}

/// A cell's value as a spreadsheet would show it by default.
pub fn display(cell: &Data) -> String {
    match cell {
        Data::Empty => String::new(),
        Data::String(s) => s.clone(),
        Data::Int(i) => i.to_string(),
        Data::Float(f) => number(*f),
        Data::Bool(b) => if *b { "TRUE" } else { "FALSE" }.to_string(),
        Data::DateTime(dt) => {
            if dt.is_duration() {
                return match dt.as_duration() {
                    Some(d) => {
                        let secs = d.num_seconds();
                        format!("{}:{:02}:{:02}", secs / 3600, (secs / 60) % 60, secs % 60)
                    }
                    None => number(dt.as_f64()),
                };
            }
            match dt.as_datetime() {
                Some(t) => {
                    let s = t.to_string();
                    if dt.as_f64() < 1.0 {
                        // A time of day without a date.
                        s.split(' ').nth(1).unwrap_or(&s).to_string()
                    } else if let Some(date) = s.strip_suffix(" 00:00:00") {
                        date.to_string()
                    } else {
                        s
                    }
                }
                None => number(dt.as_f64()),
            }
        }
        Data::DateTimeIso(s) | Data::DurationIso(s) => s.clone(),
        Data::Error(e) => format!("#{e:?}").to_uppercase(),
    }
}

/// Numbers with at most 15 significant digits, as spreadsheets display them
/// (0.1 + 0.2 shows as 0.3, not 0.30000000000000004).
fn number(f: f64) -> String {
    if !f.is_finite() {
        return f.to_string();
    }
    if f.fract() == 0.0 && f.abs() < 1e15 {
        return format!("{}", f as i64);
    }
    let rounded: f64 = format!("{f:.14e}").parse().unwrap_or(f);
    format!("{rounded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_display_like_a_spreadsheet() {
        assert_eq!(number(0.1 + 0.2), "0.3");
        assert_eq!(number(42.0), "42");
        assert_eq!(number(-1.5), "-1.5");
    }

    #[test]
    fn empty_edge_columns_are_trimmed() {
        let mut rows = vec![
            vec!["".to_string(), "a".into(), "".into()],
            vec!["".to_string(), "b".into(), "".into()],
        ];
        trim_empty_columns(&mut rows);
        assert_eq!(rows, vec![vec!["a".to_string()], vec!["b".to_string()]]);
    }
}
