//! The hand-written CPU forward (backend "fast") for GGUF models of the llama family (with
//! Llama 3's RoPE factors), Qwen2, Qwen3, Phi-3 and Gemma 3, on `hearth-kernels`.
//!
//! - Weights are read once from the GGUF file (streamed through a small buffer, no mmap kept)
//!   and repacked for the SIMD kernels; Q/K/V and gate/up are fused into one matrix each when
//!   their block types agree, so one pass over the activations feeds all of them.
//! - Every row of the batch (prefill chunks and single decode tokens alike) goes through the
//!   projections and MLP as one matrix product in which each weight block loaded is used for
//!   every row.
//! - K/V go straight into each [`Sequence`](crate::Sequence)'s preallocated cache (layout
//!   `[position][kv_head][head_dim]`, K after RoPE, shared with the candle backend); attention
//!   reads the contiguous cache per (row, head) on the kernel pool.
//! - All intermediate buffers live in [`Scratch`] and only grow: once a batch shape has been
//!   seen, a step performs no heap allocation and no per-op dispatch beyond the kernels.
//!
//! Numerics follow the candle backend (and llama.cpp): RMSNorm, RoPE with angles computed by
//! repeated multiplication as ggml does (interleaved pairs for llama GGUF, NeoX for Gemma),
//! SwiGLU / GELU-tanh gates, activations quantized to 8-bit blocks before each product.
//! Attention runs in f32 by default; with [`KvPrecision::F16`] K/V are kept at f16 precision
//! and Q and the softmax weights rounded to f16, as llama.cpp's default f16 KV cache does.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, TensorInfo};
use candle_core::quantized::GgmlDType;
use hearth_kernels::{matmul, ops, GgmlType, KernelPath, QActs, QMatrix, ThreadPool};

use crate::attn::{self, RopeScaling, RopeStyle};
use crate::config::KvPrecision;
use crate::gguf::{Activation, Arch, Hparams};
use crate::model::{Backend, Step};
use crate::sequence::{Maker, Sequence};
use crate::Error;

/// Every step's cache is a host one: `forward` checks it before anything else.
const HOST_CHECKED: &str = "host caches, checked at the start of the step";

/// Most rows of a step one attention piece takes (a KV head's keys stay in cache across them).
const MAX_ROWS_PER_PIECE: usize = 32;

mod attention;
#[cfg(test)]
mod kv_tests;
mod load;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
pub(crate) use load::from_gguf;
pub(crate) use load::from_gguf_on;

/// A projection whose output columns are the concatenation of one or more weight matrices.
enum Proj {
    Fused(QMatrix),
    /// Parts with different block types, run one after another.
    Split(Vec<QMatrix>),
}

impl Proj {
    fn out_dim(&self) -> usize {
        match self {
            Proj::Fused(m) => m.rows(),
            Proj::Split(ms) => ms.iter().map(|m| m.rows()).sum(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Proj::Fused(m) => m.bytes(),
            Proj::Split(ms) => ms.iter().map(|m| m.bytes()).sum(),
        }
    }

    /// `out` is `[n, out_dim]`; `tmp` is scratch for the split case.
    fn run(&self, k: &Kern, a: &QActs, out: &mut [f32], tmp: &mut Vec<f32>) -> Result<(), Error> {
        match self {
            Proj::Fused(m) => k.matmul(m, a, out),
            Proj::Split(ms) => {
                let n = a.rows();
                let total = self.out_dim();
                let mut col = 0;
                for m in ms {
                    let t = fit(tmp, n * m.rows());
                    k.matmul(m, a, t)?;
                    for r in 0..n {
                        out[r * total + col..r * total + col + m.rows()]
                            .copy_from_slice(&t[r * m.rows()..(r + 1) * m.rows()]);
                    }
                    col += m.rows();
                }
                Ok(())
            }
        }
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    /// Output columns `[q | k | v]`.
    qkv: Proj,
    /// Added to the `[q | k | v]` row (Qwen2).
    qkv_bias: Option<Vec<f32>>,
    wo: QMatrix,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    /// Output columns `[gate | up]`.
    gate_up: Proj,
    down: QMatrix,
    post_ffn_norm: Option<Vec<f32>>,
    /// Index into `FastModel::rope_bases`.
    rope: usize,
    window: Option<usize>,
}

/// The kernel path and pool every product runs on.
struct Kern {
    path: KernelPath,
    pool: ThreadPool,
}

impl Kern {
    fn matmul(&self, w: &QMatrix, a: &QActs, out: &mut [f32]) -> Result<(), Error> {
        Ok(matmul(self.path, w, a, out, &self.pool)?)
    }
}

/// Buffers reused by every step; they grow to the largest batch seen and never shrink.
#[derive(Default)]
struct Scratch {
    /// (step index, absolute position) of each row.
    rows: Vec<(usize, usize)>,
    /// Row index of each output row (each step's last `outputs[i]` tokens), in order.
    last: Vec<usize>,
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gu: Vec<f32>,
    ff: Vec<f32>,
    fin: Vec<f32>,
    tmp: Vec<f32>,
    /// Per RoPE base: `(cos, sin)` for `[row][pair]`.
    cs: Vec<Vec<(f32, f32)>>,
    acts: QActs,
}

/// `v[..len]`, growing `v` if needed (no allocation once it is large enough).
fn fit(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

pub(crate) struct FastModel {
    hp: Hparams,
    kern: Kern,
    embd: QMatrix,
    /// `None`: tied to the embeddings.
    output: Option<QMatrix>,
    norm: Vec<f32>,
    layers: Vec<Layer>,
    rope_style: RopeStyle,
    rope_bases: Vec<f32>,
    /// Llama 3's or LongRoPE's factors, linear scaling, LongRoPE's attention factor.
    rope_scaling: RopeScaling,
    embed_scale: Option<f32>,
    activation: Activation,
    attn_scale: f32,
    /// The caches' precision, and so the attention's (see [`KvPrecision`]; [`Self::set_kv`]).
    kv: KvPrecision,
    /// Stamped on every sequence this model makes.
    pub(crate) maker: Maker,
    s: Scratch,
}

fn ggml_type(name: &str, t: GgmlDType) -> Result<GgmlType, Error> {
    Ok(match t {
        GgmlDType::F32 => GgmlType::F32,
        GgmlDType::F16 => GgmlType::F16,
        GgmlDType::BF16 => GgmlType::BF16,
        GgmlDType::Q4_0 => GgmlType::Q4_0,
        GgmlDType::Q4_1 => GgmlType::Q4_1,
        GgmlDType::Q5_0 => GgmlType::Q5_0,
        GgmlDType::Q5_1 => GgmlType::Q5_1,
        GgmlDType::Q8_0 => GgmlType::Q8_0,
        GgmlDType::Q4K => GgmlType::Q4_K,
        GgmlDType::Q5K => GgmlType::Q5_K,
        GgmlDType::Q6K => GgmlType::Q6_K,
        GgmlDType::Q8K => GgmlType::Q8_K,
        other => {
            return Err(Error::metadata(
                name,
                format!("block type {other:?} is not supported by the fast backend (use backend = \"candle\")"),
            ))
        }
    })
}

impl FastModel {
    /// Bytes of packed weights held.
    pub(crate) fn weights_bytes(&self) -> u64 {
        let mut b = self.embd.bytes() + self.output.as_ref().map_or(0, |m| m.bytes());
        for l in &self.layers {
            b += l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes();
        }
        b as u64
    }

    /// Sets the caches' precision for sequences made from now on. A quantized cache needs
    /// heads of whole blocks of 32 (at most `ops::MAX_QUANT_HEAD`), as llama.cpp's does.
    pub(crate) fn set_kv(&mut self, kv: KvPrecision) -> Result<(), Error> {
        let hd = self.hp.head_dim;
        let block = KvPrecision::QUANT_BLOCK;
        if kv.quant().is_some() && (!hd.is_multiple_of(block) || hd > ops::MAX_QUANT_HEAD) {
            return Err(Error::InvalidConfig {
                key: "kv_precision",
                reason: format!(
                    "{} stores blocks of {block} values and this model's heads are {hd} wide; use f16 or f32",
                    kv.name()
                ),
            });
        }
        self.kv = kv;
        Ok(())
    }

    /// Forces a kernel path (tests compare paths); refuses one the CPU lacks.
    #[cfg(test)]
    pub(crate) fn set_kernel_path(&mut self, path: KernelPath) -> bool {
        if path.is_available() {
            self.kern.path = path;
        }
        path.is_available()
    }
}

fn rope_head(x: &mut [f32], cs: &[(f32, f32)], style: RopeStyle) {
    let half = cs.len();
    for (i, &(c, s)) in cs.iter().enumerate() {
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/// RMSNorm of each `dim`-wide row of `x` into `out`.
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], pool: &ThreadPool) {
    let dim = w.len();
    let per = rows_per_piece(x.len() / dim.max(1), pool.threads());
    pool.for_each_piece_mut(out, per * dim, &|i, op| {
        let xs = &x[i * per * dim..];
        for (xr, or) in xs.chunks_exact(dim).zip(op.chunks_exact_mut(dim)) {
            ops::rms_norm(xr, w, eps, or);
        }
    });
}

/// Rows per piece when a row-wise step is spread over the pool: about four pieces a thread,
/// at least 4 rows a piece (a decode step's few rows stay on the caller).
fn rows_per_piece(rows: usize, threads: usize) -> usize {
    rows.div_ceil(4 * threads).max(4)
}

/// Rows whose MLP runs at once. Its scratch (gate and up, `2 * ff` floats a row, then the gated
/// `ff`) is the largest of a step: at 512 prompt rows of Llama 3.1 8B's width, 88 MB. In blocks
/// of this many rows it is a quarter of that, and the weights, read once per block, cost little
/// beside the arithmetic of 128 rows. A multiple of every tile's activation rows (8, AMX's 16),
/// so each row meets the same tiles as in one pass: the result is the same.
const MLP_ROWS: usize = 128;

/// The MLP of `layer` for the step's `n` rows (`s.x`, `n x e`), added onto `s.x`, in blocks of
/// [`MLP_ROWS`].
#[allow(clippy::too_many_arguments)]
fn mlp(
    layer: &Layer,
    kern: &Kern,
    activation: Activation,
    eps: f32,
    s: &mut Scratch,
    n: usize,
    e: usize,
    ff: usize,
) -> Result<(), Error> {
    for r0 in (0..n).step_by(MLP_ROWS) {
        let b = MLP_ROWS.min(n - r0);
        let x = &mut s.x[r0 * e..(r0 + b) * e];
        let h = fit(&mut s.h, b * e);
        norm_rows(x, &layer.ffn_norm, eps, h, &kern.pool);
        s.acts.quantize_on(h, b, e, Some(&kern.pool))?;
        let gu = fit(&mut s.gu, b * 2 * ff);
        layer.gate_up.run(kern, &s.acts, gu, &mut s.tmp)?;
        let f = fit(&mut s.ff, b * ff);
        let gu: &[f32] = gu;
        let per = rows_per_piece(b, kern.pool.threads());
        kern.pool.for_each_piece_mut(f, per * ff, &|i, fp| {
            for (rr, fr) in fp.chunks_exact_mut(ff).enumerate() {
                let r = i * per + rr;
                let (g, u) = gu[r * 2 * ff..(r + 1) * 2 * ff].split_at(ff);
                match activation {
                    Activation::Silu => ops::silu_mul(g, u, fr),
                    Activation::GeluTanh => ops::gelu_tanh_mul(g, u, fr),
                }
            }
        });
        s.acts.quantize_on(f, b, ff, Some(&kern.pool))?;
        let proj = fit(&mut s.proj, b * e);
        kern.matmul(&layer.down, &s.acts, proj)?;
        if let Some(w) = &layer.post_ffn_norm {
            norm_rows_in_place(proj, w, eps, fit(&mut s.tmp, e));
        }
        for (xv, &pv) in x.iter_mut().zip(proj.iter()) {
            *xv += pv;
        }
    }
    Ok(())
}

/// RMSNorm of each `dim`-wide row of `x` in place.
fn norm_rows_in_place(x: &mut [f32], w: &[f32], eps: f32, tmp: &mut [f32]) {
    let dim = w.len();
    for xr in x.chunks_exact_mut(dim) {
        let t = &mut tmp[..dim];
        ops::rms_norm(xr, w, eps, t);
        xr.copy_from_slice(t);
    }
}

impl Backend for FastModel {
    fn name(&self) -> &'static str {
        "fast"
    }

    fn new_sequence(
        &self,
        layers: usize,
        kv_dim: usize,
        capacity: usize,
    ) -> Result<Sequence, Error> {
        Sequence::on_host(&self.maker, layers, kv_dim, capacity, self.kv)
    }

    fn kv_bytes(&self, values: usize) -> usize {
        self.kv.bytes(values)
    }

    /// Its own host caches, of its precision or f32 (which holds any value; an f16 cache under
    /// f32 attention would lose precision).
    fn accepts(&self, seq: &Sequence) -> bool {
        seq.made_by(&self.maker)
            && seq
                .host()
                .is_some_and(|c| c.k.elem() == self.kv || c.k.elem() == KvPrecision::F32)
    }

    fn forward(
        &mut self,
        steps: &mut [Step<'_>],
        outputs: &[usize],
        logits: &mut Vec<f32>,
    ) -> Result<(), Error> {
        self.run(steps, outputs, Out::Logits(logits))
    }

    fn hidden(&mut self, steps: &mut [Step<'_>], out: &mut Vec<f32>) -> Result<(), Error> {
        self.run(steps, &[], Out::Hidden(out))
    }
}

/// What a forward pass gives back.
enum Out<'a> {
    /// The logits of each step's last `outputs[i]` rows.
    Logits(&'a mut Vec<f32>),
    /// Every row's final normed hidden state.
    Hidden(&'a mut Vec<f32>),
}

impl FastModel {
    /// Runs `steps`; `outputs` (one per step, for `Out::Logits`) says how many of each step's
    /// last rows give logits.
    fn run(
        &mut self,
        steps: &mut [Step<'_>],
        outputs: &[usize],
        out: Out<'_>,
    ) -> Result<(), Error> {
        let FastModel {
            hp,
            kern,
            embd,
            output,
            norm,
            layers,
            rope_style,
            rope_bases,
            rope_scaling,
            embed_scale,
            activation,
            attn_scale,
            kv,
            maker: _,
            s,
        } = self;
        if let Some(step) = steps.iter().position(|st| st.seq.host().is_none()) {
            return Err(Error::ForeignSequence { step });
        }
        let (e, hd, nh, eps) = (hp.n_embd, hp.head_dim, hp.n_head, hp.rms_eps);
        let (qd, kvd, ff) = (nh * hd, hp.kv_dim(), hp.n_ff);
        let qkv_w = qd + 2 * kvd;
        let half = hd / 2;

        s.rows.clear();
        s.last.clear();
        for (si, st) in steps.iter().enumerate() {
            for i in 0..st.tokens.len() {
                s.rows.push((si, st.seq.len + i));
            }
            let wanted = crate::model::output_rows(outputs, si);
            s.last.extend(s.rows.len() - wanted..s.rows.len());
        }
        let n = s.rows.len();
        let x = fit(&mut s.x, n * e);
        {
            let mut r = 0;
            for st in steps.iter() {
                for &t in st.tokens {
                    embd.row_to_f32(t as usize, &mut x[r * e..(r + 1) * e])?;
                    r += 1;
                }
            }
        }
        if let Some(sc) = *embed_scale {
            x.iter_mut().for_each(|v| *v *= sc);
        }
        // RoPE angles per base and row, as ggml computes them (`attn::rope_angles`).
        for (b, &base) in rope_bases.iter().enumerate() {
            let cs = &mut s.cs[b];
            cs.clear();
            for &(_, pos) in &s.rows {
                attn::rope_angles(hd, pos, base, rope_scaling, cs);
            }
        }

        for (il, layer) in layers.iter().enumerate() {
            // --- attention ---
            let h = fit(&mut s.h, n * e);
            norm_rows(&s.x[..n * e], &layer.attn_norm, eps, h, &kern.pool);
            s.acts.quantize_on(h, n, e, Some(&kern.pool))?;
            let qkv = fit(&mut s.qkv, n * qkv_w);
            layer.qkv.run(kern, &s.acts, qkv, &mut s.tmp)?;
            let shape = attention::Shape {
                hd,
                n_head: nh,
                n_head_kv: hp.n_head_kv,
                qkv_w,
                scale: *attn_scale,
                window: layer.window,
                kv: *kv,
            };
            for (r, &(si, pos)) in s.rows.iter().enumerate() {
                let row = &mut qkv[r * qkv_w..(r + 1) * qkv_w];
                if let Some(bias) = &layer.qkv_bias {
                    row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
                }
                let (q, kvs) = row.split_at_mut(qd);
                let (k, v) = kvs.split_at_mut(kvd);
                let mut t = [0f32; 512];
                if let Some(w) = &layer.q_norm {
                    for qh in q.chunks_exact_mut(hd) {
                        ops::rms_norm(qh, w, eps, &mut t[..hd]);
                        qh.copy_from_slice(&t[..hd]);
                    }
                }
                if let Some(w) = &layer.k_norm {
                    for kh in k.chunks_exact_mut(hd) {
                        ops::rms_norm(kh, w, eps, &mut t[..hd]);
                        kh.copy_from_slice(&t[..hd]);
                    }
                }
                let cs = &s.cs[layer.rope][r * half..(r + 1) * half];
                for qh in q.chunks_exact_mut(hd) {
                    rope_head(qh, cs, *rope_style);
                }
                for kh in k.chunks_exact_mut(hd) {
                    rope_head(kh, cs, *rope_style);
                }
                attention::prepare_row(&shape, q, k, v);
                let c = steps[si].seq.host_mut().expect(HOST_CHECKED);
                attention::store(c, il, pos, k, v);
            }
            let att = fit(&mut s.att, n * qd);
            attention::attend_layer(&shape, steps, &s.rows, qkv, il, &kern.pool, att);
            attention::finish_rows(&shape, att);
            s.acts.quantize_on(att, n, qd, Some(&kern.pool))?;
            let proj = fit(&mut s.proj, n * e);
            kern.matmul(&layer.wo, &s.acts, proj)?;
            if let Some(w) = &layer.post_attn_norm {
                norm_rows_in_place(proj, w, eps, fit(&mut s.tmp, e));
            }
            for (xv, &pv) in s.x[..n * e].iter_mut().zip(proj.iter()) {
                *xv += pv;
            }

            // --- MLP ---
            mlp(layer, kern, *activation, eps, s, n, e, ff)?;
        }

        let logits = match out {
            Out::Logits(logits) => logits,
            Out::Hidden(hidden) => {
                hidden.clear();
                hidden.resize(n * e, 0.0);
                for (x, h) in s.x[..n * e].chunks_exact(e).zip(hidden.chunks_exact_mut(e)) {
                    ops::rms_norm(x, norm, eps, h);
                }
                return Ok(());
            }
        };
        // --- output head, each step's output rows only ---
        let ns = s.last.len();
        let fin = fit(&mut s.fin, ns * e);
        for (j, &r) in s.last.iter().enumerate() {
            ops::rms_norm(
                &s.x[r * e..(r + 1) * e],
                norm,
                eps,
                &mut fin[j * e..(j + 1) * e],
            );
        }
        s.acts.quantize(fin, ns, e)?;
        let head = output.as_ref().unwrap_or(embd);
        logits.clear();
        logits.resize(ns * head.rows(), 0.0);
        kern.matmul(head, &s.acts, logits)?;
        Ok(())
    }
}
