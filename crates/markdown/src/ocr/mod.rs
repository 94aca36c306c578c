//! OCR of page images (uploaded images, PDF pages without a text layer) with Tesseract 5 as a
//! child process of the conversion worker (the choice and its measurements: docs/decisions.md).
//!
//! Per page: the analysis on a reduced, thresholded copy (`page`) says whether it looks like
//! text, whether it lies on its side and how skewed it is; the page is turned and levelled,
//! its rules taken out (`rules`), then cut where it can be read in parts at the same time (two columns, or two halves at a gap
//! between lines); the parts go to the engine side by side, one thread each; their words come
//! back as lines and become tables where their columns line up (`table`) and paragraphs
//! elsewhere (`text`). A page read with poor confidence is given to the engine's orientation
//! detection once, and read again turned if it says so.

mod language;
mod page;
pub(crate) mod raster;
mod rules;
mod table;
mod tesseract;
mod text;

pub use language::Languages;
pub use tesseract::OcrEngine;

use std::sync::{Mutex, PoisonError};

use crate::error::{Error, Result};
use crate::limits::Ctx;
use raster::Gray;

/// Pages whose lines of text are taller than this many pixels are scaled down to
/// [`LINE_PIXELS`] (the engine reads lines of 11-point type at 200 dpi as well as at 300).
const MAX_LINE_PIXELS: usize = 40;
const LINE_PIXELS: usize = 32;
/// White kept around the ink of a part read on its own, in pixels.
const PART_MARGIN: usize = 24;

/// When pages are read by OCR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Ocr {
    /// Images that look like text, and PDF pages without a usable text layer.
    #[default]
    Auto,
    /// Every image, and every PDF page that has images, whatever its text layer holds.
    Force,
    /// Never: images give their metadata, image-only PDF pages a note.
    Off,
}

impl Ocr {
    /// The name `FromStr` reads.
    pub fn name(self) -> &'static str {
        match self {
            Ocr::Auto => "auto",
            Ocr::Force => "force",
            Ocr::Off => "off",
        }
    }
}

impl std::str::FromStr for Ocr {
    type Err = String;
    /// Parses `auto`, `force` or `off`.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Ocr::Auto),
            "force" => Ok(Ocr::Force),
            "off" => Ok(Ocr::Off),
            other => Err(format!(
                "ocr must be \"auto\", \"force\" or \"off\", not {other:?}"
            )),
        }
    }
}

/// What a page image is, for the `auto` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// An uploaded image: read only when it looks like text (under `auto`).
    Image,
    /// A PDF page without text: always read (under `auto`).
    ScannedPage,
}

/// The engine, and the languages the request named (`None`: chosen per page), or why there is
/// no engine: what the caller writes in place of the text.
pub(crate) fn engine(ctx: &Ctx<'_>) -> Result<(&'static OcrEngine, Option<Languages>)> {
    let engine = OcrEngine::installed().ok_or_else(|| Error::Ocr {
        reason: "no OCR engine on this machine (tesseract is not installed)".into(),
    })?;
    let named = ctx.budget.options.languages.clone();
    let wanted = named.clone().unwrap_or_else(Languages::first);
    if !engine.has(&wanted) {
        let missing: Vec<&str> = wanted
            .parts()
            .filter(|l| !engine.languages.iter().any(|h| h == l))
            .collect();
        if named.is_none() {
            return Err(Error::Ocr {
                reason: format!("the OCR engine has no model for {}", missing.join("+")),
            });
        }
        return Err(Error::UnknownLanguage {
            languages: missing.join("+"),
            available: engine.languages.join(", "),
        });
    }
    Ok((engine, named))
}

/// Reads `pages` and returns each page's Markdown (`None` for a page the `auto` rule skipped:
/// an image that does not look like text, or every page when OCR cannot run and the request
/// did not force it, which leaves a warning). Pages run side by side when there are several.
/// Headings in the text start with `heading` (`"## "`).
pub(crate) fn read(
    ctx: &Ctx<'_>,
    pages: Vec<Gray>,
    source: Source,
    heading: &str,
) -> Result<Vec<Option<String>>> {
    let lanes = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let reader = Reader {
        ctx,
        force: ctx.budget.options.ocr == Ocr::Force || source == Source::ScannedPage,
        // Several pages: one page to a lane; one page: its parts share the lanes.
        lanes: if pages.len() >= lanes { 1 } else { lanes },
        heading,
    };
    let count = pages.len();
    let next = Mutex::new(pages.into_iter().enumerate());
    let results = Mutex::new(vec![None; count]);
    let failed = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..lanes.min(count) {
            scope.spawn(|| loop {
                let job = next.lock().unwrap_or_else(PoisonError::into_inner).next();
                let Some((i, gray)) = job else { break };
                match reader.page(gray) {
                    Ok(md) => results.lock().unwrap_or_else(PoisonError::into_inner)[i] = md,
                    Err(e) => {
                        failed
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_or_insert(e);
                        break;
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
        // OCR that cannot run is a warning unless the request forced it: the rest converts.
        Some(Error::Ocr { reason }) if ctx.budget.options.ocr != Ocr::Force => {
            ctx.warn(format!("no OCR: {reason}"));
            Ok(vec![None; count])
        }
        Some(e) => Err(e),
        None => Ok(results.into_inner().unwrap_or_else(PoisonError::into_inner)),
    }
}

/// What reading one page takes.
struct Reader<'a, 'c> {
    ctx: &'a Ctx<'c>,
    force: bool,
    lanes: usize,
    heading: &'a str,
}

impl Reader<'_, '_> {
    /// One page: levelled, surveyed, turned upright, cut, read; read again in its own language
    /// when the first reading in English shows it is another; and once more turned if the
    /// engine's orientation detection says a poor reading was of a page the wrong way round.
    fn page(&self, gray: Gray) -> Result<Option<String>> {
        self.ctx.check_time()?;
        let (mut gray, mut ink) = level(self.ctx, gray)?;
        let survey = page::survey(&ink);
        if !self.force && !survey.text_like {
            return Ok(None);
        }
        // Looked for only now: a conversion with no page to read needs no engine.
        let (engine, named) = engine(self.ctx)?;
        let read = Read {
            ctx: self.ctx,
            engine,
            lanes: self.lanes,
        };
        if survey.sideways {
            // A quarter turn makes the lines run across; then level and check the way up.
            (gray, ink) = level(self.ctx, gray.turned(1))?;
        }
        if page::upright(&ink) == Some(false) {
            gray = gray.turned(2);
            ink = Gray::turned_ink(&ink, 2);
        }
        if let Some(mut height) = page::line_height(&ink) {
            // Lines taller than the engine needs cost layout time for nothing: scaled down.
            let scale = (LINE_PIXELS as f64 / height as f64).max(0.5);
            let scaled = height > MAX_LINE_PIXELS;
            if scaled {
                gray = gray.scaled(scale);
                height = (height as f64 * scale) as usize;
            }
            // The ink map is measured again only when the page changed.
            if rules::remove(&mut gray, height) || scaled {
                ink = page::ink(&gray);
            }
        }
        let first = named.clone().unwrap_or_else(Languages::first);
        let mut lines = read.lines(&gray, &ink, &first)?;
        let (conf, words) = text::quality(&lines);
        if conf < 60.0 || words < 3 {
            if let Some(q @ 1..) = engine.orientation(self.ctx, &gray)? {
                let (turned, turned_ink) = level(self.ctx, gray.turned(q))?;
                let again = read.lines(&turned, &turned_ink, &first)?;
                if text::quality(&again).0 > conf {
                    (gray, ink, lines) = (turned, turned_ink, again);
                }
            }
        }
        if named.is_none() {
            let plain: String = lines
                .iter()
                .flat_map(|l| l.words.iter())
                .map(|w| format!("{} ", w.text))
                .collect();
            if let Some(own) = language::second_reading(engine, &plain) {
                lines = read.lines(&gray, &ink, &own)?;
            }
        }
        Ok(Some(text::markdown(&lines, self.heading)))
    }
}

/// The engine at work on one page.
struct Read<'a, 'c> {
    ctx: &'a Ctx<'c>,
    engine: &'static OcrEngine,
    lanes: usize,
}

impl Read<'_, '_> {
    /// The page's lines: cut into parts, the parts read side by side.
    fn lines(
        &self,
        gray: &Gray,
        ink: &raster::Ink,
        languages: &Languages,
    ) -> Result<Vec<text::Line>> {
        let parts = page::parts(ink, self.lanes);
        let read_part = |part: &page::Part| -> Result<Vec<text::Line>> {
            let part = page::tighten(ink, *part, PART_MARGIN);
            let image = gray.crop(part.x0, part.y0, part.x1, part.y1);
            let tsv = self.engine.words(self.ctx, &image, languages.as_str())?;
            Ok(text::lines(
                &tsv,
                part.x0 as i64,
                part.y0 as i64,
                part.joins_previous,
            ))
        };
        let read: Vec<Result<Vec<text::Line>>> = if parts.len() == 1 {
            vec![read_part(&parts[0])]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = parts
                    .iter()
                    .map(|part| scope.spawn(move || read_part(part)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Ocr {
                                reason: "an OCR thread failed".into(),
                            })
                        })
                    })
                    .collect()
            })
        };
        let mut lines = Vec::new();
        for part in read {
            lines.extend(part?);
        }
        Ok(lines)
    }
}

/// The page levelled (its skew undone) and its ink map.
fn level(ctx: &Ctx<'_>, gray: Gray) -> Result<(Gray, raster::Ink)> {
    let ink = page::ink(&gray);
    match page::skew(&ink) {
        Some(degrees) => {
            ctx.check_time()?;
            let level = gray.levelled(degrees);
            let ink = page::ink(&level);
            Ok((level, ink))
        }
        None => Ok((gray, ink)),
    }
}
