//! Every name a LoRA file may give an adapter-capable layer, computed from the layer's diffusers
//! module path (which the model itself supplies) rather than parsed out of the file's keys:
//!
//! - diffusers/peft: `unet.<path>` (or the bare `<path>`), `text_encoder.<path>`,
//!   `text_encoder_2.<path>`;
//! - kohya (sd-scripts): `lora_unet_<path with _>`, `lora_te1_<...>` (also `lora_te_`),
//!   `lora_te2_<...>`, and for the UNet also the original SGM (Stability's `generative-models`)
//!   names that kohya's SDXL trainer uses, `lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q`.

use crate::config::UNetConfig;

/// The names of one text encoder's layer: `component` is `text_encoder` or `text_encoder_2`.
pub(crate) fn text_encoder(component: &str, path: &str) -> Vec<String> {
    let kohya: &[&str] = if component == "text_encoder" {
        &["lora_te1_", "lora_te_"]
    } else {
        &["lora_te2_"]
    };
    let mut names = vec![format!("{component}.{path}")];
    names.extend(
        kohya
            .iter()
            .map(|k| format!("{k}{}", path.replace('.', "_"))),
    );
    names
}

/// Maps UNet module paths to SGM names, which number blocks by the UNet's layout.
#[derive(Debug, Clone)]
pub(crate) struct UNetNames {
    /// Resnets per down block (`layers_per_block`; an up block has one more).
    layers: usize,
    /// Whether up block `i` has attentions (then its upsampler is the third module of its
    /// last SGM block, else the second).
    up_attention: Vec<bool>,
}

impl UNetNames {
    pub(crate) fn new(c: &UNetConfig) -> Self {
        UNetNames {
            layers: c.layers_per_block,
            up_attention: c
                .up_block_types
                .iter()
                .map(|t| t.starts_with("CrossAttn"))
                .collect(),
        }
    }

    /// Every name of the UNet layer at `path`.
    pub(crate) fn names(&self, path: &str) -> Vec<String> {
        let mut names = vec![
            format!("unet.{path}"),
            path.to_string(),
            format!("lora_unet_{}", path.replace('.', "_")),
        ];
        if let Some(sgm) = self.sgm(path) {
            names.push(format!("lora_unet_{}", sgm.replace('.', "_")));
        }
        names
    }

    /// The SGM module path of a diffusers UNet module path, `None` for one SGM does not have.
    pub(crate) fn sgm(&self, path: &str) -> Option<String> {
        let parts: Vec<&str> = path.split('.').collect();
        let per = self.layers + 1;
        let num = |s: &str| s.parse::<usize>().ok();
        let tail = |rest: &[&str]| rest.join(".");
        Some(match parts.as_slice() {
            ["conv_in"] => "input_blocks.0.0".into(),
            ["conv_out"] => "out.2".into(),
            ["down_blocks", i, "resnets", j, rest @ ..] => {
                let n = 1 + num(i)? * per + num(j)?;
                format!("input_blocks.{n}.0.{}", resnet(rest)?)
            }
            ["down_blocks", i, "attentions", j, rest @ ..] => {
                let n = 1 + num(i)? * per + num(j)?;
                format!("input_blocks.{n}.1.{}", tail(rest))
            }
            ["down_blocks", i, "downsamplers", "0", "conv"] => {
                format!("input_blocks.{}.0.op", (num(i)? + 1) * per)
            }
            ["mid_block", "resnets", "0", rest @ ..] => format!("middle_block.0.{}", resnet(rest)?),
            ["mid_block", "attentions", "0", rest @ ..] => format!("middle_block.1.{}", tail(rest)),
            ["mid_block", "resnets", "1", rest @ ..] => format!("middle_block.2.{}", resnet(rest)?),
            ["up_blocks", i, "resnets", j, rest @ ..] => {
                let n = num(i)? * per + num(j)?;
                format!("output_blocks.{n}.0.{}", resnet(rest)?)
            }
            ["up_blocks", i, "attentions", j, rest @ ..] => {
                let n = num(i)? * per + num(j)?;
                format!("output_blocks.{n}.1.{}", tail(rest))
            }
            ["up_blocks", i, "upsamplers", "0", "conv"] => {
                let i = num(i)?;
                let inner = if *self.up_attention.get(i)? { 2 } else { 1 };
                format!("output_blocks.{}.{inner}.conv", i * per + self.layers)
            }
            _ => return None,
        })
    }
}

/// A resnet's layer in SGM's `ResBlock`.
fn resnet(rest: &[&str]) -> Option<&'static str> {
    Some(match rest {
        ["conv1"] => "in_layers.2",
        ["conv2"] => "out_layers.3",
        ["time_emb_proj"] => "emb_layers.1",
        ["conv_shortcut"] => "skip_connection",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// stabilityai/stable-diffusion-xl-base-1.0's layout.
    fn sdxl() -> UNetNames {
        UNetNames {
            layers: 2,
            up_attention: vec![true, true, false],
        }
    }

    #[test]
    fn sdxl_paths_map_to_the_sgm_names_kohya_files_use() {
        let n = sdxl();
        for (diffusers, sgm) in [
            (
                "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q",
                "input_blocks.4.1.transformer_blocks.0.attn1.to_q",
            ),
            (
                "down_blocks.2.attentions.1.proj_out",
                "input_blocks.8.1.proj_out",
            ),
            (
                "down_blocks.0.resnets.1.conv1",
                "input_blocks.2.0.in_layers.2",
            ),
            (
                "down_blocks.1.resnets.0.conv_shortcut",
                "input_blocks.4.0.skip_connection",
            ),
            ("down_blocks.0.downsamplers.0.conv", "input_blocks.3.0.op"),
            ("down_blocks.1.downsamplers.0.conv", "input_blocks.6.0.op"),
            (
                "mid_block.resnets.0.time_emb_proj",
                "middle_block.0.emb_layers.1",
            ),
            (
                "mid_block.attentions.0.transformer_blocks.9.ff.net.2",
                "middle_block.1.transformer_blocks.9.ff.net.2",
            ),
            ("mid_block.resnets.1.conv2", "middle_block.2.out_layers.3"),
            (
                "up_blocks.0.attentions.2.transformer_blocks.0.attn2.to_out.0",
                "output_blocks.2.1.transformer_blocks.0.attn2.to_out.0",
            ),
            (
                "up_blocks.1.resnets.1.conv1",
                "output_blocks.4.0.in_layers.2",
            ),
            ("up_blocks.0.upsamplers.0.conv", "output_blocks.2.2.conv"),
            ("up_blocks.1.upsamplers.0.conv", "output_blocks.5.2.conv"),
            (
                "up_blocks.2.resnets.2.conv2",
                "output_blocks.8.0.out_layers.3",
            ),
            ("conv_in", "input_blocks.0.0"),
            ("conv_out", "out.2"),
        ] {
            assert_eq!(n.sgm(diffusers).as_deref(), Some(sgm), "{diffusers}");
        }
        assert_eq!(n.sgm("time_embedding.linear_1"), None);
    }

    #[test]
    fn an_up_block_without_attention_has_its_upsampler_second() {
        let n = UNetNames {
            layers: 2,
            up_attention: vec![false, true, true],
        };
        assert_eq!(
            n.sgm("up_blocks.0.upsamplers.0.conv").as_deref(),
            Some("output_blocks.2.1.conv")
        );
    }

    #[test]
    fn every_spelling_is_listed() {
        let names = sdxl().names("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_out.0");
        assert_eq!(
            names,
            [
                "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_out.0",
                "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_out.0",
                "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_out_0",
                "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_out_0",
            ]
        );
        assert_eq!(
            text_encoder("text_encoder_2", "text_model.encoder.layers.3.mlp.fc1"),
            [
                "text_encoder_2.text_model.encoder.layers.3.mlp.fc1",
                "lora_te2_text_model_encoder_layers_3_mlp_fc1",
            ]
        );
    }
}
