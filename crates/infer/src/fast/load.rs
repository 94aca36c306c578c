//! Loading the fast backend from a GGUF file: tensors streamed through one reusable buffer
//! ([`Reader`]) and packed for the kernels.

use super::*;

/// Streams tensors out of a GGUF file through one reusable buffer.
pub(super) struct Reader<'a> {
    pub(super) path: &'a Path,
    pub(super) file: File,
    pub(super) content: &'a Content,
    pub(super) buf: Vec<u8>,
    /// The kernel path the matrices are laid out for.
    pub(super) kernel: KernelPath,
    /// Every tensor read so far: a file with a tensor the loader never read holds something
    /// the forward would ignore, which is refused rather than run wrong.
    pub(super) used: std::collections::HashSet<&'a str>,
}

impl<'a> Reader<'a> {
    pub(super) fn info(&mut self, name: &str) -> Result<&'a TensorInfo, Error> {
        let (key, info) = self
            .content
            .tensor_infos
            .get_key_value(name)
            .ok_or_else(|| Error::metadata(name, "tensor missing from the GGUF file"))?;
        self.used.insert(key.as_str());
        Ok(info)
    }

    /// Refuses a file with a tensor nothing read (say, a bias or scaling table this
    /// architecture's forward does not apply).
    pub(super) fn all_used(&self, hp: &Hparams) -> Result<(), Error> {
        crate::gguf::refuse_unused(self.content, |k| self.used.contains(k), "fast", hp)
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    pub(super) fn read_at(&mut self, offset: u64, len: usize) -> Result<(), Error> {
        let io = |source| Error::Io {
            path: self.path.to_path_buf(),
            source,
        };
        self.buf.resize(len, 0);
        self.file.seek(SeekFrom::Start(offset)).map_err(io)?;
        self.file.read_exact(&mut self.buf[..len]).map_err(io)
    }

    /// (type, rows, cols, absolute byte offset) of a 2-D tensor.
    pub(super) fn shape2(&mut self, name: &str) -> Result<(GgmlType, usize, usize, u64), Error> {
        let info = self.info(name)?;
        let (rows, cols) = info.shape.dims2().map_err(|e| Error::metadata(name, e))?;
        let ty = ggml_type(name, info.ggml_dtype)?;
        Ok((
            ty,
            rows,
            cols,
            self.content.tensor_data_offset + info.offset,
        ))
    }

    /// The named 2-D tensors stacked by rows into one packed matrix (they must share the
    /// block type and column count).
    pub(super) fn matrix(&mut self, names: &[&str]) -> Result<QMatrix, Error> {
        let shapes = names
            .iter()
            .map(|n| self.shape2(n))
            .collect::<Result<Vec<_>, _>>()?;
        let (ty, _, cols, _) = shapes[0];
        let total: usize = shapes.iter().map(|s| s.1).sum();
        let mut m = QMatrix::for_ggml_on(ty, total, cols, self.kernel)
            .map_err(|e| Error::metadata(names[0], e))?;
        let mut r0 = 0;
        for (name, &(t, rows, c, off)) in names.iter().zip(&shapes) {
            if t != ty || c != cols {
                return Err(Error::metadata(
                    *name,
                    "cannot be stacked with its neighbours",
                ));
            }
            let row_bytes = t.row_bytes(c).map_err(|e| Error::metadata(*name, e))?;
            let per_read = (4 << 20) / row_bytes.max(1) + 1;
            let mut r = 0;
            while r < rows {
                let k = per_read.min(rows - r);
                self.read_at(off + (r * row_bytes) as u64, k * row_bytes)?;
                m.pack_ggml_rows(r0 + r, &self.buf[..k * row_bytes])
                    .map_err(|e| Error::metadata(*name, e))?;
                r += k;
            }
            r0 += rows;
        }
        Ok(m)
    }

    /// Stacks `names` into one matrix when their types agree, else keeps them apart.
    pub(super) fn proj(&mut self, names: &[&str]) -> Result<Proj, Error> {
        let shapes = names
            .iter()
            .map(|n| self.shape2(n))
            .collect::<Result<Vec<_>, _>>()?;
        if shapes
            .iter()
            .all(|s| s.0 == shapes[0].0 && s.2 == shapes[0].2)
        {
            Ok(Proj::Fused(self.matrix(names)?))
        } else {
            Ok(Proj::Split(
                names
                    .iter()
                    .map(|n| self.matrix(&[n]))
                    .collect::<Result<_, _>>()?,
            ))
        }
    }

    /// A 1-D tensor (norm weights) as f32.
    pub(super) fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, Error> {
        let info = self.info(name)?;
        let ty = ggml_type(name, info.ggml_dtype)?;
        let n = info.shape.elem_count();
        if n != len {
            return Err(Error::metadata(
                name,
                format!("has {n} elements, expected {len}"),
            ));
        }
        let bytes = ty.row_bytes(n).map_err(|e| Error::metadata(name, e))?;
        self.read_at(self.content.tensor_data_offset + info.offset, bytes)?;
        let mut out = vec![0f32; n];
        hearth_kernels::dequantize_row(ty, &self.buf[..bytes], &mut out)
            .map_err(|e| Error::metadata(name, e))?;
        Ok(out)
    }
}

/// Builds the fast backend from an opened GGUF file at `path`, on the best kernel path this CPU
/// has.
#[cfg(test)]
pub(crate) fn from_gguf(
    path: &Path,
    content: &Content,
    hp: Hparams,
    threads: usize,
) -> Result<FastModel, Error> {
    from_gguf_on(path, content, hp, threads, KernelPath::detect())
}

/// Builds the fast backend from an opened GGUF file at `path`, its matrices laid out for
/// `kernel`.
pub(crate) fn from_gguf_on(
    path: &Path,
    content: &Content,
    hp: Hparams,
    threads: usize,
    kernel: KernelPath,
) -> Result<FastModel, Error> {
    let file = File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut rd = Reader {
        path,
        file,
        content,
        buf: Vec::new(),
        kernel,
        used: Default::default(),
    };
    let (hd, e) = (hp.head_dim, hp.n_embd);
    if hd > 512 {
        return Err(Error::metadata(
            "attention.key_length",
            "head size above 512 is not supported by the fast backend",
        ));
    }
    let embd = rd.matrix(&["token_embd.weight"])?;
    if embd.rows() != hp.vocab_size || embd.cols() != e {
        return Err(Error::metadata(
            "token_embd.weight",
            "shape differs from vocab_size x embedding_length",
        ));
    }
    let output = if rd.has("output.weight") {
        Some(rd.matrix(&["output.weight"])?)
    } else {
        None
    };
    let gemma = hp.arch == Arch::Gemma3;
    let qk_norms = matches!(hp.arch, Arch::Gemma3 | Arch::Qwen3);
    let (qd, kvd) = (hp.n_head * hd, hp.kv_dim());
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}.weight");
        let b = |s: &str| format!("blk.{il}.{s}.bias");
        let qkv = if hp.arch == Arch::Phi3 {
            Proj::Fused(rd.matrix(&[&p("attn_qkv")])?)
        } else {
            rd.proj(&[&p("attn_q"), &p("attn_k"), &p("attn_v")])?
        };
        if qkv.out_dim() != qd + 2 * kvd {
            return Err(Error::metadata(
                p("attn_q"),
                "Q/K/V shapes differ from the head counts",
            ));
        }
        // Biases on Q, K and V (Qwen2; llama.cpp reads them for llama files too).
        let qkv_bias = if rd.has(&b("attn_q")) {
            let mut bias = rd.vector(&b("attn_q"), qd)?;
            bias.extend(rd.vector(&b("attn_k"), kvd)?);
            bias.extend(rd.vector(&b("attn_v"), kvd)?);
            Some(bias)
        } else {
            None
        };
        let gate_up = if hp.arch == Arch::Phi3 {
            // One matrix whose first half of rows is the gate and the second the up projection.
            Proj::Fused(rd.matrix(&[&p("ffn_up")])?)
        } else {
            rd.proj(&[&p("ffn_gate"), &p("ffn_up")])?
        };
        let sliding = hp.is_sliding(il);
        let opt = |rd: &mut Reader, on: bool, name: String, len: usize| {
            on.then(|| rd.vector(&name, len)).transpose()
        };
        let layer = Layer {
            attn_norm: rd.vector(&p("attn_norm"), e)?,
            qkv,
            qkv_bias,
            wo: rd.matrix(&[&p("attn_output")])?,
            q_norm: opt(&mut rd, qk_norms, p("attn_q_norm"), hd)?,
            k_norm: opt(&mut rd, qk_norms, p("attn_k_norm"), hd)?,
            post_attn_norm: opt(&mut rd, gemma, p("post_attention_norm"), e)?,
            ffn_norm: rd.vector(&p("ffn_norm"), e)?,
            gate_up,
            down: rd.matrix(&[&p("ffn_down")])?,
            post_ffn_norm: opt(&mut rd, gemma, p("post_ffw_norm"), e)?,
            rope: usize::from(gemma && sliding),
            window: if sliding { hp.sliding_window } else { None },
        };
        if layer.gate_up.out_dim() != 2 * hp.n_ff
            || layer.down.cols() != hp.n_ff
            || layer.wo.rows() != e
        {
            return Err(Error::metadata(
                p("ffn_down"),
                "MLP/output shapes differ from the hyperparameters",
            ));
        }
        layers.push(layer);
    }
    let (factors, checked) = crate::gguf::rope_factor_tensors(|n| rd.has(n));
    if let Some(name) = checked {
        rd.vector(name, hd / 2)?;
    }
    let rope_factors = factors.map(|n| rd.vector(n, hd / 2)).transpose()?;
    let rope_scaling = hp.rope_scaling(rope_factors);
    let norm = rd.vector("output_norm.weight", e)?;
    rd.all_used(&hp)?;
    let rope_style = if hp.arch.neox_rope() {
        RopeStyle::Neox
    } else {
        RopeStyle::Interleaved
    };
    let activation = hp.arch.activation();
    let (rope_bases, embed_scale) = match hp.arch {
        Arch::Gemma3 => (
            vec![hp.rope_theta, hp.rope_theta_local],
            Some((e as f64).sqrt() as f32),
        ),
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => (vec![hp.rope_theta], None),
    };
    let model = FastModel {
        attn_scale: 1.0 / (hd as f32).sqrt(),
        kv: KvPrecision::default(),
        maker: Maker::new(),
        kern: Kern {
            path: kernel,
            pool: ThreadPool::new(threads),
        },
        s: Scratch {
            cs: vec![Vec::new(); rope_bases.len()],
            ..Scratch::default()
        },
        hp,
        embd,
        output,
        norm,
        layers,
        rope_style,
        rope_bases,
        rope_scaling,
        embed_scale,
        activation,
    };
    tracing::debug!(
        packed_bytes = model.weights_bytes(),
        kernel_path = model.kern.path.name(),
        threads = model.kern.pool.threads(),
        "fast backend ready"
    );
    Ok(model)
}
