//! GGML/GGUF block formats exactly as the files store them, and the scalar reference
//! dequantization every kernel is tested against.
//!
//! All multi-byte fields are little-endian. Layouts (bytes per block / elements per block):
//! - `Q4_0` (18/32): `d: f16`, `qs[16]`; element `j` is `qs[j] & 15`, element `j+16` is `qs[j] >> 4`;
//!   value `d * (q - 8)`.
//! - `Q4_1` (20/32): `d: f16`, `m: f16`, `qs[16]` as Q4_0; value `d * q + m`.
//! - `Q5_0` (22/32): `d: f16`, `qh: u32`, `qs[16]`; bit `j` of `qh` is the fifth bit of element `j`;
//!   value `d * (q - 16)`.
//! - `Q5_1` (24/32): `d: f16`, `m: f16`, `qh: u32`, `qs[16]` as Q5_0; value `d * q + m`.
//! - `Q8_0` (34/32): `d: f16`, `qs: [i8; 32]`; value `d * q`.
//! - `Q4_K` (144/256): `d: f16`, `dmin: f16`, `scales[12]` (eight 6-bit scale/min pairs), `qs[128]`;
//!   value `d * sc[j] * q - dmin * m[j]` for the 32-element sub-block `j`. Byte `32 c + l` of
//!   `qs` holds element `64 c + l` in its low nibble and `64 c + 32 + l` in its high nibble.
//! - `Q5_K` (176/256): `d: f16`, `dmin: f16`, `scales[12]` as Q4_K, `qh[32]`, `qs[128]` as Q4_K;
//!   bit `2 c` of `qh[l]` is the fifth bit of element `64 c + l`, bit `2 c + 1` that of
//!   `64 c + 32 + l`; value as Q4_K with a 5-bit `q`.
//! - `Q6_K` (210/256): `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d: f16`; value
//!   `d * scales[e / 16] * (q - 32)` with a 6-bit `q`.
//! - `Q8_K` (292/256): `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`; value `d * q`.

use crate::Error;
use half::{bf16, f16};

/// A tensor element type as GGUF numbers it (`ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
}

impl GgmlType {
    /// Maps the numeric `ggml_type` id stored in a GGUF tensor header.
    pub fn from_id(id: u32) -> Result<GgmlType, Error> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            30 => GgmlType::BF16,
            other => return Err(Error::UnsupportedType(other)),
        })
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                32
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
        }
    }

    /// Bytes taken by one row of `cols` elements; `cols` must be a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize, Error> {
        let be = self.block_elems();
        if !cols.is_multiple_of(be) {
            return Err(Error::RowNotBlockAligned {
                ty: self,
                cols,
                block: be,
            });
        }
        Ok(cols / be * self.block_bytes())
    }
}

#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// The `(scale, min)` 6-bit pair of sub-block `j` (0..8) of a Q4_K/Q5_K `scales[12]` field.
#[inline]
pub(crate) fn k4_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q5_0 (`m == None`) or Q5_1: the block's `(d, m, qh, qs)`.
#[inline]
pub(crate) fn q5_fields(ty: GgmlType, blk: &[u8]) -> (f32, Option<f32>, u32, &[u8]) {
    let at = if ty == GgmlType::Q5_1 { 4 } else { 2 };
    let m = (ty == GgmlType::Q5_1).then(|| f16_at(blk, 2));
    let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
    (f16_at(blk, 0), m, qh, &blk[at + 4..at + 20])
}

/// The unsigned 5-bit quant of element `e` (0..32) of a Q5_0/Q5_1 block's `qh` and `qs`.
#[inline]
pub(crate) fn q5_q(qh: u32, qs: &[u8], e: usize) -> u8 {
    let low = if e < 16 { qs[e] & 15 } else { qs[e - 16] >> 4 };
    low | ((((qh >> e) & 1) as u8) << 4)
}

/// Q4_K (`qh == None`) or Q5_K: the block's `(d, dmin, scales[12], qh[32], qs[128])`.
#[inline]
pub(crate) fn k45_fields(ty: GgmlType, blk: &[u8]) -> (f32, f32, &[u8], Option<&[u8]>, &[u8]) {
    let (d, dmin, scales) = (f16_at(blk, 0), f16_at(blk, 2), &blk[4..16]);
    if ty == GgmlType::Q5_K {
        (d, dmin, scales, Some(&blk[16..48]), &blk[48..176])
    } else {
        (d, dmin, scales, None, &blk[16..144])
    }
}

/// The unsigned quant of element `e` (0..256) of a Q4_K block's `qs` (4 bits), or with `qh` of
/// a Q5_K block (5 bits).
#[inline]
pub(crate) fn k45_q(qh: Option<&[u8]>, qs: &[u8], e: usize) -> u8 {
    let (c, upper, l) = (e / 64, (e / 32) % 2, e % 32);
    let byte = qs[32 * c + l];
    let low = if upper == 0 { byte & 15 } else { byte >> 4 };
    low | qh.map_or(0, |h| ((h[l] >> (2 * c + upper)) & 1) << 4)
}

/// Scalar reference: dequantizes one row (`bytes` = whole blocks) into `out` (`out.len()` elements).
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), Error> {
    let need = ty.row_bytes(out.len())?;
    if bytes.len() != need {
        return Err(Error::ShapeMismatch {
            what: "dequantize_row bytes",
            expected: need,
            got: bytes.len(),
        });
    }
    let bb = ty.block_bytes();
    let be = ty.block_elems();
    for (blk, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        match ty {
            GgmlType::F32 => y[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            GgmlType::F16 => y[0] = f16_at(blk, 0),
            GgmlType::BF16 => y[0] = bf16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32(),
            GgmlType::Q4_0 => {
                let d = f16_at(blk, 0);
                for j in 0..16 {
                    y[j] = d * ((blk[2 + j] & 15) as i32 - 8) as f32;
                    y[j + 16] = d * ((blk[2 + j] >> 4) as i32 - 8) as f32;
                }
            }
            GgmlType::Q4_1 => {
                let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
                for j in 0..16 {
                    y[j] = d * (blk[4 + j] & 15) as f32 + m;
                    y[j + 16] = d * (blk[4 + j] >> 4) as f32 + m;
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let (d, m, qh, qs) = q5_fields(ty, blk);
                for (e, y) in y.iter_mut().enumerate() {
                    let q = q5_q(qh, qs, e) as i32;
                    *y = match m {
                        None => d * (q - 16) as f32,
                        Some(m) => d * q as f32 + m,
                    };
                }
            }
            GgmlType::Q8_0 => {
                let d = f16_at(blk, 0);
                for j in 0..32 {
                    y[j] = d * (blk[2 + j] as i8) as f32;
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin, scales, qh, qs) = k45_fields(ty, blk);
                for (j, ys) in y.chunks_exact_mut(32).enumerate() {
                    let (sc, m) = k4_scale_min(j, scales);
                    let (dj, mj) = (d * sc as f32, dmin * m as f32);
                    for (l, y) in ys.iter_mut().enumerate() {
                        *y = dj * k45_q(qh, qs, 32 * j + l) as f32 - mj;
                    }
                }
            }
            GgmlType::Q6_K => {
                let d = f16_at(blk, 208);
                for e in 0..256 {
                    let q = q6k_q(blk, e);
                    let sc = blk[192 + e / 16] as i8;
                    y[e] = d * sc as f32 * (q as i32 - 32) as f32;
                }
            }
            GgmlType::Q8_K => {
                let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                for j in 0..256 {
                    y[j] = d * (blk[4 + j] as i8) as f32;
                }
            }
        }
    }
    Ok(())
}

/// The unsigned 6-bit quant of element `e` (0..256) of a Q6_K block.
#[inline]
pub(crate) fn q6k_q(blk: &[u8], e: usize) -> u8 {
    let half = e / 128; // 128-element halves use ql[64*half..], qh[32*half..]
    let r = e % 128;
    let quarter = r / 32; // 0..4
    let l = r % 32;
    let ql = &blk[64 * half..64 * half + 64];
    let qh = blk[128 + 32 * half + l];
    let low = match quarter {
        0 => ql[l] & 15,
        1 => ql[l + 32] & 15,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    low | (((qh >> (2 * quarter)) & 3) << 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_block_dequantizes_nibbles_low_then_high() {
        let mut blk = vec![0u8; 18];
        blk[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        blk[2] = 0xF1; // element 0 -> 1, element 16 -> 15
        let mut y = vec![0f32; 32];
        dequantize_row(GgmlType::Q4_0, &blk, &mut y).unwrap();
        assert_eq!(y[0], 0.5 * (1.0 - 8.0));
        assert_eq!(y[16], 0.5 * (15.0 - 8.0));
        assert_eq!(y[1], 0.5 * -8.0);
    }

    #[test]
    fn q5_0_fifth_bit_comes_from_qh() {
        let mut blk = vec![0u8; 22];
        blk[0..2].copy_from_slice(&f16::from_f32(1.0).to_bits().to_le_bytes());
        blk[2..6].copy_from_slice(&((1u32 << 3) | (1u32 << 20)).to_le_bytes());
        let mut y = vec![0f32; 32];
        dequantize_row(GgmlType::Q5_0, &blk, &mut y).unwrap();
        assert_eq!(y[3], 0.0); // 16 - 16
        assert_eq!(y[20], 0.0);
        assert_eq!(y[4], -16.0);
    }

    #[test]
    fn q5_k_fifth_bits_are_two_per_qh_byte_per_64_elements() {
        let mut blk = vec![0u8; 176];
        blk[0..2].copy_from_slice(&f16::from_f32(1.0).to_bits().to_le_bytes()); // d
        blk[2..4].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes()); // dmin
                                                                                // Every sub-block's 6-bit scale 1; mins 0, except sub-block 7's: 3 (low nibble of
                                                                                // scales[11]'s high half) + 16 (bit 6 of scales[7]).
        blk[4..16].copy_from_slice(&[1, 1, 1, 1, 0, 0, 0, 0x40, 1, 1, 1, 0x31]);
        blk[16 + 3] = 1 << 4; // qh[3], bit 2*2: element 128 + 3
        blk[16 + 5] = 1 << 7; // qh[5], bit 2*3 + 1: element 192 + 32 + 5
        blk[48 + 64 + 3] = 0xF2; // qs[32*2 + 3]: element 131 low 2, element 163 high 15
        let mut y = vec![0f32; 256];
        dequantize_row(GgmlType::Q5_K, &blk, &mut y).unwrap();
        assert_eq!(y[131], 18.0); // 2 | 16
        assert_eq!(y[163], 15.0);
        assert_eq!(y[229], 16.0 - 0.5 * 19.0);
        assert_eq!(y[3], 0.0);
        assert_eq!(y[230], -0.5 * 19.0);
        assert_eq!(GgmlType::from_id(13).unwrap(), GgmlType::Q5_K);
        assert_eq!(GgmlType::from_id(7).unwrap(), GgmlType::Q5_1);
    }

    #[test]
    fn misaligned_row_is_a_typed_error() {
        let mut y = vec![0f32; 33];
        let err = dequantize_row(GgmlType::Q4_0, &[0u8; 36], &mut y).unwrap_err();
        assert!(matches!(err, Error::RowNotBlockAligned { .. }));
        let mut y = vec![0f32; 32];
        let err = dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut y).unwrap_err();
        assert!(matches!(err, Error::ShapeMismatch { .. }));
    }

    #[test]
    fn unknown_type_id_is_rejected() {
        assert!(matches!(
            GgmlType::from_id(99),
            Err(Error::UnsupportedType(99))
        ));
        assert_eq!(GgmlType::from_id(3).unwrap(), GgmlType::Q4_1);
    }
}
