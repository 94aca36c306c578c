//! The tiny SDXL-shaped test model: same architecture, file layout and config format as
//! `stabilityai/stable-diffusion-xl-base-1.0`, with small widths, few layers and seeded random
//! weights, so the whole pipeline runs in seconds on a CPU. It makes meaningless pictures; it
//! exists for tests, benchmarks of the machinery, and numerical parity against diffusers.
//!
//! Layout written (diffusers' own, loadable by `StableDiffusionXLPipeline.from_pretrained`):
//! `model_index.json`, `scheduler/`, `tokenizer{,_2}/` (vocab.json, merges.txt, configs),
//! `text_encoder{,_2}/` (config.json, model.safetensors), `unet/` and `vae/`
//! (config.json, diffusion_pytorch_model.safetensors).
//!
//! Weights are made by building each component through a `VarBuilder` whose backend creates
//! every requested tensor on the fly, seeded from the tensor's name; so names and shapes are
//! exactly what the loaders ask for, and the same seed always writes the same bytes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use candle_transformers::models::stable_diffusion::vae::{AutoEncoderKL, AutoEncoderKLConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::clip::ClipTextEncoder;
use crate::config::{ClipTextConfig, UNetConfig, VaeConfig};
use crate::error::{Error, Result};
use crate::tokenizer::{byte_order, bytes_to_unicode};
use crate::unet::SdxlUNet;

/// Default seed of the tiny model's weights.
pub const TINY_SEED: u64 = 20240221;

/// Marker file written last: a folder with it holds a complete tiny model.
pub const TINY_MARKER: &str = "hearth-tiny-sdxl.json";

/// Words the tiny BPE vocabulary is trained on (prompt-like English).
const CORPUS: &str = "a photo of an astronaut riding a horse on the moon, a cat sitting on a \
    red chair in the garden, portrait of a woman with blue eyes, landscape with mountains and a \
    lake at sunset, cinematic lighting, highly detailed, digital painting, the city at night \
    with neon lights, a dog running on the beach, watercolor painting of flowers, an old castle \
    in the forest, futuristic robot holding a candle, oil painting of a ship in a storm, studio \
    photograph, sharp focus, colorful, beautiful, dark, bright, green, yellow, white, black, \
    small house, big tree, snow, rain, fire, water, sky, clouds, sun, stars, person, people, \
    street, river, bridge, flower, bird, fish, car, train, tower, temple, desert, ocean, ice";

/// Writes the tiny model into `dir` (created if needed). Existing files are overwritten.
pub fn write_tiny_sdxl(dir: &Path, seed: u64) -> Result<()> {
    write_tiny(dir, seed, 4)
}

/// [`write_tiny_sdxl`] with an inpainting UNet: 9 input channels (the latents, the mask and the
/// masked picture's latents), as `diffusers/stable-diffusion-xl-1.0-inpainting-0.1` has.
pub fn write_tiny_sdxl_inpainting(dir: &Path, seed: u64) -> Result<()> {
    write_tiny(dir, seed, 9)
}

fn write_tiny(dir: &Path, seed: u64, unet_in_channels: usize) -> Result<()> {
    let mk = |sub: &str| -> Result<std::path::PathBuf> {
        let p = dir.join(sub);
        std::fs::create_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        Ok(p)
    };
    for sub in [
        "scheduler",
        "tokenizer",
        "tokenizer_2",
        "text_encoder",
        "text_encoder_2",
        "unet",
        "vae",
    ] {
        mk(sub)?;
    }
    let (vocab, merges) = train_bpe(CORPUS, 300);
    let vocab_size = vocab.len();
    for (sub, pad) in [("tokenizer", "<|endoftext|>"), ("tokenizer_2", "!")] {
        write_tokenizer(&dir.join(sub), &vocab, &merges, pad)?;
    }

    let te1 = clip_config(vocab_size, 32, 64, 2, 3, "quick_gelu", 32);
    let te2 = clip_config(vocab_size, 64, 128, 4, 3, "gelu", 32);
    let mut unet = unet_config(96, 32 + 6 * 8);
    unet["in_channels"] = json!(unet_in_channels);
    let vae = vae_config();

    let dev = Device::Cpu;
    let make = |name: &str, build: &dyn Fn(VarBuilder) -> Result<()>| -> Result<()> {
        let rec = Recorder::new(seed ^ fnv1a(name.as_bytes()));
        let store = rec.tensors.clone();
        build(VarBuilder::from_backend(
            Box::new(rec),
            DType::F32,
            dev.clone(),
        ))?;
        let map: HashMap<String, Tensor> = store
            .lock()
            .map_err(|_| Error::config(name, "recorder lock poisoned"))?
            .clone();
        let path = dir.join(name);
        candle_core::safetensors::save(&map, &path)?;
        Ok(())
    };
    let c1: ClipTextConfig = from_value(&te1)?;
    let c2: ClipTextConfig = from_value(&te2)?;
    let cu: UNetConfig = from_value(&unet)?;
    let cv: VaeConfig = from_value(&vae)?;
    make("text_encoder/model.safetensors", &|vb| {
        ClipTextEncoder::new(vb, &c1, false).map(|_| ())
    })?;
    make("text_encoder_2/model.safetensors", &|vb| {
        ClipTextEncoder::new(vb, &c2, true).map(|_| ())
    })?;
    make("unet/diffusion_pytorch_model.safetensors", &|vb| {
        SdxlUNet::new(vb, &cu).map(|_| ())
    })?;
    make("vae/diffusion_pytorch_model.safetensors", &|vb| {
        AutoEncoderKL::new(
            vb,
            3,
            3,
            AutoEncoderKLConfig {
                block_out_channels: cv.block_out_channels.clone(),
                layers_per_block: cv.layers_per_block,
                latent_channels: cv.latent_channels,
                norm_num_groups: cv.norm_num_groups,
                use_quant_conv: true,
                use_post_quant_conv: true,
            },
        )
        .map(|_| ())
        .map_err(Error::from)
    })?;

    write_json(&dir.join("text_encoder/config.json"), &te1)?;
    write_json(&dir.join("text_encoder_2/config.json"), &te2)?;
    write_json(&dir.join("unet/config.json"), &unet)?;
    write_json(&dir.join("vae/config.json"), &vae)?;
    write_json(
        &dir.join("scheduler/scheduler_config.json"),
        &scheduler_config(),
    )?;
    write_json(&dir.join("model_index.json"), &model_index())?;
    write_json(
        &dir.join(TINY_MARKER),
        &json!({"generator": "hearth dev tiny-sdxl", "seed": seed, "note":
            "tiny SDXL-shaped test model with random weights; it does not make real pictures"}),
    )?;
    Ok(())
}

/// Writes the tiny model into `dir`, then replaces its four configs with those of the full-size
/// SDXL base (CLIP ViT-L and OpenCLIP ViT-bigG text encoders, the 2.6B-weight UNet, the VAE,
/// marked fp16-safe as SDXL-Lightning is served with the fp16-fixed VAE). Its weight files stay
/// the tiny ones and do not fit: the folder is for [`crate::SdxlPipeline::random`], which makes
/// full-size random weights on the device.
pub fn write_full_sdxl_configs(dir: &Path) -> Result<()> {
    write_tiny_sdxl(dir, TINY_SEED)?;
    let vocab = 49408;
    write_json(
        &dir.join("text_encoder/config.json"),
        &clip_config(vocab, 768, 3072, 12, 12, "quick_gelu", 768),
    )?;
    write_json(
        &dir.join("text_encoder_2/config.json"),
        &clip_config(vocab, 1280, 5120, 20, 32, "gelu", 1280),
    )?;
    let mut unet = unet_config(2048, 2816);
    for (k, v) in [
        ("addition_time_embed_dim", json!(256)),
        ("attention_head_dim", json!([5, 10, 20])),
        ("block_out_channels", json!([320, 640, 1280])),
        ("transformer_layers_per_block", json!([1, 2, 10])),
    ] {
        unet[k] = v;
    }
    write_json(&dir.join("unet/config.json"), &unet)?;
    let mut vae = vae_config();
    vae["block_out_channels"] = json!([128, 256, 512, 512]);
    vae["layers_per_block"] = json!(2);
    vae["force_upcast"] = json!(false);
    write_json(&dir.join("vae/config.json"), &vae)?;
    Ok(())
}

/// Whether `dir` holds a complete tiny model written by [`write_tiny_sdxl`].
pub fn is_tiny_model(dir: &Path) -> bool {
    dir.join(TINY_MARKER).is_file()
}

fn from_value<T: for<'de> serde::Deserialize<'de>>(v: &Value) -> Result<T> {
    serde_json::from_value(v.clone()).map_err(|e| Error::config("tiny model config", e.to_string()))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::config(path, e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| Error::io(path, e))
}

fn clip_config(
    vocab: usize,
    hidden: usize,
    inter: usize,
    heads: usize,
    layers: usize,
    act: &str,
    proj: usize,
) -> Value {
    let arch = if act == "gelu" {
        "CLIPTextModelWithProjection"
    } else {
        "CLIPTextModel"
    };
    json!({
        "architectures": [arch], "model_type": "clip_text_model",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
        "num_attention_heads": heads, "num_hidden_layers": layers,
        "max_position_embeddings": 77, "hidden_act": act, "layer_norm_eps": 1e-5,
        "projection_dim": proj, "attention_dropout": 0.0, "dropout": 0.0,
        "initializer_factor": 1.0, "initializer_range": 0.02,
        "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "torch_dtype": "float32"
    })
}

fn unet_config(cross: usize, add_in: usize) -> Value {
    json!({
        "_class_name": "UNet2DConditionModel", "_diffusers_version": "0.19.0",
        "act_fn": "silu", "addition_embed_type": "text_time", "addition_embed_type_num_heads": 64,
        "addition_time_embed_dim": 8, "attention_head_dim": [2, 2, 4],
        "block_out_channels": [32, 64, 64], "center_input_sample": false,
        "cross_attention_dim": cross,
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "downsample_padding": 1, "flip_sin_to_cos": true, "freq_shift": 0,
        "in_channels": 4, "layers_per_block": 2, "mid_block_scale_factor": 1,
        "norm_eps": 1e-5, "norm_num_groups": 32, "out_channels": 4,
        "projection_class_embeddings_input_dim": add_in, "sample_size": 128,
        "transformer_layers_per_block": [1, 1, 2],
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        "use_linear_projection": true
    })
}

fn vae_config() -> Value {
    json!({
        "_class_name": "AutoencoderKL", "_diffusers_version": "0.19.0", "act_fn": "silu",
        "block_out_channels": [32, 32, 64, 64],
        "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
        "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
        "in_channels": 3, "out_channels": 3, "latent_channels": 4, "layers_per_block": 1,
        "norm_num_groups": 32, "sample_size": 1024, "scaling_factor": 0.13025,
        "force_upcast": true
    })
}

fn scheduler_config() -> Value {
    json!({
        "_class_name": "EulerDiscreteScheduler", "_diffusers_version": "0.19.0",
        "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
        "interpolation_type": "linear", "num_train_timesteps": 1000,
        "prediction_type": "epsilon", "steps_offset": 1, "timestep_spacing": "trailing",
        "trained_betas": null, "use_karras_sigmas": false
    })
}

fn model_index() -> Value {
    json!({
        "_class_name": "StableDiffusionXLPipeline", "_diffusers_version": "0.19.0",
        "force_zeros_for_empty_prompt": true,
        "scheduler": ["diffusers", "EulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"]
    })
}

fn write_tokenizer(
    dir: &Path,
    vocab: &[String],
    merges: &[(String, String)],
    pad: &str,
) -> Result<()> {
    let map: BTreeMap<&str, usize> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    write_json(&dir.join("vocab.json"), &json!(map))?;
    let mut text = String::from("#version: 0.2\n");
    for (a, b) in merges {
        text.push_str(&format!("{a} {b}\n"));
    }
    let p = dir.join("merges.txt");
    std::fs::write(&p, text).map_err(|e| Error::io(&p, e))?;
    let special = json!({
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "pad_token": pad
    });
    write_json(&dir.join("special_tokens_map.json"), &special)?;
    let mut cfg = special.clone();
    if let Value::Object(o) = &mut cfg {
        o.insert("tokenizer_class".into(), json!("CLIPTokenizer"));
        o.insert("model_max_length".into(), json!(77));
        o.insert("do_lower_case".into(), json!(true));
        o.insert("errors".into(), json!("replace"));
        o.insert("add_prefix_space".into(), json!(false));
    }
    write_json(&dir.join("tokenizer_config.json"), &cfg)
}

/// A deterministic byte-level BPE trainer: CLIP's vocabulary order (bytes, bytes + `</w>`,
/// merged symbols in merge order, then the two special tokens) over `corpus`'s words.
fn train_bpe(corpus: &str, n_merges: usize) -> (Vec<String>, Vec<(String, String)>) {
    let table = bytes_to_unicode();
    let mut vocab: Vec<String> = byte_order()
        .iter()
        .map(|&b| table[b as usize].to_string())
        .collect();
    let with_end: Vec<String> = vocab.iter().map(|c| format!("{c}</w>")).collect();
    vocab.extend(with_end);
    // Word -> count, each word split into symbols with `</w>` on the last one.
    let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for w in corpus
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let chars: Vec<char> = w.to_lowercase().chars().collect();
        let mut syms: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        if let Some(last) = syms.last_mut() {
            last.push_str("</w>");
        }
        *words.entry(syms).or_default() += 1;
    }
    let mut merges = Vec::new();
    while merges.len() < n_merges {
        let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (syms, n) in &words {
            for p in syms.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_default() += n;
            }
        }
        // Most frequent pair; ties go to the smallest pair (BTreeMap order) for determinism.
        let Some((pair, _)) = counts.into_iter().fold(
            None::<((String, String), usize)>,
            |best, (p, n)| match best {
                Some((_, bn)) if bn >= n => best,
                _ => Some((p, n)),
            },
        ) else {
            break;
        };
        let joined = format!("{}{}", pair.0, pair.1);
        words = words
            .into_iter()
            .map(|(syms, n)| {
                let mut out = Vec::with_capacity(syms.len());
                let mut i = 0;
                while i < syms.len() {
                    if i + 1 < syms.len() && syms[i] == pair.0 && syms[i + 1] == pair.1 {
                        out.push(joined.clone());
                        i += 2;
                    } else {
                        out.push(syms[i].clone());
                        i += 1;
                    }
                }
                (out, n)
            })
            .collect();
        if !vocab.contains(&joined) {
            vocab.push(joined);
        }
        merges.push(pair);
    }
    vocab.push("<|startoftext|>".into());
    vocab.push("<|endoftext|>".into());
    (vocab, merges)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A `VarBuilder` backend that invents each requested tensor (seeded by its name) and keeps it.
struct Recorder {
    seed: u64,
    tensors: Arc<Mutex<HashMap<String, Tensor>>>,
}

impl Recorder {
    fn new(seed: u64) -> Self {
        Recorder {
            seed,
            tensors: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl SimpleBackend for Recorder {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut map = self
            .tensors
            .lock()
            .map_err(|_| candle_core::Error::Msg("recorder lock poisoned".into()))?;
        if let Some(t) = map.get(name) {
            if t.shape() != &s {
                return Err(candle_core::Error::Msg(format!(
                    "{name} requested as {s:?} and {:?}",
                    t.shape()
                )));
            }
            return t.to_dtype(dtype)?.to_device(dev);
        }
        let n = s.elem_count();
        let dims = s.dims();
        let fan_in = if dims.len() > 1 { n / dims[0] } else { n };
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ fnv1a(name.as_bytes()));
        let mut normal = || -> f64 {
            let u1: f64 = 1.0 - rng.gen::<f64>();
            let u2: f64 = rng.gen::<f64>();
            (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        };
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let z = normal();
                let v = match h {
                    // Norm weights near 1, biases near 0: perturbed so mistakes show in parity.
                    Init::Const(c) if c != 0.0 => c + 0.1 * z,
                    Init::Const(_) => 0.05 * z,
                    Init::Randn { mean, stdev } => mean + stdev.min(0.5) * z,
                    Init::Uniform { lo, up } => lo + (up - lo) * (z.tanh() * 0.5 + 0.5),
                    Init::Kaiming { .. } => z / (fan_in.max(1) as f64).sqrt(),
                };
                v as f32
            })
            .collect();
        let t = Tensor::from_vec(values, s, &Device::Cpu)?;
        map.insert(name.to_string(), t.clone());
        t.to_dtype(dtype)?.to_device(dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let map = self
            .tensors
            .lock()
            .map_err(|_| candle_core::Error::Msg("recorder lock poisoned".into()))?;
        match map.get(name) {
            Some(t) => t.to_dtype(dtype)?.to_device(dev),
            None => Err(candle_core::Error::Msg(format!("{name} has no shape yet"))),
        }
    }

    fn contains_tensor(&self, _name: &str) -> bool {
        // Lets loaders that probe for diffusers' current tensor names pick them.
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpe_training_is_deterministic_and_keeps_clip_vocab_order() {
        let (v1, m1) = train_bpe(CORPUS, 300);
        let (v2, m2) = train_bpe(CORPUS, 300);
        assert_eq!(v1, v2);
        assert_eq!(m1, m2);
        assert_eq!(v1[0], "!");
        assert_eq!(v1[256], "!</w>");
        assert_eq!(v1.last().unwrap(), "<|endoftext|>");
        assert!(m1.len() > 100, "{} merges", m1.len());
    }
}
