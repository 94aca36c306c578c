//! Where an SDXL model's component files are: a local diffusers-layout folder, or Hugging Face
//! repos fetched through hf-hub (cache first, network only for files not cached yet).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Hugging Face repos for an SDXL model. Everything comes from `base` unless overridden.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HubSource {
    /// diffusers repo with tokenizers, text encoders, scheduler and UNet config,
    /// e.g. `stabilityai/stable-diffusion-xl-base-1.0`.
    pub base: String,
    #[serde(default)]
    pub revision: Option<String>,
    /// Repo of the UNet weights file, e.g. `ByteDance/SDXL-Lightning`.
    #[serde(default)]
    pub unet_repo: Option<String>,
    /// UNet weights file in `unet_repo`, e.g. `sdxl_lightning_4step_unet.safetensors`.
    #[serde(default)]
    pub unet_file: Option<String>,
    /// A diffusers VAE repo replacing the base VAE, e.g. `madebyollin/sdxl-vae-fp16-fix`
    /// (config.json + diffusion_pytorch_model.safetensors at its root).
    #[serde(default)]
    pub vae_repo: Option<String>,
    /// Use the `*.fp16.safetensors` variants of the base repo's weights.
    #[serde(default)]
    pub fp16_variant: bool,
}

/// The concrete local files of one SDXL model.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    pub tokenizer: PathBuf,
    pub tokenizer_2: PathBuf,
    pub text_encoder_config: PathBuf,
    pub text_encoder: PathBuf,
    pub text_encoder_2_config: PathBuf,
    pub text_encoder_2: PathBuf,
    pub unet_config: PathBuf,
    pub unet: PathBuf,
    pub vae_config: PathBuf,
    pub vae: PathBuf,
    /// Absent in some repos; the SDXL defaults are used then.
    pub scheduler_config: Option<PathBuf>,
}

const TOKENIZER_FILES: [&str; 4] = [
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer_config.json",
];

impl ModelFiles {
    /// Resolves a diffusers-layout folder. `unet_file`, when given, replaces
    /// `unet/diffusion_pytorch_model.safetensors` (relative paths are inside `dir`).
    pub fn from_dir(dir: &Path, unet_file: Option<&Path>) -> Result<Self> {
        let need = |p: PathBuf| -> Result<PathBuf> {
            if p.is_file() {
                Ok(p)
            } else {
                Err(Error::io(
                    &p,
                    std::io::Error::new(std::io::ErrorKind::NotFound, "not found"),
                ))
            }
        };
        let weights = |sub: &str, stem: &str| -> Result<PathBuf> {
            let plain = dir.join(sub).join(format!("{stem}.safetensors"));
            let fp16 = dir.join(sub).join(format!("{stem}.fp16.safetensors"));
            if plain.is_file() {
                Ok(plain)
            } else {
                need(fp16).map_err(|_| {
                    Error::io(
                        &plain,
                        std::io::Error::new(std::io::ErrorKind::NotFound, "not found"),
                    )
                })
            }
        };
        for sub in ["tokenizer", "tokenizer_2"] {
            for f in &TOKENIZER_FILES[..2] {
                need(dir.join(sub).join(f))?;
            }
        }
        let unet = match unet_file {
            Some(p) => need(dir.join(p))?,
            None => weights("unet", "diffusion_pytorch_model")?,
        };
        let scheduler = dir.join("scheduler").join("scheduler_config.json");
        Ok(ModelFiles {
            tokenizer: dir.join("tokenizer"),
            tokenizer_2: dir.join("tokenizer_2"),
            text_encoder_config: need(dir.join("text_encoder/config.json"))?,
            text_encoder: weights("text_encoder", "model")?,
            text_encoder_2_config: need(dir.join("text_encoder_2/config.json"))?,
            text_encoder_2: weights("text_encoder_2", "model")?,
            unet_config: need(dir.join("unet/config.json"))?,
            unet,
            vae_config: need(dir.join("vae/config.json"))?,
            vae: weights("vae", "diffusion_pytorch_model")?,
            scheduler_config: scheduler.is_file().then_some(scheduler),
        })
    }

    /// Fetches (or finds in the hf-hub cache under `cache_dir`, default `~/.cache/huggingface`)
    /// every file of `src`. Blocking; call it off the async runtime.
    pub fn from_hub(src: &HubSource, cache_dir: Option<&Path>) -> Result<Self> {
        use hf_hub::api::sync::ApiBuilder;
        use hf_hub::{Cache, Repo, RepoType};
        let cache = match cache_dir {
            Some(d) => Cache::new(d.to_path_buf()),
            None => Cache::default(),
        };
        let api = ApiBuilder::from_cache(cache)
            .with_progress(false)
            .build()
            .map_err(|e| Error::Hub {
                repo: src.base.clone(),
                file: String::new(),
                message: e.to_string(),
            })?;
        let repo_of = |id: &str| {
            let rev = src.revision.clone().unwrap_or_else(|| "main".into());
            if id == src.base {
                api.repo(Repo::with_revision(id.to_string(), RepoType::Model, rev))
            } else {
                api.repo(Repo::new(id.to_string(), RepoType::Model))
            }
        };
        let fetch = |id: &str, file: &str| -> Result<PathBuf> {
            repo_of(id).get(file).map_err(|e| Error::Hub {
                repo: id.to_string(),
                file: file.to_string(),
                message: e.to_string(),
            })
        };
        let variant = if src.fp16_variant { ".fp16" } else { "" };
        let base = src.base.as_str();
        let mut tok_dirs = Vec::new();
        for sub in ["tokenizer", "tokenizer_2"] {
            let mut d = None;
            for f in TOKENIZER_FILES {
                let p = fetch(base, &format!("{sub}/{f}"));
                match (p, f) {
                    (Ok(p), _) => d = p.parent().map(Path::to_path_buf),
                    // The two json maps are optional.
                    (Err(_), "special_tokens_map.json" | "tokenizer_config.json") => {}
                    (Err(e), _) => return Err(e),
                }
            }
            tok_dirs.push(d.ok_or_else(|| Error::config(sub, "no tokenizer files"))?);
        }
        let unet = match (&src.unet_repo, &src.unet_file) {
            (Some(repo), Some(file)) => fetch(repo, file)?,
            (None, Some(file)) => fetch(base, file)?,
            _ => fetch(
                base,
                &format!("unet/diffusion_pytorch_model{variant}.safetensors"),
            )?,
        };
        let (vae_config, vae) = match &src.vae_repo {
            Some(repo) => (
                fetch(repo, "config.json")?,
                fetch(repo, "diffusion_pytorch_model.safetensors")?,
            ),
            None => (
                fetch(base, "vae/config.json")?,
                fetch(
                    base,
                    &format!("vae/diffusion_pytorch_model{variant}.safetensors"),
                )?,
            ),
        };
        let tokenizer_2 = tok_dirs.pop().unwrap_or_default();
        let tokenizer = tok_dirs.pop().unwrap_or_default();
        Ok(ModelFiles {
            tokenizer,
            tokenizer_2,
            text_encoder_config: fetch(base, "text_encoder/config.json")?,
            text_encoder: fetch(base, &format!("text_encoder/model{variant}.safetensors"))?,
            text_encoder_2_config: fetch(base, "text_encoder_2/config.json")?,
            text_encoder_2: fetch(base, &format!("text_encoder_2/model{variant}.safetensors"))?,
            unet_config: fetch(base, "unet/config.json")?,
            unet,
            vae_config,
            vae,
            scheduler_config: fetch(base, "scheduler/scheduler_config.json").ok(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_names_the_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = ModelFiles::from_dir(dir.path(), None).unwrap_err();
        assert!(err.to_string().contains("vocab.json"), "{err}");
    }

    #[test]
    fn hub_source_parses_from_toml_like_json() {
        let s: HubSource = serde_json::from_str(
            r#"{"base":"stabilityai/stable-diffusion-xl-base-1.0",
                "unet_repo":"ByteDance/SDXL-Lightning",
                "unet_file":"sdxl_lightning_4step_unet.safetensors",
                "vae_repo":"madebyollin/sdxl-vae-fp16-fix"}"#,
        )
        .unwrap();
        assert_eq!(s.unet_repo.as_deref(), Some("ByteDance/SDXL-Lightning"));
        assert!(!s.fp16_variant);
    }
}
