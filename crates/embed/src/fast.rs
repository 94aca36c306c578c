//! The BERT encoder on Hearth's own CPU kernels, for CPUs with AVX-512 BF16: the matrix
//! products in bf16 with f32 sums (`hearth_kernels::gemm_bf16`, the query, key and value
//! projections as one product), attention, layer norms and GELU in f32. Inputs are packed one
//! after another, not padded: each sequence attends over its own tokens only, and every row's
//! arithmetic is independent of the rows beside it, so an input gets the same vector alone or
//! in any batch. sentence-transformers' f32 vectors are matched to a cosine of at least 0.9999
//! (`tests/reference.rs`).

use std::sync::Mutex;

use candle_nn::VarBuilder;
use hearth_kernels::ops::{gelu_erf, layer_norm, softmax};
use hearth_kernels::{gemm_bf16, Bf16Matrix, ThreadPool};

use crate::encoder::{Hidden, Tokens};
use crate::error::Result;

struct Layer {
    qkv: Bf16Matrix,
    qkv_bias: Vec<f32>,
    out: Bf16Matrix,
    out_bias: Vec<f32>,
    norm1: (Vec<f32>, Vec<f32>),
    up: Bf16Matrix,
    up_bias: Vec<f32>,
    down: Bf16Matrix,
    down_bias: Vec<f32>,
    norm2: (Vec<f32>, Vec<f32>),
}

/// The shapes `config.json` gives.
pub(crate) struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub positions: usize,
    pub types: usize,
    pub eps: f32,
}

/// A BERT encoder's weights, ready for the kernels.
pub(crate) struct FastBert {
    shape: Shape,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    norm: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
    pool: ThreadPool,
    /// The layers' working buffers, kept between batches: fresh ones cost page faults and
    /// zeroing on every call (a batch of 32 long texts needs about 70 MB).
    scratch: Mutex<Scratch>,
}

#[derive(Default)]
struct Scratch {
    qkv: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    up: Vec<f32>,
}

fn matrix(vb: &VarBuilder, rows: usize, cols: usize, name: &str) -> Result<Vec<f32>> {
    Ok(vb
        .get((rows, cols), name)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

fn vector(vb: &VarBuilder, len: usize, name: &str) -> Result<Vec<f32>> {
    Ok(vb.get(len, name)?.to_vec1::<f32>()?)
}

impl FastBert {
    /// The encoder's weights from `vb` (under `bert.` or not), on `threads` threads.
    pub fn load(vb: &VarBuilder, shape: Shape, threads: usize) -> Result<FastBert> {
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb.clone()
        };
        let h = shape.hidden;
        let norm = |vb: &VarBuilder| -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((
                vector(vb, h, "LayerNorm.weight")?,
                vector(vb, h, "LayerNorm.bias")?,
            ))
        };
        let e = vb.pp("embeddings");
        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let a = l.pp("attention");
            let mut qkv = matrix(&a, h, h, "self.query.weight")?;
            qkv.extend(matrix(&a, h, h, "self.key.weight")?);
            qkv.extend(matrix(&a, h, h, "self.value.weight")?);
            let mut qkv_bias = vector(&a, h, "self.query.bias")?;
            qkv_bias.extend(vector(&a, h, "self.key.bias")?);
            qkv_bias.extend(vector(&a, h, "self.value.bias")?);
            layers.push(Layer {
                qkv: Bf16Matrix::from_f32(&qkv, 3 * h, h),
                qkv_bias,
                out: Bf16Matrix::from_f32(&matrix(&a, h, h, "output.dense.weight")?, h, h),
                out_bias: vector(&a, h, "output.dense.bias")?,
                norm1: norm(&a.pp("output"))?,
                up: Bf16Matrix::from_f32(
                    &matrix(&l, shape.ffn, h, "intermediate.dense.weight")?,
                    shape.ffn,
                    h,
                ),
                up_bias: vector(&l, shape.ffn, "intermediate.dense.bias")?,
                down: Bf16Matrix::from_f32(
                    &matrix(&l, h, shape.ffn, "output.dense.weight")?,
                    h,
                    shape.ffn,
                ),
                down_bias: vector(&l, h, "output.dense.bias")?,
                norm2: norm(&l.pp("output"))?,
            });
        }
        Ok(FastBert {
            word: matrix(&e, shape.vocab, h, "word_embeddings.weight")?,
            position: matrix(&e, shape.positions, h, "position_embeddings.weight")?,
            token_type: matrix(&e, shape.types, h, "token_type_embeddings.weight")?,
            norm: norm(&e)?,
            layers,
            pool: ThreadPool::new(threads),
            scratch: Mutex::default(),
            shape,
        })
    }

    /// The last layer's vectors of every input, packed.
    pub fn forward(&self, inputs: &[&Tokens]) -> Hidden {
        let h = self.shape.hidden;
        let mut starts = Vec::with_capacity(inputs.len() + 1);
        starts.push(0);
        for input in inputs {
            starts.push(starts.last().unwrap() + input.len());
        }
        let total = *starts.last().unwrap();
        let mut x = vec![0.0f32; total * h];
        for (s, input) in inputs.iter().enumerate() {
            for (j, &id) in input.ids.iter().enumerate() {
                let kind = usize::from(j >= input.second).min(self.shape.types - 1);
                let row = &mut x[(starts[s] + j) * h..][..h];
                let word = &self.word[id as usize * h..][..h];
                let pos = &self.position[j * h..][..h];
                let ty = &self.token_type[kind * h..][..h];
                for (d, r) in row.iter_mut().enumerate() {
                    *r = word[d] + pos[d] + ty[d];
                }
            }
        }
        self.norm_rows(&mut x, None, &self.norm);
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let Scratch { qkv, att, proj, up } = &mut *scratch;
        qkv.resize(total * 3 * h, 0.0);
        att.resize(total * h, 0.0);
        proj.resize(total * h, 0.0);
        up.resize(total * self.shape.ffn, 0.0);
        let (qkv, att, proj, up) = (
            &mut qkv[..total * 3 * h],
            &mut att[..total * h],
            &mut proj[..total * h],
            &mut up[..total * self.shape.ffn],
        );
        for layer in &self.layers {
            gemm_bf16(
                &layer.qkv,
                &x,
                total,
                Some(&layer.qkv_bias),
                qkv,
                Some(&self.pool),
            );
            self.attention(qkv, &starts, att);
            gemm_bf16(
                &layer.out,
                att,
                total,
                Some(&layer.out_bias),
                proj,
                Some(&self.pool),
            );
            self.norm_rows(&mut x, Some(proj), &layer.norm1);
            gemm_bf16(
                &layer.up,
                &x,
                total,
                Some(&layer.up_bias),
                up,
                Some(&self.pool),
            );
            self.pool
                .for_each_piece_mut(up, 64 * self.shape.ffn, &|_, piece| gelu_erf(piece));
            gemm_bf16(
                &layer.down,
                up,
                total,
                Some(&layer.down_bias),
                proj,
                Some(&self.pool),
            );
            self.norm_rows(&mut x, Some(proj), &layer.norm2);
        }
        Hidden {
            rows: x,
            starts,
            width: h,
        }
    }

    /// `x = LayerNorm(x + add)` row by row.
    fn norm_rows(&self, x: &mut [f32], add: Option<&[f32]>, (gamma, beta): &(Vec<f32>, Vec<f32>)) {
        let (h, eps) = (self.shape.hidden, self.shape.eps);
        let rows = 32;
        self.pool.for_each_piece_mut(x, rows * h, &|i, piece| {
            for (r, row) in piece.chunks_exact_mut(h).enumerate() {
                let add = add.map_or(&[][..], |add| &add[(i * rows + r) * h..][..h]);
                layer_norm(row, add, gamma, beta, eps);
            }
        });
    }

    /// Each sequence's rows attending over that sequence, every head; `att` gets the heads
    /// side by side.
    fn attention(&self, qkv: &[f32], starts: &[usize], att: &mut [f32]) {
        let h = self.shape.hidden;
        let heads = self.shape.heads;
        let dh = h / heads;
        let scale = 1.0 / (dh as f32).sqrt();
        let seqs = starts.len() - 1;
        let total = starts[seqs];
        // Head-major scratch, so that every (sequence, head) writes one contiguous piece.
        let mut by_head = vec![0.0f32; total * h];
        let mut pieces: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(seqs * heads);
        let mut rest: &mut [f32] = &mut by_head;
        for _ in 0..heads {
            for s in 0..seqs {
                let (piece, after) =
                    std::mem::take(&mut rest).split_at_mut((starts[s + 1] - starts[s]) * dh);
                pieces.push(Mutex::new(piece));
                rest = after;
            }
        }
        self.pool.run(seqs * heads, &|task| {
            let (head, s) = (task / seqs, task % seqs);
            let (first, len) = (starts[s], starts[s + 1] - starts[s]);
            let rows = &qkv[first * 3 * h..(first + len) * 3 * h];
            let mut out = pieces[task].lock().unwrap_or_else(|e| e.into_inner());
            attend(rows, h, head * dh, dh, scale, &mut out);
        });
        drop(pieces);
        for head in 0..heads {
            let from = &by_head[head * total * dh..][..total * dh];
            for (row, src) in from.chunks_exact(dh).enumerate() {
                att[row * h + head * dh..][..dh].copy_from_slice(src);
            }
        }
    }
}

/// One head of one sequence: `rows` are its tokens' query, key and value projections side by
/// side (`3 * h` a row), the head's columns from `at`, `dh` wide. `softmax(scale Q K^T) V` into
/// `out` (`len x dh`), the two products in bf16 with f32 sums, the softmax in f32.
fn attend(rows: &[f32], h: usize, at: usize, dh: usize, scale: f32, out: &mut [f32]) {
    let len = rows.len() / (3 * h);
    let (mut q, mut k) = (Vec::with_capacity(len * dh), Vec::with_capacity(len * dh));
    // V transposed: each of the head's columns is an output, each token an input.
    let mut vt = vec![0.0f32; dh * len];
    for (i, row) in rows.chunks_exact(3 * h).enumerate() {
        q.extend(row[at..at + dh].iter().map(|x| x * scale));
        k.extend_from_slice(&row[h + at..h + at + dh]);
        for (d, &x) in row[2 * h + at..2 * h + at + dh].iter().enumerate() {
            vt[d * len + i] = x;
        }
    }
    let mut scores = vec![0.0f32; len * len];
    gemm_bf16(
        &Bf16Matrix::from_f32(&k, len, dh),
        &q,
        len,
        None,
        &mut scores,
        None,
    );
    scores.chunks_exact_mut(len).for_each(softmax);
    gemm_bf16(
        &Bf16Matrix::from_f32(&vt, dh, len),
        &scores,
        len,
        None,
        out,
        None,
    );
}
