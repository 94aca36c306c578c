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

/// Whitens the page's rules; `line` is the height of its lines of text in pixels. Returns
/// whether it found any.
pub(crate) fn remove(page: &mut Gray, line: usize) -> bool {
    if line == 0 || page.w == 0 || page.h == 0 {
        return false;
    }
    let dark = page.threshold();
    let thin = (line / 4).max(3);
    let across = runs_across(page, dark, line * 3);
    let down = runs_down(page, dark, line * 2);
    let (w, h) = (page.w, page.h);
    let across: Vec<_> = across
        .into_iter()
        .filter(|&(y, x0, x1)| {
            thickness(
                page,
                dark,
                (x0..x1).step_by(((x1 - x0) / 5).max(1)),
                |x, d| (y as isize + d, x as isize),
            ) <= thin
        })
        .collect();
    let down: Vec<_> = down
        .into_iter()
        .filter(|&(x, y0, y1)| {
            thickness(
                page,
                dark,
                (y0..y1).step_by(((y1 - y0) / 5).max(1)),
                |y, d| (y as isize, x as isize + d),
            ) <= thin
        })
        .collect();
    // The rule, the pixels beside it (where it is only partly dark, it breaks into runs too
    // short to be found) and the grey fringe one further out.
    let mut clear = |y: usize, x: usize, off: usize| {
        let i = y * w + x;
        if off <= 1 || page.px[i] >= dark {
            page.px[i] = 255;
        }
    };
    for &(y, x0, x1) in &across {
        for x in x0..x1 {
            for yy in y.saturating_sub(2)..(y + 3).min(h) {
                clear(yy, x, yy.abs_diff(y));
            }
        }
    }
    for &(x, y0, y1) in &down {
        for y in y0..y1 {
            for xx in x.saturating_sub(2)..(x + 3).min(w) {
                clear(y, xx, xx.abs_diff(x));
            }
        }
    }
    !across.is_empty() || !down.is_empty()
}

/// Runs of ink along each row at least `min` long: (row, from, to).
fn runs_across(page: &Gray, dark: u8, min: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for (y, row) in page.px.chunks_exact(page.w).enumerate() {
        let mut start = None;
        let mut last_ink = 0;
        for (x, &p) in row.iter().enumerate() {
            if p < dark {
                start.get_or_insert(x);
                last_ink = x;
            } else if let Some(s) = start {
                if x - last_ink > HOLE {
                    if last_ink + 1 - s >= min {
                        out.push((y, s, last_ink + 1));
                    }
                    start = None;
                }
            }
        }
        if let Some(s) = start {
            if last_ink + 1 - s >= min {
                out.push((y, s, last_ink + 1));
            }
        }
    }
    out
}

/// Runs of ink down each column at least `min` long: (column, from, to).
fn runs_down(page: &Gray, dark: u8, min: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut start: Vec<Option<usize>> = vec![None; page.w];
    let mut last_ink = vec![0usize; page.w];
    for (y, row) in page.px.chunks_exact(page.w).enumerate() {
        for (x, &p) in row.iter().enumerate() {
            if p < dark {
                start[x].get_or_insert(y);
                last_ink[x] = y;
            } else if let Some(s) = start[x] {
                if y - last_ink[x] > HOLE {
                    if last_ink[x] + 1 - s >= min {
                        out.push((x, s, last_ink[x] + 1));
                    }
                    start[x] = None;
                }
            }
        }
    }
    for (x, s) in start.iter().enumerate() {
        if let Some(s) = *s {
            if last_ink[x] + 1 - s >= min {
                out.push((x, s, last_ink[x] + 1));
            }
        }
    }
    out
}

/// The median thickness of a run at the sampled positions: how far the ink reaches on either
/// side of it. `at(position, offset)` is the (row, column) `offset` pixels across the run.
fn thickness(
    page: &Gray,
    dark: u8,
    samples: impl Iterator<Item = usize>,
    at: impl Fn(usize, isize) -> (isize, isize),
) -> usize {
    let ink = |pos: usize, d: isize| {
        let (y, x) = at(pos, d);
        y >= 0
            && x >= 0
            && (y as usize) < page.h
            && (x as usize) < page.w
            && page.px[y as usize * page.w + x as usize] < dark
    };
    let mut widths: Vec<usize> = samples
        .map(|pos| {
            let up = (1..).take_while(|&d| ink(pos, -d)).count();
            let down = (1..).take_while(|&d| ink(pos, d)).count();
            1 + up + down
        })
        .collect();
    if widths.is_empty() {
        return usize::MAX;
    }
    widths.sort_unstable();
    widths[widths.len() / 2]
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
