//! The engine's words (its TSV: block, paragraph, line, box, confidence, text) to Markdown:
//! tables found by their aligned columns (`table`), the other lines joined into paragraphs by
//! their spacing and indents, hyphenated line ends joined, lines in clearly larger type as
//! headings.

use super::table;

/// One recognised word and its left and right edges, in page pixels.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Word {
    pub text: String,
    pub left: i64,
    pub right: i64,
}

/// One line of recognised words, in page pixels.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Line {
    pub block: u32,
    pub par: u32,
    pub left: i64,
    pub top: i64,
    pub right: i64,
    pub bottom: i64,
    pub words: Vec<Word>,
    /// Mean word confidence, 0 to 100.
    pub conf: f64,
    /// The cut above this line's part ran through a paragraph (see `page::Part`).
    pub joins_previous: bool,
}

impl Line {
    pub(crate) fn height(&self) -> i64 {
        self.bottom - self.top
    }
}

/// The lines of one part's TSV, moved by the part's origin `(dx, dy)`; `joins` is the part's
/// `joins_previous`, set on its first line.
pub(crate) fn lines(tsv: &str, dx: i64, dy: i64, joins: bool) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    let mut key = None;
    let mut confs: Vec<f64> = Vec::new();
    for row in tsv.lines().skip(1) {
        let f: Vec<&str> = row.splitn(12, '\t').collect();
        if f.len() < 12 || f[0] != "5" {
            continue;
        }
        let num = |i: usize| f[i].trim().parse::<i64>().unwrap_or(0);
        let text = f[11].trim();
        if text.is_empty() {
            continue;
        }
        let (left, top) = (num(6) + dx, num(7) + dy);
        let (right, bottom) = (left + num(8), top + num(9));
        let conf = f[10].trim().parse::<f64>().unwrap_or(0.0);
        let this = (num(2), num(3), num(4));
        let word = Word {
            text: text.to_string(),
            left,
            right,
        };
        match out.last_mut() {
            Some(line) if key == Some(this) => {
                line.left = line.left.min(left);
                line.top = line.top.min(top);
                line.right = line.right.max(right);
                line.bottom = line.bottom.max(bottom);
                line.words.push(word);
                confs.push(conf);
            }
            _ => {
                if let Some(line) = out.last_mut() {
                    line.conf = mean(&confs);
                }
                confs = vec![conf];
                key = Some(this);
                out.push(Line {
                    block: this.0 as u32,
                    par: this.1 as u32,
                    left,
                    top,
                    right,
                    bottom,
                    words: vec![word],
                    conf: 0.0,
                    joins_previous: joins && out.is_empty(),
                });
            }
        }
    }
    if let Some(line) = out.last_mut() {
        line.conf = mean(&confs);
    }
    out
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The mean confidence and count of the words of `lines`.
pub(crate) fn quality(lines: &[Line]) -> (f64, usize) {
    let words: usize = lines.iter().map(|l| l.words.len()).sum();
    let sum: f64 = lines.iter().map(|l| l.conf * l.words.len() as f64).sum();
    (if words == 0 { 0.0 } else { sum / words as f64 }, words)
}

pub(crate) fn median(mut v: Vec<i64>) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// A page's lines, from all its parts in reading order, as Markdown: each table where its first
/// line was, the lines between tables as paragraphs.
pub(crate) fn markdown(lines: &[Line], heading_mark: &str) -> String {
    let page = Page {
        usual_height: median(lines.iter().map(Line::height).collect()),
        usual_pitch: median(
            lines
                .windows(2)
                .filter(|w| w[0].block == w[1].block && !w[1].joins_previous)
                .map(|w| w[1].top - w[0].top)
                .filter(|&p| p > 0)
                .collect(),
        ),
        heading_mark,
    };
    let tables = table::find(lines, page.usual_height);
    let mut in_table = vec![None; lines.len()];
    for (t, found) in tables.iter().enumerate() {
        for &i in &found.lines {
            in_table[i] = Some(t);
        }
    }
    let mut out = String::new();
    let mut run: Vec<&Line> = Vec::new();
    let mut written = vec![false; tables.len()];
    for (line, table) in lines.iter().zip(&in_table) {
        match table {
            None => run.push(line),
            Some(t) => {
                if !written[*t] {
                    page.paragraphs(&std::mem::take(&mut run), &mut out);
                    out.push_str(&tables[*t].markdown);
                    out.push('\n');
                    written[*t] = true;
                }
            }
        }
    }
    page.paragraphs(&run, &mut out);
    out
}

/// What the page's lines have in common, against which each line is judged.
struct Page<'a> {
    usual_height: i64,
    usual_pitch: i64,
    heading_mark: &'a str,
}

impl Page<'_> {
    /// In type half as large again as the page's usual lines.
    fn is_heading(&self, l: &Line) -> bool {
        self.usual_height > 0 && l.height() * 2 >= self.usual_height * 3
    }

    /// Consecutive lines as paragraphs, appended to `out`.
    fn paragraphs(&self, lines: &[&Line], out: &mut String) {
        let mut paragraphs: Vec<(bool, Vec<&Line>)> = Vec::new();
        for (i, &line) in lines.iter().enumerate() {
            let heading = self.is_heading(line);
            let new = match i.checked_sub(1).map(|p| lines[p]) {
                None => true,
                Some(prev) if line.joins_previous => heading != self.is_heading(prev),
                Some(prev) => {
                    let pitch = line.top - prev.top;
                    let usual_pitch = self.usual_pitch;
                    let gap = usual_pitch > 0 && (pitch * 5 > usual_pitch * 7 || pitch < 0);
                    let width =
                        paragraph_right(&paragraphs).max(prev.right) - prev.left.min(line.left);
                    let short = prev.right - prev.left.min(line.left) < width * 17 / 20;
                    let indented = line.left - prev.left > self.usual_height;
                    // A new block or paragraph of the engine's counts only after a short line
                    // or before an indent (it also splits at the last line of a paragraph).
                    let engine_break = line.block != prev.block || line.par != prev.par;
                    heading != self.is_heading(prev) || gap || engine_break && (short || indented)
                }
            };
            if new {
                paragraphs.push((heading, vec![line]));
            } else if let Some((_, p)) = paragraphs.last_mut() {
                p.push(line);
            }
        }
        for (heading, p) in paragraphs {
            let text = join(&p);
            if text.is_empty() {
                continue;
            }
            if heading && text.len() <= 200 {
                out.push_str(self.heading_mark);
            }
            out.push_str(&text);
            out.push_str("\n\n");
        }
    }
}

fn paragraph_right(paragraphs: &[(bool, Vec<&Line>)]) -> i64 {
    paragraphs
        .last()
        .map_or(0, |(_, p)| p.iter().map(|l| l.right).max().unwrap_or(0))
}

/// A paragraph's lines as one line of text, words hyphenated across a line end made whole.
fn join(lines: &[&Line]) -> String {
    let mut text = String::new();
    for line in lines {
        for word in &line.words {
            let broken = text
                .strip_suffix(['-', '\u{ad}', '¬'])
                .filter(|t| t.chars().last().is_some_and(char::is_alphabetic))
                .is_some()
                && std::ptr::eq(word, &line.words[0])
                && word.text.chars().next().is_some_and(char::is_lowercase);
            if broken {
                text.pop();
            } else if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&escape(&word.text));
        }
    }
    text
}

/// A word with the characters Markdown would read as markup escaped.
pub(crate) fn escape(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        if matches!(
            c,
            '*' | '_' | '`' | '[' | ']' | '<' | '>' | '#' | '|' | '\\'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word: block, paragraph, line, left, top, width, height, text.
    type Word<'a> = (u32, u32, u32, i64, i64, i64, i64, &'a str);

    /// The engine's TSV of `words`.
    fn tsv(words: &[Word<'_>]) -> String {
        let mut s = String::from("level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n");
        for (i, (b, p, l, x, y, w, h, t)) in words.iter().enumerate() {
            s.push_str(&format!(
                "5\t1\t{b}\t{p}\t{l}\t{i}\t{x}\t{y}\t{w}\t{h}\t95.5\t{t}\n"
            ));
        }
        s
    }

    #[test]
    fn lines_join_into_paragraphs_and_hyphenated_words_are_made_whole() {
        let t = tsv(&[
            (1, 1, 1, 100, 100, 800, 40, "A Title"),
            (
                2,
                1,
                1,
                100,
                200,
                1000,
                25,
                "The harbour office opens at seven, when the inter-",
            ),
            (
                2,
                1,
                2,
                100,
                240,
                1000,
                25,
                "island ferries come in. Clerks record",
            ),
            (2, 2, 1, 100, 280, 990, 25, "every arrival in a ledger."),
            (2, 2, 2, 100, 320, 400, 25, "Short last line."),
            (3, 1, 1, 100, 420, 1000, 25, "A new block after a gap."),
        ]);
        let lines = lines(&t, 0, 0, false);
        assert_eq!(lines.len(), 6);
        let md = markdown(&lines, "## ");
        assert_eq!(
            md,
            "## A Title\n\nThe harbour office opens at seven, when the interisland ferries come in. \
             Clerks record every arrival in a ledger. Short last line.\n\nA new block after a gap.\n\n"
        );
    }

    #[test]
    fn a_short_line_ends_a_paragraph_and_markup_is_escaped() {
        let t = tsv(&[
            (1, 1, 1, 100, 100, 1000, 25, "First paragraph ends here."),
            (1, 1, 2, 100, 140, 300, 25, "Short."),
            (1, 2, 1, 100, 180, 1000, 25, "*Second* starts [here] #1"),
        ]);
        let md = markdown(&lines(&t, 0, 0, false), "## ");
        assert_eq!(
            md,
            "First paragraph ends here. Short.\n\n\\*Second\\* starts \\[here\\] \\#1\n\n"
        );
    }

    #[test]
    fn a_part_cut_mid_paragraph_joins_the_one_before() {
        let first = tsv(&[(
            1,
            1,
            1,
            100,
            100,
            1000,
            25,
            "the cut runs through this para-",
        )]);
        let second = tsv(&[(1, 1, 1, 0, 0, 1000, 25, "graph and it is joined")]);
        let mut all = lines(&first, 0, 0, false);
        all.extend(lines(&second, 100, 140, true));
        assert_eq!(all[1].top, 140);
        assert_eq!(
            markdown(&all, "## "),
            "the cut runs through this paragraph and it is joined\n\n"
        );
    }
}
