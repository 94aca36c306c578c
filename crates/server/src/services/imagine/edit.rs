//! An edit's pictures, from the request to the pipeline's [`InitImage`]: the init image and the
//! mask arrive as a data URL or plain base64 in the JSON routes (`POST /`, `POST /stream`) or as
//! multipart files (`/v1/images/edits`); here they are decoded under the pixel limits, the output
//! size is chosen by rule, and both are brought to it (docs/decisions.md "Image edits").
//!
//! The rule: a request that names `width`/`height` gets that size (the picture is stretched to
//! it); one that names neither gets the picture's own size, its aspect kept, scaled down into
//! the model's bounds and rounded to the size grid. A mask must have the picture's own size.
//! `strength` defaults to 0.75 for image-to-image and 1 for inpainting.

use base64::Engine as _;
use hearth_imagine::edit::{self, DecodeLimits, Picture};
use hearth_imagine::InitImage;
use serde_json::{json, Value};

use super::catalog::{Limits, SIZE_MULTIPLE};
use crate::validate::{self as fields, FieldError};

/// Declared pixels an uploaded picture may have (a 4096 x 4096 photo), and its longest side.
pub const DECODE_LIMITS: DecodeLimits = DecodeLimits {
    max_pixels: 4096 * 4096,
    max_side: 8192,
};

/// `strength` when the request has none: without a mask, and with one.
pub const DEFAULT_STRENGTH: f64 = 0.75;
pub const DEFAULT_INPAINT_STRENGTH: f64 = 1.0;

/// Which pixels of a mask repaint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskRule {
    /// White (luma 128 and up) repaints, as diffusers and most image tools read a mask.
    White,
    /// OpenAI's `/v1/images/edits`: fully transparent pixels repaint; a mask without alpha falls
    /// back to [`MaskRule::White`].
    Transparent,
}

/// An edit as it arrives: the encoded pictures, checked for size, not yet decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct EditBytes {
    pub image: Vec<u8>,
    pub mask: Option<Vec<u8>>,
    pub strength: Option<f64>,
    pub rule: MaskRule,
}

/// The JSON routes' `image`, `mask` and `strength`: `None` when there is no `image` (a `mask`
/// or `strength` without one is an error naming it).
pub fn from_json(
    image: &Option<Value>,
    mask: &Option<Value>,
    strength: &Option<Value>,
    max_bytes: usize,
) -> Result<Option<EditBytes>, FieldError> {
    let present = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    if !present(image) {
        for (field, v) in [("mask", mask), ("strength", strength)] {
            if present(v) {
                return Err(FieldError::new(field, "needs an `image` to edit"));
            }
        }
        return Ok(None);
    }
    let image = picture_bytes("image", image, max_bytes)?;
    let mask = present(mask)
        .then(|| picture_bytes("mask", mask, max_bytes))
        .transpose()?;
    let strength = match strength.as_ref().filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(fields::number("strength", v)?),
    };
    Ok(Some(EditBytes {
        image,
        mask,
        strength,
        rule: MaskRule::White,
    }))
}

/// A picture field: `data:image/...;base64,<data>` or plain base64, at most `max_bytes` decoded.
fn picture_bytes(
    field: &str,
    value: &Option<Value>,
    max_bytes: usize,
) -> Result<Vec<u8>, FieldError> {
    let Some(Value::String(s)) = value else {
        return Err(FieldError::new(
            field,
            "must be a string: a data URL (data:image/png;base64,...) or base64",
        ));
    };
    let data = match s.strip_prefix("data:") {
        Some(rest) => {
            let (kind, data) = rest.split_once(',').ok_or_else(|| {
                FieldError::new(field, "a data URL needs a comma before its data")
            })?;
            if !kind.ends_with(";base64") {
                return Err(FieldError::new(
                    field,
                    "the data URL must be base64 (;base64,)",
                ));
            }
            data
        }
        None => s.as_str(),
    };
    // Four characters of base64 carry three bytes: refuse before decoding anything too large.
    if data.len() / 4 * 3 > max_bytes + 3 {
        return Err(too_large(field, max_bytes));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| FieldError::new(field, format!("is not valid base64: {e}")))?;
    check_length(field, &bytes, max_bytes)?;
    Ok(bytes)
}

/// An upload over `max_bytes` is refused naming its field.
pub fn check_length(field: &str, bytes: &[u8], max_bytes: usize) -> Result<(), FieldError> {
    if bytes.len() > max_bytes {
        return Err(too_large(field, max_bytes));
    }
    if bytes.is_empty() {
        return Err(FieldError::new(field, "is empty"));
    }
    Ok(())
}

/// A picture over `max_bytes`, named.
pub fn too_large(field: &str, max_bytes: usize) -> FieldError {
    FieldError::new(field, format!("is over {max_bytes} bytes")).with("maxBytes", json!(max_bytes))
}

/// A decoded edit and the size it is made at.
#[derive(Debug, Clone, PartialEq)]
pub struct SizedEdit {
    pub init: InitImage,
    pub width: usize,
    pub height: usize,
}

/// Decodes the pictures (CPU work: call it off the async threads), picks the output size
/// (`size` when the request named one) and brings image and mask to it. `steps` checks that the
/// strength leaves a step to run.
pub fn resolve(
    edit: &EditBytes,
    size: Option<(usize, usize)>,
    steps: usize,
    limits: &Limits,
) -> Result<SizedEdit, FieldError> {
    let imagine = |e: hearth_imagine::Error| match e {
        hearth_imagine::Error::InvalidParams { field, message } => FieldError::new(field, message),
        other => FieldError::new("image", other),
    };
    let picture = edit::decode("image", &edit.image, DECODE_LIMITS).map_err(imagine)?;
    let mask = edit
        .mask
        .as_ref()
        .map(|m| edit::decode("mask", m, DECODE_LIMITS))
        .transpose()
        .map_err(imagine)?;
    if let Some(m) = &mask {
        if (m.width(), m.height()) != (picture.width(), picture.height()) {
            return Err(FieldError::new(
                "mask",
                format!(
                    "is {}x{}, the image {}x{}: they must be the same size",
                    m.width(),
                    m.height(),
                    picture.width(),
                    picture.height()
                ),
            ));
        }
    }
    let strength = edit.strength.unwrap_or(if mask.is_some() {
        DEFAULT_INPAINT_STRENGTH
    } else {
        DEFAULT_STRENGTH
    });
    edit::steps_to_run(steps, strength).map_err(imagine)?;
    let (width, height) = size.unwrap_or_else(|| {
        edit::fit(
            picture.width(),
            picture.height(),
            SIZE_MULTIPLE,
            limits.min_size,
            limits.max_size,
            limits.max_pixels,
        )
    });
    let mask = mask.map(|m| mask_of(&m, edit.rule, width, height));
    Ok(SizedEdit {
        init: InitImage {
            image: picture.resized(width, height),
            strength,
            mask,
        },
        width,
        height,
    })
}

fn mask_of(picture: &Picture, rule: MaskRule, width: usize, height: usize) -> hearth_imagine::Mask {
    match rule {
        MaskRule::Transparent if picture.has_alpha() => picture.transparent_mask(width, height),
        _ => picture.mask(width, height),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::for_tests()
    }

    fn png(width: u32, height: u32) -> Vec<u8> {
        let img = image::RgbImage::from_pixel(width, height, image::Rgb([200, 10, 10]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    fn b64(bytes: &[u8]) -> Option<Value> {
        Some(json!(
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ))
    }

    #[test]
    fn a_data_url_or_plain_base64_gives_the_same_bytes() {
        let bytes = png(8, 8);
        let plain = from_json(&b64(&bytes), &None, &None, 1 << 20)
            .unwrap()
            .unwrap();
        let url = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(&bytes)
        );
        let from_url = from_json(&Some(json!(url)), &None, &None, 1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!(plain.image, bytes);
        assert_eq!(from_url.image, bytes);
    }

    #[test]
    fn each_bad_edit_field_is_named() {
        let field = |image: Option<Value>, mask: Option<Value>, strength: Option<Value>| {
            from_json(&image, &mask, &strength, 64).unwrap_err().field
        };
        assert_eq!(field(None, b64(b"x"), None), "mask");
        assert_eq!(field(None, None, Some(json!(0.5))), "strength");
        assert_eq!(field(Some(json!(3)), None, None), "image");
        assert_eq!(field(Some(json!("%%%")), None, None), "image");
        assert_eq!(
            field(Some(json!("data:image/png,abc")), None, None),
            "image"
        );
        assert_eq!(field(b64(&[0; 100]), None, None), "image");
        assert_eq!(field(b64(b"abc"), Some(json!("***")), None), "mask");
        assert_eq!(field(b64(b"abc"), None, Some(json!("1"))), "strength");
    }

    #[test]
    fn the_size_comes_from_the_picture_unless_the_request_names_one() {
        let edit = EditBytes {
            image: png(1600, 1200),
            mask: None,
            strength: None,
            rule: MaskRule::White,
        };
        let own = resolve(&edit, None, 4, &limits()).unwrap();
        assert_eq!((own.width, own.height), (1152, 896));
        assert_eq!(own.init.strength, DEFAULT_STRENGTH);
        let named = resolve(&edit, Some((512, 512)), 4, &limits()).unwrap();
        assert_eq!(
            (named.init.image.width, named.init.image.height),
            (512, 512)
        );
    }

    #[test]
    fn a_mask_of_another_size_and_a_strength_leaving_no_step_are_refused() {
        let edit = EditBytes {
            image: png(64, 64),
            mask: Some(png(32, 64)),
            strength: None,
            rule: MaskRule::White,
        };
        let err = resolve(&edit, None, 4, &limits()).unwrap_err();
        assert_eq!(err.field, "mask");
        assert!(err.message.contains("32x64"), "{}", err.message);
        let weak = EditBytes {
            mask: None,
            strength: Some(0.1),
            ..edit
        };
        assert_eq!(
            resolve(&weak, None, 4, &limits()).unwrap_err().field,
            "strength"
        );
    }
}
