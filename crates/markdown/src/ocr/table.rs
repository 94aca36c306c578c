//! Tables on a page read by OCR, found by their columns. The page's lines are grouped into rows
//! (lines side by side, as the engine returns each column of a table in a block of its own);
//! consecutive rows whose white space lines up into corridors running down through all of them
//! are a table, the corridors its column boundaries. Ruled tables are found the same way: the
//! engine returns no words for the rules, or a `|`, which is dropped. A run of rows is kept as a
//! table only when it looks like one: at least three rows and two columns, short cells, most
//! of them filled (two columns of prose side by side line up as well, but hold long cells).
//! A row sitting much closer under the one before than rows usually do, with its first column
//! empty, continues that row's cells (a cell's text wrapped over two lines).

use super::text::{self, Line, Word};
use crate::md;

/// A table found on the page.
pub(crate) struct Table {
    /// The page's lines it was made of, by index.
    pub lines: Vec<usize>,
    /// The table in Markdown, its first row the header.
    pub markdown: String,
}

/// A run of white space across the page, from `.0` to `.1` (exclusive of the words at either
/// end). The open ends of a row are `i64::MIN` and `i64::MAX`.
type Span = (i64, i64);

/// Lines side by side: one row of the page.
struct Row<'a> {
    lines: Vec<usize>,
    top: i64,
    bottom: i64,
    /// Its words left to right, rule marks left out.
    words: Vec<&'a Word>,
}

impl Row<'_> {
    fn centre(&self) -> i64 {
        (self.top + self.bottom) / 2
    }

    /// The white space of the row: before its first word, between words, after its last.
    fn free(&self) -> Vec<Span> {
        let mut out = Vec::with_capacity(self.words.len() + 1);
        let mut from = i64::MIN;
        for w in &self.words {
            if w.left > from {
                out.push((from, w.left));
            }
            from = from.max(w.right);
        }
        out.push((from, i64::MAX));
        out
    }
}

/// A character the engine reads a table's rule as.
fn is_rule_mark(c: char) -> bool {
    matches!(c, '|' | '¦' | '[' | ']' | '{' | '}')
}

/// A word the engine made of a table's rule: nothing but bars and brackets.
fn is_rule(word: &str) -> bool {
    word.chars().all(is_rule_mark)
}

/// The page's tables; `height` is the page's usual line height (the widest gap between words of
/// running text is about that).
pub(crate) fn find(lines: &[Line], height: i64) -> Vec<Table> {
    if height <= 0 {
        return Vec::new();
    }
    let rows = rows(lines, height);
    let mut out = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        match table_at(&rows, start, height) {
            Some((end, table)) => {
                out.push(table);
                start = end;
            }
            None => start += 1,
        }
    }
    out
}

/// The lines grouped into rows, top to bottom: a line joins the row whose centre is within half
/// a line of its own.
fn rows(lines: &[Line], height: i64) -> Vec<Row<'_>> {
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by_key(|&i| (lines[i].top + lines[i].bottom) / 2);
    let mut rows: Vec<Row<'_>> = Vec::new();
    for i in order {
        let line = &lines[i];
        let centre = (line.top + line.bottom) / 2;
        let words = line.words.iter().filter(|w| !is_rule(&w.text));
        match rows.last_mut() {
            Some(row) if (centre - row.centre()).abs() * 2 <= height => {
                row.lines.push(i);
                row.top = row.top.min(line.top);
                row.bottom = row.bottom.max(line.bottom);
                row.words.extend(words);
            }
            _ => rows.push(Row {
                lines: vec![i],
                top: line.top,
                bottom: line.bottom,
                words: words.collect(),
            }),
        }
    }
    for row in &mut rows {
        row.words.sort_by_key(|w| w.left);
    }
    rows
}

/// Where two sets of white space overlap.
fn intersect(a: &[Span], b: &[Span]) -> Vec<Span> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (from, to) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if from < to {
            out.push((from, to));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The column boundaries in `free`: white space with words on both sides, at least `height`
/// wide.
fn corridors(free: &[Span], height: i64) -> Vec<Span> {
    free.iter()
        .copied()
        .filter(|&(a, b)| a != i64::MIN && b != i64::MAX && b - a >= height)
        .collect()
}

/// The column of a word between `corridors`.
fn column(word: &Word, corridors: &[Span]) -> usize {
    corridors.iter().filter(|&&(_, b)| b <= word.left).count()
}

/// The distinct columns a row has words in.
fn columns_used(row: &Row<'_>, corridors: &[Span]) -> Vec<usize> {
    let mut used: Vec<usize> = row.words.iter().map(|w| column(w, corridors)).collect();
    used.dedup();
    used
}

/// The table that starts at row `start`, if one does, and the row after it.
fn table_at(rows: &[Row<'_>], start: usize, height: i64) -> Option<(usize, Table)> {
    let mut free = rows[start].free();
    let mut walls = corridors(&free, height);
    if walls.is_empty() {
        return None;
    }
    let mut end = start + 1;
    while let Some(row) = rows.get(end) {
        if row.top - rows[end - 1].bottom > height * 5 / 2 {
            break;
        }
        if row.words.is_empty() {
            // Nothing but rule marks: part of the table's drawing.
            end += 1;
            continue;
        }
        let narrowed = intersect(&free, &row.free());
        let kept = corridors(&narrowed, height);
        // Every column boundary holds through a table's rows.
        if kept.len() < walls.len() {
            break;
        }
        let used = columns_used(row, &kept);
        let continues = used.len() == 1 && used[0] > 0 && row.top - rows[end - 1].bottom < height;
        if used.len() < 2 && !continues {
            break;
        }
        (free, walls) = (narrowed, kept);
        end += 1;
    }
    let cells = cells(&rows[start..end], &walls);
    if !looks_like_a_table(&cells) {
        return None;
    }
    let markdown = md::table(
        &cells
            .iter()
            .map(|row| row.iter().map(|c| c.join(" ")).collect())
            .collect::<Vec<Vec<String>>>(),
    );
    let lines = rows[start..end]
        .iter()
        .flat_map(|r| r.lines.iter().copied())
        .collect();
    Some((end, Table { lines, markdown }))
}

/// The rows' words by column (escaped for a table cell), a row that continues the one before
/// merged into it.
fn cells(rows: &[Row<'_>], walls: &[Span]) -> Vec<Vec<Vec<String>>> {
    let rows: Vec<&Row<'_>> = rows.iter().filter(|r| !r.words.is_empty()).collect();
    let gaps: Vec<i64> = rows.windows(2).map(|w| w[1].top - w[0].bottom).collect();
    let usual_gap = text::median(gaps.clone());
    let mut out: Vec<Vec<Vec<String>>> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let mut cells = vec![Vec::new(); walls.len() + 1];
        for w in &row.words {
            let word = w.text.trim_matches(is_rule_mark);
            cells[column(w, walls)].push(text::escape(word));
        }
        let closer = i > 0 && gaps[i - 1] * 5 < usual_gap * 3;
        match out.last_mut() {
            Some(last) if closer && cells[0].is_empty() => {
                for (into, more) in last.iter_mut().zip(cells) {
                    into.extend(more);
                }
            }
            _ => out.push(cells),
        }
    }
    out
}

/// Whether rows of cells read as a table rather than prose that happens to line up: three rows
/// or more, two columns or more, most cells filled, and short cells (half of them at most three
/// words, and hardly any of six or more).
fn looks_like_a_table(rows: &[Vec<Vec<String>>]) -> bool {
    let columns = rows.first().map_or(0, Vec::len);
    if rows.len() < 3 || columns < 2 {
        return false;
    }
    let mut sizes: Vec<i64> = rows
        .iter()
        .flatten()
        .filter(|c| !c.is_empty())
        .map(|c| c.len() as i64)
        .collect();
    let filled = sizes.len();
    let long = sizes.iter().filter(|&&n| n >= 6).count();
    sizes.sort_unstable();
    filled * 2 >= rows.len() * columns && sizes[filled / 2] <= 3 && long * 5 <= filled
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line of words at `top`, each `(left, text)` 20 pixels a character wide.
    fn line(block: u32, top: i64, words: &[(i64, &str)]) -> Line {
        let words: Vec<Word> = words
            .iter()
            .map(|&(left, t)| Word {
                text: t.into(),
                left,
                right: left + 20 * t.chars().count() as i64,
            })
            .collect();
        Line {
            block,
            par: 1,
            left: words[0].left,
            top,
            right: words.last().unwrap().right,
            bottom: top + 40,
            words,
            conf: 95.0,
            joins_previous: false,
        }
    }

    #[test]
    fn aligned_columns_become_a_table_and_prose_around_it_does_not() {
        let lines = vec![
            line(1, 100, &[(100, "Arrivals"), (300, "this"), (400, "week")]),
            line(2, 200, &[(100, "Vessel"), (600, "Arrives"), (900, "Berth")]),
            line(
                2,
                260,
                &[(100, "Northern"), (280, "Star"), (600, "07:15"), (900, "3")],
            ),
            line(2, 320, &[(100, "Island"), (240, "Queen"), (600, "08:40")]),
            line(
                2,
                380,
                &[(100, "Cormorant"), (600, "|"), (610, "12:30"), (900, "2")],
            ),
            line(
                3,
                480,
                &[
                    (100, "The"),
                    (180, "office"),
                    (320, "closes"),
                    (460, "at noon."),
                ],
            ),
        ];
        let found = find(&lines, 40);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].lines, vec![1, 2, 3, 4]);
        assert_eq!(
            found[0].markdown,
            "| Vessel | Arrives | Berth |\n| --- | --- | --- |\n| Northern Star | 07:15 | 3 |\n\
             | Island Queen | 08:40 |  |\n| Cormorant | 12:30 | 2 |\n"
        );
    }

    #[test]
    fn columns_returned_as_separate_blocks_are_joined_into_rows() {
        // The engine often returns each column of a table as a block of its own.
        let mut lines = Vec::new();
        for (i, name) in ["Vessel", "Aurora", "Pelican", "Osprey"].iter().enumerate() {
            lines.push(line(1, 200 + 60 * i as i64, &[(100, name)]));
        }
        for (i, time) in ["Time", "07:15", "08:40", "12:30"].iter().enumerate() {
            lines.push(line(2, 202 + 60 * i as i64, &[(500, time)]));
        }
        let found = find(&lines, 40);
        assert_eq!(found.len(), 1);
        assert!(
            found[0]
                .markdown
                .starts_with("| Vessel | Time |\n| --- | --- |\n| Aurora | 07:15 |\n"),
            "{}",
            found[0].markdown
        );
    }

    #[test]
    fn two_columns_of_prose_are_not_a_table() {
        let words =
            |x: i64| -> Vec<(i64, &'static str)> { (0..7).map(|k| (x + 70 * k, "word")).collect() };
        let mut lines = Vec::new();
        for i in 0..8 {
            lines.push(line(1, 100 + 50 * i, &words(100)));
            lines.push(line(2, 100 + 50 * i, &words(700)));
        }
        assert!(find(&lines, 40).is_empty());
    }

    #[test]
    fn a_wrapped_cell_continues_its_row() {
        let lines = vec![
            line(1, 100, &[(100, "Item"), (600, "Note")]),
            line(1, 200, &[(100, "Rope"), (600, "Two"), (680, "coils,")]),
            line(1, 245, &[(600, "tarred")]),
            line(1, 340, &[(100, "Nets"), (600, "Mended")]),
            line(1, 440, &[(100, "Oars"), (600, "Four")]),
        ];
        let found = find(&lines, 40);
        assert_eq!(found.len(), 1);
        assert!(
            found[0]
                .markdown
                .contains("| Rope | Two coils, tarred |\n| Nets | Mended |"),
            "{}",
            found[0].markdown
        );
    }
}
