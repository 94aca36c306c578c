//! Charts of OOXML documents (DrawingML `c:chartSpace` parts, which PPTX slides reference from a
//! graphic frame): a heading with the chart's title, then a Markdown table of its categories by
//! its series, from the values the file caches beside its embedded spreadsheet (the numbers
//! PowerPoint draws). Every plot of a combination chart contributes its series; scatter and
//! bubble charts use their X values as the categories; categories cached as spreadsheet date
//! serials under a date format are written as ISO dates. Bounded by the XML limits the part was
//! parsed under, and by [`MAX_SERIES`] columns.

use std::collections::BTreeMap;

use crate::md;
use crate::xml::Element;

/// Columns past this many series are left out (with a note under the table).
const MAX_SERIES: usize = 64;

/// The chart's Markdown (from a parsed chart part), or `None` when it has neither a title nor
/// any data.
pub fn markdown(part: &Element) -> Option<String> {
    let space = if part.name == "chartSpace" {
        part
    } else {
        part.find("chartSpace")?
    };
    let chart = space.child("chart")?;
    let title = chart
        .child("title")
        .map(title_text)
        .filter(|t| !t.is_empty());
    let date1904 = space.child("date1904").and_then(|d| d.attr("val")) == Some("1");
    let mut series: Vec<Series> = Vec::new();
    if let Some(plot) = chart.child("plotArea") {
        for group in plot.elements().filter(|e| e.name.ends_with("Chart")) {
            for ser in group.children_named("ser") {
                series.push(Series::read(ser, series.len(), date1904));
            }
        }
    }
    let mut out = match &title {
        Some(t) => format!("### Chart: {}", md::escape_inline(t)),
        None => "### Chart".to_string(),
    };
    // Rows: every index that any series has a category or a value for, in order.
    let mut indexes: Vec<u64> = series
        .iter()
        .flat_map(|s| s.categories.keys().chain(s.values.keys()))
        .copied()
        .collect();
    indexes.sort_unstable();
    indexes.dedup();
    if indexes.is_empty() {
        return title.map(|_| out);
    }
    let shown = &series[..series.len().min(MAX_SERIES)];
    let mut rows = vec![std::iter::once("Category".to_string())
        .chain(shown.iter().map(|s| md::cell(&s.name)))
        .collect::<Vec<_>>()];
    for i in &indexes {
        let category = series
            .iter()
            .find_map(|s| s.categories.get(i))
            .cloned()
            .unwrap_or_else(|| (i + 1).to_string());
        let mut row = vec![md::cell(&category)];
        row.extend(
            shown
                .iter()
                .map(|s| s.values.get(i).map(|v| md::cell(v)).unwrap_or_default()),
        );
        rows.push(row);
    }
    out.push_str("\n\n");
    out.push_str(md::table(&rows).trim_end());
    if series.len() > shown.len() {
        out.push_str(&format!(
            "\n\n({} more series not shown)",
            series.len() - shown.len()
        ));
    }
    Some(out)
}

/// One series: its name and its points (category labels and values by point index).
struct Series {
    name: String,
    categories: BTreeMap<u64, String>,
    values: BTreeMap<u64, String>,
}

impl Series {
    fn read(ser: &Element, position: usize, date1904: bool) -> Series {
        let name = ser
            .child("tx")
            .and_then(|tx| {
                points(tx)
                    .into_values()
                    .next()
                    .or_else(|| tx.child("v").map(Element::text))
            })
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("Series {}", position + 1));
        let categories = ser
            .child("cat")
            .or_else(|| ser.child("xVal"))
            .map(|c| {
                let mut labels = points(c);
                if is_date_format(&format_code(c)) {
                    for label in labels.values_mut() {
                        if let Some(date) = label.parse().ok().and_then(|s| iso_date(s, date1904)) {
                            *label = date;
                        }
                    }
                }
                labels
            })
            .unwrap_or_default();
        let values = ser
            .child("val")
            .or_else(|| ser.child("yVal"))
            .map(points)
            .unwrap_or_default();
        Series {
            name,
            categories,
            values,
        }
    }
}

/// The cached points under a data source (`strRef`/`numRef` caches, literals, or the first level
/// of a multi-level category cache): point index to its text.
fn points(source: &Element) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    let Some(cache) = source.elements().find_map(|r| {
        ["strCache", "numCache", "multiLvlStrCache"]
            .iter()
            .find_map(|c| r.child(c))
            .or_else(|| matches!(r.name.as_str(), "strLit" | "numLit").then_some(r))
    }) else {
        return out;
    };
    let cache = cache.child("lvl").unwrap_or(cache);
    for pt in cache.children_named("pt") {
        if let (Some(idx), Some(v)) = (
            pt.attr("idx").and_then(|i| i.parse::<u64>().ok()),
            pt.child("v"),
        ) {
            out.insert(idx, v.text().trim().to_string());
        }
    }
    out
}

/// The number format of a data source's cache (`numCache/formatCode`), or "".
fn format_code(source: &Element) -> String {
    source
        .elements()
        .find_map(|r| r.child("numCache"))
        .and_then(|c| c.child("formatCode"))
        .map(Element::text)
        .unwrap_or_default()
}

/// Whether a spreadsheet number format shows a date: a day or year field outside quoted text
/// and bracketed parts (`m/d/yy`, `d-mmm`, `yyyy`, but not `0.00` or `h:mm`).
fn is_date_format(code: &str) -> bool {
    let (mut quoted, mut bracket) = (false, false);
    for c in code.chars() {
        match c {
            '"' => quoted = !quoted,
            '[' if !quoted => bracket = true,
            ']' if !quoted => bracket = false,
            'd' | 'D' | 'y' | 'Y' if !quoted && !bracket => return true,
            _ => {}
        }
    }
    false
}

/// A spreadsheet date serial as `YYYY-MM-DD` (the 1900 system, whose day 60 is the 29 February
/// 1900 that never was, or the 1904 system); `None` outside years 1900-9999.
fn iso_date(serial: f64, date1904: bool) -> Option<String> {
    if !serial.is_finite() || !(0.0..3_000_000.0).contains(&serial) {
        return None;
    }
    let whole = serial.floor() as i64;
    // Days from 1970-01-01.
    let days = if date1904 {
        whole - 24_107
    } else if whole >= 61 {
        whole - 25_569
    } else if whole == 60 {
        return Some("1900-02-29".into());
    } else {
        whole - 25_568
    };
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (1900..=9999)
        .contains(&year)
        .then(|| format!("{year:04}-{month:02}-{day:02}"))
}

/// A title's text: its rich text's paragraphs joined by spaces (or a referenced cell's cache).
fn title_text(title: &Element) -> String {
    let Some(tx) = title.child("tx") else {
        return String::new();
    };
    if let Some(rich) = tx.child("rich") {
        let parts: Vec<String> = rich
            .children_named("p")
            .map(|p| {
                let mut ts = Vec::new();
                p.find_all("t", &mut ts);
                ts.iter().map(|t| t.text()).collect::<String>()
            })
            .filter(|p| !p.trim().is_empty())
            .collect();
        return parts.join(" ").trim().to_string();
    }
    points(tx).into_values().next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Format;
    use crate::limits::{Budget, Ctx, Limits};

    fn chart(xml: &str) -> Option<String> {
        let budget = Budget::new(Limits::default());
        let ctx = Ctx {
            budget: &budget,
            depth: 0,
        };
        let el = crate::xml::parse_str(&ctx, Format::Pptx, xml).unwrap();
        markdown(&el)
    }

    const NS: &str = r#"xmlns:c="c" xmlns:a="a""#;

    #[test]
    fn a_bar_chart_becomes_a_titled_table_of_categories_by_series() {
        let xml = format!(
            r#"<c:chartSpace {NS}><c:chart><c:title><c:tx><c:rich><a:p><a:r><a:t>Sales </a:t></a:r><a:r><a:t>by quarter</a:t></a:r></a:p></c:rich></c:tx></c:title>
            <c:plotArea><c:barChart>
              <c:ser><c:tx><c:strRef><c:strCache><c:pt idx="0"><c:v>East</c:v></c:pt></c:strCache></c:strRef></c:tx>
                <c:cat><c:strRef><c:strCache><c:pt idx="0"><c:v>Q1</c:v></c:pt><c:pt idx="1"><c:v>Q2</c:v></c:pt></c:strCache></c:strRef></c:cat>
                <c:val><c:numRef><c:numCache><c:pt idx="0"><c:v>4.3</c:v></c:pt><c:pt idx="1"><c:v>2.5</c:v></c:pt></c:numCache></c:numRef></c:val></c:ser>
              <c:ser><c:tx><c:v>West|Coast</c:v></c:tx>
                <c:val><c:numRef><c:numCache><c:pt idx="1"><c:v>7</c:v></c:pt></c:numCache></c:numRef></c:val></c:ser>
            </c:barChart></c:plotArea></c:chart></c:chartSpace>"#
        );
        assert_eq!(
            chart(&xml).unwrap(),
            "### Chart: Sales by quarter\n\n| Category | East | West\\|Coast |\n| --- | --- | --- |\n\
             | Q1 | 4.3 |  |\n| Q2 | 2.5 | 7 |"
        );
    }

    #[test]
    fn scatter_points_use_their_x_values_and_unnamed_series_are_numbered() {
        let xml = format!(
            r#"<c:chartSpace {NS}><c:chart><c:plotArea><c:scatterChart><c:ser>
              <c:xVal><c:numLit><c:pt idx="0"><c:v>0.5</c:v></c:pt><c:pt idx="1"><c:v>1.5</c:v></c:pt></c:numLit></c:xVal>
              <c:yVal><c:numLit><c:pt idx="0"><c:v>10</c:v></c:pt><c:pt idx="1"><c:v>20</c:v></c:pt></c:numLit></c:yVal>
            </c:ser></c:scatterChart></c:plotArea></c:chart></c:chartSpace>"#
        );
        let md = chart(&xml).unwrap();
        assert!(
            md.starts_with("### Chart\n\n| Category | Series 1 |"),
            "{md}"
        );
        assert!(
            md.contains("| 0.5 | 10 |") && md.contains("| 1.5 | 20 |"),
            "{md}"
        );
    }

    #[test]
    fn a_sparse_huge_index_makes_one_row_not_a_billion() {
        let xml = format!(
            r#"<c:chartSpace {NS}><c:chart><c:plotArea><c:lineChart><c:ser>
              <c:val><c:numRef><c:numCache><c:ptCount val="4000000000"/><c:pt idx="3999999999"><c:v>1</c:v></c:pt></c:numCache></c:numRef></c:val>
            </c:ser></c:lineChart></c:plotArea></c:chart></c:chartSpace>"#
        );
        let md = chart(&xml).unwrap();
        assert_eq!(md.lines().count(), 5, "{md}");
        assert!(md.contains("| 4000000000 | 1 |"), "{md}");
    }

    #[test]
    fn date_serials_under_a_date_format_become_iso_dates() {
        assert!(is_date_format("m/d/yy") && is_date_format("d-mmm") && is_date_format("yyyy"));
        assert!(!is_date_format("0.00") && !is_date_format("h:mm") && !is_date_format("General"));
        assert!(!is_date_format(r#"0" days""#) && !is_date_format("[Red]0"));
        assert_eq!(iso_date(37261.0, false).as_deref(), Some("2002-01-05"));
        assert_eq!(iso_date(1.0, false).as_deref(), Some("1900-01-01"));
        assert_eq!(iso_date(59.0, false).as_deref(), Some("1900-02-28"));
        assert_eq!(iso_date(61.0, false).as_deref(), Some("1900-03-01"));
        assert_eq!(iso_date(0.0, true).as_deref(), Some("1904-01-01"));
        assert_eq!(iso_date(45657.75, false).as_deref(), Some("2024-12-31"));
        assert_eq!(iso_date(f64::NAN, false), None);
        assert_eq!(iso_date(1e12, false), None);
        let xml = format!(
            r#"<c:chartSpace {NS}><c:date1904 val="0"/><c:chart><c:plotArea><c:lineChart><c:ser>
              <c:cat><c:numRef><c:numCache><c:formatCode>m/d/yy</c:formatCode><c:pt idx="0"><c:v>37261.0</c:v></c:pt></c:numCache></c:numRef></c:cat>
              <c:val><c:numRef><c:numCache><c:formatCode>General</c:formatCode><c:pt idx="0"><c:v>32.0</c:v></c:pt></c:numCache></c:numRef></c:val>
            </c:ser></c:lineChart></c:plotArea></c:chart></c:chartSpace>"#
        );
        assert!(chart(&xml).unwrap().contains("| 2002-01-05 | 32.0 |"));
    }

    #[test]
    fn an_empty_chart_without_a_title_says_nothing() {
        assert_eq!(
            chart(&format!(r#"<c:chartSpace {NS}><c:chart/></c:chartSpace>"#)),
            None
        );
        let many: String = (0..70)
            .map(|i| {
                format!(r#"<c:ser><c:val><c:numLit><c:pt idx="0"><c:v>{i}</c:v></c:pt></c:numLit></c:val></c:ser>"#)
            })
            .collect();
        let md = chart(&format!(
            r#"<c:chartSpace {NS}><c:chart><c:plotArea><c:barChart>{many}</c:barChart></c:plotArea></c:chart></c:chartSpace>"#
        ))
        .unwrap();
        assert!(md.ends_with("(6 more series not shown)"), "{md}");
        assert!(
            md.contains("Series 64 |") && !md.contains("Series 65"),
            "{md}"
        );
    }
}
