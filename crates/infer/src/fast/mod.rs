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
use half::slice::HalfFloatSliceExt;
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
    /// What the attention rounds to f16 (see [`KvPrecision`]).
    pub(crate) kv: KvPrecision,
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

    fn kv_value_bytes(&self) -> usize {
        self.kv.value_bytes()
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
        let f16_kv = kv.rounds_to_f16();
        let (e, hd, nh, eps) = (hp.n_embd, hp.head_dim, hp.n_head, hp.rms_eps);
        let (qd, kvd, ff) = (nh * hd, hp.kv_dim(), hp.n_ff);
        let qkv_w = qd + 2 * kvd;
        let group = nh / hp.n_head_kv;
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
            for (r, &(si, pos)) in s.rows.iter().enumerate() {
                let row = &mut qkv[r * qkv_w..(r + 1) * qkv_w];
                if let Some(bias) = &layer.qkv_bias {
                    row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
                }
                let (q, kv) = row.split_at_mut(qd);
                let (k, v) = kv.split_at_mut(kvd);
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
                if f16_kv {
                    // An f16 cache keeps K/V at f16 precision, and without flash attention
                    // llama.cpp converts Q to f16 for the Q·K products (the f16 cache's vec-dot
                    // type).
                    ops::round_to_f16(k);
                    ops::round_to_f16(v);
                    ops::round_to_f16(q);
                }
                let c = steps[si].seq.host_mut().expect(HOST_CHECKED);
                let at = pos * kvd..(pos + 1) * kvd;
                match (c.k.f16_mut(il), c.v.f16_mut(il)) {
                    (Some(kc), Some(vc)) => {
                        // Exact: the values were rounded to f16 above.
                        kc[at.clone()].convert_from_f32_slice(k);
                        vc[at].convert_from_f32_slice(v);
                    }
                    _ => {
                        c.k[il][at.clone()].copy_from_slice(k);
                        c.v[il][at].copy_from_slice(v);
                    }
                }
            }
            let att = fit(&mut s.att, n * qd);
            {
                let steps_ro: &[Step<'_>] = steps;
                let rows = &s.rows;
                let qkv: &[f32] = qkv;
                let (scale, window) = (*attn_scale, layer.window);
                // The keys a row at `pos` attends: all before it, or its sliding window's.
                let keys =
                    |pos: usize| (window.map_or(0, |w| (pos + 1).saturating_sub(w)), pos + 1);
                // Query heads `first..first + out.len() / hd` of row `r`, all of one KV head.
                let attend_heads = |r: usize, first: usize, out: &mut [f32]| {
                    let (si, pos) = rows[r];
                    let c = steps_ro[si].seq.host().expect(HOST_CHECKED);
                    let kvh = first / group;
                    let (start, end) = keys(pos);
                    let q = &qkv[r * qkv_w + first * hd..r * qkv_w + first * hd + out.len()];
                    if let (Some(k), Some(v)) = (c.k.f16(il), c.v.f16(il)) {
                        let (k, v) = (&k[kvh * hd..], &v[kvh * hd..]);
                        ops::attend(q, hd, k, v, kvd, start, end, scale, f16_kv, out);
                        return;
                    }
                    ops::attend(
                        q,
                        hd,
                        &c.k[il][kvh * hd..],
                        &c.v[il][kvh * hd..],
                        kvd,
                        start,
                        end,
                        scale,
                        f16_kv,
                        out,
                    );
                };
                // Rows `first..first + out.len() / qd` (one sequence's, consecutive positions)
                // for KV head `kvh`: together, so each block of its keys and values is read
                // once for all of them (bit-identical to row by row).
                let attend_run = |first: usize, kvh: usize, out: &mut [f32]| {
                    let count = out.len() / qd;
                    let c = steps_ro[rows[first].0].seq.host().expect(HOST_CHECKED);
                    let mut ranges = [(0, 0); MAX_ROWS_PER_PIECE];
                    for (range, &(_, pos)) in ranges.iter_mut().zip(&rows[first..first + count]) {
                        *range = keys(pos);
                    }
                    let run = ops::RowRun {
                        q: &qkv[first * qkv_w + kvh * group * hd..],
                        q_stride: qkv_w,
                        ranges: &ranges[..count],
                        heads: group,
                        hd,
                        scale,
                        f16_weights: f16_kv,
                    };
                    let out = &mut out[kvh * group * hd..];
                    let at = kvh * hd..;
                    if let (Some(k), Some(v)) = (c.k.f16(il), c.v.f16(il)) {
                        ops::attend_rows(&run, &k[at.clone()], &v[at], kvd, out, qd);
                    } else {
                        ops::attend_rows(&run, &c.k[il][at.clone()], &c.v[il][at], kvd, out, qd);
                    }
                };
                let threads = kern.pool.threads();
                if n * hp.n_head_kv >= 4 * threads {
                    // Enough rows: one piece per few rows, and inside it one KV head at a time
                    // over all of them (its query heads together), so that head's keys and
                    // values, read from memory for the first row, come from the core's cache
                    // for the rest of a prefill chunk's rows instead of being read again for
                    // each (the whole cache of a long prompt does not fit; one head's does).
                    let rows_per_piece = (n / (4 * threads)).clamp(1, MAX_ROWS_PER_PIECE);
                    kern.pool
                        .for_each_piece_mut(att, rows_per_piece * qd, &|i, out| {
                            let first = i * rows_per_piece;
                            let count = out.len() / qd;
                            for kvh in 0..hp.n_head_kv {
                                // Runs of rows of one sequence (a prefill chunk's).
                                let mut r0 = 0;
                                while r0 < count {
                                    let si = rows[first + r0].0;
                                    let r1 = (r0 + 1..count)
                                        .find(|&r| rows[first + r].0 != si)
                                        .unwrap_or(count);
                                    attend_run(first + r0, kvh, &mut out[r0 * qd..r1 * qd]);
                                    r0 = r1;
                                }
                            }
                        });
                } else if n * hp.n_head_kv >= threads {
                    // Few rows (decode): one piece per row and KV head, its query heads together,
                    // so the head's keys and values are read from memory once for all of them
                    // (decode after 2,048 tokens: +12% on SmolLM2, three query heads per KV head).
                    let nkv = hp.n_head_kv;
                    kern.pool.for_each_piece_mut(att, group * hd, &|i, out| {
                        attend_heads(i / nkv, (i % nkv) * group, out)
                    });
                } else {
                    // Fewer KV heads than threads: one piece per query head keeps them all busy.
                    kern.pool
                        .for_each_piece_mut(att, hd, &|i, out| attend_heads(i / nh, i % nh, out));
                }
            }
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
            let h = fit(&mut s.h, n * e);
            norm_rows(&s.x[..n * e], &layer.ffn_norm, eps, h, &kern.pool);
            s.acts.quantize_on(h, n, e, Some(&kern.pool))?;
            let gu = fit(&mut s.gu, n * 2 * ff);
            layer.gate_up.run(kern, &s.acts, gu, &mut s.tmp)?;
            let f = fit(&mut s.ff, n * ff);
            let gu: &[f32] = gu;
            let per = rows_per_piece(n, kern.pool.threads());
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
            s.acts.quantize_on(f, n, ff, Some(&kern.pool))?;
            let proj = fit(&mut s.proj, n * e);
            kern.matmul(&layer.down, &s.acts, proj)?;
            if let Some(w) = &layer.post_ffn_norm {
                norm_rows_in_place(proj, w, eps, fit(&mut s.tmp, e));
            }
            for (xv, &pv) in s.x[..n * e].iter_mut().zip(proj.iter()) {
                *xv += pv;
            }
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
