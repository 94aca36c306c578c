//! GGML/GGUF block formats exactly as the files store them, and the scalar reference
//! dequantization every kernel is tested against.
//!
//! All multi-byte fields are little-endian. Layouts (bytes per block / elements per block):
//! - `Q4_0` (18/32): `d: f16`, `qs[16]`; element `j` is `qs[j] & 15`, element `j+16` is `qs[j] >> 4`;
//!   value `d * (q - 8)`.
//! - `Q4_1` (20/32): `d: f16`, `m: f16`, `qs[16]` as Q4_0; value `d * q + m`.
//! - `Q5_0` (22/32): `d: f16`, `qh: u32`, `qs[16]`; bit `j` of `qh` is the fifth bit of element `j`;
//!   value `d * (q - 16)`.
//! - `Q8_0` (34/32): `d: f16`, `qs: [i8; 32]`; value `d * q`.
//! - `Q4_K` (144/256): `d: f16`, `dmin: f16`, `scales[12]` (eight 6-bit scale/min pairs), `qs[128]`;
//!   value `d * sc[j] * q - dmin * m[j]` for the 32-element sub-block `j`.
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
    Q8_0,
    Q4_K,
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
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4_K,
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
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => 32,
            GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_K => 256,
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
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_K => 144,
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
            GgmlType::Q5_0 => {
                let d = f16_at(blk, 0);
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                for j in 0..16 {
                    let h0 = ((qh >> j) & 1) << 4;
                    let h1 = ((qh >> (j + 16)) & 1) << 4;
                    y[j] = d * (((blk[6 + j] & 15) as u32 | h0) as i32 - 16) as f32;
                    y[j + 16] = d * (((blk[6 + j] >> 4) as u32 | h1) as i32 - 16) as f32;
                }
            }
            GgmlType::Q8_0 => {
                let d = f16_at(blk, 0);
                for j in 0..32 {
                    y[j] = d * (blk[2 + j] as i8) as f32;
                }
            }
            GgmlType::Q4_K => {
                let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                let scales = &blk[4..16];
                let qs = &blk[16..144];
                for c in 0..4 {
                    let (s0, m0) = k4_scale_min(2 * c, scales);
                    let (s1, m1) = k4_scale_min(2 * c + 1, scales);
                    let (d0, mm0) = (d * s0 as f32, dmin * m0 as f32);
                    let (d1, mm1) = (d * s1 as f32, dmin * m1 as f32);
                    for l in 0..32 {
                        let q = qs[32 * c + l];
                        y[64 * c + l] = d0 * (q & 15) as f32 - mm0;
                        y[64 * c + 32 + l] = d1 * (q >> 4) as f32 - mm1;
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
