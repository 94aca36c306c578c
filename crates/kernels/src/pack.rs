//! Load-time repacking of GGML weight rows into one SIMD-friendly layout shared by every
//! kernel path.
//!
//! Every supported format is rewritten, exactly, as `w = scale[g] * q + min[g]` with an
//! unsigned `q` (or a signed 8-bit `q` and no min for Q8_0 / float weights) and one f16
//! `scale` (and `min`) per group of 32 elements (16 for Q6_K). Rows are padded with zeros to
//! a multiple of 64 columns ("chunks"). Within a 64-element chunk:
//! - the low 4 bits of `q` sit in 32 bytes: byte `j` holds element `j` in its low nibble and
//!   element `j + 32` in its high nibble, so one 32-byte load unpacks to the chunk in order;
//! - the fifth bits of Q5_0/Q5_1/Q5_K sit in one little-endian u64 per chunk: element `e`'s is
//!   bit `8 t + j + 4 (1 - h)` with `h = e / 32`, `j = e % 32 / 8`, `t = e % 8` (see
//!   `hi5_bit`), so that a shift of each 64-bit lane by a constant brings every fifth bit of
//!   a 32-element half to bit 4 of its element's byte;
//! - Q6_K's two top bits sit in a 16-byte plane: bits `2*(e/16)..` of byte `e % 16`.
//!
//! Interleaved variant ([`QMatrix::for_ggml_on`] with the AVX2, VNNI or AMX path, for the 4-bit,
//! 5-bit and 8-bit layouts, and 6-bit on VNNI and AMX, when the rows are a multiple of 16): rows are taken 16 at a time, and
//! for each 32-element block the 16 rows' quants are stored so that one 64-byte load holds 4
//! consecutive quants of each of the 16 rows (32-bit lane `r` = row `r`; AVX2 reads each
//! 64-byte unit as two 32-byte halves of 8 rows):
//! - 4-bit: 256 bytes per (16 rows, block); byte `64 h + 4 r + t` holds element `8 h + t` of
//!   row `r` in its low nibble and element `8 h + 4 + t` in its high nibble;
//! - 8-bit: 512 bytes per (16 rows, block); byte `64 k + 4 r + t` holds element `4 k + t` of
//!   row `r` as the unsigned `q + 128`;
//! - 5-bit: the 4-bit plane as above, plus 64 bytes per (16 rows, block) of fifth bits: bit
//!   `4 r + t` of little-endian word `k` is the fifth bit of element `4 k + t` of row `r`;
//! - 6-bit (Q6_K, VNNI and AMX paths only): as 8-bit, one byte per quant, `q` unsigned (0..64);
//!   its two scales per block (one per 16 elements) are consecutive groups;
//! - scales and mins: 16 f16 per (16 rows, group), row order.
//!
//! The products then accumulate a whole block per lane in i32 and apply one scale per block,
//! and each 16-lane result is 16 consecutive outputs (no horizontal sums).
//!
//! Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 scales are f16 in the file and stay exact. K-quant scales are
//! products `d * sc` of an f16 and a 6/8-bit integer, rounded here to f16 (relative error
//! <= 2^-11, far below the 4/5/6-bit quantization step).

use crate::formats::{f16_at, k45_fields, k45_q, k4_scale_min, q5_fields, q5_q, q6k_q, GgmlType};
use crate::lines::Lines;
use crate::Error;
use half::f16;

/// The repacked quant layout of a [`QMatrix`]. The discriminants are the SIMD tiles'
/// const-generic layout ids (`crate::L_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Layout {
    /// 4-bit unsigned q, per-32 scale and stored min (Q4_0, Q4_1, Q4_K).
    U4Min,
    /// 5-bit unsigned q, per-32 scale, min = -16 * scale (Q5_0).
    U5,
    /// 5-bit unsigned q, per-32 scale and stored min (Q5_1, Q5_K).
    U5Min,
    /// 6-bit unsigned q, per-16 scale, min = -32 * scale (Q6_K).
    U6,
    /// Signed 8-bit q, per-32 scale, no min (Q8_0, Q8_K, and F32/F16/BF16 quantized at load).
    S8,
}

impl Layout {
    pub(crate) fn group(self) -> usize {
        match self {
            Layout::U6 => 16,
            _ => 32,
        }
    }
    /// Bytes of the low/8-bit quant plane per 64-element chunk.
    pub(crate) fn qs_per_chunk(self) -> usize {
        match self {
            Layout::S8 => 64,
            _ => 32,
        }
    }
    /// Bytes of the high-bit plane per 64-element chunk.
    pub(crate) fn hi_per_chunk(self) -> usize {
        match self {
            Layout::U5 | Layout::U5Min => 8,
            Layout::U6 => 16,
            _ => 0,
        }
    }
    /// Whether quants have a fifth bit (in the 8-byte plane).
    pub(crate) fn fifth_bit(self) -> bool {
        crate::fifth_bit(self as u8)
    }
    /// Whether each group stores its min (else it is `-zero() * scale`).
    pub(crate) fn stored_min(self) -> bool {
        crate::stored_min(self as u8)
    }
    /// Zero point for the derived-min layouts.
    pub(crate) fn zero(self) -> f32 {
        match self {
            Layout::U5 => 16.0,
            Layout::U6 => 32.0,
            _ => 0.0,
        }
    }
}

/// A weight matrix (`rows` outputs x `cols` inputs) repacked for the kernels. Immutable once
/// built; share it freely between threads.
#[derive(Debug, Clone)]
pub struct QMatrix {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// `cols` rounded up to a multiple of 64.
    pub(crate) kp: usize,
    pub(crate) layout: Layout,
    pub(crate) source: GgmlType,
    /// On cache lines (see `lines`).
    pub(crate) qs: Lines<u8>,
    pub(crate) hi: Vec<u8>,
    /// f16 bits, `rows * kp / group`.
    pub(crate) scales: Vec<u16>,
    /// f16 bits, `rows * kp / group` for the stored-min layouts, else empty.
    pub(crate) mins: Vec<u16>,
    /// Stored in the interleaved arrangement (see the module documentation).
    pub(crate) il: bool,
}

/// The bit of a chunk's fifth-bit word that holds element `i` (< 64) of the chunk: in 64-bit
/// lane `j` of a 32-element half `h`, bit 4 of byte `t` after a shift right by `j` (half 0) or
/// left by `4 - j` (half 1).
#[inline]
pub(crate) fn hi5_bit(i: usize) -> u32 {
    let (h, j, t) = (i / 32, i % 32 / 8, i % 8);
    (8 * t + j + 4 * (1 - h)) as u32
}

fn to_f16_bits(x: f32) -> u16 {
    f16::from_f32(x.clamp(-65504.0, 65504.0)).to_bits()
}

/// One row decoded into unsigned/signed quants plus per-group scale/min, before packing.
struct RowBuf {
    q: Vec<u8>,
    scale: Vec<f32>,
    min: Vec<f32>,
}

impl QMatrix {
    /// Repacks `rows` GGML rows of `cols` elements stored back to back in `bytes`.
    pub fn from_ggml(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QMatrix, Error> {
        let mut m = QMatrix::for_ggml(ty, rows, cols)?;
        m.pack_ggml_rows(0, bytes)?;
        Ok(m)
    }

    /// An all-zero matrix laid out for `ty` weights, to be filled with [`QMatrix::pack_ggml_rows`]
    /// (lets a loader stream a large tensor through a small buffer).
    pub fn for_ggml(ty: GgmlType, rows: usize, cols: usize) -> Result<QMatrix, Error> {
        ty.row_bytes(cols)?;
        let layout = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => Layout::U4Min,
            GgmlType::Q5_0 => Layout::U5,
            GgmlType::Q5_1 | GgmlType::Q5_K => Layout::U5Min,
            GgmlType::Q6_K => Layout::U6,
            GgmlType::Q8_0 | GgmlType::Q8_K | GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                Layout::S8
            }
        };
        Ok(QMatrix::empty(ty, layout, rows, cols))
    }

    /// Like [`QMatrix::for_ggml`], laid out for the kernel `path` that will run it: the AVX2 and
    /// VNNI paths get the interleaved arrangement where the layout and row count allow it (every
    /// path computes correct products from either arrangement).
    pub fn for_ggml_on(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        path: crate::KernelPath,
    ) -> Result<QMatrix, Error> {
        let mut m = QMatrix::for_ggml(ty, rows, cols)?;
        // Q6_K interleaves for the VNNI and AMX tiles only (the AVX2 tile has no 6-bit form).
        let six = m.layout == Layout::U6
            && matches!(path, crate::KernelPath::Avx512Vnni | crate::KernelPath::Amx);
        if path.interleaves()
            && (six
                || matches!(
                    m.layout,
                    Layout::U4Min | Layout::U5 | Layout::U5Min | Layout::S8
                ))
            && rows > 0
            && rows.is_multiple_of(16)
        {
            m.il = true;
            if m.layout == Layout::S8 {
                m.qs.fill(0x80); // unsigned q + 128: zero quants
            }
            if six {
                m.qs = Lines::filled(rows * m.kp, 0); // one byte per 6-bit quant
                m.hi = Vec::new();
            }
        }
        Ok(m)
    }

    /// Whether the matrix uses the interleaved arrangement.
    pub fn interleaved(&self) -> bool {
        self.il
    }

    /// Packs whole GGML rows (`bytes`, back to back) into rows `r0..` of a matrix made by
    /// [`QMatrix::for_ggml`].
    pub fn pack_ggml_rows(&mut self, r0: usize, bytes: &[u8]) -> Result<(), Error> {
        let ty = self.source;
        let row_bytes = ty.row_bytes(self.cols)?;
        if !bytes.len().is_multiple_of(row_bytes) || r0 + bytes.len() / row_bytes > self.rows {
            return Err(Error::ShapeMismatch {
                what: "QMatrix::pack_ggml_rows bytes (whole rows inside the matrix)",
                expected: (self.rows - r0.min(self.rows)) * row_bytes,
                got: bytes.len(),
            });
        }
        let g = self.layout.group();
        let mut rb = RowBuf {
            q: vec![0; self.kp],
            scale: vec![0.0; self.kp / g],
            min: vec![0.0; self.kp / g],
        };
        let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let mut floats = vec![0f32; if float { self.cols } else { 0 }];
        for (i, src) in bytes.chunks_exact(row_bytes).enumerate() {
            rb.q.fill(0);
            rb.scale.fill(0.0);
            rb.min.fill(0.0);
            if float {
                crate::formats::dequantize_row(ty, src, &mut floats)?;
                quantize_s8_groups(&floats, &mut rb);
            } else {
                decode_row(ty, src, &mut rb);
            }
            self.pack_row(r0 + i, &rb);
        }
        Ok(())
    }

    /// Quantizes a row-major f32 matrix to signed 8-bit groups of 32 (Q8_0 precision).
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Result<QMatrix, Error> {
        if data.len() != rows * cols {
            return Err(Error::ShapeMismatch {
                what: "QMatrix::from_f32 data",
                expected: rows * cols,
                got: data.len(),
            });
        }
        let mut m = QMatrix::empty(GgmlType::F32, Layout::S8, rows, cols);
        let mut rb = RowBuf {
            q: vec![0; m.kp],
            scale: vec![0.0; m.kp / 32],
            min: vec![0.0; m.kp / 32],
        };
        for r in 0..rows {
            rb.q.fill(0);
            rb.scale.fill(0.0);
            quantize_s8_groups(&data[r * cols..(r + 1) * cols], &mut rb);
            m.pack_row(r, &rb);
        }
        Ok(m)
    }

    fn empty(source: GgmlType, layout: Layout, rows: usize, cols: usize) -> QMatrix {
        let kp = cols.div_ceil(64).max(1) * 64;
        let chunks = kp / 64;
        let groups = kp / layout.group();
        QMatrix {
            rows,
            cols,
            kp,
            layout,
            source,
            qs: Lines::filled(rows * chunks * layout.qs_per_chunk(), 0),
            hi: vec![0; rows * chunks * layout.hi_per_chunk()],
            scales: vec![0; rows * groups],
            mins: if layout.stored_min() {
                vec![0; rows * groups]
            } else {
                Vec::new()
            },
            il: false,
        }
    }

    /// Index of the byte holding element `e` of row `r` in the interleaved arrangement, and
    /// whether it is the high nibble (4-bit layout).
    #[inline]
    fn il_byte(&self, r: usize, e: usize) -> (usize, bool) {
        let (at, high) = self.il_in_block(r % 16, e % 32);
        (self.il_block_base(r, e / 32) + at, high)
    }

    /// Where the quants of block `b` of row `r`'s 16-row group start.
    #[inline]
    fn il_block_base(&self, r: usize, b: usize) -> usize {
        let bytes = if self.il_bytes() { 512 } else { 256 };
        ((r / 16) * (self.kp / 32) + b) * bytes
    }

    /// Offset of element `i` (< 32) of the group's row `rr` (< 16) inside its block, and
    /// whether it is the high nibble.
    #[inline]
    fn il_in_block(&self, rr: usize, i: usize) -> (usize, bool) {
        let (k, t) = (i / 4, i % 4);
        if self.il_bytes() {
            (64 * k + 4 * rr + t, false)
        } else {
            (64 * (k / 2) + 4 * rr + t, k % 2 == 1)
        }
    }

    /// Whether the interleaved arrangement holds one quant per byte (8-bit and 6-bit layouts).
    #[inline]
    fn il_bytes(&self) -> bool {
        matches!(self.layout, Layout::S8 | Layout::U6)
    }

    /// Index of group `gi`'s scale (and min) of row `r`.
    #[inline]
    fn group_index(&self, r: usize, gi: usize) -> usize {
        let groups = self.kp / self.layout.group();
        if self.il {
            ((r / 16) * groups + gi) * 16 + r % 16
        } else {
            r * groups + gi
        }
    }

    /// Where the fifth bit of element `e` of row `r` sits in the interleaved 5-bit plane: the
    /// byte index and the bit's mask.
    #[inline]
    fn il_hi_bit(&self, r: usize, e: usize) -> (usize, u8) {
        let blocks = self.kp / 32;
        let i = e % 32;
        let word = (((r / 16) * blocks + e / 32) * 8 + i / 4) * 8;
        let bit = 4 * (r % 16) + i % 4;
        (word + bit / 8, 1 << (bit % 8))
    }

    fn pack_row_il(&mut self, r: usize, rb: &RowBuf) {
        for (b, q) in rb.q.chunks_exact(32).enumerate() {
            let base = self.il_block_base(r, b);
            for (i, &v) in q.iter().enumerate() {
                let (off, high) = self.il_in_block(r % 16, i);
                let at = base + off;
                self.qs[at] = match (self.layout, high) {
                    (Layout::S8, _) => v ^ 0x80,
                    (Layout::U6, _) => v,
                    (_, true) => (self.qs[at] & 0x0F) | ((v & 15) << 4),
                    (_, false) => (self.qs[at] & 0xF0) | (v & 15),
                };
                if self.layout.fifth_bit() {
                    let (at, m) = self.il_hi_bit(r, 32 * b + i);
                    self.hi[at] = (self.hi[at] & !m) | if v & 16 != 0 { m } else { 0 };
                }
            }
        }
    }

    fn pack_row(&mut self, r: usize, rb: &RowBuf) {
        if self.il {
            self.pack_row_il(r, rb);
        } else {
            self.pack_quants(r, rb);
        }
        let groups = self.kp / self.layout.group();
        for gi in 0..groups {
            let at = self.group_index(r, gi);
            self.scales[at] = to_f16_bits(rb.scale[gi]);
            if self.layout.stored_min() {
                self.mins[at] = to_f16_bits(rb.min[gi]);
            }
        }
    }

    fn pack_quants(&mut self, r: usize, rb: &RowBuf) {
        let chunks = self.kp / 64;
        let qpc = self.layout.qs_per_chunk();
        let hpc = self.layout.hi_per_chunk();
        for c in 0..chunks {
            let q = &rb.q[64 * c..64 * c + 64];
            let qs = &mut self.qs[(r * chunks + c) * qpc..(r * chunks + c + 1) * qpc];
            if self.layout == Layout::S8 {
                qs.copy_from_slice(q);
            } else {
                for j in 0..32 {
                    qs[j] = (q[j] & 15) | ((q[j + 32] & 15) << 4);
                }
            }
            let hi = &mut self.hi[(r * chunks + c) * hpc..(r * chunks + c + 1) * hpc];
            match self.layout {
                Layout::U5 | Layout::U5Min => {
                    let mut bits = 0u64;
                    for (e, &v) in q.iter().enumerate() {
                        bits |= (((v >> 4) & 1) as u64) << hi5_bit(e);
                    }
                    hi.copy_from_slice(&bits.to_le_bytes());
                }
                Layout::U6 => {
                    for (e, &v) in q.iter().enumerate() {
                        hi[e % 16] |= ((v >> 4) & 3) << (2 * (e / 16));
                    }
                }
                _ => {}
            }
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// The GGML type the matrix was built from.
    pub fn source_type(&self) -> GgmlType {
        self.source
    }
    /// Heap bytes held by the packed weights.
    pub fn bytes(&self) -> usize {
        self.qs.len() + self.hi.len() + 2 * (self.scales.len() + self.mins.len())
    }

    /// The quant of element `e` of row `r`: unsigned for the U layouts, signed for S8.
    #[inline]
    pub(crate) fn q_at(&self, r: usize, e: usize) -> i32 {
        if self.il {
            let (at, high) = self.il_byte(r, e);
            let byte = self.qs[at];
            let q = match (self.layout, high) {
                (Layout::S8, _) => return byte as i32 - 128,
                (Layout::U6, _) => return byte as i32,
                (_, true) => (byte >> 4) as i32,
                (_, false) => (byte & 15) as i32,
            };
            if self.layout.fifth_bit() {
                let (at, m) = self.il_hi_bit(r, e);
                return q | if self.hi[at] & m != 0 { 16 } else { 0 };
            }
            return q;
        }
        let chunks = self.kp / 64;
        let (c, i) = (e / 64, e % 64);
        let base = r * chunks + c;
        match self.layout {
            Layout::S8 => self.qs[base * 64 + i] as i8 as i32,
            l => {
                let byte = self.qs[base * 32 + i % 32];
                let mut q = if i < 32 { byte & 15 } else { byte >> 4 } as i32;
                if l.fifth_bit() {
                    let at = base * 8..base * 8 + 8;
                    let word = u64::from_le_bytes(self.hi[at].try_into().unwrap());
                    q |= (((word >> hi5_bit(i)) & 1) as i32) << 4;
                } else if l == Layout::U6 {
                    q |= (((self.hi[base * 16 + i % 16] >> (2 * (i / 16))) & 3) as i32) << 4;
                }
                q
            }
        }
    }

    /// (scale, min) of the group holding element `e` of row `r`, as f32.
    #[inline]
    pub(crate) fn scale_min_at(&self, r: usize, e: usize) -> (f32, f32) {
        let at = self.group_index(r, e / self.layout.group());
        let s = f16::from_bits(self.scales[at]).to_f32();
        let m = if self.layout.stored_min() {
            f16::from_bits(self.mins[at]).to_f32()
        } else {
            -self.layout.zero() * s
        };
        (s, m)
    }

    /// Dequantizes row `r` of the packed matrix (e.g. an embedding lookup) into `out[..cols]`.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) -> Result<(), Error> {
        if r >= self.rows {
            return Err(Error::ShapeMismatch {
                what: "QMatrix::row_to_f32 row index bound",
                expected: self.rows,
                got: r,
            });
        }
        if out.len() < self.cols {
            return Err(Error::ShapeMismatch {
                what: "QMatrix::row_to_f32 output length",
                expected: self.cols,
                got: out.len(),
            });
        }
        for (e, y) in out[..self.cols].iter_mut().enumerate() {
            let (s, m) = self.scale_min_at(r, e);
            *y = s * self.q_at(r, e) as f32 + m;
        }
        Ok(())
    }
}

/// Signed 8-bit per-32 quantization of float weights (as llama.cpp's Q8_0).
fn quantize_s8_groups(x: &[f32], rb: &mut RowBuf) {
    for (gi, xs) in x.chunks(32).enumerate() {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        // Round the scale to its stored f16 first so that q is computed against it.
        let d16 = f16::from_f32(d).to_f32();
        let id = if d16 > 0.0 { 1.0 / d16 } else { 0.0 };
        for (j, &v) in xs.iter().enumerate() {
            rb.q[32 * gi + j] = ((v * id).round().clamp(-127.0, 127.0) as i8) as u8;
        }
        rb.scale[gi] = d16;
    }
}

fn decode_row(ty: GgmlType, src: &[u8], rb: &mut RowBuf) {
    let bb = ty.block_bytes();
    for (b, blk) in src.chunks_exact(bb).enumerate() {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let off = if ty == GgmlType::Q4_0 { 2 } else { 4 };
                let d = f16_at(blk, 0);
                rb.scale[b] = d;
                rb.min[b] = if ty == GgmlType::Q4_0 {
                    -8.0 * d
                } else {
                    f16_at(blk, 2)
                };
                for j in 0..16 {
                    rb.q[32 * b + j] = blk[off + j] & 15;
                    rb.q[32 * b + j + 16] = blk[off + j] >> 4;
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let (d, m, qh, qs) = q5_fields(ty, blk);
                rb.scale[b] = d;
                rb.min[b] = m.unwrap_or(-16.0 * d); // Q5_0's is derived, not stored
                for (e, q) in rb.q[32 * b..32 * b + 32].iter_mut().enumerate() {
                    *q = q5_q(qh, qs, e);
                }
            }
            GgmlType::Q8_0 => {
                rb.scale[b] = f16_at(blk, 0);
                rb.q[32 * b..32 * b + 32].copy_from_slice(&blk[2..34]);
            }
            GgmlType::Q8_K => {
                let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                for gi in 0..8 {
                    rb.scale[8 * b + gi] = d;
                }
                rb.q[256 * b..256 * b + 256].copy_from_slice(&blk[4..260]);
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin, scales, qh, qs) = k45_fields(ty, blk);
                for j in 0..8 {
                    let (sc, mn) = k4_scale_min(j, scales);
                    rb.scale[8 * b + j] = d * sc as f32;
                    rb.min[8 * b + j] = -dmin * mn as f32;
                }
                for (e, q) in rb.q[256 * b..256 * b + 256].iter_mut().enumerate() {
                    *q = k45_q(qh, qs, e);
                }
            }
            GgmlType::Q6_K => {
                let d = f16_at(blk, 208);
                for j in 0..16 {
                    rb.scale[16 * b + j] = d * (blk[192 + j] as i8) as f32;
                }
                for e in 0..256 {
                    rb.q[256 * b + e] = q6k_q(blk, e);
                }
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                unreachable!("float rows are quantized by the caller")
            }
        }
    }
}
