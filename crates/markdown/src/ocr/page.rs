//! What the page analysis measures on a thresholded, reduced page before the engine reads it:
//! whether it looks like text at all, whether its lines run sideways, its skew, and where it
//! can be cut into parts read at the same time without changing the reading order (a gutter
//! between two columns, or a gap between two lines).

use super::raster::{Gray, Ink};

/// Reduced pages are about this many cells wide.
const CELLS_ACROSS: usize = 700;
/// Skews searched, in degrees either way, and the step of the search.
const MAX_SKEW: f64 = 10.0;
const SKEW_STEP: f64 = 0.1;
const COARSE_STEP: f64 = 0.5;
/// Skews smaller than this are left to the engine.
const MIN_SKEW: f64 = 0.3;

/// The reduced, thresholded page.
pub(crate) fn ink(page: &Gray) -> Ink {
    let factor = (page.w.max(page.h) / CELLS_ACROSS).max(1);
    page.ink(factor, page.threshold())
}

/// Ink per row and per column.
fn profiles(ink: &Ink, x0: usize, y0: usize, x1: usize, y1: usize) -> (Vec<u32>, Vec<u32>) {
    let mut rows = vec![0u32; y1 - y0];
    let mut cols = vec![0u32; x1 - x0];
    for y in y0..y1 {
        for x in x0..x1 {
            if ink.get(x, y) {
                rows[y - y0] += 1;
                cols[x - x0] += 1;
            }
        }
    }
    (rows, cols)
}

/// How strongly a profile alternates between ink and gaps: the variance over the squared mean
/// (lines of text give a comb; a photograph a smooth curve).
fn comb(profile: &[u32]) -> f64 {
    let n = profile.len().max(1) as f64;
    let mean = profile.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    if mean == 0.0 {
        return 0.0;
    }
    let var = profile
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    var / (mean * mean)
}

/// Runs of empty entries strictly inside the profile's ink: (start, end) pairs.
fn gaps(profile: &[u32], empty: u32) -> Vec<(usize, usize)> {
    let first = profile.iter().position(|&v| v > empty);
    let last = profile.iter().rposition(|&v| v > empty);
    let (Some(first), Some(last)) = (first, last) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut start = None;
    for (i, &v) in profile.iter().enumerate().take(last + 1).skip(first) {
        match (v <= empty, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Rows (or columns) with ink, between the first and the last.
fn extent(profile: &[u32]) -> Option<(usize, usize)> {
    let first = profile.iter().position(|&v| v > 0)?;
    let last = profile.iter().rposition(|&v| v > 0)?;
    Some((first, last + 1))
}

/// What the analysis found on a page.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Survey {
    /// Lines of text seem to be there (a comb of rows or columns, with room between them).
    pub text_like: bool,
    /// The lines run top to bottom: the page lies on its side.
    pub sideways: bool,
}

pub(crate) fn survey(ink: &Ink) -> Survey {
    let (rows, cols) = profiles(ink, 0, 0, ink.w, ink.h);
    let total: u64 = rows.iter().map(|&v| u64::from(v)).sum();
    let cover = total as f64 / (ink.w * ink.h).max(1) as f64;
    let (row_comb, col_comb) = (comb(&rows), comb(&cols));
    let lines = |p: &[u32]| {
        let Some((a, b)) = extent(p) else { return 0 };
        let span = &p[a..b];
        // Lines: gaps of nearly empty rows between inked ones.
        let empty = span.iter().copied().max().unwrap_or(0) / 8;
        gaps(span, empty).len()
    };
    let (row_lines, col_lines) = (lines(&rows), lines(&cols));
    let sideways = col_comb > 1.5 * row_comb && col_lines > row_lines;
    let (comb_best, lines_best) = if sideways {
        (col_comb, col_lines)
    } else {
        (row_comb, row_lines)
    };
    Survey {
        text_like: (0.002..0.45).contains(&cover) && lines_best >= 2 && comb_best > 0.15,
        sideways,
    }
}

/// The page's skew in degrees (positive: lines rise to the right), from the angle whose
/// projection of the ink is sharpest; `None` when it is too small to matter.
pub(crate) fn skew(ink: &Ink) -> Option<f64> {
    let mut points: Vec<(i64, i64)> = Vec::new();
    for y in 0..ink.h {
        for x in 0..ink.w {
            if ink.get(x, y) {
                points.push((x as i64, y as i64));
            }
        }
    }
    // Too little ink, or so much that it is no page of text (a photograph): no skew to find.
    let cover = points.len() as f64 / (ink.w * ink.h).max(1) as f64;
    if points.len() < 50 || !(0.002..0.45).contains(&cover) {
        return None;
    }
    // A bounded sample keeps the search cheap on dense pages.
    let step = (points.len() / 20_000).max(1);
    let points: Vec<(i64, i64)> = points.into_iter().step_by(step).collect();
    let offset = ink.w as i64;
    let mut bins = vec![0u32; (ink.w + ink.h) * 2 + 2];
    let mut sharpness = |degrees: f64| {
        bins.iter_mut().for_each(|b| *b = 0);
        // A line rising by `t` keeps y + x·t constant; t in 16-bit fixed point.
        let t = (degrees.to_radians().tan() * 65536.0).round() as i64;
        for &(x, y) in &points {
            let b = y + ((x * t + 32768) >> 16) + offset;
            if let Some(bin) = usize::try_from(b).ok().and_then(|b| bins.get_mut(b)) {
                *bin += 1;
            }
        }
        bins.iter()
            .map(|&v| u64::from(v) * u64::from(v))
            .sum::<u64>()
    };
    let flat = sharpness(0.0);
    let best_of = |angles: &mut dyn Iterator<Item = f64>, sharpness: &mut dyn FnMut(f64) -> u64| {
        angles
            .map(|a| (a, sharpness(a)))
            .max_by_key(|&(_, score)| score)
            .unwrap_or((0.0, 0))
    };
    // Coarse, then fine around the best coarse angle.
    let coarse = (MAX_SKEW / COARSE_STEP).round() as i32;
    let (around, _) = best_of(
        &mut (-coarse..=coarse).map(|i| f64::from(i) * COARSE_STEP),
        &mut sharpness,
    );
    let fine = (COARSE_STEP / SKEW_STEP).round() as i32;
    let (best, best_score) = best_of(
        &mut (-fine..=fine).map(|i| around + f64::from(i) * SKEW_STEP),
        &mut sharpness,
    );
    // Only a clear improvement over level counts: noise has no sharp angle.
    (best.abs() >= MIN_SKEW && best_score as f64 > flat as f64 * 1.05).then_some(best)
}

/// Whether the page's lines stand the right way up (`Some(true)`), upside down (`Some(false)`),
/// or it cannot tell. Latin text has more ascenders (b, d, h, k, l, capitals) than descenders
/// (g, p, q, y): above each line's core of x-height rows there is more ink than below it.
pub(crate) fn upright(ink: &Ink) -> Option<bool> {
    let (rows, _) = profiles(ink, 0, 0, ink.w, ink.h);
    let (mut above, mut below, mut lines) = (0u64, 0u64, 0usize);
    for band in line_bands(&rows).into_iter().filter(|b| b.len() >= 4) {
        let band = &rows[band];
        let top = band.iter().copied().max().unwrap_or(0);
        let core_start = band.iter().position(|&v| v * 2 >= top).unwrap_or(0);
        let core_end = band
            .iter()
            .rposition(|&v| v * 2 >= top)
            .unwrap_or(band.len() - 1);
        let sum = |part: &[u32]| part.iter().map(|&v| u64::from(v)).sum::<u64>();
        above += sum(&band[..core_start]);
        below += sum(&band[core_end + 1..]);
        lines += 1;
    }
    if lines < 3 {
        return None;
    }
    if above * 10 > below * 13 {
        Some(true)
    } else if below * 10 > above * 13 {
        Some(false)
    } else {
        None
    }
}

/// The median height of the page's lines of text, in page pixels (ascenders to descenders).
pub(crate) fn line_height(ink: &Ink) -> Option<usize> {
    let (rows, _) = profiles(ink, 0, 0, ink.w, ink.h);
    let mut heights: Vec<usize> = line_bands(&rows).iter().map(|b| b.len()).collect();
    if heights.len() < 3 {
        return None;
    }
    heights.sort_unstable();
    Some(heights[heights.len() / 2] * ink.factor)
}

/// The runs of rows that hold a line of text: more ink than a sixteenth of the fullest row.
fn line_bands(rows: &[u32]) -> Vec<std::ops::Range<usize>> {
    let floor = rows.iter().copied().max().unwrap_or(0) / 16;
    let mut bands = Vec::new();
    let mut start = None;
    for (y, &v) in rows.iter().enumerate() {
        match (v > floor, start) {
            (true, None) => start = Some(y),
            (false, Some(s)) => {
                bands.push(s..y);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        bands.push(s..rows.len());
    }
    bands
}

/// `part` shrunk to the ink inside it, with a margin of white the engine needs around text.
pub(crate) fn tighten(ink: &Ink, part: Part, margin: usize) -> Part {
    let f = ink.factor;
    let (x0, y0) = (part.x0 / f, part.y0 / f);
    let (x1, y1) = (
        part.x1.div_ceil(f).min(ink.w),
        part.y1.div_ceil(f).min(ink.h),
    );
    if x1 <= x0 || y1 <= y0 {
        return part;
    }
    let (rows, cols) = profiles(ink, x0, y0, x1, y1);
    let (Some((top, bottom)), Some((left, right))) = (extent(&rows), extent(&cols)) else {
        return part;
    };
    Part {
        x0: ((x0 + left) * f).saturating_sub(margin).max(part.x0),
        y0: ((y0 + top) * f).saturating_sub(margin).max(part.y0),
        x1: ((x0 + right) * f + margin).min(part.x1),
        y1: ((y0 + bottom) * f + margin).min(part.y1),
        ..part
    }
}

/// A part of the page read on its own, in reading order, in page pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub x0: usize,
    pub y0: usize,
    pub x1: usize,
    pub y1: usize,
    /// The cut above this part runs between two lines of one paragraph, which is joined again.
    pub joins_previous: bool,
}

/// Cuts the page into parts that can be read at the same time: two columns (with a full-width
/// top and bottom apart), or two halves at a gap between lines near the middle of the ink.
/// A page that offers neither, or is short, stays whole.
pub(crate) fn parts(ink: &Ink, want: usize) -> Vec<Part> {
    let whole = |ink: &Ink| Part {
        x0: 0,
        y0: 0,
        x1: ink.w * ink.factor,
        y1: ink.h * ink.factor,
        joins_previous: false,
    };
    let (rows, cols) = profiles(ink, 0, 0, ink.w, ink.h);
    let (Some((top, bottom)), Some((left, right))) = (extent(&rows), extent(&cols)) else {
        return vec![whole(ink)];
    };
    let row_gaps = gaps(&rows[top..bottom], 0);
    if want < 2 || row_gaps.len() < 8 {
        return vec![whole(ink)];
    }
    let scale = |v: usize| v * ink.factor;
    let part = |x0: usize, y0: usize, x1: usize, y1: usize, joins: bool| Part {
        x0: scale(x0),
        y0: scale(y0),
        x1: scale(x1),
        y1: scale(y1),
        joins_previous: joins,
    };
    // Two columns: a gutter over a band of rows, with at most a full-width head and foot.
    let tops: Vec<usize> = std::iter::once(top)
        .chain(
            row_gaps
                .iter()
                .map(|&(_, e)| top + e)
                .filter(|&y| y < top + (bottom - top) * 2 / 5),
        )
        .collect();
    let bottoms: Vec<usize> = std::iter::once(bottom)
        .chain(
            row_gaps
                .iter()
                .rev()
                .map(|&(s, _)| top + s)
                .filter(|&y| y > top + (bottom - top) * 7 / 10),
        )
        .collect();
    for &a in tops.iter().take(12) {
        for &b in bottoms.iter().take(6) {
            if let Some(x) = gutter(ink, a, b, left, right) {
                let mut out = Vec::new();
                if a > top {
                    out.push(part(0, 0, ink.w, a, false));
                }
                out.push(part(0, a, x, b, false));
                out.push(part(x, a, ink.w, b, false));
                if b < bottom {
                    out.push(part(0, b, ink.w, ink.h, false));
                }
                return out;
            }
        }
    }
    // One column: cut at the gap between lines nearest the middle of the ink.
    let total: u64 = rows.iter().map(|&v| u64::from(v)).sum();
    let mut seen = 0u64;
    let middle = rows
        .iter()
        .position(|&v| {
            seen += u64::from(v);
            seen * 2 >= total
        })
        .unwrap_or(ink.h / 2);
    let Some(&(s, e)) = row_gaps
        .iter()
        .min_by_key(|&&(s, e)| (top + (s + e) / 2).abs_diff(middle))
    else {
        return vec![whole(ink)];
    };
    let mut widths: Vec<usize> = row_gaps.iter().map(|&(s, e)| e - s).collect();
    widths.sort_unstable();
    let usual = widths[widths.len() / 2];
    let cut = top + (s + e) / 2;
    let joins = (e - s) * 2 <= usual * 3;
    vec![
        part(0, 0, ink.w, cut, false),
        part(0, cut, ink.w, ink.h, joins),
    ]
}

/// A column of empty cells between `left` and `right` over rows `a..b`, near the middle, with
/// ink of its own on either side: the gutter's middle.
fn gutter(ink: &Ink, a: usize, b: usize, left: usize, right: usize) -> Option<usize> {
    if b <= a + 8 {
        return None;
    }
    let (_, cols) = profiles(ink, 0, a, ink.w, b);
    let width = right - left;
    // Wider than the spaces between words that happen to line up (a sixtieth of the page).
    let min_gap = (ink.w / 60).max(2);
    gaps(&cols[left..right], 0)
        .into_iter()
        .filter(|&(s, e)| e - s >= min_gap)
        .filter(|&(s, e)| {
            let x = left + (s + e) / 2;
            x >= left + width * 3 / 10 && x <= left + width * 7 / 10
        })
        .max_by_key(|&(s, e)| e - s)
        .map(|(s, e)| left + (s + e) / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of `lines` text-like bars (dashes for words) in `columns` columns.
    fn page(w: usize, h: usize, columns: usize, lines: usize) -> Gray {
        let mut g = Gray::new(w, h, 255);
        let margin = w / 10;
        let col_w = (w - 2 * margin - (columns - 1) * (w / 20)) / columns;
        for c in 0..columns {
            let x0 = margin + c * (col_w + w / 20);
            for l in 0..lines {
                let y = margin + l * 40;
                for x in x0..x0 + col_w {
                    // Words of 50 px with 12 px spaces, 14 px high.
                    if (x - x0) % 62 < 50 {
                        for yy in y..y + 14 {
                            g.px[yy * w + x] = 0;
                        }
                    }
                }
            }
        }
        g
    }

    #[test]
    fn lines_of_text_look_like_text_and_a_gradient_does_not() {
        let text = page(1200, 1700, 1, 30);
        let s = survey(&ink(&text));
        assert!(s.text_like && !s.sideways, "{s:?}");
        let sideways = survey(&ink(&text.turned(1)));
        assert!(sideways.text_like && sideways.sideways, "{sideways:?}");
        let mut photo = Gray::new(800, 600, 0);
        for (i, p) in photo.px.iter_mut().enumerate() {
            *p = ((i % 800) * 255 / 800) as u8;
        }
        assert!(!survey(&ink(&photo)).text_like);
    }

    #[test]
    fn a_rising_page_measures_its_skew() {
        let text = page(1200, 1700, 1, 30);
        assert_eq!(skew(&ink(&text)), None);
        for degrees in [2.0, -4.0] {
            let tilted = text.rotated(degrees);
            let found = skew(&ink(&tilted)).expect("a skew");
            assert!((found - degrees).abs() < 0.35, "{degrees}: {found}");
            // Levelling by the measured skew leaves none.
            assert_eq!(skew(&ink(&tilted.levelled(found))), None);
        }
    }

    #[test]
    fn two_columns_are_cut_at_the_gutter_and_one_column_between_lines() {
        let two = page(1200, 1700, 2, 30);
        let cut = parts(&ink(&two), 2);
        assert_eq!(cut.len(), 2, "{cut:?}");
        assert!(cut[0].x1 > 560 && cut[0].x1 < 640, "{cut:?}");
        assert_eq!((cut[1].y0, cut[1].x0), (cut[0].y0, cut[0].x1));
        let one = page(1200, 1700, 1, 30);
        let cut = parts(&ink(&one), 2);
        assert_eq!(cut.len(), 2, "{cut:?}");
        assert_eq!(cut[0].x1, cut[1].x1);
        assert!(cut[1].joins_previous);
        assert_eq!(parts(&ink(&one), 1).len(), 1);
        assert_eq!(parts(&ink(&page(1200, 1700, 1, 4)), 2).len(), 1);
    }
}
