//! CLIP text encoders as SDXL uses them: the penultimate layer's hidden states of both, and the
//! projected pooled output of the second (OpenCLIP ViT-bigG).
//!
//! candle-transformers has a CLIP text transformer, but its config cannot be built for other
//! widths (private fields), it has no text projection or pooled output, and it uses the tanh
//! approximation for `gelu` where ViT-bigG uses the exact form; so this module carries its own,
//! small, weight-compatible implementation (transformers' `CLIPTextModel` tensor names).

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{
    embedding, layer_norm, linear, linear_no_bias, Embedding, LayerNorm, Linear, VarBuilder,
};

use crate::config::ClipTextConfig;
use crate::error::{Error, Result};
use crate::lora::{text_encoder_names, AdaptedLinear, Slot, Table};

#[derive(Debug, Clone, Copy)]
enum Activation {
    QuickGelu,
    Gelu,
}

impl Activation {
    fn forward(self, xs: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Activation::QuickGelu => xs * candle_nn::ops::sigmoid(&(xs * 1.702)?)?,
            Activation::Gelu => xs.gelu_erf(),
        }
    }
}

#[derive(Debug)]
struct Attention {
    q: AdaptedLinear,
    k: AdaptedLinear,
    v: AdaptedLinear,
    out: AdaptedLinear,
    heads: usize,
}

impl Attention {
    fn forward(&self, xs: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, c) = xs.dims3()?;
        let hd = c / self.heads;
        let shape = |x: Tensor| -> candle_core::Result<Tensor> {
            x.reshape((b, t, self.heads, hd))?
                .transpose(1, 2)?
                .contiguous()?
                .to_dtype(DType::F32)
        };
        let q = (shape(self.q.forward(xs)?)? * (hd as f64).powf(-0.5))?;
        let k = shape(self.k.forward(xs)?)?;
        let v = shape(self.v.forward(xs)?)?;
        let att = q.matmul(&k.t()?)?.broadcast_add(mask)?;
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att
            .matmul(&v)?
            .to_dtype(xs.dtype())?
            .transpose(1, 2)?
            .reshape((b, t, c))?;
        self.out.forward(&y)
    }
}

#[derive(Debug)]
struct Layer {
    ln1: LayerNorm,
    attn: Attention,
    ln2: LayerNorm,
    fc1: AdaptedLinear,
    fc2: AdaptedLinear,
    act: Activation,
}

/// A linear layer with bias that takes adapters.
fn adapted(vb: VarBuilder, dim_in: usize, dim_out: usize) -> candle_core::Result<AdaptedLinear> {
    AdaptedLinear::new(linear(dim_in, dim_out, vb.clone())?, &vb)
}

impl Layer {
    fn new(vb: VarBuilder, c: &ClipTextConfig, act: Activation) -> candle_core::Result<Self> {
        let h = c.hidden_size;
        let a = vb.pp("self_attn");
        Ok(Layer {
            ln1: layer_norm(h, c.layer_norm_eps, vb.pp("layer_norm1"))?,
            attn: Attention {
                q: adapted(a.pp("q_proj"), h, h)?,
                k: adapted(a.pp("k_proj"), h, h)?,
                v: adapted(a.pp("v_proj"), h, h)?,
                out: adapted(a.pp("out_proj"), h, h)?,
                heads: c.num_attention_heads,
            },
            ln2: layer_norm(h, c.layer_norm_eps, vb.pp("layer_norm2"))?,
            fc1: adapted(vb.pp("mlp.fc1"), h, c.intermediate_size)?,
            fc2: adapted(vb.pp("mlp.fc2"), c.intermediate_size, h)?,
            act,
        })
    }

    fn forward(&self, xs: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let xs = (xs + self.attn.forward(&self.ln1.forward(xs)?, mask)?)?;
        let h = self
            .act
            .forward(&self.fc1.forward(&self.ln2.forward(&xs)?)?)?;
        xs + self.fc2.forward(&h)?
    }

    fn visit_slots(&mut self, f: &mut dyn FnMut(&mut Slot)) {
        let a = &mut self.attn;
        for p in [
            &mut a.q,
            &mut a.k,
            &mut a.v,
            &mut a.out,
            &mut self.fc1,
            &mut self.fc2,
        ] {
            f(&mut p.slot);
        }
    }
}

/// What SDXL takes from one text encoder.
#[derive(Debug)]
pub struct ClipOutput {
    /// `hidden_states[-2]`: output of the penultimate layer, `(batch, seq, hidden)`.
    pub penultimate: Tensor,
    /// Pooled (end-of-text position, after the final layer norm) and projected output,
    /// `(batch, projection_dim)`; only for an encoder with a text projection.
    pub pooled: Option<Tensor>,
}

/// A CLIP text transformer, optionally with its text projection.
#[derive(Debug)]
pub struct ClipTextEncoder {
    token_embedding: Embedding,
    position_embedding: Embedding,
    layers: Vec<Layer>,
    final_layer_norm: LayerNorm,
    text_projection: Option<Linear>,
    config: ClipTextConfig,
    /// Its adapter-capable layers, and the LoRA updates in effect on them.
    pub(crate) adapters: Table,
}

impl ClipTextEncoder {
    /// Builds the encoder; `with_projection` for `CLIPTextModelWithProjection`, which is SDXL's
    /// second (its LoRA component `text_encoder_2`; the first is `text_encoder`).
    pub fn new(vb: VarBuilder, config: &ClipTextConfig, with_projection: bool) -> Result<Self> {
        let act = match config.hidden_act.as_str() {
            "quick_gelu" => Activation::QuickGelu,
            "gelu" => Activation::Gelu,
            other => {
                return Err(Error::config(
                    "text_encoder config.json",
                    format!("hidden_act {other} is not supported"),
                ))
            }
        };
        if config.num_hidden_layers < 2
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Err(Error::config(
                "text_encoder config.json",
                "need at least 2 layers and hidden_size divisible by the head count",
            ));
        }
        let tm = vb.pp("text_model");
        let h = config.hidden_size;
        let emb = tm.pp("embeddings");
        let token_embedding = embedding(config.vocab_size, h, emb.pp("token_embedding"))?;
        let position_embedding = embedding(
            config.max_position_embeddings,
            h,
            emb.pp("position_embedding"),
        )?;
        let mut layers = (0..config.num_hidden_layers)
            .map(|i| Layer::new(tm.pp(format!("encoder.layers.{i}")), config, act))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let component = if with_projection {
            "text_encoder_2"
        } else {
            "text_encoder"
        };
        let adapters = Table::build(
            component,
            &|path| text_encoder_names(component, path),
            |f| layers.iter_mut().for_each(|l| l.visit_slots(f)),
        );
        let final_layer_norm = layer_norm(h, config.layer_norm_eps, tm.pp("final_layer_norm"))?;
        let text_projection = if with_projection {
            let p = config.projection_dim.ok_or_else(|| {
                Error::config("text_encoder_2 config.json", "projection_dim is missing")
            })?;
            Some(linear_no_bias(h, p, vb.pp("text_projection"))?)
        } else {
            None
        };
        Ok(ClipTextEncoder {
            token_embedding,
            position_embedding,
            layers,
            final_layer_norm,
            text_projection,
            config: config.clone(),
            adapters,
        })
    }

    /// Longest token sequence the position table allows.
    pub fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    /// Runs the encoder on `(batch, seq)` u32 token ids.
    pub fn forward(&self, ids: &Tensor) -> Result<ClipOutput> {
        let (b, t) = ids.dims2()?;
        let dev = ids.device();
        let positions = Tensor::arange(0u32, t as u32, dev)?;
        let mut xs = self
            .token_embedding
            .forward(ids)?
            .broadcast_add(&self.position_embedding.forward(&positions)?)?;
        let mask = causal_mask(t, dev)?;
        let n = self.layers.len();
        let mut penultimate = None;
        // The last layer only matters for the pooled output.
        let run = if self.text_projection.is_some() {
            n
        } else {
            n - 1
        };
        for (i, layer) in self.layers.iter().take(run).enumerate() {
            xs = layer.forward(&xs, &mask)?;
            if i + 2 == n {
                penultimate = Some(xs.clone());
            }
        }
        let penultimate = penultimate.unwrap_or_else(|| xs.clone());
        let pooled = match &self.text_projection {
            None => None,
            Some(proj) => {
                let last = self.final_layer_norm.forward(&xs)?;
                let rows = self.pool_positions(ids)?;
                let picked = rows
                    .iter()
                    .enumerate()
                    .map(|(bi, &pos)| last.get(bi)?.get(pos))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                let pooled = Tensor::stack(&picked, 0)?;
                debug_assert_eq!(pooled.dims2()?.0, b);
                Some(proj.forward(&pooled)?)
            }
        };
        Ok(ClipOutput {
            penultimate,
            pooled,
        })
    }

    /// transformers' pooling position: with `eos_token_id == 2` (the legacy configs SDXL ships)
    /// the first position of the largest id, else the first position of `eos_token_id`.
    fn pool_positions(&self, ids: &Tensor) -> Result<Vec<usize>> {
        let rows = ids.to_dtype(DType::U32)?.to_vec2::<u32>()?;
        Ok(rows
            .iter()
            .map(|row| {
                if self.config.eos_token_id == 2 {
                    let max = row.iter().copied().max().unwrap_or(0);
                    row.iter().position(|&x| x == max).unwrap_or(0)
                } else {
                    row.iter()
                        .position(|&x| x == self.config.eos_token_id)
                        .unwrap_or(row.len() - 1)
                }
            })
            .collect())
    }
}

fn causal_mask(t: usize, dev: &Device) -> candle_core::Result<Tensor> {
    let m: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { f32::MIN } else { 0.0 }))
        .collect();
    Tensor::from_vec(m, (1, 1, t, t), dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_mask_blocks_only_future_positions() {
        let m = causal_mask(3, &Device::Cpu)
            .unwrap()
            .reshape((3, 3))
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(m[0][0], 0.0);
        assert_eq!(m[0][1], f32::MIN);
        assert_eq!(m[2][1], 0.0);
    }
}
