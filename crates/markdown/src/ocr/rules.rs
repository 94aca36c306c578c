//! Long thin lines (a table's rules, frames, underlines) taken out of the page before the engine
//! reads it. The engine's layout analysis takes a ruled table for a picture and returns no words
//! for it; with its rules gone the table is text in aligned columns, which `table` finds.
//!
//! A rule is a run of ink at least three lines of text long across the page, or two lines long
//! down it (no letter's stroke is), and thin where it runs (a quarter of a line of text at most;
//! a dark block or a photograph is left alone). Runs are found on the page as it is and whitened
//! afterwards, so a rule crossing another is found whole.

use super::raster::Gray;

/// Light pixels a run of ink may have inside it (speckle, a scanner's dropout) and go on.
const HOLE: usize = 2;

/// A run of ink along a row (`across`) or down a column: in row or column `at`, from `from` to
/// `to` along it.
struct Run {
    across: bool,
    at: usize,
    from: usize,
    to: usize,
}

impl Run {
    /// The pixel `along` the run and `off` pixels to one side of it, as (row, column), when it
    /// is on the page.
    fn pixel(&self, page: &Gray, along: usize, off: isize) -> Option<usize> {
        let side = self.at.checked_add_signed(off)?;
        let (y, x) = if self.across {
            (side, along)
        } else {
            (along, side)
        };
        (y < page.h && x < page.w).then_some(y * page.w + x)
    }

    /// Its median thickness at five points along it: how far the ink reaches to either side.
    fn thickness(&self, page: &Gray, dark: u8) -> usize {
        let ink = |along: usize, off: isize| {
            self.pixel(page, along, off)
                .is_some_and(|i| page.px[i] < dark)
        };
        let step = ((self.to - self.from) / 5).max(1);
        let mut widths: Vec<usize> = (self.from..self.to)
            .step_by(step)
            .map(|along| {
                let before = (1..).take_while(|&d| ink(along, -d)).count();
                let after = (1..).take_while(|&d| ink(along, d)).count();
                1 + before + after
            })
            .collect();
        widths.sort_unstable();
        widths.get(widths.len() / 2).copied().unwrap_or(usize::MAX)
    }
}

/// Whitens the page's rules; `line` is the height of its lines of text in pixels. Returns
/// whether it found any.
pub(crate) fn remove(page: &mut Gray, line: usize) -> bool {
    if line == 0 || page.w == 0 || page.h == 0 {
        return false;
    }
    let dark = page.threshold();
    let thin = (line / 4).max(3);
    let mut rules = runs_across(page, dark, line * 3);
    rules.extend(runs_down(page, dark, line * 2));
    rules.retain(|run| run.thickness(page, dark) <= thin);
    // The rule, the pixels beside it (where it is only partly dark, it breaks into runs too
    // short to be found) and the grey fringe one further out.
    for run in &rules {
        for along in run.from..run.to {
            for off in -2isize..=2 {
                if let Some(i) = run.pixel(page, along, off) {
                    if off.abs() <= 1 || page.px[i] >= dark {
                        page.px[i] = 255;
                    }
                }
            }
        }
    }
    !rules.is_empty()
}

/// Runs of ink along each row at least `min` long.
fn runs_across(page: &Gray, dark: u8, min: usize) -> Vec<Run> {
    let mut out = Vec::new();
    let mut push = |at: usize, from: usize, last_ink: usize| {
        if last_ink + 1 - from >= min {
            out.push(Run {
                across: true,
                at,
                from,
                to: last_ink + 1,
            });
        }
    };
    for (y, row) in page.px.chunks_exact(page.w).enumerate() {
        let mut start = None;
        let mut last_ink = 0;
        for (x, &p) in row.iter().enumerate() {
            if p < dark {
                start.get_or_insert(x);
                last_ink = x;
            } else if let Some(s) = start {
                if x - last_ink > HOLE {
                    push(y, s, last_ink);
                    start = None;
                }
            }
        }
        if let Some(s) = start {
            push(y, s, last_ink);
        }
    }
    out
}

/// Runs of ink down each column at least `min` long (read row by row, as the pixels lie).
fn runs_down(page: &Gray, dark: u8, min: usize) -> Vec<Run> {
    let mut out = Vec::new();
    let mut push = |at: usize, from: usize, last_ink: usize| {
        if last_ink + 1 - from >= min {
            out.push(Run {
                across: false,
                at,
                from,
                to: last_ink + 1,
            });
        }
    };
    let mut start: Vec<Option<usize>> = vec![None; page.w];
    let mut last_ink = vec![0usize; page.w];
    for (y, row) in page.px.chunks_exact(page.w).enumerate() {
        for (x, &p) in row.iter().enumerate() {
            if p < dark {
                start[x].get_or_insert(y);
                last_ink[x] = y;
            } else if let Some(s) = start[x] {
                if y - last_ink[x] > HOLE {
                    push(x, s, last_ink[x]);
                    start[x] = None;
                }
            }
        }
    }
    for (x, s) in start.iter().enumerate() {
        if let Some(s) = *s {
            push(x, s, last_ink[x]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_long_lines_go_and_blocks_and_short_strokes_stay() {
        let mut page = Gray::new(400, 300, 255);
        let mut paint = |x0: usize, y0: usize, x1: usize, y1: usize| {
            for y in y0..y1 {
                page.px[y * 400 + x0..y * 400 + x1].fill(0);
            }
        };
        paint(10, 20, 390, 23); // a rule across, 3 pixels thick
        paint(50, 10, 52, 290); // a rule down, crossing it
        paint(100, 100, 300, 200); // a dark block
        paint(320, 60, 323, 80); // a letter's stroke: 20 pixels, shorter than two lines
        let mut copy = page.clone();
        assert!(remove(&mut copy, 20));
        let ink = |g: &Gray, x: usize, y: usize| g.px[y * 400 + x] < 128;
        assert!(!ink(&copy, 200, 21) && !ink(&copy, 51, 150) && !ink(&copy, 51, 21));
        assert!(ink(&copy, 200, 150) && ink(&copy, 321, 70));
        // A page without rules is left as it was.
        let mut plain = Gray::new(400, 300, 255);
        for x in (20..380).step_by(12) {
            for y in 40..60 {
                plain.px[y * 400 + x..y * 400 + x + 6].fill(0);
            }
        }
        let before = plain.clone();
        assert!(!remove(&mut plain, 20));
        assert_eq!(plain.px, before.px);
    }
}
