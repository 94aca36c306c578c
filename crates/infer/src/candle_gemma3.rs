//! Gemma 3 from GGUF on the shared candle forward: Q/K RMSNorm per head, norms after attention
//! and MLP, GELU (tanh) gate, embeddings scaled by sqrt(hidden), NeoX RoPE with a local base for
//! sliding-window layers and a global base for every `sliding_window_pattern`-th layer. GGUF
//! stores Gemma's norm weights with the `1 + w` already folded in, so plain RMSNorm applies.

use candle_core::Device;

use crate::attn::RopeStyle;
use crate::candle_llama::{
    embeddings_and_output, norm_weight, qmatmul, Activation, CandleModel, Layer,
};
use crate::gguf::{Arch, GgufFile, Hparams};
use crate::Error;

fn host_weight(file: &GgufFile, name: &str) -> Result<Vec<f32>, Error> {
    Ok(norm_weight(file, name, &Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

pub(crate) fn from_gguf(
    file: &GgufFile,
    hp: Hparams,
    device: &Device,
) -> Result<CandleModel, Error> {
    debug_assert_eq!(hp.arch, Arch::Gemma3);
    let (embeddings, output) = embeddings_and_output(file, device)?;
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}.weight");
        let sliding = hp.is_sliding(il);
        let q_norm = host_weight(file, &p("attn_q_norm"))?;
        let k_norm = host_weight(file, &p("attn_k_norm"))?;
        if q_norm.len() != hp.head_dim || k_norm.len() != hp.head_dim {
            return Err(Error::metadata(
                p("attn_q_norm"),
                "length differs from the head size",
            ));
        }
        layers.push(Layer {
            attn_norm: norm_weight(file, &p("attn_norm"), device)?,
            wq: qmatmul(file, &p("attn_q"), device)?,
            wk: qmatmul(file, &p("attn_k"), device)?,
            wv: qmatmul(file, &p("attn_v"), device)?,
            wo: qmatmul(file, &p("attn_output"), device)?,
            q_norm: Some(q_norm),
            k_norm: Some(k_norm),
            post_attn_norm: Some(norm_weight(file, &p("post_attention_norm"), device)?),
            ffn_norm: norm_weight(file, &p("ffn_norm"), device)?,
            gate: qmatmul(file, &p("ffn_gate"), device)?,
            up: qmatmul(file, &p("ffn_up"), device)?,
            down: qmatmul(file, &p("ffn_down"), device)?,
            post_ffn_norm: Some(norm_weight(file, &p("post_ffw_norm"), device)?),
            rope_theta: if sliding {
                hp.rope_theta_local
            } else {
                hp.rope_theta
            },
            window: if sliding { hp.sliding_window } else { None },
        });
    }
    Ok(CandleModel {
        norm: norm_weight(file, "output_norm.weight", device)?,
        attn_scale: 1.0 / (hp.head_dim as f32).sqrt(),
        kv: crate::config::KvPrecision::default(),
        embed_scale: Some((hp.n_embd as f64).sqrt()),
        hp,
        device: device.clone(),
        embeddings,
        layers,
        output,
        rope: RopeStyle::Neox,
        activation: Activation::GeluTanh,
    })
}
