//! The diffusers/transformers config files of an SDXL checkpoint, read into typed structs.
//!
//! Only the fields the pipeline uses are read; unknown fields are ignored so that the real
//! `stabilityai/stable-diffusion-xl-base-1.0` files and the tiny model's files both parse.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Reads and parses one JSON file, naming the file in any error.
pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::config(path, e.to_string()))
}

/// A field that diffusers writes either as one number or as one number per block.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PerBlock {
    One(usize),
    Each(Vec<usize>),
}

impl PerBlock {
    /// The value for block `i` of `n`.
    pub fn get(&self, i: usize) -> Option<usize> {
        match self {
            PerBlock::One(v) => Some(*v),
            PerBlock::Each(v) => v.get(i).copied(),
        }
    }
}

/// `unet/config.json` of an SDXL `UNet2DConditionModel`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UNetConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub down_block_types: Vec<String>,
    pub up_block_types: Vec<String>,
    pub layers_per_block: usize,
    /// Number of attention heads per block (diffusers' historical name for it).
    pub attention_head_dim: PerBlock,
    #[serde(default)]
    pub num_attention_heads: Option<PerBlock>,
    #[serde(default = "one_block")]
    pub transformer_layers_per_block: PerBlock,
    pub cross_attention_dim: usize,
    #[serde(default)]
    pub addition_embed_type: Option<String>,
    #[serde(default)]
    pub addition_time_embed_dim: Option<usize>,
    #[serde(default)]
    pub projection_class_embeddings_input_dim: Option<usize>,
    #[serde(default = "yes")]
    pub flip_sin_to_cos: bool,
    #[serde(default)]
    pub freq_shift: f64,
    #[serde(default)]
    pub center_input_sample: bool,
    #[serde(default = "one_usize")]
    pub downsample_padding: usize,
    #[serde(default = "one_f64")]
    pub mid_block_scale_factor: f64,
    #[serde(default = "groups32")]
    pub norm_num_groups: usize,
    #[serde(default = "eps5")]
    pub norm_eps: f64,
    #[serde(default)]
    pub use_linear_projection: bool,
    #[serde(default)]
    pub sample_size: Option<usize>,
}

/// `vae/config.json` of an `AutoencoderKL`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VaeConfig {
    #[serde(default = "three")]
    pub in_channels: usize,
    #[serde(default = "three")]
    pub out_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub latent_channels: usize,
    #[serde(default = "groups32")]
    pub norm_num_groups: usize,
    /// Latents are divided by this before decoding: 0.13025 for SDXL (0.18215 was SD 1.x).
    pub scaling_factor: f64,
    #[serde(default = "yes")]
    pub use_quant_conv: bool,
    #[serde(default = "yes")]
    pub use_post_quant_conv: bool,
    #[serde(default)]
    pub force_upcast: Option<bool>,
}

/// `text_encoder*/config.json` of a transformers `CLIPTextModel[WithProjection]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClipTextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_hidden_layers: usize,
    pub max_position_embeddings: usize,
    /// `quick_gelu` (CLIP ViT-L) or `gelu` (OpenCLIP ViT-bigG, the exact erf form).
    pub hidden_act: String,
    #[serde(default = "eps5")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub projection_dim: Option<usize>,
    /// 2 selects transformers' legacy pooling (position of the largest token id).
    #[serde(default = "two")]
    pub eos_token_id: u32,
}

/// `scheduler/scheduler_config.json` of an `EulerDiscreteScheduler`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SchedulerConfig {
    #[serde(default = "train_steps")]
    pub num_train_timesteps: usize,
    #[serde(default = "beta_start")]
    pub beta_start: f64,
    #[serde(default = "beta_end")]
    pub beta_end: f64,
    #[serde(default = "scaled_linear")]
    pub beta_schedule: String,
    #[serde(default = "epsilon")]
    pub prediction_type: String,
    /// Read for information only: SDXL-Lightning needs `trailing`, which Hearth always uses.
    #[serde(default)]
    pub timestep_spacing: Option<String>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            num_train_timesteps: train_steps(),
            beta_start: beta_start(),
            beta_end: beta_end(),
            beta_schedule: scaled_linear(),
            prediction_type: epsilon(),
            timestep_spacing: Some("trailing".into()),
        }
    }
}

fn one_block() -> PerBlock {
    PerBlock::One(1)
}
fn yes() -> bool {
    true
}
fn one_usize() -> usize {
    1
}
fn one_f64() -> f64 {
    1.0
}
fn groups32() -> usize {
    32
}
fn eps5() -> f64 {
    1e-5
}
fn three() -> usize {
    3
}
fn two() -> u32 {
    2
}
fn train_steps() -> usize {
    1000
}
fn beta_start() -> f64 {
    0.00085
}
fn beta_end() -> f64 {
    0.012
}
fn scaled_linear() -> String {
    "scaled_linear".into()
}
fn epsilon() -> String {
    "epsilon".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdxl_base_unet_config_parses_with_per_block_lists() {
        // The fields of stabilityai/stable-diffusion-xl-base-1.0 unet/config.json that matter.
        let json = r#"{"_class_name":"UNet2DConditionModel","act_fn":"silu",
            "addition_embed_type":"text_time","addition_time_embed_dim":256,
            "attention_head_dim":[5,10,20],"block_out_channels":[320,640,1280],
            "cross_attention_dim":2048,"down_block_types":["DownBlock2D","CrossAttnDownBlock2D","CrossAttnDownBlock2D"],
            "in_channels":4,"out_channels":4,"layers_per_block":2,"norm_num_groups":32,"norm_eps":1e-05,
            "projection_class_embeddings_input_dim":2816,"transformer_layers_per_block":[1,2,10],
            "up_block_types":["CrossAttnUpBlock2D","CrossAttnUpBlock2D","UpBlock2D"],
            "use_linear_projection":true,"num_attention_heads":null}"#;
        let c: UNetConfig = serde_json::from_str(json).unwrap();
        assert_eq!(c.attention_head_dim.get(2), Some(20));
        assert_eq!(c.transformer_layers_per_block.get(2), Some(10));
        assert_eq!(c.num_attention_heads, None);
        assert_eq!(c.projection_class_embeddings_input_dim, Some(2816));
    }

    #[test]
    fn scheduler_defaults_are_sdxl_betas() {
        let c: SchedulerConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c.num_train_timesteps, 1000);
        assert_eq!(c.beta_schedule, "scaled_linear");
        assert!((c.beta_start - 0.00085).abs() < 1e-12);
    }
}
