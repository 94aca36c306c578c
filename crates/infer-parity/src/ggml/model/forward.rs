//! The emulated forward pass: ubatches of up to 512 tokens, layer by layer, as llama.cpp
//! decodes one sequence.

use super::*;

impl GgmlModel {
    /// `out[t * rows + r] = w.row(r) · x[t]` for the `n` rows of `x` (each `w.cols` long),
    /// quantized first as ggml does.
    pub(super) fn matmul(&self, w: &RawMatrix, x: &[f32], n: usize, b: &mut Bufs, out: &mut [f32]) {
        let k_quant = w.k_quant();
        let nb = w.cols / if k_quant { 256 } else { 32 };
        b.acts.clear();
        b.kacts.clear();
        if k_quant {
            b.kacts.resize(n * nb, Q8K_ZERO);
            for (xr, ar) in x.chunks_exact(w.cols).zip(b.kacts.chunks_exact_mut(nb)) {
                quantize_row_q8_k(xr, ar);
            }
        } else {
            b.acts.resize(n * nb, Q8_ZERO);
            for (xr, ar) in x.chunks_exact(w.cols).zip(b.acts.chunks_exact_mut(nb)) {
                quantize_row_q8(xr, w.wants_sum(), ar);
            }
        }
        // Rows of the weight matrix in pieces over the pool, output transposed in `tmp`.
        b.tmp.clear();
        b.tmp.resize(w.rows * n, 0.0);
        let (acts, kacts) = (&b.acts, &b.kacts);
        const PIECE: usize = 64;
        self.pool
            .for_each_piece_mut(&mut b.tmp, PIECE * n, &|i, piece| {
                for (j, o) in piece.chunks_exact_mut(n).enumerate() {
                    let r = i * PIECE + j;
                    for (t, o) in o.iter_mut().enumerate() {
                        *o = if k_quant {
                            w.dot_k(r, &kacts[t * nb..(t + 1) * nb], t, n)
                        } else {
                            w.dot(r, &acts[t * nb..(t + 1) * nb])
                        };
                    }
                }
            });
        for r in 0..w.rows {
            for t in 0..n {
                out[t * w.rows + r] = b.tmp[r * n + t];
            }
        }
    }

    /// `get_rows` of the Q8_0 embeddings: d × q, exact.
    pub(super) fn embed(&self, tokens: &[u32], x: &mut Vec<f32>) -> Result<(), Error> {
        let (e, vocab) = (self.hp.n_embd, self.hp.vocab_size);
        x.clear();
        x.resize(tokens.len() * e, 0.0);
        for (xr, &t) in x.chunks_exact_mut(e).zip(tokens) {
            if t as usize >= vocab {
                return Err(Error::InvalidToken {
                    id: t,
                    vocab_size: vocab,
                });
            }
            for (xb, blk) in xr
                .chunks_exact_mut(32)
                .zip(self.embd.row(t as usize).chunks_exact(Q8_0_BYTES))
            {
                let d = f16_at(blk);
                for (o, &q) in xb.iter_mut().zip(&blk[2..]) {
                    *o = d * f32::from(q as i8);
                }
            }
        }
        Ok(())
    }

    /// The attention norm of `b.x` (into `b.h`) and its Q, K and V projections, in buffers taken
    /// from `b` (the caller gives them back).
    pub(super) fn attn_inputs<T: Tap>(
        &self,
        l: &Layer,
        il: usize,
        n: usize,
        b: &mut Bufs,
        tap: &mut T,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let hp = &self.hp;
        let e = hp.n_embd;
        norm_rows(&b.x, &l.attn_norm, hp.rms_eps, e, &mut b.h);
        tap.tap("attn_norm", Some(il), &b.h);
        let (mut q, mut k, mut v) = (
            take_zeroed(&mut b.q, n * hp.n_head * hp.head_dim),
            take_zeroed(&mut b.k, n * hp.kv_dim()),
            take_zeroed(&mut b.v, n * hp.kv_dim()),
        );
        let h = std::mem::take(&mut b.h);
        self.matmul(&l.wq, &h, n, b, &mut q);
        self.matmul(&l.wk, &h, n, b, &mut k);
        self.matmul(&l.wv, &h, n, b, &mut v);
        b.h = h;
        (q, k, v)
    }

    /// The attention output projection of `b.att` for `n` tokens, in a buffer taken from
    /// `b.proj` (the caller gives it back).
    pub(super) fn attn_out(&self, l: &Layer, n: usize, b: &mut Bufs) -> Vec<f32> {
        let att = std::mem::take(&mut b.att);
        let mut proj = take_zeroed(&mut b.proj, n * self.hp.n_embd);
        self.matmul(&l.wo, &att, n, b, &mut proj);
        b.att = att;
        proj
    }

    /// The MLP's gate and up projections of `b.h` for `rows` tokens, in buffers taken from
    /// `b.gate` and `b.up` (the caller gives them back).
    pub(super) fn gate_up(&self, l: &Layer, rows: usize, b: &mut Bufs) -> (Vec<f32>, Vec<f32>) {
        let ff = self.hp.n_ff;
        let h = std::mem::take(&mut b.h);
        let mut gate = take_zeroed(&mut b.gate, rows * ff);
        let mut up = take_zeroed(&mut b.up, rows * ff);
        self.matmul(&l.gate, &h, rows, b, &mut gate);
        self.matmul(&l.up, &h, rows, b, &mut up);
        b.h = h;
        (gate, up)
    }

    /// RoPE on the new tokens' Q and K (positions `p0..`, cos/sin from ggml's per-position
    /// cache), then their K and V rows stored in layer `il`'s cache.
    pub(super) fn rope_and_cache(
        &self,
        seq: &mut Cache,
        (il, p0): (usize, usize),
        theta_scale: f32,
        rope: fn(&mut [f32], &[(f32, f32)]),
        (q, k, v): (&mut [f32], &mut [f32], &[f32]),
    ) {
        let (hd, kvd) = (self.hp.head_dim, self.hp.kv_dim());
        let n = v.len() / kvd;
        let qd = q.len() / n;
        let mut cache = vec![(0f32, 0f32); hd / 2];
        for t in 0..n {
            rope_cache(p0 + t, theta_scale, &mut cache);
            for head in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope(head, &cache);
            }
            for head in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                rope(head, &cache);
            }
            let pos = p0 + t;
            seq.k[il][pos * kvd..(pos + 1) * kvd].copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
            seq.v[il][pos * kvd..(pos + 1) * kvd].copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
        }
    }

    /// One ubatch of one sequence: `tokens` at positions `seq.len + start..`; returns the hidden
    /// state of the last token after the final norm in `b.h[..n_embd]`.
    pub(super) fn ubatch<T: Tap>(
        &self,
        seq: &mut Cache,
        start: usize,
        tokens: &[u32],
        b: &mut Bufs,
        tap: &mut T,
    ) -> Result<(), Error> {
        let hp = &self.hp;
        let (e, eps, dims) = (hp.n_embd, hp.rms_eps, AttnDims::of(hp));
        let n = tokens.len();
        let p0 = seq.len + start;

        self.embed(tokens, &mut b.x)?;
        tap.tap("embd", None, &b.x);

        for (il, l) in self.layers.iter().enumerate() {
            let (mut q, mut k, v) = self.attn_inputs(l, il, n, b, tap);
            self.rope_and_cache(
                seq,
                (il, p0),
                self.theta_scale,
                rope_normal,
                (&mut q, &mut k, &v),
            );
            tap.tap("Qcur", Some(il), &q);
            tap.tap("Kcur", Some(il), &k);
            tap.tap("Vcur", Some(il), &v);

            // Attention, per token and head.
            attend(
                &seq.k[il],
                &seq.v[il],
                &q,
                p0,
                dims,
                self.kq_scale,
                |_| 0,
                &mut b.att,
            );
            tap.tap("kqv_out", Some(il), &b.att);
            let mut proj = self.attn_out(l, n, b);
            add_into(&mut b.x, &proj);
            tap.tap("ffn_inp", Some(il), &b.x);

            // MLP.
            norm_rows(&b.x, &l.ffn_norm, eps, e, &mut b.h);
            tap.tap("ffn_norm", Some(il), &b.h);
            let (mut gate, up) = self.gate_up(l, n, b);
            for (g, &u) in gate.iter_mut().zip(&up) {
                *g = v_silu(*g) * u;
            }
            tap.tap("ffn_swiglu", Some(il), &gate);
            self.matmul(&l.down, &gate, n, b, &mut proj);
            add_into(&mut b.x, &proj);
            tap.tap("l_out", Some(il), &b.x);
            (b.q, b.k, b.v, b.proj, b.gate, b.up) = (q, k, v, proj, gate, up);
        }
        norm_rows(&b.x[(n - 1) * e..], &self.norm, eps, e, &mut b.h);
        tap.tap("result_norm", None, &b.h);
        Ok(())
    }

    /// [`Self::ubatch`] for Gemma 3 (`llm_build_gemma3`): scaled embeddings, Q/K norms, NeoX
    /// RoPE with the local or global base, Q scaled by `1 / sqrt(head_dim)`, sliding-window
    /// layers, norms after attention and after the GELU-gated MLP; only the last token goes
    /// on after the last layer's attention (llama.cpp's `inp_out_ids`).
    pub(super) fn ubatch_gemma<T: Tap>(
        &self,
        seq: &mut Cache,
        start: usize,
        tokens: &[u32],
        b: &mut Bufs,
        tap: &mut T,
    ) -> Result<(), Error> {
        let hp = &self.hp;
        let (e, eps, dims) = (hp.n_embd, hp.rms_eps, AttnDims::of(hp));
        let hd = dims.hd;
        let n = tokens.len();
        let p0 = seq.len + start;
        let gelu = gelu_table();

        self.embed(tokens, &mut b.x)?;
        tap.tap("embd", None, &b.x);
        let embd_scale = (e as f32).sqrt();
        for v in b.x.iter_mut() {
            *v *= embd_scale;
        }
        tap.tap("inp_scaled", None, &b.x);
        let q_scale = 1.0 / (hd as f32).sqrt();

        let mut nrm = vec![0f32; hd];
        // Tokens going on through the layer (all but in the last layer after attention).
        let mut rows = n;
        for (il, l) in self.layers.iter().enumerate() {
            let g = l.gemma.as_ref().expect("Gemma norms");
            let sliding = hp.is_sliding(il);
            let theta_scale = if sliding {
                self.theta_scale_local
            } else {
                self.theta_scale
            };
            let (mut q, mut k, v) = self.attn_inputs(l, il, n, b, tap);
            for head in q.chunks_exact_mut(hd) {
                rms_norm(head, &g.q_norm, eps, &mut nrm);
                head.copy_from_slice(&nrm);
            }
            tap.tap("Qcur_normed", Some(il), &q);
            for head in k.chunks_exact_mut(hd) {
                rms_norm(head, &g.k_norm, eps, &mut nrm);
                head.copy_from_slice(&nrm);
            }
            tap.tap("Kcur_normed", Some(il), &k);
            self.rope_and_cache(seq, (il, p0), theta_scale, rope_neox, (&mut q, &mut k, &v));
            tap.tap("Qcur", Some(il), &q);
            tap.tap("Kcur", Some(il), &k);
            tap.tap("Vcur", Some(il), &v);
            for x in q.iter_mut() {
                *x *= q_scale;
            }

            // LLAMA_SWA_TYPE_STANDARD: position p is masked when pos - p >= n_swa.
            let first = |pos: usize| match (sliding, hp.sliding_window) {
                (true, Some(win)) => (pos + 1).saturating_sub(win),
                _ => 0,
            };
            attend(
                &seq.k[il],
                &seq.v[il],
                &q,
                p0,
                dims,
                self.kq_scale,
                first,
                &mut b.att,
            );
            tap.tap("kqv_out", Some(il), &b.att);
            let mut proj = self.attn_out(l, n, b);
            if il + 1 == self.layers.len() && rows > 1 {
                // get_rows(inp_out_ids): only the last token's row goes on.
                b.x.drain(..(rows - 1) * e);
                proj.drain(..(rows - 1) * e);
                rows = 1;
            }
            norm_rows(&proj, &g.post_attn, eps, e, &mut b.h);
            tap.tap("attn_post_norm", Some(il), &b.h);
            add_into(&mut b.x, &b.h);
            tap.tap("sa_out", Some(il), &b.x);

            norm_rows(&b.x, &l.ffn_norm, eps, e, &mut b.h);
            tap.tap("ffn_norm", Some(il), &b.h);
            let (mut gate, up) = self.gate_up(l, rows, b);
            tap.tap("ffn_up", Some(il), &up);
            tap.tap("ffn_gate", Some(il), &gate);
            for (gv, &uv) in gate.iter_mut().zip(&up) {
                *gv = geglu(*gv, uv, gelu);
            }
            tap.tap("ffn_geglu", Some(il), &gate);
            zeroed(&mut proj, rows * e);
            self.matmul(&l.down, &gate, rows, b, &mut proj);
            tap.tap("ffn_out", Some(il), &proj);
            norm_rows(&proj, &g.post_ffw, eps, e, &mut b.h);
            tap.tap("ffn_post_norm", Some(il), &b.h);
            add_into(&mut b.x, &b.h);
            tap.tap("l_out", Some(il), &b.x);
            (b.q, b.k, b.v, b.proj, b.gate, b.up) = (q, k, v, proj, gate, up);
        }
        norm_rows(&b.x[(rows - 1) * e..], &self.norm, eps, e, &mut b.h);
        tap.tap("result_norm", None, &b.h);
        Ok(())
    }

    /// The forward of [`GgmlModel::forward`] with a tap on the intermediate tensors: `tokens`
    /// at positions `seq.len..` (the caller advances `len`), the last one's logits in `logits`.
    pub(super) fn forward_tapped<T: Tap>(
        &mut self,
        seq: &mut Cache,
        tokens: &[u32],
        logits: &mut Vec<f32>,
        tap: &mut T,
    ) -> Result<(), Error> {
        if tokens.is_empty() {
            return Err(Error::InvalidBatch("a step without tokens".into()));
        }
        let needed = seq.len + tokens.len();
        if needed > seq.capacity {
            return Err(Error::ContextFull {
                needed,
                capacity: seq.capacity,
            });
        }
        let mut b = Bufs::default();
        let mut start = 0;
        while start < tokens.len() {
            let end = (start + UBATCH).min(tokens.len());
            if self.layers[0].gemma.is_some() {
                self.ubatch_gemma(seq, start, &tokens[start..end], &mut b, tap)?;
            } else {
                self.ubatch(seq, start, &tokens[start..end], &mut b, tap)?;
            }
            start = end;
        }
        logits.clear();
        logits.resize(self.hp.vocab_size, 0.0);
        let head = self.output.as_ref().unwrap_or(&self.embd);
        let h = std::mem::take(&mut b.h);
        self.matmul(head, &h, 1, &mut b, logits);
        tap.tap("result_output", None, logits);
        Ok(())
    }
}
