//! Scanned PDF pages: the images a page draws, kept aside before the text pass empties image
//! streams, decoded to grey pixels (JPEG, fax-coded and raw samples) and read by OCR where the
//! page has no usable text layer (or every page with images, under `?ocr=force`).

use std::collections::{BTreeMap, HashMap};

use pdf_extract::{Dictionary, Document, Object, ObjectId};

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::ocr::raster::{check_size, jpeg, luma, Gray};
use crate::ocr::{Ocr, Source};

use super::layout::Line;

/// How far up the page tree resources are looked for.
const MAX_INHERIT: usize = 16;

/// An image stream as the file stores it.
struct Image {
    dict: Dictionary,
    data: Vec<u8>,
    /// A JBIG2 image's shared segments (`JBIG2Globals`), decoded.
    globals: Option<Vec<u8>>,
}

/// The images of each page (by page number), largest first; one image may be on many pages.
#[derive(Default)]
pub(super) struct Scans {
    pages: BTreeMap<u32, Vec<ObjectId>>,
    images: HashMap<ObjectId, Image>,
}

/// Takes the image streams of every page out of `doc` (their content moves here), unless OCR is
/// off. Called before [`super::unpack::unpack_streams`] empties image streams.
pub(super) fn take(ctx: &Ctx<'_>, doc: &mut Document) -> Scans {
    let mut scans = Scans::default();
    if ctx.budget.options.ocr == Ocr::Off {
        return scans;
    }
    for (number, page) in doc.get_pages() {
        let ids = page_images(doc, page);
        if !ids.is_empty() {
            scans.pages.insert(number, ids);
        }
    }
    let ids: Vec<ObjectId> = scans.pages.values().flatten().copied().collect();
    for id in ids {
        if scans.images.contains_key(&id) {
            continue;
        }
        if let Some(Object::Stream(stream)) = doc.objects.get_mut(&id) {
            let data = std::mem::take(&mut stream.content);
            let mut dict = stream.dict.clone();
            resolve_space(doc, &mut dict);
            let globals = jbig2_globals(doc, &dict);
            let image = Image {
                dict,
                data,
                globals,
            };
            scans.images.insert(id, image);
        }
    }
    let images = &scans.images;
    for ids in scans.pages.values_mut() {
        ids.sort_by_key(|id| std::cmp::Reverse(images.get(id).map_or(0, |i| area(&i.dict))));
    }
    scans
}

/// The decoded `JBIG2Globals` stream an image's parameters name.
fn jbig2_globals(doc: &Document, dict: &Dictionary) -> Option<Vec<u8>> {
    let id = decode_params(dict)?
        .get(b"JBIG2Globals")
        .ok()?
        .as_reference()
        .ok()?;
    let stream = doc.get_object(id).ok()?.as_stream().ok()?;
    stream
        .decompressed_content()
        .ok()
        .or_else(|| Some(stream.content.clone()))
        .filter(|g| g.len() <= 4 << 20)
}

/// The parameters of an image's (last) filter.
fn decode_params(dict: &Dictionary) -> Option<&Dictionary> {
    match dict.get(b"DecodeParms").ok()? {
        Object::Dictionary(d) => Some(d),
        Object::Array(a) => a.last()?.as_dict().ok(),
        _ => None,
    }
}

/// Puts the colour space's facts that live in other objects into the image's own dictionary:
/// an ICC profile's component count (as the device space of that many), an indexed space's
/// palette kept in a stream.
fn resolve_space(doc: &Document, dict: &mut Dictionary) {
    let space = match dict.get(b"ColorSpace") {
        Ok(Object::Reference(id)) => doc.get_object(*id).ok().cloned(),
        Ok(other) => Some(other.clone()),
        Err(_) => None,
    };
    let Some(Object::Array(mut parts)) = space else {
        if let Some(space) = space {
            dict.set("ColorSpace", space);
        }
        return;
    };
    let stream_of = |o: &Object| {
        o.as_reference()
            .ok()
            .and_then(|id| doc.get_object(id).ok())
            .and_then(|o| o.as_stream().ok())
    };
    let device = |n: i64| match n {
        1 => Some(Object::Name(b"DeviceGray".to_vec())),
        3 => Some(Object::Name(b"DeviceRGB".to_vec())),
        4 => Some(Object::Name(b"DeviceCMYK".to_vec())),
        _ => None,
    };
    match parts.first().and_then(|o| o.as_name().ok()) {
        Some(b"ICCBased") => {
            let n = parts
                .get(1)
                .and_then(stream_of)
                .and_then(|s| int(&s.dict, b"N"));
            if let Some(space) = n.and_then(device) {
                dict.set("ColorSpace", space);
            }
        }
        Some(b"Indexed") => {
            if let Some(Object::Array(base)) = parts.get(1).and_then(|o| match o {
                Object::Reference(id) => doc.get_object(*id).ok(),
                other => Some(other),
            }) {
                let n = base
                    .get(1)
                    .and_then(stream_of)
                    .and_then(|s| int(&s.dict, b"N"));
                if let Some(space) = n.and_then(device) {
                    parts[1] = space;
                }
            }
            if let Some(lookup) = parts.get(3).and_then(stream_of) {
                let bytes = lookup
                    .decompressed_content()
                    .unwrap_or_else(|_| lookup.content.clone());
                // A palette has at most 256 entries of 4 components.
                if bytes.len() <= 1024 {
                    parts[3] = Object::String(bytes, pdf_extract::StringFormat::Literal);
                }
            }
            dict.set("ColorSpace", Object::Array(parts));
        }
        _ => dict.set("ColorSpace", Object::Array(parts)),
    }
}

/// The image XObjects a page's resources name (inherited from the page tree if need be).
fn page_images(doc: &Document, page: ObjectId) -> Vec<ObjectId> {
    let mut node = doc.get_dictionary(page).ok();
    for _ in 0..MAX_INHERIT {
        let Some(dict) = node else { break };
        let resources = match dict.get(b"Resources") {
            Ok(Object::Reference(id)) => doc.get_dictionary(*id).ok(),
            Ok(Object::Dictionary(d)) => Some(d),
            _ => None,
        };
        if let Some(resources) = resources {
            let xobjects = match resources.get(b"XObject") {
                Ok(Object::Reference(id)) => doc.get_dictionary(*id).ok(),
                Ok(Object::Dictionary(d)) => Some(d),
                _ => None,
            };
            let Some(xobjects) = xobjects else {
                return Vec::new();
            };
            return xobjects
                .iter()
                .filter_map(|(_, v)| v.as_reference().ok())
                .filter(|id| {
                    doc.get_object(*id)
                        .and_then(Object::as_stream)
                        .is_ok_and(|s| {
                            s.dict.get(b"Subtype").and_then(Object::as_name).ok() == Some(b"Image")
                        })
                })
                .collect();
        }
        node = dict
            .get(b"Parent")
            .and_then(Object::as_reference)
            .and_then(|id| doc.get_dictionary(id))
            .ok();
    }
    Vec::new()
}

fn int(dict: &Dictionary, key: &[u8]) -> Option<i64> {
    dict.get(key).and_then(Object::as_i64).ok()
}

fn area(dict: &Dictionary) -> i64 {
    int(dict, b"Width").unwrap_or(0) * int(dict, b"Height").unwrap_or(0)
}

/// The OCR text of the pages that need it, by index into `pages` (whose page numbers are
/// `numbers`): pages without a usable text layer that draw an image, or every page that draws
/// one under `force`.
pub(super) fn read(
    ctx: &Ctx<'_>,
    scans: Scans,
    pages: &[Vec<Line>],
    numbers: &[u32],
) -> Result<HashMap<usize, String>> {
    let force = ctx.budget.options.ocr == Ocr::Force;
    let mut wanted: Vec<(usize, Gray)> = Vec::new();
    for (i, (lines, number)) in pages.iter().zip(numbers).enumerate() {
        if !force && usable(lines) {
            continue;
        }
        let Some(ids) = scans.pages.get(number) else {
            continue;
        };
        // The largest image that decodes: a scanned page is one picture of the page.
        for image in ids.iter().filter_map(|id| scans.images.get(id)) {
            ctx.check_time()?;
            match decode(ctx, image) {
                Ok(Some(gray)) => {
                    wanted.push((i, gray));
                    break;
                }
                Ok(None) => {}
                Err(e @ (Error::TimedOut { .. } | Error::ExpandsTooMuch { .. })) => return Err(e),
                Err(e) => ctx.warn(format!("page {number}: an image could not be read: {e}")),
            }
        }
    }
    if wanted.is_empty() {
        return Ok(HashMap::new());
    }
    let (index, grays): (Vec<usize>, Vec<Gray>) = wanted.into_iter().unzip();
    let read = crate::ocr::read(ctx, grays, Source::ScannedPage, "## ")?;
    Ok(index
        .into_iter()
        .zip(read)
        .filter_map(|(i, text)| Some((i, text.filter(|t| !t.trim().is_empty())?)))
        .collect())
}

/// Whether a page's text layer is worth keeping: some text, mostly letters, digits, spaces and
/// punctuation (a layer of unmapped glyphs reads as private-use or replacement characters).
fn usable(lines: &[Line]) -> bool {
    let (mut good, mut all) = (0usize, 0usize);
    for line in lines {
        for c in line.text().chars() {
            all += 1;
            let private = ('\u{e000}'..='\u{f8ff}').contains(&c) || c == '\u{fffd}';
            if !private && (c.is_alphanumeric() || c.is_whitespace() || c.is_ascii_punctuation()) {
                good += 1;
            }
        }
    }
    all > 0 && good * 2 > all
}

/// The image as grey pixels, or `None` for one OCR cannot use (too small to be a page, or in
/// a colour space or filter chain it cannot read).
fn decode(ctx: &Ctx<'_>, image: &Image) -> Result<Option<Gray>> {
    let dict = &image.dict;
    let (w, h) = (
        int(dict, b"Width").unwrap_or(0),
        int(dict, b"Height").unwrap_or(0),
    );
    if w <= 0 || h <= 0 {
        return Ok(None);
    }
    check_size(w as u64, h as u64)?;
    // Small pictures (logos, rules) are not scans of a page.
    if w < 200 || h < 100 {
        return Ok(None);
    }
    let (w, h) = (w as usize, h as usize);
    let filters: Vec<Vec<u8>> = match dict.get(b"Filter") {
        Ok(Object::Name(n)) => vec![n.clone()],
        Ok(Object::Array(a)) => a
            .iter()
            .filter_map(|o| o.as_name().ok().map(<[u8]>::to_vec))
            .collect(),
        _ => Vec::new(),
    };
    let params = |key: &[u8]| decode_params(dict).and_then(|d| d.get(key).ok().cloned());
    ctx.charge((w * h) as u64)?;
    let inverted = matches!(dict.get(b"Decode"), Ok(Object::Array(a)) if a.first().and_then(|o| o.as_float().ok()) == Some(1.0));
    let mut gray = match filters.last().map(Vec::as_slice) {
        Some(b"DCTDecode") if filters.len() == 1 => jpeg(&image.data, Format::Pdf)?,
        Some(b"CCITTFaxDecode") if filters.len() == 1 => {
            let k = params(b"K").and_then(|o| o.as_i64().ok()).unwrap_or(0);
            let black_is_1 = params(b"BlackIs1")
                .and_then(|o| o.as_bool().ok())
                .unwrap_or(false);
            let mut gray = fax(&image.data, w, h, k)?;
            if black_is_1 {
                gray.px.iter_mut().for_each(|p| *p = 255 - *p);
            }
            gray
        }
        Some(b"JBIG2Decode") if filters.len() == 1 => {
            jbig2(&image.data, image.globals.as_deref(), w, h)?
        }
        Some(b"JPXDecode") if filters.len() == 1 => jpx(ctx, &image.data)?,
        _ => {
            let stream = pdf_extract::Stream::new(dict.clone(), image.data.clone());
            let data = match super::unpack::decode(ctx, (0, 0), &stream)? {
                Some(plain) => plain,
                None if filters.is_empty() => image.data.clone(),
                None => return Ok(None),
            };
            match samples(dict, &data, w, h) {
                Some(gray) => gray,
                None => return Ok(None),
            }
        }
    };
    if inverted {
        gray.px.iter_mut().for_each(|p| *p = 255 - *p);
    }
    Ok(Some(gray))
}

/// Fax-coded (CCITT group 3 or 4) pixels.
fn fax(data: &[u8], w: usize, h: usize, k: i64) -> Result<Gray> {
    let width =
        u16::try_from(w).map_err(|_| Error::malformed(Format::Pdf, "fax image too wide"))?;
    let mut px = Vec::with_capacity(w * h);
    let mut line = |transitions: &[u16]| {
        if px.len() < w * h {
            px.extend(fax::decoder::pels(transitions, width).map(|c| match c {
                fax::Color::Black => 0u8,
                fax::Color::White => 255u8,
            }));
        }
    };
    let done = if k < 0 {
        fax::decoder::decode_g4(
            data.iter().copied(),
            width,
            u16::try_from(h).ok(),
            &mut line,
        )
    } else {
        fax::decoder::decode_g3(data.iter().copied(), &mut line)
    };
    if done.is_none() && px.is_empty() {
        return Err(Error::malformed(
            Format::Pdf,
            "a fax-coded image did not decode",
        ));
    }
    px.resize(w * h, 255);
    Ok(Gray { w, h, px })
}

/// JPEG 2000-coded pixels, as grey. The codestream's own size is checked against the page
/// limits, and its decoding (a float per sample) charged, before it is decoded.
fn jpx(ctx: &Ctx<'_>, data: &[u8]) -> Result<Gray> {
    use hayro_jpeg2000::{ColorSpace, DecodeSettings, DecoderContext, Image as Jpx};
    let bad =
        |e: hayro_jpeg2000::DecodeError| Error::malformed(Format::Pdf, format!("JPEG 2000: {e}"));
    let image = Jpx::new(data, &DecodeSettings::default()).map_err(bad)?;
    let (w, h) = (image.width() as usize, image.height() as usize);
    check_size(w as u64, h as u64)?;
    let channels = usize::from(image.color_space().num_channels()) + usize::from(image.has_alpha());
    ctx.charge((w * h * channels * 4) as u64)?;
    let mut decoder = DecoderContext::default();
    let decoded = image.decode(&mut decoder).map_err(bad)?;
    let data = decoded.data_u8();
    if w == 0 || channels == 0 || data.len() != w * h * channels {
        return Err(Error::malformed(
            Format::Pdf,
            "JPEG 2000: unexpected sample count",
        ));
    }
    let px = match image.color_space() {
        ColorSpace::RGB
        | ColorSpace::Icc {
            num_channels: 3, ..
        } => data
            .chunks_exact(channels)
            .map(|p| luma(p[0], p[1], p[2]))
            .collect(),
        ColorSpace::CMYK
        | ColorSpace::Icc {
            num_channels: 4, ..
        } => data
            .chunks_exact(channels)
            .map(|p| cmyk_gray(p[0], p[1], p[2], p[3]))
            .collect(),
        // Grey, or channels of unknown meaning: the first is read as grey.
        _ => data.chunks_exact(channels).map(|p| p[0]).collect(),
    };
    Ok(Gray { w, h, px })
}

/// JBIG2-coded pixels (the embedded organisation PDF uses), with the shared segments if any.
fn jbig2(data: &[u8], globals: Option<&[u8]>, w: usize, h: usize) -> Result<Gray> {
    let bad = |e: hayro_jbig2::DecodeError| Error::malformed(Format::Pdf, format!("JBIG2: {e}"));
    let settings = hayro_jbig2::DecodeSettings::default();
    let globals = globals
        .map(|g| hayro_jbig2::Globals::new(g, &settings))
        .transpose()
        .map_err(bad)?;
    let page = hayro_jbig2::Page::new_embedded(data, globals.as_ref(), &settings).map_err(bad)?;
    check_size(u64::from(page.width()), u64::from(page.height()))?;
    let mut out = Rows {
        w: page.width() as usize,
        px: Vec::with_capacity(w * h),
        row: Vec::new(),
    };
    page.decode(&mut out).map_err(bad)?;
    let (w, h) = (out.w, out.px.len() / out.w.max(1));
    Ok(Gray { w, h, px: out.px })
}

/// Collects a JBIG2 page's pixels row by row.
struct Rows {
    w: usize,
    px: Vec<u8>,
    row: Vec<u8>,
}

impl hayro_jbig2::Decoder for Rows {
    fn push_pixel(&mut self, black: bool) {
        self.row.push(if black { 0 } else { 255 });
    }
    fn push_pixel_chunk(&mut self, black: bool, chunk_count: u32) {
        let n = chunk_count as usize * 8;
        self.row
            .extend(std::iter::repeat_n(if black { 0 } else { 255 }, n));
    }
    fn next_line(&mut self) {
        self.row.resize(self.w, 255);
        self.px.extend_from_slice(&self.row);
        self.row.clear();
    }
}

/// Raw samples as grey pixels: 1 or 8 bits a component, grey, RGB, CMYK, ICC-based or indexed.
fn samples(dict: &Dictionary, data: &[u8], w: usize, h: usize) -> Option<Gray> {
    let mask = dict
        .get(b"ImageMask")
        .and_then(Object::as_bool)
        .unwrap_or(false);
    let bits = if mask {
        1
    } else {
        int(dict, b"BitsPerComponent").unwrap_or(8) as usize
    };
    let space = dict.get(b"ColorSpace").ok();
    let (components, palette) = color_space(space, mask)?;
    let stride = (w * components * bits).div_ceil(8);
    if data.len() < stride * h || !(bits == 1 || bits == 8) {
        return None;
    }
    let mut px = Vec::with_capacity(w * h);
    for y in 0..h {
        let row = &data[y * stride..(y + 1) * stride];
        for x in 0..w {
            let value = |c: usize| -> u8 {
                if bits == 8 {
                    row[x * components + c]
                } else {
                    let bit = x * components + c;
                    if row[bit / 8] & (0x80 >> (bit % 8)) != 0 {
                        255
                    } else {
                        0
                    }
                }
            };
            let v = match (&palette, components) {
                (Some(p), _) => p.get(usize::from(value(0))).copied().unwrap_or(255),
                (None, 1) => value(0),
                (None, 3) => luma(value(0), value(1), value(2)),
                (None, 4) => cmyk_gray(value(0), value(1), value(2), value(3)),
                _ => return None,
            };
            px.push(v);
        }
    }
    Some(Gray { w, h, px })
}

/// The grey of a CMYK sample (each ink's amount added to black's, as PDF's naive conversion).
fn cmyk_gray(c: u8, m: u8, y: u8, k: u8) -> u8 {
    let ink = |v: u8| (255 - (u32::from(v) + u32::from(k)).min(255)) as u8;
    luma(ink(c), ink(m), ink(y))
}

/// Components a sample has, and for an indexed space the grey of each palette entry.
fn color_space(space: Option<&Object>, mask: bool) -> Option<(usize, Option<Vec<u8>>)> {
    if mask {
        return Some((1, None));
    }
    let name = |o: &Object| o.as_name().ok().map(<[u8]>::to_vec);
    match space {
        None => Some((1, None)),
        Some(Object::Name(n)) => components(n).map(|c| (c, None)),
        Some(Object::Array(a)) => match a.first().and_then(name).as_deref() {
            // Resolved to a device space at `take` where the profile says its size.
            Some(b"ICCBased") => Some((3, None)),
            Some(b"Indexed") => {
                let base = a
                    .get(1)
                    .and_then(name)
                    .and_then(|n| components(&n))
                    .unwrap_or(3);
                let lookup = match a.get(3) {
                    Some(Object::String(s, _)) => s.clone(),
                    _ => return None,
                };
                let palette = lookup
                    .chunks(base)
                    .map(|c| match c {
                        [g] => *g,
                        [r, g, b] => luma(*r, *g, *b),
                        _ => 128,
                    })
                    .collect();
                Some((1, Some(palette)))
            }
            Some(other) => components(other).map(|c| (c, None)),
            None => None,
        },
        _ => None,
    }
}

fn components(name: &[u8]) -> Option<usize> {
    match name {
        b"DeviceGray" | b"CalGray" | b"G" => Some(1),
        b"DeviceRGB" | b"CalRGB" | b"RGB" => Some(3),
        b"DeviceCMYK" | b"CMYK" => Some(4),
        _ => None,
    }
}
