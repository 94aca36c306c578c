//! Loading a configured image model, falling back to the tiny test model when the configured
//! weights are absent.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::files::{HubSource, ModelFiles};
use crate::pipeline::SdxlPipeline;
use crate::tiny::{is_tiny_model, write_tiny_sdxl, TINY_SEED};

/// Where the weights of one image model come from. Paths are resolved by the caller.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ImageModelSource {
    /// A diffusers-layout folder.
    pub weights: Option<PathBuf>,
    /// A UNet weights file replacing the folder's `unet/diffusion_pytorch_model.safetensors`
    /// (e.g. `sdxl_lightning_4step_unet.safetensors`), relative to `weights`.
    pub unet_file: Option<PathBuf>,
    /// Hugging Face repos; used instead of `weights` when set.
    pub hf: Option<HubSource>,
}

/// Device and precision choices for loading.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// `f32`, `f16` or `bf16`; default f32 on CPU and f16 on CUDA.
    pub dtype: Option<String>,
    /// Where the tiny model is written when the configured weights are missing.
    pub tiny_dir: PathBuf,
    /// hf-hub cache folder; the hub's default when `None`.
    pub hub_cache: Option<PathBuf>,
}

/// What was actually loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provenance {
    /// Real weights from a local folder.
    Local(PathBuf),
    /// Real weights from Hugging Face (base repo named).
    Hub(String),
    /// The tiny random-weight test model, from this folder.
    Tiny(PathBuf),
}

impl Provenance {
    /// Whether the tiny test model is being served.
    pub fn is_tiny(&self) -> bool {
        matches!(self, Provenance::Tiny(_))
    }
}

/// A loaded pipeline and where it came from.
#[derive(Debug)]
pub struct LoadedModel {
    pub pipeline: SdxlPipeline,
    pub provenance: Provenance,
}

/// Parses `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(spec: &str) -> Result<Device> {
    match spec.trim() {
        "cpu" => Ok(Device::Cpu),
        s if s == "cuda" || s.starts_with("cuda:") => {
            let ordinal: usize = match s.strip_prefix("cuda:") {
                Some(n) => n.parse().map_err(|_| Error::Device(s.to_string()))?,
                None => 0,
            };
            cuda_device(ordinal, s)
        }
        other => Err(Error::Device(other.to_string())),
    }
}

/// `hearth_gpu`'s device: one stream, no event tracking, the memory pool kept between images.
#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize, _spec: &str) -> Result<Device> {
    Ok(hearth_gpu::cuda_device(
        ordinal,
        hearth_gpu::Tuning::default(),
    )?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_ordinal: usize, spec: &str) -> Result<Device> {
    Err(Error::Device(format!(
        "{spec} (built without the `cuda` feature)"
    )))
}

/// Parses a dtype name, with the device's default when `None`.
pub fn parse_dtype(spec: Option<&str>, device: &Device) -> Result<DType> {
    match spec {
        None if device.is_cpu() => Ok(DType::F32),
        None => Ok(DType::F16),
        Some("f32") => Ok(DType::F32),
        Some("f16") => Ok(DType::F16),
        Some("bf16") => Ok(DType::BF16),
        Some(other) => Err(Error::Device(format!("dtype {other}"))),
    }
}

/// Loads the model `src` describes. When it names no hub repos and its folder has no weights,
/// writes (once) and loads the tiny test model from `opts.tiny_dir`, logging a warning.
/// Blocking (reads gigabytes for a real model): call it off the async runtime.
pub fn load_model(src: &ImageModelSource, opts: &LoadOptions) -> Result<LoadedModel> {
    let device = parse_device(&opts.device)?;
    let dtype = parse_dtype(opts.dtype.as_deref(), &device)?;
    if let Some(hub) = &src.hf {
        let files = ModelFiles::from_hub(hub, opts.hub_cache.as_deref())?;
        let pipeline = SdxlPipeline::load(&files, &device, dtype)?;
        return Ok(LoadedModel {
            pipeline,
            provenance: Provenance::Hub(hub.base.clone()),
        });
    }
    if let Some(dir) = &src.weights {
        if dir.join("model_index.json").is_file() || dir.join("unet").is_dir() {
            let files = ModelFiles::from_dir(dir, src.unet_file.as_deref())?;
            let pipeline = SdxlPipeline::load(&files, &device, dtype)?;
            let provenance = if is_tiny_model(dir) {
                Provenance::Tiny(dir.clone())
            } else {
                Provenance::Local(dir.clone())
            };
            return Ok(LoadedModel {
                pipeline,
                provenance,
            });
        }
    }
    tracing::warn!(
        configured = ?src.weights,
        tiny = %opts.tiny_dir.display(),
        "image weights not found: serving the tiny SDXL-shaped TEST model (random weights)"
    );
    ensure_tiny(&opts.tiny_dir)?;
    let files = ModelFiles::from_dir(&opts.tiny_dir, None)?;
    // The tiny model is always f32: it is small, and its parity reference is f32.
    let pipeline = SdxlPipeline::load(&files, &device, DType::F32)?;
    Ok(LoadedModel {
        pipeline,
        provenance: Provenance::Tiny(opts.tiny_dir.clone()),
    })
}

/// Writes the tiny model into `dir` unless a complete one is already there.
pub fn ensure_tiny(dir: &Path) -> Result<()> {
    if is_tiny_model(dir) {
        return Ok(());
    }
    write_tiny_sdxl(dir, TINY_SEED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse_or_name_the_problem() {
        assert!(parse_device("cpu").unwrap().is_cpu());
        assert!(matches!(parse_device("tpu"), Err(Error::Device(_))));
        #[cfg(not(feature = "cuda"))]
        assert!(matches!(parse_device("cuda:0"), Err(Error::Device(_))));
        assert_eq!(parse_dtype(None, &Device::Cpu).unwrap(), DType::F32);
        assert_eq!(
            parse_dtype(Some("bf16"), &Device::Cpu).unwrap(),
            DType::BF16
        );
    }
}
