//! Decompression of a PDF's streams within the conversion's budget, before pdf-extract sees them.
//!
//! lopdf and pdf-extract inflate streams with no bound: object streams while the file loads,
//! content streams and form XObjects on every page that draws them, fonts on every page that
//! uses them. Here every stream is decoded once, by us, a chunk at a time and charged against
//! [`crate::Limits::max_unpacked_bytes`] as it comes, and put back in place as plain bytes, so
//! the third-party code after us only ever copies bytes already counted.

use std::collections::HashSet;
use std::io::Read;

use pdf_extract::{Document, Object, ObjectId, Stream};

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;

/// Largest single decoded stream kept. pdf-extract turns a content stream into a list of
/// operations several times its size, so one stream is capped well below the whole budget;
/// a larger one is left out with a warning.
pub(super) const MAX_STREAM_BYTES: u64 = 32 * 1024 * 1024;

/// Most bytes one input byte of an LZW stream may decode to (12-bit codes naming strings of up
/// to 4096 bytes, rounded up).
const LZW_RATIO: u64 = 4096;

/// Before a third-party parser reads the file: its streams are found by a scan of the bytes,
/// inflated here (counting only) and charged, and a file that expands past the budget is
/// refused before the parser starts. With `object_streams_only`, only those lopdf inflates
/// while loading (`/Type /ObjStm`); else all (pdf_oxide, the fallback, inflates what it likes),
/// and the arrays of references in the file and in its object streams are checked too (see
/// [`repeated_reference`]).
pub(super) fn precheck(ctx: &Ctx<'_>, bytes: &[u8], object_streams_only: bool) -> Result<()> {
    let mut from = 0;
    let mut object_streams = Vec::new();
    while let Some(at) = find(&bytes[from..], b"stream").map(|p| from + p) {
        ctx.check_time()?;
        from = at + 6;
        if at >= 3 && &bytes[at - 3..at] == b"end" {
            continue;
        }
        // The stream's dictionary lies between its `obj` keyword and here.
        let window_start = at.saturating_sub(64 * 1024);
        let head = match rfind(&bytes[window_start..at], b"obj") {
            Some(p) => &bytes[window_start + p..at],
            None => &bytes[window_start..at],
        };
        let head = unescape(head);
        let object_stream = find(&head, b"ObjStm").is_some();
        if object_streams_only && !object_stream {
            continue;
        }
        let mut start = from;
        if bytes.get(start) == Some(&b'\r') {
            start += 1;
        }
        if bytes.get(start) == Some(&b'\n') {
            start += 1;
        }
        let data = &bytes[start.min(bytes.len())..];
        let raw_len = find(data, b"endstream").unwrap_or(data.len()) as u64;
        if find(&head, b"LZW").is_some() {
            // lopdf decodes LZW itself: allow it only where the worst case fits.
            ctx.charge(raw_len.saturating_mul(LZW_RATIO))?;
        }
        if find(&head, b"Fl").is_some() {
            let keep = object_stream && !object_streams_only;
            let _ = ctx.drain_charged(flate2::read::ZlibDecoder::new(data), |chunk| {
                if keep && (object_streams.len() as u64) < MAX_STREAM_BYTES {
                    object_streams.extend_from_slice(chunk);
                }
            })?;
        }
    }
    if !object_streams_only
        && (object_streams.len() as u64 >= MAX_STREAM_BYTES
            || repeated_reference(ctx, bytes)?
            || repeated_reference(ctx, &object_streams)?)
    {
        return Err(Error::malformed(
            Format::Pdf,
            "an array names one object twice, or the object streams are too large to check",
        ));
    }
    Ok(())
}

/// Whether some array of references (`[4 0 R 5 0 R ...]`) names one object twice. pdf_oxide
/// joins the streams a page's `Contents` names, as often as it names them: one stream of a
/// megabyte listed 100,000 times asked it for a hundred gigabytes. No real document repeats a
/// reference within an array, so a file that does is not handed to it.
fn repeated_reference(ctx: &Ctx<'_>, bytes: &[u8]) -> Result<bool> {
    let mut seen = HashSet::new();
    let mut i = 0;
    while let Some(open) = bytes[i..].iter().position(|&b| b == b'[').map(|p| i + p) {
        ctx.check_time()?;
        seen.clear();
        // Tokens after `[`: integers and `R`, every third token closing a reference.
        let mut tokens: Vec<&[u8]> = Vec::new();
        let mut j = open + 1;
        loop {
            while j < bytes.len() && (bytes[j].is_ascii_whitespace() || bytes[j] == 0) {
                j += 1;
            }
            let start = j;
            while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == b'R') {
                j += 1;
            }
            if start == j {
                break;
            }
            tokens.push(&bytes[start..j]);
            if tokens.len() == 3 {
                if tokens[2] != b"R" || !seen.insert((tokens[0], tokens[1])) {
                    if tokens[2] == b"R" {
                        return Ok(true);
                    }
                    break;
                }
                tokens.clear();
            }
        }
        i = j.max(open + 1);
    }
    Ok(false)
}

/// After loading: decodes every stream in place within the budget. Image streams are emptied
/// (pdf-extract has no use for pixels, yet runs a drawn image through its content parser).
/// Streams too large to decode are emptied, with a warning.
pub(super) fn unpack_streams(ctx: &Ctx<'_>, doc: &mut Document) -> Result<()> {
    let ids: Vec<ObjectId> = doc.objects.keys().copied().collect();
    for id in ids {
        ctx.check_time()?;
        let Some(Object::Stream(stream)) = doc.objects.get_mut(&id) else {
            continue;
        };
        if is_image(stream) {
            stream.set_plain_content(Vec::new());
            continue;
        }
        if let Some(plain) = decode(ctx, id, stream)? {
            stream.set_plain_content(plain);
        }
    }
    Ok(())
}

fn is_image(stream: &Stream) -> bool {
    matches!(
        stream.dict.get(b"Subtype").and_then(Object::as_name),
        Ok(b"Image")
    )
}

/// The stream's decoded bytes, or `None` to leave it as it is (no filter, or one pdf-extract
/// does not decode either, so it reads the raw bytes).
pub(super) fn decode(ctx: &Ctx<'_>, id: ObjectId, stream: &Stream) -> Result<Option<Vec<u8>>> {
    let filters: Vec<Vec<u8>> = match stream.filters() {
        Ok(f) => f.into_iter().map(<[u8]>::to_vec).collect(),
        Err(_) => return Ok(None),
    };
    if filters.is_empty() {
        return Ok(None);
    }
    let params = stream
        .dict
        .get(b"DecodeParms")
        .and_then(Object::as_dict)
        .ok();
    let predictor = params
        .and_then(|p| p.get(b"Predictor").and_then(Object::as_i64).ok())
        .is_some_and(|p| p > 1);
    let mut data = stream.content.clone();
    for (i, filter) in filters.iter().enumerate() {
        let last = i + 1 == filters.len();
        data = match filter.as_slice() {
            b"FlateDecode" if !(last && predictor) => inflate(ctx, &data)?,
            b"FlateDecode" | b"LZWDecode" | b"ASCII85Decode" => {
                // lopdf's own decoder (it applies predictors), run only where the result is
                // already known to be bounded: by our own inflation for Flate, by the worst
                // case for the others.
                let bound = match filter.as_slice() {
                    b"FlateDecode" => inflate(ctx, &data)?.len() as u64,
                    b"LZWDecode" => (data.len() as u64).saturating_mul(LZW_RATIO),
                    _ => data.len() as u64,
                };
                if bound > MAX_STREAM_BYTES.min(ctx.unpack_allowance()) {
                    ctx.warn(format!(
                        "PDF object {} {}: a stream too large to decode was left out",
                        id.0, id.1
                    ));
                    return Ok(Some(Vec::new()));
                }
                let mut one = Stream::new(pdf_extract::Dictionary::new(), data);
                one.dict.set("Filter", Object::Name(filter.clone()));
                if last {
                    if let Some(p) = params {
                        one.dict.set("DecodeParms", Object::Dictionary(p.clone()));
                    }
                }
                let plain = one.decompressed_content().unwrap_or_default();
                if filter.as_slice() != b"FlateDecode" {
                    ctx.charge(plain.len() as u64)?;
                }
                plain
            }
            // A filter lopdf does not decode: pdf-extract reads the raw bytes, as before.
            _ => return Ok(None),
        };
        if data.len() as u64 > MAX_STREAM_BYTES {
            ctx.warn(format!(
                "PDF object {} {}: a stream past {MAX_STREAM_BYTES} bytes was left out",
                id.0, id.1
            ));
            return Ok(Some(Vec::new()));
        }
    }
    Ok(Some(data))
}

/// Inflates a zlib stream (or, failing that at once, a raw deflate stream after its two-byte
/// header, as lopdf does), charged as it goes and cut at [`MAX_STREAM_BYTES`]. Corrupt data
/// yields what inflated before the fault.
fn inflate(ctx: &Ctx<'_>, data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let cap = MAX_STREAM_BYTES + 1;
    let zlib = ctx.read_charged(flate2::read::ZlibDecoder::new(data).take(cap), &mut out)?;
    if zlib.is_err() && out.is_empty() && data.len() > 2 {
        let raw = flate2::read::DeflateDecoder::new(&data[2..]).take(cap);
        let _ = ctx.read_charged(raw, &mut out)?;
    }
    Ok(out)
}

/// PDF names may spell any byte as `#xx` (`/O#62jStm` is `/ObjStm`): spelled out here.
pub(super) fn unescape(name: &[u8]) -> Vec<u8> {
    let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
    let mut out = Vec::with_capacity(name.len());
    let mut i = 0;
    while i < name.len() {
        if name[i] == b'#' {
            if let (Some(h), Some(l)) = (hex(name.get(i + 1)), hex(name.get(i + 2))) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(name[i]);
        i += 1;
    }
    out
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}
