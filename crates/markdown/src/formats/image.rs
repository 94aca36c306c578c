//! Images: format, dimensions, XMP metadata (`xmp.rs`) and EXIF metadata as a table, then the
//! text OCR reads on it (`crate::ocr`; every page of a multi-page TIFF) under `## Text`.

use std::io::Cursor;

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;
use crate::ocr::{Ocr, Source};

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let kind = imagesize::image_type(bytes).map_err(|e| Error::malformed(Format::Image, e))?;
    let size = imagesize::blob_size(bytes).map_err(|e| Error::malformed(Format::Image, e))?;
    let mut rows = vec![
        vec!["Property".to_string(), "Value".to_string()],
        vec!["Format".into(), format!("{kind:?}").to_uppercase()],
        vec!["Width".into(), format!("{} px", size.width)],
        vec!["Height".into(), format!("{} px", size.height)],
    ];
    if let Some(xmp) = super::xmp::read(&ctx, bytes) {
        for (name, value) in xmp.rows() {
            rows.push(vec![name.to_string(), md::cell(&value)]);
        }
    }
    if let Ok(exif) = exif::Reader::new().read_from_container(&mut Cursor::new(bytes)) {
        for field in exif.fields() {
            if field.ifd_num != exif::In::PRIMARY && field.tag.to_string().starts_with("Tag(") {
                continue;
            }
            // Binary blobs (maker notes, thumbnails) are noise in a document.
            if matches!(field.value, exif::Value::Undefined(..))
                && field.tag != exif::Tag::ExifVersion
            {
                continue;
            }
            let value = field.display_value().with_unit(&exif).to_string();
            if value.len() > 200 {
                continue;
            }
            rows.push(vec![md::cell(&field.tag.to_string()), md::cell(&value)]);
        }
    }
    let mut out = format!("# Image\n\n{}", md::table(&rows));
    if let Some(text) = ocr_text(&ctx, bytes)? {
        out.push_str("\n\n## Text\n\n");
        out.push_str(&text);
    }
    Ok(out)
}

/// The text of the image's pages, when OCR is on and finds some; OCR that cannot run is a
/// warning under `auto` (the metadata still converts) and an error under `force`.
fn ocr_text(ctx: &Ctx<'_>, bytes: &[u8]) -> Result<Option<String>> {
    let mode = ctx.budget.options.ocr;
    if mode == Ocr::Off {
        return Ok(None);
    }
    // Pixels that do not decode (a truncated file) leave the metadata standing under `auto`;
    // a bomb's header is refused whatever the mode.
    let pages = match crate::ocr::raster::decode(ctx, bytes) {
        Ok(pages) => pages,
        Err(Error::Malformed { reason, .. }) if mode == Ocr::Auto => {
            ctx.warn(format!(
                "no OCR: the image's pixels could not be read: {reason}"
            ));
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let many = pages.len() > 1;
    let heading = if many { "#### " } else { "### " };
    let read = crate::ocr::read(ctx, pages, Source::Image, heading)?;
    let mut text = String::new();
    for (i, page) in read.into_iter().enumerate() {
        let Some(page) = page.filter(|p| !p.trim().is_empty()) else {
            continue;
        };
        if many {
            text.push_str(&format!("### Page {}\n\n", i + 1));
        }
        text.push_str(&page);
    }
    Ok((!text.trim().is_empty()).then_some(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    #[test]
    fn png_dimensions_are_reported() {
        // A 3x2 PNG header is enough for the dimensions.
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&3u32.to_be_bytes());
        png.extend_from_slice(&2u32.to_be_bytes());
        png.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        let budget = Budget::new(Limits::default());
        let out = convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            &png,
        )
        .unwrap();
        assert!(out.contains("| Format | PNG |"), "{out}");
        assert!(out.contains("| Width | 3 px |"), "{out}");
        assert!(out.contains("| Height | 2 px |"), "{out}");
    }

    #[test]
    fn xmp_title_author_and_dates_join_the_table() {
        let budget = Budget::new(Limits::default());
        let jpeg = super::super::xmp::tests::jpeg_with(super::super::xmp::tests::PACKET.as_bytes());
        let out = convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            &jpeg,
        )
        .unwrap();
        for row in [
            "| Format | JPEG |",
            "| Width | 7 px |",
            "| Height | 5 px |",
            "| Title | Harbour at dusk |",
            "| Description | Boats & a lighthouse |",
            "| Author | Jean Dupré, Ada Lovelace |",
            "| Created | 2019-05-04T10:20:30Z |",
            "| Modified | 2020-01-02T03:04:05Z |",
            "| Keywords | harbour, sea |",
        ] {
            assert!(out.contains(row), "{row} in:\n{out}");
        }
    }
}
