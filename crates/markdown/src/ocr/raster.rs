//! Page images as 8-bit grey pixels: decoding uploads within bounds (a decompression bomb is
//! refused from its header, before any pixel is decoded), and the few pixel operations the page
//! analysis needs (threshold, quarter turns, a small rotation, crops, PGM for the engine).

use std::io::Cursor;

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;

/// The most pixels one page may have (an A4 page at 600 dpi is 35 million).
pub(crate) const MAX_PAGE_PIXELS: u64 = 80_000_000;
/// The longest side a page may have, in pixels.
pub(crate) const MAX_PAGE_SIDE: u64 = 20_000;
/// The most pages a multi-page image may have.
pub(crate) const MAX_PAGES: usize = 200;

/// An 8-bit grey image, 0 black, 255 white, rows top to bottom.
#[derive(Clone)]
pub(crate) struct Gray {
    pub w: usize,
    pub h: usize,
    pub px: Vec<u8>,
}

impl std::fmt::Debug for Gray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gray({}x{})", self.w, self.h)
    }
}

impl Gray {
    #[cfg(test)]
    pub fn new(w: usize, h: usize, fill: u8) -> Gray {
        Gray {
            w,
            h,
            px: vec![fill; w * h],
        }
    }

    #[cfg(test)]
    pub fn at(&self, x: usize, y: usize) -> u8 {
        self.px[y * self.w + x]
    }

    /// The image as binary PGM (P5), which the engine reads from a pipe.
    pub fn pgm(&self) -> Vec<u8> {
        let header = format!("P5\n{} {}\n255\n", self.w, self.h);
        let mut out = Vec::with_capacity(header.len() + self.px.len());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&self.px);
        out
    }

    /// The rectangle `x0..x1` × `y0..y1`.
    pub fn crop(&self, x0: usize, y0: usize, x1: usize, y1: usize) -> Gray {
        let (x1, y1) = (x1.min(self.w), y1.min(self.h));
        let (w, h) = (x1.saturating_sub(x0), y1.saturating_sub(y0));
        let mut px = Vec::with_capacity(w * h);
        for y in y0..y0 + h {
            px.extend_from_slice(&self.px[y * self.w + x0..y * self.w + x0 + w]);
        }
        Gray { w, h, px }
    }

    /// Turned clockwise by `quarters` quarter turns.
    pub fn turned(&self, quarters: u32) -> Gray {
        let (w, h) = (self.w, self.h);
        match quarters % 4 {
            0 => self.clone(),
            2 => {
                let mut px = self.px.clone();
                px.reverse();
                Gray { w, h, px }
            }
            q => {
                // A quarter clockwise: new (x, y) = (h-1-y, x) of the old; three: (y, w-1-x).
                let mut px = vec![255u8; w * h];
                for y in 0..h {
                    for x in 0..w {
                        let (nx, ny) = if q == 1 {
                            (h - 1 - y, x)
                        } else {
                            (y, w - 1 - x)
                        };
                        px[ny * h + nx] = self.px[y * w + x];
                    }
                }
                Gray { w: h, h: w, px }
            }
        }
    }

    /// Levelled: a page whose lines rise by `degrees` to the right turned back by two shears
    /// (a column shift that levels the lines, then a row shift that stands the strokes upright
    /// again), same size, uncovered corners white. Whole-pixel moves only: ten times cheaper
    /// than a bilinear rotation, and within a pixel of it for the skews of scanned pages.
    pub fn levelled(&self, degrees: f64) -> Gray {
        let t = degrees.to_radians().tan();
        let (w, h) = (self.w, self.h);
        let (cx, cy) = (w as f64 / 2.0, h as f64 / 2.0);
        // Columns: out[y][x] = in[y - (x - cx)·t][x].
        let shift: Vec<isize> = (0..w)
            .map(|x| ((x as f64 - cx) * t).round() as isize)
            .collect();
        let mut columns = vec![255u8; w * h];
        for y in 0..h {
            let out = &mut columns[y * w..(y + 1) * w];
            for (x, (o, &s)) in out.iter_mut().zip(&shift).enumerate() {
                let from = y as isize - s;
                if (0..h as isize).contains(&from) {
                    *o = self.px[from as usize * w + x];
                }
            }
        }
        // Rows: out[y][x] = in[y][x + (y - cy)·t].
        let mut px = vec![255u8; w * h];
        for y in 0..h {
            let s = ((y as f64 - cy) * t).round() as isize;
            let (src, dst) = (&columns[y * w..(y + 1) * w], &mut px[y * w..(y + 1) * w]);
            let (from, to, n) = if s >= 0 {
                (s as usize, 0, w.saturating_sub(s as usize))
            } else {
                (0, (-s) as usize, w.saturating_sub((-s) as usize))
            };
            dst[to..to + n].copy_from_slice(&src[from..from + n]);
        }
        Gray { w, h, px }
    }

    /// Rotated by `degrees` (counter-clockwise positive, as the text's lines rise) about the
    /// centre, same size, bilinear, uncovered corners white: a skewed page for the tests.
    #[cfg(test)]
    pub fn rotated(&self, degrees: f64) -> Gray {
        let (s, c) = degrees.to_radians().sin_cos();
        let (cx, cy) = (self.w as f64 / 2.0, self.h as f64 / 2.0);
        let mut out = Gray::new(self.w, self.h, 255);
        for y in 0..self.h {
            let dy = y as f64 + 0.5 - cy;
            for x in 0..self.w {
                let dx = x as f64 + 0.5 - cx;
                // The source of an output pixel: the output point turned back by the angle.
                let sx = c * dx - s * dy + cx - 0.5;
                let sy = s * dx + c * dy + cy - 0.5;
                if sx < 0.0 || sy < 0.0 {
                    continue;
                }
                let (x0, y0) = (sx as usize, sy as usize);
                if x0 + 1 >= self.w || y0 + 1 >= self.h {
                    continue;
                }
                let (fx, fy) = (sx - x0 as f64, sy - y0 as f64);
                let p = |xx: usize, yy: usize| f64::from(self.at(xx, yy));
                let top = p(x0, y0) * (1.0 - fx) + p(x0 + 1, y0) * fx;
                let bottom = p(x0, y0 + 1) * (1.0 - fx) + p(x0 + 1, y0 + 1) * fx;
                out.px[y * self.w + x] = (top * (1.0 - fy) + bottom * fy).round() as u8;
            }
        }
        out
    }

    /// Scaled down by `scale` (0 < scale ≤ 1), each new pixel the mean of the old ones it covers.
    pub fn scaled(&self, scale: f64) -> Gray {
        let w = ((self.w as f64 * scale).round() as usize).max(1);
        let h = ((self.h as f64 * scale).round() as usize).max(1);
        let span = |i: usize, n: usize, old: usize| {
            let a = i * old / n;
            let b = ((i + 1) * old / n).max(a + 1).min(old);
            (a, b)
        };
        let mut px = Vec::with_capacity(w * h);
        for y in 0..h {
            let (y0, y1) = span(y, h, self.h);
            for x in 0..w {
                let (x0, x1) = span(x, w, self.w);
                let mut sum = 0u32;
                for yy in y0..y1 {
                    sum += self.px[yy * self.w + x0..yy * self.w + x1]
                        .iter()
                        .map(|&p| u32::from(p))
                        .sum::<u32>();
                }
                px.push((sum / ((y1 - y0) * (x1 - x0)) as u32) as u8);
            }
        }
        Gray { w, h, px }
    }

    /// Otsu's threshold: the grey level that best separates ink from paper.
    pub fn threshold(&self) -> u8 {
        let mut hist = [0u64; 256];
        for &p in &self.px {
            hist[p as usize] += 1;
        }
        otsu(&hist)
    }

    /// Ink (true) and paper, `factor` times smaller on each side: a cell is ink when at least
    /// a quarter of its pixels are darker than `threshold` (so that specks of noise are not).
    pub fn ink(&self, factor: usize, threshold: u8) -> Ink {
        let factor = factor.max(1);
        let (w, h) = (self.w.div_ceil(factor), self.h.div_ceil(factor));
        let mut counts = vec![0u16; w * h];
        for y in 0..self.h {
            let row = &self.px[y * self.w..(y + 1) * self.w];
            let out = &mut counts[(y / factor) * w..(y / factor + 1) * w];
            for (x, &p) in row.iter().enumerate() {
                if p < threshold {
                    out[x / factor] += 1;
                }
            }
        }
        let need = (factor * factor).div_ceil(4).max(1) as u16;
        let bits = counts.into_iter().map(|c| c >= need).collect();
        Ink { w, h, bits, factor }
    }

    /// The same ink map turned clockwise by `quarters` quarter turns.
    pub fn turned_ink(ink: &Ink, quarters: u32) -> Ink {
        let as_gray = Gray {
            w: ink.w,
            h: ink.h,
            px: ink.bits.iter().map(|&b| u8::from(b)).collect(),
        }
        .turned(quarters);
        Ink {
            w: as_gray.w,
            h: as_gray.h,
            bits: as_gray.px.into_iter().map(|p| p == 1).collect(),
            factor: ink.factor,
        }
    }
}

/// A thresholded, reduced page: what [`super::page`] measures.
pub(crate) struct Ink {
    pub w: usize,
    pub h: usize,
    pub bits: Vec<bool>,
    /// How many page pixels a cell spans on each side.
    pub factor: usize,
}

impl Ink {
    pub fn get(&self, x: usize, y: usize) -> bool {
        self.bits[y * self.w + x]
    }
}

pub(crate) fn otsu(hist: &[u64; 256]) -> u8 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 128;
    }
    let sum: f64 = hist
        .iter()
        .enumerate()
        .map(|(i, &n)| i as f64 * n as f64)
        .sum();
    let (mut below, mut below_sum, mut best, mut best_var) = (0u64, 0f64, 128u8, -1f64);
    for (t, &n) in hist.iter().enumerate() {
        below += n;
        below_sum += t as f64 * n as f64;
        if below == 0 || below == total {
            continue;
        }
        let above = total - below;
        let m0 = below_sum / below as f64;
        let m1 = (sum - below_sum) / above as f64;
        let var = below as f64 * above as f64 * (m0 - m1) * (m0 - m1);
        if var > best_var {
            best_var = var;
            best = t as u8;
        }
    }
    // Pixels at or below `best` are ink; [`Gray::ink`] takes those strictly below the level.
    best.saturating_add(1)
}

/// The pages of an uploaded image (several for a multi-page TIFF), as grey pixels. Dimensions
/// and page counts are checked against the limits from the headers first; decoded pixels are
/// charged to the conversion's unpack budget.
pub(crate) fn decode(ctx: &Ctx<'_>, bytes: &[u8]) -> Result<Vec<Gray>> {
    let kind = imagesize::image_type(bytes).map_err(|e| Error::malformed(Format::Image, e))?;
    let size = imagesize::blob_size(bytes).map_err(|e| Error::malformed(Format::Image, e))?;
    check_size(size.width as u64, size.height as u64)?;
    if kind == imagesize::ImageType::Tiff {
        return tiff_pages(ctx, bytes);
    }
    ctx.charge(size.width as u64 * size.height as u64 * 4)?;
    let gray = if kind == imagesize::ImageType::Jpeg {
        jpeg(bytes, Format::Image)?
    } else {
        any_image(bytes, Format::Image)?
    };
    Ok(vec![gray])
}

/// A JPEG's grey pixels (an upload's, or a PDF's DCT image's): straight to grey where the
/// decoder can, else through the general path; errors name `format`.
pub(crate) fn jpeg(bytes: &[u8], format: Format) -> Result<Gray> {
    match jpeg_gray(bytes) {
        Some(gray) => Ok(gray),
        None => any_image(bytes, format),
    }
}

/// Any image the `image` crate reads, within the page limits, as grey.
fn any_image(bytes: &[u8], format: Format) -> Result<Gray> {
    let mut reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| Error::malformed(format, e))?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_PAGE_SIDE as u32);
    limits.max_image_height = Some(MAX_PAGE_SIDE as u32);
    limits.max_alloc = Some(MAX_PAGE_PIXELS * 4 + (64 << 20));
    reader.limits(limits);
    let decoded = reader.decode().map_err(|e| Error::malformed(format, e))?;
    Ok(flatten(decoded))
}

/// A JPEG decoded straight to grey (no colour buffer, no colour conversion), within the side
/// limit; `None` when this decoder cannot (CMYK and other rare kinds go the general way).
fn jpeg_gray(bytes: &[u8]) -> Option<Gray> {
    use zune_core::bytestream::ZCursor;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::Luma)
        .set_max_width(MAX_PAGE_SIDE as usize)
        .set_max_height(MAX_PAGE_SIDE as usize);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    let px = decoder.decode().ok()?;
    let (w, h) = decoder.dimensions()?;
    (px.len() == w * h).then_some(Gray { w, h, px })
}

/// Refuses a page whose declared size is past the limits (a decompression bomb's header says
/// what it would expand to).
pub(crate) fn check_size(width: u64, height: u64) -> Result<()> {
    if width == 0 || height == 0 {
        return Err(Error::malformed(Format::Image, "the image has no pixels"));
    }
    if width > MAX_PAGE_SIDE || height > MAX_PAGE_SIDE || width * height > MAX_PAGE_PIXELS {
        return Err(Error::ImageTooLarge {
            width,
            height,
            limit_pixels: MAX_PAGE_PIXELS,
        });
    }
    Ok(())
}

/// Grey pixels of a decoded image; transparent pixels count as paper (white).
fn flatten(image: image::DynamicImage) -> Gray {
    let rgba = image.has_alpha();
    let (w, h) = (image.width() as usize, image.height() as usize);
    let px = if rgba {
        image
            .to_luma_alpha8()
            .pixels()
            .map(|p| blend(p.0[0], p.0[1]))
            .collect()
    } else {
        image.into_luma8().into_raw()
    };
    Gray { w, h, px }
}

/// Every page of a TIFF: the page count and each page's size checked before its pixels.
fn tiff_pages(ctx: &Ctx<'_>, bytes: &[u8]) -> Result<Vec<Gray>> {
    use tiff::decoder::{Decoder, Limits};
    let bad = |e: tiff::TiffError| Error::malformed(Format::Image, e);
    let mut limits = Limits::default();
    limits.decoding_buffer_size = (MAX_PAGE_PIXELS * 8) as usize;
    let open = || -> Result<Decoder<Cursor<&[u8]>>> {
        Ok(Decoder::new(Cursor::new(bytes))
            .map_err(bad)?
            .with_limits(limits.clone()))
    };
    // First the directory chain alone: its length and every page's size.
    let mut walk = open()?;
    let mut pages = 1usize;
    loop {
        let (w, h) = walk.dimensions().map_err(bad)?;
        check_size(u64::from(w), u64::from(h))?;
        if !walk.more_images() {
            break;
        }
        pages += 1;
        if pages > MAX_PAGES {
            return Err(Error::TooManyPages { limit: MAX_PAGES });
        }
        ctx.check_time()?;
        walk.next_image().map_err(bad)?;
    }
    let mut decoder = open()?;
    let mut out = Vec::with_capacity(pages);
    for page in 0..pages {
        ctx.check_time()?;
        if page > 0 {
            decoder.next_image().map_err(bad)?;
        }
        let (w, h) = decoder.dimensions().map_err(bad)?;
        ctx.charge(u64::from(w) * u64::from(h) * 4)?;
        match tiff_page(&mut decoder) {
            Ok(gray) => out.push(gray),
            Err(e) => ctx.warn(format!("TIFF page {}: {e}", page + 1)),
        }
    }
    Ok(out)
}

fn tiff_page(decoder: &mut tiff::decoder::Decoder<Cursor<&[u8]>>) -> Result<Gray> {
    use tiff::decoder::DecodingResult;
    use tiff::tags::Tag;
    use tiff::ColorType;
    let bad = |e: tiff::TiffError| Error::malformed(Format::Image, e);
    let (w, h) = decoder.dimensions().map_err(bad)?;
    let (w, h) = (w as usize, h as usize);
    let color = decoder.colortype().map_err(bad)?;
    // Photometric 0 is WhiteIsZero (common in fax-coded scans).
    let white_is_zero = decoder
        .get_tag_u32(Tag::PhotometricInterpretation)
        .is_ok_and(|p| p == 0);
    let data = decoder.read_image().map_err(bad)?;
    let unsupported = || Error::malformed(Format::Image, format!("TIFF pixels of type {color:?}"));
    let samples: Vec<u8> = match data {
        DecodingResult::U8(v) => v,
        DecodingResult::U16(v) => v.into_iter().map(|s| (s >> 8) as u8).collect(),
        _ => return Err(unsupported()),
    };
    let mut px = match color {
        ColorType::Gray(1) => {
            let stride = w.div_ceil(8);
            let mut px = Vec::with_capacity(w * h);
            for y in 0..h {
                for x in 0..w {
                    let byte = samples.get(y * stride + x / 8).copied().unwrap_or(0);
                    px.push(if byte & (0x80 >> (x % 8)) != 0 {
                        255
                    } else {
                        0
                    });
                }
            }
            px
        }
        ColorType::Gray(8 | 16) => samples,
        ColorType::GrayA(8 | 16) => samples.chunks_exact(2).map(|p| blend(p[0], p[1])).collect(),
        ColorType::RGB(8 | 16) | ColorType::YCbCr(8) => samples
            .chunks_exact(3)
            .map(|p| luma(p[0], p[1], p[2]))
            .collect(),
        ColorType::RGBA(8 | 16) => samples
            .chunks_exact(4)
            .map(|p| blend(luma(p[0], p[1], p[2]), p[3]))
            .collect(),
        _ => return Err(unsupported()),
    };
    if white_is_zero {
        px.iter_mut().for_each(|p| *p = 255 - *p);
    }
    if px.len() != w * h {
        return Err(Error::malformed(
            Format::Image,
            "TIFF page shorter than its size",
        ));
    }
    Ok(Gray { w, h, px })
}

/// The grey of an RGB colour (Rec. 601 weights).
pub(crate) fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((u32::from(r) * 299 + u32::from(g) * 587 + u32::from(b) * 114) / 1000) as u8
}

fn blend(l: u8, a: u8) -> u8 {
    let (l, a) = (u32::from(l), u32::from(a));
    ((l * a + 255 * (255 - a)) / 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(w: usize, h: usize) -> Gray {
        Gray {
            w,
            h,
            px: (0..w * h).map(|i| (i % 251) as u8).collect(),
        }
    }

    #[test]
    fn four_quarter_turns_give_the_page_back() {
        let page = ramp(5, 3);
        let once = page.turned(1);
        assert_eq!((once.w, once.h), (3, 5));
        // The top-left pixel goes to the top-right corner.
        assert_eq!(once.at(2, 0), page.at(0, 0));
        let back = once.turned(1).turned(1).turned(1);
        assert_eq!(back.px, page.px);
        assert_eq!(page.turned(2).turned(2).px, page.px);
        assert_eq!(page.turned(3).px, page.turned(1).turned(2).px);
    }

    #[test]
    fn otsu_splits_ink_from_paper() {
        let mut hist = [0u64; 256];
        hist[20] = 100;
        hist[230] = 900;
        let t = otsu(&hist);
        assert!(t > 20 && t <= 230, "{t}");
    }

    #[test]
    fn crops_and_pgm_keep_the_pixels() {
        let page = ramp(6, 4);
        let part = page.crop(1, 1, 4, 3);
        assert_eq!((part.w, part.h), (3, 2));
        assert_eq!(part.at(0, 0), page.at(1, 1));
        assert!(part.pgm().starts_with(b"P5\n3 2\n255\n"));
    }
}
