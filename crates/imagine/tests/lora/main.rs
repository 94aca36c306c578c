//! LoRA: numerical parity with diffusers' `load_lora_weights` + `set_adapters`, the adapters'
//! life time, and the typed refusal of files that do not fit.
//!
//! `tests/fixtures/imagine/lora/` was produced by `scripts/sdxl-lora-parity.sh`: a seeded LoRA
//! in the peft layout (with diffusers' adapter-config metadata) and one in kohya's layout with
//! SGM UNet names (float16, `.alpha` tensors, LoCon on convolutions), for the tiny model Hearth's
//! generator writes; and the latents diffusers generates from fixed noise with each, both, and
//! none. Tolerance as `tests/parity.rs`: max |hearth - reference| / max |reference| <= 1e-5
//! (measured, f32 on a CPU: 6.6e-7 with the peft file, 9.4e-7 with the kohya one, 2.0e-6 with
//! both, 8.3e-7 with none; the latents reach about 55). The tests print what they measure.

mod hostile;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use hearth_imagine::pipeline::Noise;
use hearth_imagine::tiny::TINY_SEED;
use hearth_imagine::{
    write_tiny_sdxl, ActiveLora, Error, ImageParams, Lora, ModelFiles, SdxlPipeline,
};
use sha2::{Digest, Sha256};

const TIGHT: f64 = 1e-5;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/imagine/lora")
}

struct Setup {
    dir: tempfile::TempDir,
    p: SdxlPipeline,
    t: HashMap<String, Tensor>,
    meta: serde_json::Value,
}

impl Setup {
    fn get(&self, name: &str) -> &Tensor {
        self.t
            .get(name)
            .unwrap_or_else(|| panic!("fixture lacks {name}"))
    }

    fn meta(&self, key: &str) -> String {
        self.meta[key].as_str().unwrap().to_string()
    }

    fn scale(&self, key: &str) -> f64 {
        self.meta(key).parse().unwrap()
    }

    fn lora(&self, file: &str) -> Arc<Lora> {
        Arc::new(Lora::load(&fixtures().join(file), &self.p).unwrap())
    }

    fn params(&self, loras: Vec<ActiveLora>) -> ImageParams {
        let size = self.meta("gen_size").parse().unwrap();
        ImageParams {
            prompt: self.meta("prompt"),
            negative_prompt: String::new(),
            seed: 0,
            steps: self.meta("gen_steps").parse().unwrap(),
            width: size,
            height: size,
            guidance_scale: 0.0,
            init: None,
            loras,
        }
    }

    /// The 4-step latents from the fixture's noise.
    fn latents(&self, loras: Vec<ActiveLora>) -> Tensor {
        let noise = Noise::from(self.get("noise"));
        self.p
            .sample(&self.params(loras), &noise, &|| false)
            .unwrap()
    }
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_sdxl(dir.path(), TINY_SEED).unwrap();
    let t = candle_core::safetensors::load(fixtures().join("reference.safetensors"), &Device::Cpu)
        .expect("LoRA fixture (run scripts/sdxl-lora-parity.sh)");
    let meta =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("reference.json")).unwrap())
            .unwrap();
    let files = ModelFiles::from_dir(dir.path(), None).unwrap();
    let p = SdxlPipeline::load(&files, &Device::Cpu, DType::F32).unwrap();
    Setup { dir, p, t, meta }
}

/// max |a - b| / max |b|, after checking shapes agree.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shape mismatch");
    let a = a.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let b = b.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let max = |t: &Tensor| t.abs().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap();
    max(&(&a - &b).unwrap()) / max(&b).max(1e-12)
}

fn check(name: &str, ours: &Tensor, reference: &Tensor) {
    let e = rel_err(ours, reference);
    let abs = (ours - reference)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    println!("{name}: relative max error {e:.3e}, max abs diff {abs:.3e} (tolerance {TIGHT:.0e})");
    assert!(
        e <= TIGHT,
        "{name}: relative max error {e:.3e} exceeds {TIGHT:.0e}"
    );
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn the_tiny_model_is_the_one_the_reference_ran() {
    let s = setup();
    for (key, file) in [
        ("unet_sha256", "unet/diffusion_pytorch_model.safetensors"),
        ("te1_sha256", "text_encoder/model.safetensors"),
        ("te2_sha256", "text_encoder_2/model.safetensors"),
    ] {
        let bytes = std::fs::read(s.dir.path().join(file)).unwrap();
        let digest: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(digest, s.meta(key), "{file} differs from the reference's");
    }
    check(
        "latents without LoRA",
        &s.latents(vec![]),
        s.get("base_latents"),
    );
}

#[test]
fn peft_layout_matches_diffusers_in_the_text_encoders_and_the_latents() {
    let s = setup();
    let lora = s.lora("peft.safetensors");
    let active = vec![ActiveLora::new(lora, s.scale("peft_scale"))];
    {
        let _guard = s.p.apply_loras(&active).unwrap();
        let e = s.p.encode_prompt(&s.meta("prompt")).unwrap();
        check(
            "peft prompt embeds",
            &e.context,
            s.get("peft_prompt_embeds"),
        );
        check("peft pooled", &e.pooled, s.get("peft_pooled"));
    }
    check("peft latents", &s.latents(active), s.get("peft_latents"));
}

#[test]
fn kohya_layout_with_sgm_names_and_locon_matches_diffusers() {
    let s = setup();
    let lora = s.lora("kohya.safetensors");
    let active = vec![ActiveLora::new(lora, s.scale("kohya_scale"))];
    {
        let _guard = s.p.apply_loras(&active).unwrap();
        let e = s.p.encode_prompt(&s.meta("prompt")).unwrap();
        check(
            "kohya prompt embeds",
            &e.context,
            s.get("kohya_prompt_embeds"),
        );
    }
    check("kohya latents", &s.latents(active), s.get("kohya_latents"));
}

#[test]
fn two_loras_at_once_match_diffusers_with_two_adapters() {
    let s = setup();
    let active = vec![
        ActiveLora::new(s.lora("peft.safetensors"), s.scale("peft_scale")),
        ActiveLora::new(s.lora("kohya.safetensors"), s.scale("kohya_scale")),
    ];
    check("both latents", &s.latents(active), s.get("both_latents"));
}

#[test]
fn scale_zero_and_every_way_out_of_a_generation_leave_the_model_without_lora() {
    let s = setup();
    let base = values(&s.latents(vec![]));
    let lora = s.lora("kohya.safetensors");
    assert_eq!(
        values(&s.latents(vec![ActiveLora::new(lora.clone(), 0.0)])),
        base
    );
    let with = values(&s.latents(vec![ActiveLora::new(lora.clone(), 1.0)]));
    assert_ne!(with, base);
    // After a generation with it: gone.
    assert_eq!(values(&s.latents(vec![])), base);
    // After one cancelled midway: gone too.
    let params = s.params(vec![ActiveLora::new(lora.clone(), 1.0)]);
    let noise = Noise::from(s.get("noise"));
    let stopped =
        s.p.sample_observed(&params, &noise, &mut |done, _| done == 2);
    assert!(matches!(stopped, Err(Error::Cancelled)), "{stopped:?}");
    assert_eq!(values(&s.latents(vec![])), base);
    // And after one refused (a size that is not a multiple of 8).
    let mut bad = s.params(vec![ActiveLora::new(lora, 1.0)]);
    bad.width = 60;
    assert!(s.p.sample(&bad, &noise, &|| false).is_err());
    assert_eq!(values(&s.latents(vec![])), base);
}

/// Writes `tensors` (f32) as safetensors with `metadata`, as `candle` cannot write metadata.
fn write_st(path: &Path, tensors: &[(String, Tensor)], metadata: Option<serde_json::Value>) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, t) in tensors {
        let v = values(t);
        let start = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": t.dims(), "data_offsets": [start, data.len()]}),
        );
    }
    if let Some(m) = metadata {
        header.insert("__metadata__".into(), m);
    }
    let header = serde_json::to_vec(&header).unwrap();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

fn read_st(path: &Path) -> Vec<(String, Tensor)> {
    let mut t: Vec<_> = candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap()
        .into_iter()
        .collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

fn peft_metadata() -> serde_json::Value {
    let bytes = std::fs::read(fixtures().join("peft.safetensors")).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    header["__metadata__"].clone()
}

#[test]
fn other_spellings_of_the_same_modules_give_the_same_image() {
    let s = setup();
    let peft = read_st(&fixtures().join("peft.safetensors"));
    let reference = values(&s.latents(vec![ActiveLora::new(s.lora("peft.safetensors"), 0.7)]));
    let dir = tempfile::tempdir().unwrap();
    // diffusers' own (non-peft) spelling, alphas still from the adapter metadata.
    let diffusers: Vec<_> = peft
        .iter()
        .map(|(k, t)| {
            let k = if k.starts_with("unet.") {
                k.replace(".lora_A.", ".lora.down.")
                    .replace(".lora_B.", ".lora.up.")
            } else {
                k.replace(".lora_A.", ".lora_linear_layer.down.")
                    .replace(".lora_B.", ".lora_linear_layer.up.")
            };
            (k, t.clone())
        })
        .collect();
    // kohya's, with diffusers' module names and the metadata's alphas as `.alpha` tensors.
    let mut kohya = Vec::new();
    for (k, t) in &peft {
        let (module, half) = k.rsplit_once(".lora_").unwrap();
        let (prefix, alpha) = match module.split_once('.').unwrap() {
            ("unet", m) if m.ends_with("attn2.to_k") => (format!("lora_unet_{m}"), 2.0),
            ("unet", m) => (format!("lora_unet_{m}"), 8.0),
            ("text_encoder", m) => (format!("lora_te1_{m}"), 4.0),
            (_, m) => (format!("lora_te2_{m}"), 4.0),
        };
        let name = prefix.replace('.', "_");
        let half = if half.starts_with('A') { "down" } else { "up" };
        kohya.push((format!("{name}.lora_{half}.weight"), t.clone()));
        if half == "down" {
            kohya.push((
                format!("{name}.alpha"),
                Tensor::new(alpha as f32, &Device::Cpu).unwrap(),
            ));
        }
    }
    for (file, tensors, meta) in [
        ("diffusers.safetensors", diffusers, Some(peft_metadata())),
        ("kohya-diffusers-names.safetensors", kohya, None),
    ] {
        let path = dir.path().join(file);
        write_st(&path, &tensors, meta);
        let lora = Arc::new(Lora::load(&path, &s.p).unwrap());
        assert_eq!(lora.layers(), peft.len() / 2);
        let got = values(&s.latents(vec![ActiveLora::new(lora, 0.7)]));
        assert_eq!(got, reference, "{file}");
    }
}

/// So that parity with diffusers cannot hold by both sides skipping a part: each part of each
/// fixture, alone, moves the latents far beyond the tolerance.
#[test]
fn every_part_of_each_fixture_moves_the_image() {
    let s = setup();
    let base = s.latents(vec![]);
    let dir = tempfile::tempdir().unwrap();
    let convs = [
        "_in_layers_",
        "_out_layers_",
        "_skip_connection",
        "_emb_layers_",
        "_2_conv",
    ];
    type Part<'a> = (&'a str, &'a str, &'a dyn Fn(&str) -> bool);
    let parts: [Part; 5] = [
        ("kohya.safetensors", "kohya LoCon", &|k| {
            convs.iter().any(|c| k.contains(c))
        }),
        ("kohya.safetensors", "kohya text encoder", &|k| {
            k.starts_with("lora_te1_")
        }),
        ("peft.safetensors", "peft UNet", &|k| k.starts_with("unet.")),
        ("peft.safetensors", "peft text encoder", &|k| {
            k.starts_with("text_encoder.")
        }),
        ("peft.safetensors", "peft text encoder 2", &|k| {
            k.starts_with("text_encoder_2.")
        }),
    ];
    for (file, part, keep) in parts {
        let tensors: Vec<_> = read_st(&fixtures().join(file))
            .into_iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, t)| (k, t.to_dtype(DType::F32).unwrap()))
            .collect();
        let meta = file.starts_with("peft").then(peft_metadata);
        let path = dir.path().join(format!("{part}.safetensors"));
        write_st(&path, &tensors, meta);
        let lora = Arc::new(Lora::load(&path, &s.p).unwrap());
        let moved = rel_err(&s.latents(vec![ActiveLora::new(lora, 1.0)]), &base);
        println!(
            "{part} ({} tensors) alone moves the latents by {moved:.3e}",
            tensors.len()
        );
        assert!(
            moved > 1e-3,
            "{part} barely moves the latents ({moved:.3e})"
        );
    }
}
