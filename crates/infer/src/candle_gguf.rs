//! Every family from GGUF on the shared candle forward (`candle_llama.rs`):
//! - `llama`: interleaved RoPE (the converter permutes Q/K), Llama 3's `rope_freqs`, linear
//!   scaling, Q/K/V biases when present, a sliding window when the file has one;
//! - `qwen2`: Q/K/V biases, NeoX RoPE; `qwen3`: Q/K RMSNorm per head;
//! - `phi3`: fused `attn_qkv` and `ffn_up` (`[gate; up]`), LongRoPE short factors and attention
//!   factor;
//! - `gemma3`: Q/K norms, norms after attention and MLP, GELU (tanh), embeddings scaled by
//!   sqrt(hidden), a local RoPE base and window on the sliding layers. GGUF stores Gemma's norm
//!   weights with the `1 + w` already folded in, so plain RMSNorm applies.
//!
//! Every tensor of the file must be read: one the forward would not apply is a load error
//! naming it, as on the fast backend.

use std::collections::HashSet;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};

use crate::attn::RopeStyle;
use crate::candle_llama::{CandleModel, Embeddings, GateUp, Layer, Linear, Parts, Qkv};
use crate::gguf::{self, Arch, GgufFile, Hparams};
use crate::Error;

/// Reads tensors out of a file onto a device, remembering which were read.
struct Tensors<'f> {
    file: &'f GgufFile,
    device: &'f Device,
    used: HashSet<String>,
}

impl<'f> Tensors<'f> {
    fn has(&self, name: &str) -> bool {
        self.file.has_tensor(name)
    }

    fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor, Error> {
        let t = self.file.tensor(name, device)?;
        self.used.insert(name.to_string());
        Ok(t)
    }

    fn matmul(&mut self, name: &str) -> Result<Linear, Error> {
        let device = self.device;
        Ok(Linear::new(QMatMul::from_qtensor(
            self.qtensor(name, device)?,
        )?))
    }

    /// A vector of `len` values (biases, per-head norms) on the device, f32.
    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor, Error> {
        let v = self.host(name, len)?;
        Ok(Tensor::from_vec(v, len, self.device)?)
    }

    /// A (small) weight dequantized to f32 on the device.
    fn dense(&mut self, name: &str) -> Result<Tensor, Error> {
        let device = self.device;
        Ok(self.qtensor(name, device)?.dequantize(device)?)
    }

    /// A vector of `len` f32 values on the host.
    fn host(&mut self, name: &str, len: usize) -> Result<Vec<f32>, Error> {
        let v = self
            .qtensor(name, &Device::Cpu)?
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if v.len() != len {
            return Err(Error::metadata(
                name,
                format!("has {} elements, expected {len}", v.len()),
            ));
        }
        Ok(v)
    }

    /// Embedding table (host) and output head (device); a missing `output.weight` means tied.
    fn embeddings_and_output(&mut self) -> Result<(Embeddings, Linear), Error> {
        let table = Arc::new(self.qtensor("token_embd.weight", &Device::Cpu)?);
        let output = if self.has("output.weight") {
            self.matmul("output.weight")?
        } else if self.device.is_cpu() {
            Linear::new(QMatMul::from_arc(Arc::clone(&table))?)
        } else {
            self.matmul("token_embd.weight")?
        };
        let embeddings = match table.dtype() {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                Embeddings::Dense(table.dequantize(&Device::Cpu)?)
            }
            _ => Embeddings::quantized(table)?,
        };
        Ok((embeddings, output))
    }

    fn finish(self, hp: &Hparams) -> Result<(), Error> {
        gguf::refuse_unused(&self.file.content, |k| self.used.contains(k), "candle", hp)
    }
}

/// The model in `file`, any architecture Hearth knows.
pub(crate) fn from_gguf(
    file: &GgufFile,
    hp: Hparams,
    device: &Device,
) -> Result<CandleModel, Error> {
    let mut t = Tensors {
        file,
        device,
        used: HashSet::new(),
    };
    let (hd, qd, kvd) = (hp.head_dim, hp.n_head * hp.head_dim, hp.kv_dim());
    let gemma = hp.arch == Arch::Gemma3;
    let (embeddings, output) = t.embeddings_and_output()?;
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}.weight");
        let qkv = if t.has(&p("attn_qkv")) {
            Qkv::Fused(t.matmul(&p("attn_qkv"))?)
        } else {
            Qkv::Separate {
                q: t.matmul(&p("attn_q"))?,
                k: t.matmul(&p("attn_k"))?,
                v: t.matmul(&p("attn_v"))?,
            }
        };
        let bias = |s: &str| format!("blk.{il}.{s}.bias");
        let qkv_bias = if t.has(&bias("attn_q")) {
            Some([
                t.vector(&bias("attn_q"), qd)?,
                t.vector(&bias("attn_k"), kvd)?,
                t.vector(&bias("attn_v"), kvd)?,
            ])
        } else {
            None
        };
        let (q_norm, k_norm) = if t.has(&p("attn_q_norm")) {
            (
                Some(t.vector(&p("attn_q_norm"), hd)?),
                Some(t.vector(&p("attn_k_norm"), hd)?),
            )
        } else {
            (None, None)
        };
        let gate_up = if t.has(&p("ffn_gate")) {
            GateUp::Separate {
                gate: t.matmul(&p("ffn_gate"))?,
                up: t.matmul(&p("ffn_up"))?,
            }
        } else {
            GateUp::Fused(t.matmul(&p("ffn_up"))?)
        };
        let sliding = hp.is_sliding(il);
        let mut post = |name: &str| -> Result<Option<Tensor>, Error> {
            gemma.then(|| t.dense(&p(name))).transpose()
        };
        let (post_attn_norm, post_ffn_norm) =
            (post("post_attention_norm")?, post("post_ffw_norm")?);
        layers.push(Layer {
            attn_norm: t.dense(&p("attn_norm"))?,
            qkv,
            qkv_bias,
            wo: t.matmul(&p("attn_output"))?,
            q_norm,
            k_norm,
            post_attn_norm,
            ffn_norm: t.dense(&p("ffn_norm"))?,
            gate_up,
            down: t.matmul(&p("ffn_down"))?,
            post_ffn_norm,
            rope_theta: if gemma && sliding {
                hp.rope_theta_local
            } else {
                hp.rope_theta
            },
            window: if sliding { hp.sliding_window } else { None },
        });
    }
    let (factors, checked) = gguf::rope_factor_tensors(|n| t.has(n));
    if let Some(name) = checked {
        t.host(name, hd / 2)?;
    }
    let factors = factors.map(|n| t.host(n, hd / 2)).transpose()?;
    let norm = t.dense("output_norm.weight")?;
    t.finish(&hp)?;
    let parts = Parts {
        norm,
        embed_scale: gemma.then(|| (hp.n_embd as f64).sqrt()),
        rope: if hp.arch.neox_rope() {
            RopeStyle::Neox
        } else {
            RopeStyle::Interleaved
        },
        rope_scaling: hp.rope_scaling(factors),
        activation: hp.arch.activation(),
        embeddings,
        layers,
        output,
    };
    Ok(CandleModel::new(hp, device, parts))
}
