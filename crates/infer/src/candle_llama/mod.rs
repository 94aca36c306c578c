//! The batched transformer forward on candle ops, for every family (built from GGUF by
//! `candle_gguf.rs`, and from a llama-family safetensors checkpoint here): the llama layout with
//! each family's options (biases, Q/K norms, fused matrices, post-norms, RoPE scaling).
//!
//! Everything stays on the model's device (a GPU under CUDA): weights, the KV cache (blocks of
//! one pool per model, `device_kv.rs`), RoPE, norms and attention. One call advances every step
//! of the batch: all rows (prefill chunks and single decode tokens) go through the norms,
//! projections and MLP as one `[rows, hidden]` matrix; RoPE uses each row's own position; the
//! new K/V rows of all steps are scattered into the pool at once. Attention runs once for all
//! the steps of each length (all the one-token steps together, say): their cached keys are
//! gathered into one padded batch, masked past each sequence's own position. Only the last row of each step reaches
//! the output head, and its logits are the only thing brought back to the host.

use std::collections::HashMap;
use std::sync::Arc;

mod attention;
#[cfg(feature = "cuda")]
mod graphs;
mod linear;
mod plan;
use plan::fault;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::attn::{RopeScaling, RopeStyle};
use crate::config::{GpuTuning, KvPrecision};
use crate::device_kv::{Pool, SharedPool};
use crate::fused::GluAct;
use crate::gguf::{Activation, Hparams};
use crate::model::{Backend, Step};
use crate::sequence::{Cache, Maker, Sequence};
use crate::Error;

use linear::stacked;
pub(crate) use linear::{GateUp, Linear, Qkv};

/// Token embedding table; quantized tables stay quantized and only the looked-up rows are
/// dequantized (SmolLM2's table would be 113 MB as f32).
pub(crate) enum Embeddings {
    /// In host memory; the looked-up rows are dequantized on the CPU and moved to the device.
    Quantized {
        table: Arc<QTensor>,
        dtype: GgmlDType,
        row_bytes: usize,
        n_embd: usize,
    },
    /// On the model's device, in its activation dtype ([`CandleModel::configure`]).
    Dense(Tensor),
}

impl Embeddings {
    pub fn quantized(table: Arc<QTensor>) -> Result<Self, Error> {
        let (rows, n_embd) = table.shape().dims2()?;
        let dtype = table.dtype();
        let bytes = table.storage_size_in_bytes();
        if rows == 0 || !bytes.is_multiple_of(rows) || !n_embd.is_multiple_of(dtype.block_size()) {
            return Err(Error::metadata(
                "token_embd.weight",
                "unexpected shape for its quantization",
            ));
        }
        Ok(Embeddings::Quantized {
            row_bytes: bytes / rows,
            table,
            dtype,
            n_embd,
        })
    }

    fn lookup(&self, ids: &[u32], device: &Device) -> Result<Tensor, Error> {
        match self {
            Embeddings::Dense(t) => {
                let idx = Tensor::from_slice(ids, ids.len(), t.device())?;
                Ok(t.index_select(&idx, 0)?.to_device(device)?)
            }
            Embeddings::Quantized {
                table,
                dtype,
                row_bytes,
                n_embd,
            } => {
                let data = table.data()?;
                let mut buf = Vec::with_capacity(ids.len() * row_bytes);
                for &id in ids {
                    let start = id as usize * row_bytes;
                    buf.extend_from_slice(&data[start..start + row_bytes]);
                }
                let storage =
                    QStorage::from_data(std::borrow::Cow::Owned(buf), &Device::Cpu, *dtype)?;
                let rows = QTensor::new(storage, (ids.len(), *n_embd))?;
                Ok(rows.dequantize(&Device::Cpu)?.to_device(device)?)
            }
        }
    }
}

pub(crate) struct Layer {
    pub attn_norm: Tensor,
    pub qkv: Qkv,
    /// Qwen2 (and llama files that carry them): the Q, K and V biases.
    pub qkv_bias: Option<[Tensor; 3]>,
    pub wo: Linear,
    /// Gemma 3, Qwen3: RMSNorm over each head of Q and K (`head_dim` long).
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub gate_up: GateUp,
    pub down: Linear,
    pub post_ffn_norm: Option<Tensor>,
    pub rope_theta: f32,
    pub window: Option<usize>,
}

impl Layer {
    /// Whether Q and K go from the projection straight to RoPE (no biases, no Q/K norms), as
    /// the fused RoPE-and-KV-write kernel takes them.
    fn plain_attention_inputs(&self) -> bool {
        self.qkv_bias.is_none() && self.q_norm.is_none() && self.k_norm.is_none()
    }

    /// Concatenates separate Q, K, V (and gate, up) matrices into one, so that each triple or
    /// pair is one matrix product: dense ones, and Q8_0 ones (whose rows are whole blocks, so
    /// stacking them is stacking their bytes); other quantized ones stay as they are.
    fn fuse(&mut self) -> Result<(), Error> {
        if let Qkv::Separate { q, k, v } = &self.qkv {
            if let Some(w) = stacked(&[q, k, v])? {
                self.qkv = Qkv::Fused(w);
            }
        }
        if let GateUp::Separate { gate, up } = &self.gate_up {
            if let Some(w) = stacked(&[gate, up])? {
                self.gate_up = GateUp::Fused(w);
            }
        }
        Ok(())
    }

    fn convert(&mut self, dtype: DType, rows: linear::RowProduct) -> Result<(), Error> {
        for t in [&mut self.attn_norm, &mut self.ffn_norm]
            .into_iter()
            .chain(self.q_norm.iter_mut())
            .chain(self.k_norm.iter_mut())
            .chain(self.post_attn_norm.iter_mut())
            .chain(self.post_ffn_norm.iter_mut())
            .chain(self.qkv_bias.iter_mut().flatten())
        {
            *t = t.to_dtype(dtype)?;
        }
        let mut linears = self.qkv.linears();
        linears.extend(self.gate_up.linears());
        linears.push(&mut self.wo);
        linears.push(&mut self.down);
        for l in linears {
            l.convert(dtype, rows)?;
        }
        Ok(())
    }
}

/// A loaded transformer on candle.
pub(crate) struct CandleModel {
    hp: Hparams,
    device: Device,
    /// The weights and the family's options.
    m: Parts,
    attn_scale: f32,
    /// What the attention rounds to f16 (see [`KvPrecision`]); set with [`CandleModel::configure`].
    kv: KvPrecision,
    /// The dtype of activations and dense weights: f32 on the CPU, f16 on a GPU.
    act: DType,
    pool: SharedPool,
    /// Whether one-token rows attend through the decode attention kernel (`decode_attn/`): on
    /// a GPU, when the cache is in the activations' dtype and the head fits the kernel, unless
    /// [`GpuTuning::gathered_attention`] asks for the general path (to compare the two).
    direct_decode: bool,
    /// Whether dense Q/K/V and gate/up matrices are concatenated at load and their outputs go
    /// through the fused kernels (`fused.rs`): on a GPU with the cache in the activations' dtype,
    /// unless [`GpuTuning::unfused`].
    fused: bool,
    /// The first decode attention and add-norm kernels, to compare
    /// ([`GpuTuning::first_kernels`]).
    first_kernels: bool,
    /// The decode attention's fewest positions a split ([`GpuTuning::decode_chunk`]).
    decode_chunk: usize,
    /// The gated MLP's activation, and RoPE with the KV write, in the last step of the one-row
    /// gate/up and Q/K/V products, unless [`GpuTuning::separate_epilogues`].
    epilogues: bool,
    /// Stamped on every sequence this model makes.
    maker: Maker,
    /// Decode steps captured as CUDA graphs (`graphs.rs`): on a GPU with the fused kernels and
    /// the decode attention kernel, unless [`GpuTuning::no_graphs`].
    #[cfg(feature = "cuda")]
    graphs: Option<graphs::Graphs>,
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor, Error> {
    Ok(candle_nn::ops::rms_norm(x, w, eps)?)
}

/// A step's logits (`t`, on the device, any dtype) into `logits`, replacing what it held.
fn read_logits(t: &Tensor, logits: &mut Vec<f32>) -> Result<(), Error> {
    logits.clear();
    logits.extend(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?);
    Ok(())
}

/// A model's weights and its family's options, as the loaders build them.
pub(crate) struct Parts {
    pub embeddings: Embeddings,
    pub embed_scale: Option<f64>,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    pub output: Linear,
    pub rope: RopeStyle,
    pub rope_scaling: RopeScaling,
    pub activation: Activation,
}

impl CandleModel {
    /// The model from its parts, computing in f32 with an f32 cache (see [`Self::configure`]).
    pub(crate) fn new(hp: Hparams, device: &Device, parts: Parts) -> CandleModel {
        let pool = SharedPool::new(hp.n_layer, hp.kv_dim(), DType::F32, device);
        CandleModel {
            attn_scale: 1.0 / (hp.head_dim as f32).sqrt(),
            kv: KvPrecision::default(),
            act: DType::F32,
            pool,
            direct_decode: false,
            fused: false,
            first_kernels: false,
            decode_chunk: 0,
            epilogues: false,
            maker: Maker::new(),
            #[cfg(feature = "cuda")]
            graphs: None,
            device: device.clone(),
            m: parts,
            hp,
        }
    }

    /// Sets the attention's precision and the activation dtype (`act`: f32, or f16/bf16 for a
    /// GPU, which then keeps its dense weights and its cache in that dtype too). Sequences made
    /// before belong to the old cache pool and are refused afterwards.
    pub(crate) fn configure(
        &mut self,
        kv: KvPrecision,
        act: DType,
        gpu: GpuTuning,
    ) -> Result<(), Error> {
        if kv.quant().is_some() {
            return Err(Error::InvalidConfig {
                key: "kv_precision",
                reason: format!(
                    "{} runs on the fast CPU backend only (backend = \"fast\"); candle keeps f32 or f16",
                    kv.name()
                ),
            });
        }
        let rows = linear::RowProduct::of(&gpu);
        for l in &mut self.m.layers {
            l.convert(act, rows)?;
        }
        self.m.norm = self.m.norm.to_dtype(act)?;
        self.m.output.convert(act, rows)?;
        if let Embeddings::Dense(t) = &mut self.m.embeddings {
            // Looked up on the device: only ids go there, not rows.
            *t = t.to_device(&self.device)?.to_dtype(act)?;
        }
        let cache = match (act, kv) {
            (DType::F32, KvPrecision::F32) => DType::F32,
            (DType::F32, KvPrecision::F16) => DType::F16,
            (other, _) => other,
        };
        self.pool = SharedPool::new(self.hp.n_layer, self.hp.kv_dim(), cache, &self.device);
        self.kv = kv;
        self.act = act;
        let on_gpu = !self.device.is_cpu() && cache == act;
        self.direct_decode = on_gpu
            && crate::decode_attn::DecodeAttention::fits(
                self.hp.n_head,
                self.hp.n_head_kv,
                self.hp.head_dim,
            )
            && !gpu.gathered_attention;
        self.fused = on_gpu && !gpu.unfused;
        self.first_kernels = gpu.first_kernels;
        self.decode_chunk = gpu.decode_chunk;
        self.epilogues = !gpu.separate_epilogues && !gpu.first_kernels;
        if self.fused {
            for l in &mut self.m.layers {
                l.fuse()?;
            }
        }
        #[cfg(feature = "cuda")]
        {
            self.graphs =
                (self.fused && self.direct_decode && !gpu.no_graphs).then(graphs::Graphs::default);
        }
        Ok(())
    }

    /// The activation dtype `dtype` asks for on `device`: `auto` is f16 on a GPU (tensor cores,
    /// half the bytes) and f32 on the CPU.
    pub(crate) fn act_for(device: &Device, dtype: crate::config::Dtype) -> DType {
        use crate::config::Dtype;
        match dtype {
            Dtype::Auto if device.is_cpu() => DType::F32,
            Dtype::Auto | Dtype::F16 => DType::F16,
            Dtype::F32 => DType::F32,
            Dtype::BF16 => DType::BF16,
        }
    }
}

impl Backend for CandleModel {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn new_sequence(
        &self,
        layers: usize,
        kv_dim: usize,
        capacity: usize,
    ) -> Result<Sequence, Error> {
        Sequence::on_device(&self.maker, &self.pool, layers, kv_dim, capacity)
    }

    /// Its own sequences, in blocks of its current pool (a sequence made before
    /// [`CandleModel::configure`] belongs to the pool it replaced).
    fn accepts(&self, seq: &Sequence) -> bool {
        seq.made_by(&self.maker)
            && matches!(&seq.cache, Cache::Device(d) if d.pool().same(&self.pool))
    }

    fn kv_bytes(&self, values: usize) -> usize {
        values * self.pool.lock().dtype().size_in_bytes()
    }

    fn max_rows(&self) -> usize {
        // A GPU call's cost is mostly its kernel launches, not its rows' memory.
        if self.device.is_cpu() {
            crate::pieces::MAX_ROWS
        } else {
            8192
        }
    }

    fn forward(
        &mut self,
        steps: &mut [Step<'_>],
        outputs: &[usize],
        logits: &mut Vec<f32>,
    ) -> Result<(), Error> {
        let host = self.plan(steps, outputs)?;
        #[cfg(feature = "cuda")]
        if host.decode_only() {
            if let Some(mut graphs) = self.graphs.take() {
                let done = graphs.forward(self, host, logits);
                self.graphs = Some(graphs);
                return done;
            }
        }
        let plan = host.upload(&self.device)?;
        let x = self.embed(&plan.ids)?;
        let out = self.run(x, &plan, &self.pool.lock())?;
        read_logits(&out, logits)
    }
}

impl CandleModel {
    /// The rows' embeddings, `[rows, hidden]` in the activation dtype.
    fn embed(&self, ids: &[u32]) -> Result<Tensor, Error> {
        let x = self
            .m
            .embeddings
            .lookup(ids, &self.device)?
            .to_dtype(self.act)?;
        Ok(match self.m.embed_scale {
            Some(s) => (x * s)?,
            None => x,
        })
    }

    /// The layers and the output head over `x` (the step's embeddings): each step's logits,
    /// `[steps, vocab]` in the activation dtype, on the device.
    fn run(&self, mut x: Tensor, plan: &plan::Plan, pool: &Pool) -> Result<Tensor, Error> {
        let hp = &self.hp;
        let (hd, eps) = (hp.head_dim, hp.rms_eps);
        let rope = plan
            .rope
            .iter()
            .map(|(base, c, s)| Ok((*base, (c.to_dtype(self.act)?, s.to_dtype(self.act)?))))
            .collect::<Result<Vec<_>, Error>>()?;
        // The residual add and the norm after it, one kernel on a GPU.
        let add_norm = |x: &Tensor, y: &Tensor, w: &Tensor| -> Result<(Tensor, Tensor), Error> {
            if self.fused {
                let scalar = self.first_kernels;
                crate::fused::AddNorm { eps, scalar }.run(x, y, w)
            } else {
                let x = (x + y)?;
                let h = rms_norm(&x, w, eps)?;
                Ok((x, h))
            }
        };
        // The next layer's normed input, when the previous layer's last add made it.
        let mut next_h = None;
        for (il, layer) in self.m.layers.iter().enumerate() {
            let h = match next_h.take() {
                Some(h) => h,
                None => rms_norm(&x, &layer.attn_norm, eps)?,
            };
            let base = layer.rope_theta.to_bits();
            let cs = &rope
                .iter()
                .find(|r| r.0 == base)
                .ok_or_else(|| fault("a layer's RoPE base is not in the plan"))?
                .1;
            let q = match &layer.qkv {
                Qkv::Fused(w) if self.fused && layer.plain_attention_inputs() => {
                    let (pool_k, pool_v) = pool.layer(il);
                    let rope = crate::fused::RopeKv {
                        cos: &cs.0,
                        sin: &cs.1,
                        write_at: &plan.write_at,
                        pool_k,
                        pool_v,
                        n_head: hp.n_head,
                        n_kv: hp.n_head_kv,
                        head_dim: hd,
                        interleaved: matches!(self.m.rope, RopeStyle::Interleaved),
                    };
                    w.forward_rope(&h, &rope, self.epilogues)?
                }
                _ => self.project_rope_write(il, layer, &h, cs, plan, pool)?,
            };
            let out = self.attention(il, &q, plan, pool)?;
            let attn_out = layer.wo.forward(&out)?;
            let attn_out = match &layer.post_attn_norm {
                Some(w) => rms_norm(&attn_out, w, eps)?,
                None => attn_out,
            };
            let (sum, h) = add_norm(&x, &attn_out, &layer.ffn_norm)?;
            x = sum;
            let gelu = matches!(self.m.activation, Activation::GeluTanh);
            let act = match &layer.gate_up {
                GateUp::Fused(w) if self.fused => {
                    let act = if gelu { GluAct::Gelu } else { GluAct::Silu };
                    w.forward_glu(&h, act, self.epilogues)?
                }
                _ => {
                    let (gate, up) = layer.gate_up.forward(&h)?;
                    let gate = if gelu { gate.gelu()? } else { gate.silu()? };
                    (gate * up)?
                }
            };
            let ffn_out = layer.down.forward(&act)?;
            let ffn_out = match &layer.post_ffn_norm {
                Some(w) => rms_norm(&ffn_out, w, eps)?,
                None => ffn_out,
            };
            match self.m.layers.get(il + 1) {
                Some(next) => {
                    let (sum, h) = add_norm(&x, &ffn_out, &next.attn_norm)?;
                    (x, next_h) = (sum, Some(h));
                }
                None => x = (x + ffn_out)?,
            }
        }
        let last = rms_norm(&x.index_select(&plan.last, 0)?, &self.m.norm, eps)?;
        self.m.output.forward(&last)
    }

    /// The general path from a layer's normed input to its rotated Q: the projections, biases,
    /// Q/K norms and RoPE as candle ops, and K and V written into the pool.
    fn project_rope_write(
        &self,
        il: usize,
        layer: &Layer,
        h: &Tensor,
        cs: &(Tensor, Tensor),
        plan: &plan::Plan,
        pool: &Pool,
    ) -> Result<Tensor, Error> {
        let hp = &self.hp;
        let (hd, qd, kvd, eps) = (
            hp.head_dim,
            hp.n_head * hp.head_dim,
            hp.kv_dim(),
            hp.rms_eps,
        );
        let n = plan.rows.len();
        let f16_q = self.kv == KvPrecision::F16 && self.act == DType::F32;
        let (mut q, mut k, mut v) = layer.qkv.project(h, qd, kvd)?;
        if let Some([bq, bk, bv]) = &layer.qkv_bias {
            q = q.broadcast_add(bq)?;
            k = k.broadcast_add(bk)?;
            v = v.broadcast_add(bv)?;
        }
        let mut q = q.reshape((n, hp.n_head, hd))?;
        let mut k = k.reshape((n, hp.n_head_kv, hd))?;
        if let Some(w) = &layer.q_norm {
            q = rms_norm(&q, w, eps)?;
        }
        if let Some(w) = &layer.k_norm {
            k = rms_norm(&k, w, eps)?;
        }
        let mut q = self.rope(&q, cs)?;
        let k = self.rope(&k, cs)?;
        if f16_q {
            // Without flash attention llama.cpp converts Q to f16 for the Q·K products.
            q = q.to_dtype(DType::F16)?.to_dtype(DType::F32)?;
        }
        let cache = pool.dtype();
        pool.write(
            il,
            &plan.write_at,
            &k.reshape((n, kvd))?.to_dtype(cache)?,
            &v.to_dtype(cache)?,
        )?;
        Ok(q)
    }
}

/// The llama family from Hugging Face tensor names (`model.layers.N.self_attn.q_proj.weight`, ...),
/// as read from safetensors; HF checkpoints use NeoX-style RoPE.
pub(crate) fn from_hf_tensors(
    mut t: HashMap<String, Tensor>,
    hp: Hparams,
    device: &Device,
) -> Result<CandleModel, Error> {
    let mut take = |name: &str| -> Result<Tensor, Error> {
        let w = t
            .remove(name)
            .ok_or_else(|| Error::metadata(name, "tensor missing from the checkpoint"))?;
        Ok(w.to_dtype(DType::F32)?.to_device(device)?)
    };
    let embed = take("model.embed_tokens.weight")?;
    let output = match take("lm_head.weight") {
        Ok(w) => w,
        Err(_) => embed.clone(),
    };
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("model.layers.{il}.{s}.weight");
        layers.push(Layer {
            attn_norm: take(&p("input_layernorm"))?,
            qkv: Qkv::Separate {
                q: Linear::new(QMatMul::Tensor(take(&p("self_attn.q_proj"))?)),
                k: Linear::new(QMatMul::Tensor(take(&p("self_attn.k_proj"))?)),
                v: Linear::new(QMatMul::Tensor(take(&p("self_attn.v_proj"))?)),
            },
            qkv_bias: None,
            wo: Linear::new(QMatMul::Tensor(take(&p("self_attn.o_proj"))?)),
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: take(&p("post_attention_layernorm"))?,
            gate_up: GateUp::Separate {
                gate: Linear::new(QMatMul::Tensor(take(&p("mlp.gate_proj"))?)),
                up: Linear::new(QMatMul::Tensor(take(&p("mlp.up_proj"))?)),
            },
            down: Linear::new(QMatMul::Tensor(take(&p("mlp.down_proj"))?)),
            post_ffn_norm: None,
            rope_theta: hp.rope_theta,
            window: None,
        });
    }
    let parts = Parts {
        norm: take("model.norm.weight")?,
        embeddings: Embeddings::Dense(embed),
        embed_scale: None,
        layers,
        output: Linear::new(QMatMul::Tensor(output)),
        rope: RopeStyle::Neox,
        rope_scaling: RopeScaling::NONE,
        activation: hp.arch.activation(),
    };
    Ok(CandleModel::new(hp, device, parts))
}
