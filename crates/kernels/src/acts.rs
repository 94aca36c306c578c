//! Activations quantized to signed 8-bit blocks of 32 per row, as llama.cpp does for its
//! Q8_0/Q8_1 dot products (`d = amax / 127`, `q = round(x / d)`), kept in a layout the kernels
//! read without shuffles: besides the quants, every 4-element "lane" (one 32-bit SIMD lane of
//! a `vpdpbusd`/`pmaddubsw` result) carries its block's scale `d` and `d * (sum of its 4 q)`,
//! which turns a weight block's min (Q4_1, Q5_1, Q4_K, Q5_K, the zero points of Q5_0/Q6_K) into
//! one fused multiply-add. One scale per 32 elements is at least as precise as Q8_K's one per 256,
//! so K-quant weights use the same activation blocks.

use crate::lines::Lines;
use crate::{Error, ThreadPool};
use std::sync::Mutex;

/// `v` in pieces of `n`, then empty pieces without end (so that an empty `v` zips with the
/// other buffers' pieces).
fn pieces_or_empty<T>(v: &mut [T], n: usize) -> impl Iterator<Item = &mut [T]> {
    v.chunks_mut(n.max(1))
        .chain(std::iter::repeat_with(|| &mut [][..]))
}

/// One piece of rows of the input and of every output buffer.
struct RowsMut<'a> {
    x: &'a [f32],
    qs: &'a mut [i8],
    ls: &'a mut [f32],
    lsum: &'a mut [f32],
    bsum: &'a mut [f32],
    isum: &'a mut [i32],
    t_scale: &'a mut [f32],
    t_bsum: &'a mut [f32],
    t_isum: &'a mut [i32],
    hsum: &'a mut [i32],
    t_hsum: &'a mut [i32],
}

/// Quantized activation rows; allocate once and reuse (re-quantizing never reallocates once
/// the buffers have grown to the largest shape seen).
#[derive(Debug, Default, Clone)]
pub struct QActs {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) kp: usize,
    /// On cache lines (see `lines`): rows are a multiple of 64 bytes, so every row starts on
    /// one.
    pub(crate) qs: Lines<i8>,
    /// `rows * kp / 4`: the block scale of each lane.
    pub(crate) lane_scale: Vec<f32>,
    /// `rows * kp / 4`: `d * (q0 + q1 + q2 + q3)` of each lane.
    pub(crate) lane_sum: Vec<f32>,
    /// `rows * kp / 32`: `d * (sum of the block's 32 q)` rounded to f16 (llama.cpp's Q8_1 `s`),
    /// for kernels that add a weight group's offset once per group rather than per lane.
    pub(crate) block_sum: Vec<f32>,
    /// `rows * kp / 32`: the exact sum of each block's 32 q (the interleaved 8-bit kernel
    /// takes `128 * sum` off its dot against weights stored as `q + 128`).
    pub(crate) block_isum: Vec<i32>,
    /// `rows * kp / 16`: the exact sum of each 16 q (Q6_K's zero point of 32 per 16 elements is
    /// taken off its integer dots as `32 * sum`).
    pub(crate) half_isum: Vec<i32>,
    /// The block scales, `block_sum`, `block_isum` and `half_isum` again, arranged per 16-row chunk and
    /// block: element `(chunk * blocks + b) * 16 + row % 16`. The AMX epilogue reads the 16
    /// rows of one block at fixed offsets from one pointer. Rows padded to a multiple of 16.
    pub(crate) t_scale: Vec<f32>,
    pub(crate) t_bsum: Vec<f32>,
    pub(crate) t_isum: Vec<i32>,
    /// `half_isum` per chunk, block and half: element `((chunk * blocks + b) * 2 + h) * 16 +
    /// row % 16`.
    pub(crate) t_hsum: Vec<i32>,
}

impl QActs {
    pub fn new() -> QActs {
        QActs::default()
    }

    /// Preallocates for up to `rows` rows of `cols` columns.
    pub fn with_capacity(rows: usize, cols: usize) -> QActs {
        let kp = cols.div_ceil(64).max(1) * 64;
        QActs {
            rows: 0,
            cols: 0,
            kp: 0,
            qs: Lines::with_capacity(rows * kp),
            lane_scale: Vec::with_capacity(rows * kp / 4),
            lane_sum: Vec::with_capacity(rows * kp / 4),
            block_sum: Vec::with_capacity(rows * kp / 32),
            block_isum: Vec::with_capacity(rows * kp / 32),
            t_scale: Vec::with_capacity(rows.div_ceil(16) * 16 * kp / 32),
            t_bsum: Vec::with_capacity(rows.div_ceil(16) * 16 * kp / 32),
            t_isum: Vec::with_capacity(rows.div_ceil(16) * 16 * kp / 32),
            half_isum: Vec::with_capacity(rows * kp / 16),
            t_hsum: Vec::with_capacity(rows.div_ceil(16) * 16 * kp / 16),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quantizes `rows` rows of `cols` floats (row-major `x`).
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) -> Result<(), Error> {
        self.quantize_on(x, rows, cols, None)
    }

    /// Like [`QActs::quantize`], with the rows spread over `pool` when there are enough of them
    /// to pay for it (a prompt's rows; a decode step's one row stays on the caller). Each row
    /// is quantized alone, so the result is the same either way.
    pub fn quantize_on(
        &mut self,
        x: &[f32],
        rows: usize,
        cols: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<(), Error> {
        if x.len() != rows * cols {
            return Err(Error::ShapeMismatch {
                what: "QActs::quantize input length",
                expected: rows * cols,
                got: x.len(),
            });
        }
        let kp = cols.div_ceil(64).max(1) * 64;
        self.rows = rows;
        self.cols = cols;
        self.kp = kp;
        self.qs.zeroed(rows * kp);
        self.lane_scale.clear();
        self.lane_scale.resize(rows * kp / 4, 0.0);
        self.lane_sum.clear();
        self.lane_sum.resize(rows * kp / 4, 0.0);
        self.block_sum.clear();
        self.block_sum.resize(rows * kp / 32, 0.0);
        self.block_isum.clear();
        self.block_isum.resize(rows * kp / 32, 0);
        self.half_isum.clear();
        self.half_isum.resize(rows * kp / 16, 0);
        // The chunk-arranged copies only for what AMX reads: batches of 16 rows or more (a
        // decode step's few rows skip them).
        let blocks = kp / 32;
        let padded = if rows >= 16 {
            rows.div_ceil(16) * 16
        } else {
            0
        };
        for t in [&mut self.t_scale, &mut self.t_bsum] {
            t.clear();
            t.resize(padded * blocks, 0.0);
        }
        for t in [&mut self.t_isum, &mut self.t_hsum] {
            t.clear();
        }
        self.t_isum.resize(padded * blocks, 0);
        self.t_hsum.resize(padded * 2 * blocks, 0);
        let threads = pool.map_or(1, ThreadPool::threads);
        // About 4 pieces a thread, of whole 16-row chunks (so that each piece's part of the
        // chunk-arranged copies is one range).
        let per = rows.div_ceil(4 * threads).div_ceil(16).max(1) * 16;
        let pieces: Vec<Mutex<RowsMut<'_>>> = x
            .chunks((per * cols).max(1))
            .zip(self.qs.chunks_mut(per * kp))
            .zip(self.lane_scale.chunks_mut(per * kp / 4))
            .zip(self.lane_sum.chunks_mut(per * kp / 4))
            .zip(self.block_sum.chunks_mut(per * kp / 32))
            .zip(self.block_isum.chunks_mut(per * kp / 32))
            .zip(pieces_or_empty(&mut self.t_scale, per * blocks))
            .zip(pieces_or_empty(&mut self.t_bsum, per * blocks))
            .zip(pieces_or_empty(&mut self.t_isum, per * blocks))
            .zip(self.half_isum.chunks_mut(per * kp / 16))
            .zip(pieces_or_empty(&mut self.t_hsum, per * 2 * blocks))
            .map(
                |(
                    (((((((((x, qs), ls), lsum), bsum), isum), t_scale), t_bsum), t_isum), hsum),
                    t_hsum,
                )| {
                    Mutex::new(RowsMut {
                        x,
                        qs,
                        ls,
                        lsum,
                        bsum,
                        isum,
                        t_scale,
                        t_bsum,
                        t_isum,
                        hsum,
                        t_hsum,
                    })
                },
            )
            .collect();
        let job = |i: usize| {
            let mut p = pieces[i].lock().unwrap_or_else(|e| e.into_inner());
            let p = &mut *p;
            for r in 0..p.x.len() / cols.max(1) {
                crate::ops::quantize_row(
                    &p.x[r * cols..(r + 1) * cols],
                    crate::ops::QuantRow {
                        q: &mut p.qs[r * kp..(r + 1) * kp],
                        lane_scale: &mut p.ls[r * kp / 4..(r + 1) * kp / 4],
                        lane_sum: &mut p.lsum[r * kp / 4..(r + 1) * kp / 4],
                        block_sum: &mut p.bsum[r * kp / 32..(r + 1) * kp / 32],
                        block_isum: &mut p.isum[r * kp / 32..(r + 1) * kp / 32],
                        half_isum: &mut p.hsum[r * kp / 16..(r + 1) * kp / 16],
                    },
                );
                if p.t_scale.is_empty() {
                    continue;
                }
                for b in 0..blocks {
                    let t = ((r / 16) * blocks + b) * 16 + r % 16;
                    p.t_scale[t] = p.ls[r * kp / 4 + 8 * b];
                    p.t_bsum[t] = p.bsum[r * blocks + b];
                    p.t_isum[t] = p.isum[r * blocks + b];
                    for h in 0..2 {
                        let th = (((r / 16) * blocks + b) * 2 + h) * 16 + r % 16;
                        p.t_hsum[th] = p.hsum[r * 2 * blocks + 2 * b + h];
                    }
                }
            }
        };
        match pool {
            Some(pool) if pieces.len() > 1 => pool.run(pieces.len(), &job),
            _ => (0..pieces.len()).for_each(job),
        }
        Ok(())
    }

    /// The dequantized value of element `e` of row `r` (tests and references).
    pub fn value(&self, r: usize, e: usize) -> f32 {
        self.qs[r * self.kp + e] as f32 * self.lane_scale[(r * self.kp + e) / 4]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_activations_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..2 * 100)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut a = QActs::new();
        a.quantize(&x, 2, 100).unwrap();
        for r in 0..2 {
            for b in 0..4 {
                let blk = &x[r * 100 + 32 * b..(r * 100 + (32 * b + 32).min(100))];
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (j, &v) in blk.iter().enumerate() {
                    assert!((a.value(r, 32 * b + j) - v).abs() <= amax / 254.0 + 1e-7);
                }
            }
            // padding reads as zero
            assert_eq!(a.value(r, 120), 0.0);
        }
    }

    #[test]
    fn zero_block_quantizes_to_zero_scale() {
        let mut a = QActs::new();
        a.quantize(&[0.0; 64], 1, 64).unwrap();
        assert!(a.qs.iter().all(|&q| q == 0));
        assert!(a.lane_scale.iter().all(|&d| d == 0.0));
    }

    #[test]
    fn quantizing_on_a_pool_gives_the_serial_result() {
        let x: Vec<f32> = (0..37 * 200)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.01)
            .collect();
        let pool = ThreadPool::new(3);
        let (mut serial, mut pooled) = (QActs::new(), QActs::new());
        serial.quantize(&x, 37, 200).unwrap();
        pooled.quantize_on(&x, 37, 200, Some(&pool)).unwrap();
        assert_eq!(&*serial.qs, &*pooled.qs);
        assert_eq!(serial.lane_scale, pooled.lane_scale);
        assert_eq!(serial.lane_sum, pooled.lane_sum);
        assert_eq!(serial.block_sum, pooled.block_sum);
        assert_eq!(serial.block_isum, pooled.block_isum);
        assert_eq!(serial.t_scale, pooled.t_scale);
        assert_eq!(serial.t_bsum, pooled.t_bsum);
        assert_eq!(serial.t_isum, pooled.t_isum);
        assert_eq!(serial.half_isum, pooled.half_isum);
        assert_eq!(serial.t_hsum, pooled.t_hsum);
        // The chunk arrangement holds each row's block values.
        for r in [0, 15, 16, 36] {
            for b in 0..serial.kp / 32 {
                let t = ((r / 16) * (serial.kp / 32) + b) * 16 + r % 16;
                assert_eq!(
                    serial.t_scale[t],
                    serial.lane_scale[r * serial.kp / 4 + 8 * b]
                );
                assert_eq!(serial.t_bsum[t], serial.block_sum[r * serial.kp / 32 + b]);
                assert_eq!(serial.t_isum[t], serial.block_isum[r * serial.kp / 32 + b]);
            }
        }
        assert!(pooled.qs.iter().any(|&q| q != 0));
    }

    #[test]
    fn rows_fewer_than_a_tile_skip_the_chunk_copies() {
        let mut a = QActs::new();
        a.quantize(&[0.5; 3 * 64], 3, 64).unwrap();
        assert!(a.t_scale.is_empty() && a.t_hsum.is_empty());
        assert_eq!(a.half_isum.len(), 3 * 4);
        a.quantize(&[0.5; 17 * 64], 17, 64).unwrap();
        assert_eq!(a.t_scale.len(), 32 * 2);
    }

    #[test]
    fn wrong_input_length_is_an_error() {
        let mut a = QActs::new();
        assert!(a.quantize(&[0.0; 10], 1, 64).is_err());
    }
}
