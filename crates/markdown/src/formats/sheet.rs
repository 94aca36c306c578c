//! Spreadsheets (XLSX, XLSB, XLS, ODS) through calamine: a `##` section per sheet and a table of
//! its used range, dates and numbers as a spreadsheet shows them.

use std::collections::HashMap;
use std::io::Cursor;

use calamine::{Cell, Data, DataRef, Reader, Sheets};

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
    let ods_spans = if format == Format::Ods {
        ods_spans(&ctx, bytes)?
    } else {
        HashMap::new()
    };
    let mut sections = Vec::new();
    for name in book.sheet_names() {
        ctx.check_time()?;
        if let Some(&cells) = ods_spans.get(&name).filter(|&&c| c > MAX_DENSE_CELLS) {
            ctx.warn(format!(
                "sheet {name}: its range spans {cells} cells; left out"
            ));
            sections.push(format!(
                "## {}\n\n*(this sheet spans {cells} cells, too many to lay out)*",
                md::cell(&name)
            ));
            continue;
        }
        let read = match &mut book {
            // OOXML sheets are read a cell at a time: calamine's `worksheet_range` allocates
            // the dense range spanning the first and last cell, which two cells (`A1` and
            // `XFD1048576`) make 17 billion cells.
            Sheets::Xlsx(x) => match x.worksheet_cells_reader(&name) {
                Ok(mut r) => {
                    sparse_rows(&ctx, max_rows, || r.next_cell().map_err(|e| e.to_string()))?
                }
                Err(e) => Err(e.to_string()),
            },
            Sheets::Xlsb(x) => match x.worksheet_cells_reader(&name) {
                Ok(mut r) => {
                    sparse_rows(&ctx, max_rows, || r.next_cell().map_err(|e| e.to_string()))?
                }
                Err(e) => Err(e.to_string()),
            },
            // XLS (BIFF8) addresses at most 65,536 x 256 cells; ODS repeats are checked by
            // calamine's reader.
            other => match other.worksheet_range(&name) {
                Ok(range) => Ok(dense_rows(&ctx, max_rows, &range)?),
                Err(e) => Err(e.to_string()),
            },
        };
        let (mut rows, cut) = match read {
            Ok(read) => read,
            Err(e) => {
                ctx.warn(format!("sheet {name}: {e}"));
                sections.push(format!(
                    "## {}\n\n*(this sheet could not be read: {e})*",
                    md::cell(&name)
                ));
                continue;
            }
        };
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

/// Most cells of a range calamine lays out densely (32 bytes each).
const MAX_DENSE_CELLS: u64 = 8_000_000;

/// The cells of each ODS table's range as calamine would lay it out (rows down to the last
/// with content, times columns across to the last with content), read from `content.xml`
/// before calamine allocates it: repeat counts make a few bytes of XML span a whole sheet.
fn ods_spans(ctx: &Ctx<'_>, bytes: &[u8]) -> Result<HashMap<String, u64>> {
    use quick_xml::events::Event;
    let mut archive = super::archive::Archive::open(ctx, Format::Ods, bytes)?;
    let Some(xml) = archive.read(ctx, "content.xml")? else {
        return Ok(HashMap::new());
    };
    let repeats = |e: &quick_xml::events::BytesStart<'_>, key: &str| -> u64 {
        e.try_get_attribute(key)
            .ok()
            .flatten()
            .and_then(|a| a.value.parse().ok())
            .unwrap_or(1u64)
            .max(1)
    };
    let mut spans = HashMap::new();
    let mut reader = quick_xml::Reader::from_reader(xml.as_slice());
    let (mut table, mut row, mut row_repeat, mut col) = (String::new(), 0u64, 1u64, 0u64);
    let (mut last_row, mut last_col) = (None::<u64>, 0u64);
    let mut buf = Vec::new();
    for i in 0u64.. {
        if i % 4096 == 0 {
            ctx.check_time()?;
        }
        buf.clear();
        let (e, open) = match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) => (e, true),
            Ok(Event::Empty(e)) => (e, false),
            Ok(Event::End(e)) => {
                match e.name().as_ref() {
                    "table:table-row" => row = row.saturating_add(row_repeat),
                    "table:table" => {
                        let rows = last_row.map_or(0, |r| r + 1);
                        spans.insert(
                            std::mem::take(&mut table),
                            rows.saturating_mul(last_col + 1),
                        );
                    }
                    _ => {}
                }
                continue;
            }
            Ok(Event::Eof) | Err(_) => break,
            Ok(_) => continue,
        };
        match e.name().as_ref() {
            "table:table" => {
                table = e
                    .try_get_attribute("table:name")
                    .ok()
                    .flatten()
                    .map(|a| a.value.into_owned())
                    .unwrap_or_default();
                (row, last_row, last_col) = (0, None, 0);
            }
            "table:table-row" => {
                row_repeat = repeats(&e, "table:number-rows-repeated");
                col = 0;
                if !open {
                    row = row.saturating_add(row_repeat);
                }
            }
            "table:table-cell" | "table:covered-table-cell" => {
                let n = repeats(&e, "table:number-columns-repeated");
                let content = open
                    || e.try_get_attribute("office:value-type")
                        .ok()
                        .flatten()
                        .is_some();
                if content {
                    last_row = Some(row.saturating_add(row_repeat - 1));
                    last_col = last_col.max(col.saturating_add(n - 1));
                }
                col = col.saturating_add(n);
            }
            _ => {}
        }
    }
    Ok(spans)
}

/// Most cells kept from one sheet read a cell at a time (about 100 bytes each).
const MAX_SHEET_CELLS: usize = 2_000_000;
/// Widest span of columns laid out as they stand; a sheet whose used cells span more columns
/// keeps only the columns that hold something.
const MAX_DENSE_COLUMNS: u32 = 1024;

/// A sheet's rows, and whether rows were cut.
type LaidOut = (Vec<Vec<String>>, bool);

/// Rows of a sheet read cell by cell from `next` (position and value), memory bounded by the
/// cells that hold something; and whether rows were cut.
fn sparse_rows<'a>(
    ctx: &Ctx<'_>,
    max_rows: usize,
    mut next: impl FnMut() -> std::result::Result<Option<Cell<DataRef<'a>>>, String>,
) -> Result<std::result::Result<LaidOut, String>> {
    let mut cells: Vec<(u32, u32, String)> = Vec::new();
    let mut cut = false;
    for i in 0u64.. {
        if i % 4096 == 0 {
            ctx.check_time()?;
        }
        let cell = match next() {
            Ok(Some(cell)) => cell,
            Ok(None) => break,
            Err(e) => return Ok(Err(e)),
        };
        let text = md::cell(&display(&Data::from(cell.get_value().clone())));
        if text.is_empty() {
            continue;
        }
        if cells.len() >= MAX_SHEET_CELLS {
            cut = true;
            break;
        }
        let (row, col) = cell.get_position();
        cells.push((row, col, text));
    }
    cells.sort_by_key(|&(r, c, _)| (r, c));
    cells.dedup_by_key(|&mut (r, c, _)| (r, c));
    let mut cols: Vec<u32> = cells.iter().map(|&(_, c, _)| c).collect();
    cols.sort_unstable();
    cols.dedup();
    let (first, last) = (
        cols.first().copied().unwrap_or(0),
        cols.last().copied().unwrap_or(0),
    );
    let dense = last - first < MAX_DENSE_COLUMNS;
    let width = if dense {
        (last - first + 1) as usize
    } else {
        cols.len()
    };
    // Rows are laid out `width` cells wide: as many as fit in the dense-cell budget.
    let max_rows = max_rows.min((MAX_DENSE_CELLS as usize / width.max(1)).max(1));
    let mut row_ids: Vec<u32> = cells.iter().map(|&(r, _, _)| r).collect();
    row_ids.dedup();
    if row_ids.len() > max_rows {
        cut = true;
        let last = row_ids[max_rows - 1];
        cells.retain(|&(r, _, _)| r <= last);
    }
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut current = None;
    for (r, c, text) in cells {
        if current != Some(r) {
            current = Some(r);
            rows.push(vec![String::new(); width]);
        }
        let index = if dense {
            (c - first) as usize
        } else {
            cols.binary_search(&c).unwrap_or(0)
        };
        if let Some(row) = rows.last_mut() {
            row[index] = text;
        }
    }
    Ok(Ok((rows, cut)))
}

/// Rows of a range calamine already laid out, empty rows skipped; and whether rows were cut.
fn dense_rows(
    ctx: &Ctx<'_>,
    max_rows: usize,
    range: &calamine::Range<Data>,
) -> Result<(Vec<Vec<String>>, bool)> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (i, row) in range.rows().enumerate() {
        if i % 4096 == 0 {
            ctx.check_time()?;
        }
        if rows.len() >= max_rows {
            return Ok((rows, true));
        }
        let cells: Vec<String> = row.iter().map(|c| md::cell(&display(c))).collect();
        if cells.iter().all(String::is_empty) {
            continue;
        }
        rows.push(cells);
    }
    Ok((rows, false))
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
