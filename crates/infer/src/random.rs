//! Models with random weights: the tiny llama of the tests (`TextModel::tiny_random`, seeded,
//! on the CPU) and llama-shaped models of any size made on a device, for benchmarks of the
//! machinery where no real weights of that size can be had (`examples/bench_device.rs`, run on a
//! GPU machine that cannot be sent gigabytes of weights).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::{DeviceSpec, GpuTuning, KvPrecision};
use crate::gguf::{Arch, Hparams};
use crate::model::{device_for, TextModel};
use crate::Error;

pub(crate) fn tiny_hparams(vocab_size: usize) -> Hparams {
    Hparams {
        arch: Arch::Llama,
        arch_name: "llama".into(),
        n_layer: 2,
        n_embd: 64,
        n_ff: 128,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        context_length: 4096,
        rms_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_theta_local: 10_000.0,
        sliding_window: None,
        sliding_window_pattern: 1,
        vocab_size,
        rope_freq_scale: 1.0,
        rope_attn_factor: 1.0,
        pooling: None,
    }
}

/// Seeded random llama weights under Hugging Face names.
pub(crate) fn tiny_tensors(hp: &Hparams, seed: u64) -> Result<HashMap<String, Tensor>, Error> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = HashMap::new();
    let mut rand = |rows: usize, cols: usize, scale: f32| -> Result<Tensor, Error> {
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * scale)
            .collect();
        Ok(Tensor::from_vec(data, (rows, cols), &Device::Cpu)?)
    };
    let (e, f, qd, kvd) = (hp.n_embd, hp.n_ff, hp.n_head * hp.head_dim, hp.kv_dim());
    let s = 1.0 / (e as f32).sqrt();
    t.insert(
        "model.embed_tokens.weight".to_string(),
        rand(hp.vocab_size, e, 1.0)?,
    );
    for il in 0..hp.n_layer {
        let p = |n: &str| format!("model.layers.{il}.{n}.weight");
        t.insert(p("self_attn.q_proj"), rand(qd, e, s)?);
        t.insert(p("self_attn.k_proj"), rand(kvd, e, s)?);
        t.insert(p("self_attn.v_proj"), rand(kvd, e, s)?);
        t.insert(p("self_attn.o_proj"), rand(e, qd, s)?);
        t.insert(p("mlp.gate_proj"), rand(f, e, s)?);
        t.insert(p("mlp.up_proj"), rand(f, e, s)?);
        t.insert(p("mlp.down_proj"), rand(e, f, 1.0 / (f as f32).sqrt())?);
        t.insert(
            p("input_layernorm"),
            Tensor::ones(e, DType::F32, &Device::Cpu)?,
        );
        t.insert(
            p("post_attention_layernorm"),
            Tensor::ones(e, DType::F32, &Device::Cpu)?,
        );
    }
    t.insert(
        "model.norm.weight".to_string(),
        Tensor::ones(e, DType::F32, &Device::Cpu)?,
    );
    t.insert(
        "lm_head.weight".to_string(),
        rand(hp.vocab_size, e, 4.0 * s)?,
    );
    Ok(t)
}

/// The shape of a llama-family model (Llama 3.2 1B's by default, with a 32k vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaShape {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ff: usize,
    pub vocab: usize,
    pub context: usize,
    /// Written as `{arch}.pooling_type`: an embedding model (`write_random_gguf`).
    pub pooling: Option<crate::Pooling>,
}

impl Default for LlamaShape {
    fn default() -> Self {
        LlamaShape {
            layers: 16,
            hidden: 2048,
            heads: 32,
            kv_heads: 8,
            ff: 8192,
            vocab: 32768,
            context: 8192,
            pooling: None,
        }
    }
}

impl LlamaShape {
    /// Weights in all (embeddings and output head separate).
    pub fn parameters(&self) -> usize {
        let hd = self.hidden / self.heads;
        let attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * hd;
        let mlp = 3 * self.hidden * self.ff;
        self.layers * (attn + mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden
    }
}

impl TextModel {
    /// A llama-shaped model with uniform random weights (scaled by 1/sqrt(fan-in)) made directly
    /// on `device` by the candle backend, in the device's activation dtype (f16 on a GPU), with
    /// the tiny test tokenizer (its ids are a small part of the vocabulary): for benchmarks that
    /// feed token ids, not text.
    pub fn random(
        shape: LlamaShape,
        device: DeviceSpec,
        gpu: GpuTuning,
        seed: u64,
    ) -> Result<TextModel, Error> {
        let dev = device_for(device, gpu)?;
        if !dev.is_cpu() {
            // The CPU's generator cannot be seeded; a benchmark's timings do not depend on it.
            dev.set_seed(seed)?;
        }
        let hp = Hparams {
            arch: Arch::Llama,
            arch_name: "llama".into(),
            n_layer: shape.layers,
            n_embd: shape.hidden,
            n_ff: shape.ff,
            n_head: shape.heads,
            n_head_kv: shape.kv_heads,
            head_dim: shape.hidden / shape.heads,
            context_length: shape.context,
            rms_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_theta_local: 500_000.0,
            sliding_window: None,
            sliding_window_pattern: 1,
            vocab_size: shape.vocab,
            rope_freq_scale: 1.0,
            rope_attn_factor: 1.0,
            pooling: None,
        };
        let act = crate::candle_llama::CandleModel::act_for(&dev, crate::config::Dtype::Auto);
        let rand = |rows: usize, cols: usize| -> Result<Tensor, Error> {
            let s = 1.0 / (cols as f32).sqrt();
            Ok(Tensor::rand(-s, s, (rows, cols), &dev)?.to_dtype(act)?)
        };
        let ones = |n: usize| Tensor::ones(n, act, &dev);
        let (e, f, qd, kvd) = (hp.n_embd, hp.n_ff, hp.n_head * hp.head_dim, hp.kv_dim());
        let mut t = HashMap::new();
        t.insert(
            "model.embed_tokens.weight".to_string(),
            rand(hp.vocab_size, e)?,
        );
        for il in 0..hp.n_layer {
            let p = |n: &str| format!("model.layers.{il}.{n}.weight");
            t.insert(p("self_attn.q_proj"), rand(qd, e)?);
            t.insert(p("self_attn.k_proj"), rand(kvd, e)?);
            t.insert(p("self_attn.v_proj"), rand(kvd, e)?);
            t.insert(p("self_attn.o_proj"), rand(e, qd)?);
            t.insert(p("mlp.gate_proj"), rand(f, e)?);
            t.insert(p("mlp.up_proj"), rand(f, e)?);
            t.insert(p("mlp.down_proj"), rand(e, f)?);
            t.insert(p("input_layernorm"), ones(e)?);
            t.insert(p("post_attention_layernorm"), ones(e)?);
        }
        t.insert("model.norm.weight".to_string(), ones(e)?);
        t.insert("lm_head.weight".to_string(), rand(hp.vocab_size, e)?);
        let mut backend = crate::candle_llama::from_hf_tensors(t, hp.clone(), &dev)?;
        backend.configure(KvPrecision::F32, act, gpu)?;
        let bytes = (shape.parameters() * act.size_in_bytes()) as u64;
        TextModel::assemble(hp, Box::new(backend), crate::tokenizer::tiny(), bytes, 0)
    }
}
