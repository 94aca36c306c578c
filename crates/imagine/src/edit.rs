//! What an edit starts from: the init image of image-to-image and the mask of inpainting.
//!
//! Both arrive as untrusted bytes (PNG, JPEG or WebP). [`decode`] reads the header first and
//! refuses a picture whose declared size is over the pixel budget before a pixel is decoded
//! (a "pixel bomb" declares a huge canvas in a few bytes), then decodes under an allocation limit,
//! so a corrupt or truncated file is an error, never a crash or an unbounded allocation.
//! [`fit`] chooses the output size from the image when the request gave none; [`Picture::resized`]
//! brings an image to the output size.
//!
//! The tensors follow diffusers' `VaeImageProcessor`: pixels to [-1, 1]; a mask to PIL's luma,
//! binarized at one half, and sampled to the latent grid by nearest neighbour
//! (`torch.nn.functional.interpolate`'s default), so that the parity tests hold.

use std::borrow::Cow;
use std::io::Cursor;

use candle_core::{Device, Tensor};
use image::imageops::FilterType;
use image::{DynamicImage, ImageReader};

use crate::error::{Error, Result};
use crate::pipeline::Image;

/// The formats an edit accepts.
pub const FORMATS: &str = "PNG, JPEG or WebP";

/// How an edit begins: the image it changes, how much, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct InitImage {
    /// At the output size.
    pub image: Image,
    /// In (0, 1]: the share of the schedule that runs. 1 repaints from pure noise (keeping only
    /// what a mask keeps); small values keep the picture nearly as it is.
    pub strength: f64,
    /// Inpainting: where to repaint. `None` repaints everywhere (image-to-image).
    pub mask: Option<Mask>,
}

/// A greyscale mask at the output size: a pixel of luma 128 or more repaints, below keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    pub width: usize,
    pub height: usize,
    pub luma: Vec<u8>,
}

/// A decoded picture of any size, before it is fitted to the output.
#[derive(Debug, Clone)]
pub struct Picture {
    image: DynamicImage,
}

/// What one untrusted picture may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Width x height as declared in the header.
    pub max_pixels: u64,
    /// Either side.
    pub max_side: u32,
}

/// How many of an edit's `steps` run at `strength`: `min(floor(steps x strength), steps)`, as
/// diffusers' `get_timesteps`. A strength outside (0, 1], or one that leaves no step to run, is an
/// error naming `strength`.
pub fn steps_to_run(steps: usize, strength: f64) -> Result<usize> {
    if !(strength > 0.0 && strength <= 1.0) {
        return Err(invalid(
            "strength",
            format!("must be above 0 and at most 1, got {strength}"),
        ));
    }
    let run = ((steps as f64 * strength) as usize).min(steps);
    if run == 0 {
        return Err(invalid(
            "strength",
            format!(
                "{strength} of {steps} steps leaves no step to run: ask for a strength of at \
                 least {} or more steps",
                1.0 / steps as f64
            ),
        ));
    }
    Ok(run)
}

fn invalid(field: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidParams {
        field,
        message: message.into(),
    }
}

/// Decodes `bytes` (the request field `field`) under `limits`.
pub fn decode(field: &'static str, bytes: &[u8], limits: DecodeLimits) -> Result<Picture> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| invalid(field, format!("unreadable image: {e}")))?;
    let format = match reader.format() {
        Some(
            f @ (image::ImageFormat::Png | image::ImageFormat::Jpeg | image::ImageFormat::WebP),
        ) => f,
        Some(other) => {
            return Err(invalid(
                field,
                format!("{other:?} images are not accepted: send {FORMATS}"),
            ))
        }
        None => return Err(invalid(field, format!("not an image: send {FORMATS}"))),
    };
    // The header alone, before anything is decoded.
    let (w, h) = ImageReader::with_format(Cursor::new(bytes), format)
        .into_dimensions()
        .map_err(|e| invalid(field, format!("unreadable image header: {e}")))?;
    if w == 0 || h == 0 {
        return Err(invalid(field, "the image is empty"));
    }
    if w > limits.max_side || h > limits.max_side || u64::from(w) * u64::from(h) > limits.max_pixels
    {
        return Err(invalid(
            field,
            format!(
                "the image declares {w}x{h} pixels; at most {} a side and {} in all are accepted",
                limits.max_side, limits.max_pixels
            ),
        ));
    }
    let mut reader = reader;
    let mut caps = image::Limits::default();
    caps.max_image_width = Some(limits.max_side);
    caps.max_image_height = Some(limits.max_side);
    // Room for the decoded pixels at 16 bits a channel with alpha, and the decoder's own buffers.
    caps.max_alloc = Some(limits.max_pixels.saturating_mul(8).saturating_add(64 << 20));
    reader.limits(caps);
    let image = reader
        .decode()
        .map_err(|e| invalid(field, format!("the image could not be decoded: {e}")))?;
    Ok(Picture { image })
}

impl Picture {
    pub fn width(&self) -> usize {
        self.image.width() as usize
    }

    pub fn height(&self) -> usize {
        self.image.height() as usize
    }

    /// RGB at `width` x `height`: the picture itself when it has that size, else resized with
    /// Lanczos (stretched: the caller chose the size). Alpha is dropped.
    pub fn resized(&self, width: usize, height: usize) -> Image {
        Image {
            width,
            height,
            rgb: self
                .at(width, height, FilterType::Lanczos3)
                .to_rgb8()
                .into_raw(),
        }
    }

    /// The picture at `width` x `height`: itself when it has that size, else resized.
    fn at(&self, width: usize, height: usize, filter: FilterType) -> Cow<'_, DynamicImage> {
        if (self.width(), self.height()) == (width, height) {
            Cow::Borrowed(&self.image)
        } else {
            Cow::Owned(self.image.resize_exact(width as u32, height as u32, filter))
        }
    }

    /// The picture as a mask at `width` x `height` (nearest neighbour: a mask has hard edges).
    pub fn mask(&self, width: usize, height: usize) -> Mask {
        let rgb = self.at(width, height, FilterType::Nearest).to_rgb8();
        Mask {
            width,
            height,
            luma: rgb.pixels().map(|p| pil_luma(p.0)).collect(),
        }
    }

    /// Whether the picture has an alpha channel.
    pub fn has_alpha(&self) -> bool {
        self.image.color().has_alpha()
    }

    /// The picture as a mask by OpenAI's rule for `/v1/images/edits`: fully transparent pixels
    /// (alpha 0) repaint, the rest keep. A picture without alpha keeps everything.
    pub fn transparent_mask(&self, width: usize, height: usize) -> Mask {
        let rgba = self.at(width, height, FilterType::Nearest).to_rgba8();
        Mask {
            width,
            height,
            luma: rgba
                .pixels()
                .map(|p| if p.0[3] == 0 { 255 } else { 0 })
                .collect(),
        }
    }
}

/// PIL's `convert("L")`: ITU-R 601-2 luma in fixed point.
fn pil_luma([r, g, b]: [u8; 3]) -> u8 {
    ((u32::from(r) * 19595 + u32::from(g) * 38470 + u32::from(b) * 7471 + 0x8000) >> 16) as u8
}

/// The output size for a picture of `width` x `height` when the request named none: its aspect
/// kept, scaled down (never up) to fit `max_side` and `max_pixels`, each side rounded to the
/// nearest multiple of `multiple` and kept within `min_side..=max_side`.
pub fn fit(
    width: usize,
    height: usize,
    multiple: usize,
    min_side: usize,
    max_side: usize,
    max_pixels: usize,
) -> (usize, usize) {
    let (w, h) = (width as f64, height as f64);
    let scale = 1f64
        .min(max_side as f64 / w)
        .min(max_side as f64 / h)
        .min((max_pixels as f64 / (w * h)).sqrt());
    let side = |v: f64| {
        let rounded = ((v * scale / multiple as f64).round() as usize) * multiple;
        rounded.clamp(min_side, max_side)
    };
    let (mut fw, mut fh) = (side(w), side(h));
    // Rounding up may cross the pixel budget: step the longer side down until it fits.
    while fw * fh > max_pixels && (fw > min_side || fh > min_side) {
        if fw >= fh && fw > min_side {
            fw -= multiple;
        } else {
            fh -= multiple;
        }
    }
    (fw, fh)
}

/// `(1, 3, h, w)` in [-1, 1], as diffusers' `VaeImageProcessor.preprocess`.
pub(crate) fn image_tensor(image: &Image, device: &Device) -> Result<Tensor> {
    let data: Vec<f32> = image.rgb.iter().map(|&v| f32::from(v) / 255.0).collect();
    let t = Tensor::from_vec(data, (image.height, image.width, 3), &Device::Cpu)?
        .permute((2, 0, 1))?
        .unsqueeze(0)?;
    Ok(((t * 2.0)? - 1.0)?.contiguous()?.to_device(device)?)
}

/// The binarized mask's complement at pixel size, `(1, 1, h, w)`: 1 keeps, 0 repaints (diffusers'
/// `mask < 0.5`).
pub(crate) fn keep_pixels(mask: &Mask, device: &Device) -> Result<Tensor> {
    let data: Vec<f32> = mask
        .luma
        .iter()
        .map(|&v| if f32::from(v) / 255.0 < 0.5 { 1.0 } else { 0.0 })
        .collect();
    Ok(Tensor::from_vec(data, (1, 1, mask.height, mask.width), &Device::Cpu)?.to_device(device)?)
}

/// The binarized mask sampled to the latent grid (every `factor`-th pixel), `(1, 1, h/f, w/f)`.
pub(crate) fn mask_latent(mask: &Mask, factor: usize, device: &Device) -> Result<Tensor> {
    let (h, w) = (mask.height / factor, mask.width / factor);
    let mut data = Vec::with_capacity(h * w);
    for y in 0..h {
        for x in 0..w {
            let v = mask.luma[y * factor * mask.width + x * factor];
            data.push(if f32::from(v) / 255.0 >= 0.5 {
                1f32
            } else {
                0.0
            });
        }
    }
    Ok(Tensor::from_vec(data, (1, 1, h, w), &Device::Cpu)?.to_device(device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: DecodeLimits = DecodeLimits {
        max_pixels: 4 << 20,
        max_side: 4096,
    };

    fn png(width: u32, height: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([x as u8, y as u8, (x ^ y) as u8])
        });
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn a_png_decodes_and_keeps_its_pixels_at_its_own_size() {
        let p = decode("image", &png(64, 32), LIMITS).unwrap();
        assert_eq!((p.width(), p.height()), (64, 32));
        let img = p.resized(64, 32);
        assert_eq!(&img.rgb[..6], &[0, 0, 0, 1, 0, 1]);
    }

    #[test]
    fn truncated_corrupt_and_foreign_bytes_are_errors_naming_the_field() {
        let full = png(64, 64);
        for bad in [
            &full[..full.len() / 2],
            &b"\x89PNG\r\n\x1a\nnot really"[..],
            &b"hello"[..],
            &b"GIF89a\x01\x00\x01\x00\x00\x00\x00"[..],
            &[][..],
        ] {
            let err = decode("mask", bad, LIMITS).unwrap_err();
            assert!(
                matches!(err, Error::InvalidParams { field: "mask", .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn a_pixel_bomb_is_refused_from_its_header() {
        // A PNG declaring 100,000 x 100,000 pixels in a few dozen bytes.
        let mut bomb = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = 100_000u32.to_be_bytes().to_vec();
        ihdr.extend(100_000u32.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        for (kind, data) in [
            (&b"IHDR"[..], &ihdr[..]),
            (b"IDAT", &[0x78, 0x01]),
            (b"IEND", &[]),
        ] {
            let body = [kind, data].concat();
            bomb.extend((data.len() as u32).to_be_bytes());
            bomb.extend(&body);
            bomb.extend(crc32(&body).to_be_bytes());
        }
        let err = decode("image", &bomb, LIMITS).unwrap_err().to_string();
        assert!(err.contains("declares 100000x100000"), "{err}");
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn fit_keeps_the_aspect_within_the_bounds() {
        assert_eq!(fit(512, 512, 64, 256, 2048, 1 << 20), (512, 512));
        assert_eq!(fit(4000, 3000, 64, 256, 2048, 1 << 20), (1152, 896));
        assert_eq!(fit(100, 100, 64, 256, 2048, 1 << 20), (256, 256));
        assert_eq!(fit(3000, 200, 64, 256, 2048, 1 << 20), (2048, 256));
        let (w, h) = fit(1500, 1000, 64, 256, 2048, 1 << 20);
        assert!(w * h <= 1 << 20 && w % 64 == 0 && h % 64 == 0, "{w}x{h}");
    }

    #[test]
    fn transparent_pixels_repaint_by_openais_rule() {
        let img = image::RgbaImage::from_fn(16, 8, |x, _| {
            image::Rgba([255, 255, 255, if x < 8 { 0 } else { 255 }])
        });
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        let p = decode("mask", &out.into_inner(), LIMITS).unwrap();
        assert!(p.has_alpha());
        let m = p.transparent_mask(16, 8);
        assert_eq!(m.luma[0], 255, "transparent repaints");
        assert_eq!(m.luma[15], 0, "opaque white keeps under OpenAI's rule");
        assert_eq!(
            p.mask(16, 8).luma[15],
            255,
            "and repaints under the luma rule"
        );
    }

    #[test]
    fn strength_leaves_at_least_one_step_or_is_refused() {
        assert_eq!(steps_to_run(4, 0.5).unwrap(), 2);
        assert_eq!(steps_to_run(4, 1.0).unwrap(), 4);
        assert_eq!(steps_to_run(10, 0.3).unwrap(), 3);
        for bad in [0.0, -0.1, 1.01, f64::NAN, 0.2] {
            let err = steps_to_run(4, bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidParams {
                        field: "strength",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn pil_luma_matches_pils_fixed_point_rounding() {
        assert_eq!(pil_luma([255, 255, 255]), 255);
        assert_eq!(pil_luma([0, 0, 0]), 0);
        assert_eq!(pil_luma([255, 0, 0]), 76);
        assert_eq!(pil_luma([0, 255, 0]), 150);
        assert_eq!(pil_luma([0, 0, 255]), 29);
    }
}
