//! Image generation: the SDXL pipeline on candle (both CLIP text encoders, the SDXL UNet with
//! its added time conditioning, the VAE's decoder and its encoder for image-to-image and
//! inpainting, and a plain Euler discrete scheduler with trailing timestep spacing as
//! SDXL-Lightning needs), weight loading from a diffusers-layout folder or Hugging Face repos,
//! the tiny SDXL-shaped test model generator, and the one worker thread per model that serves a
//! bounded queue, fair between users, with progress and cancel.
//!
//! It deliberately knows nothing of HTTP, JSON wire shapes, accounts or prices: the server
//! validates requests against its documented bounds, bills, and maps [`Error`] to responses.

mod blocks;
mod clip;
pub mod config;
pub mod edit;
mod error;
pub mod euler;
pub mod files;
mod jobs;
pub mod layers;
pub mod lora;
pub mod model;
pub mod pipeline;
pub mod tiny;
mod tokenizer;
mod unet;
mod vae;
mod weights;
mod worker;

pub use clip::{ClipOutput, ClipTextEncoder};
pub use edit::{InitImage, Mask};
pub use error::{Error, LoraProblem, Result};
pub use euler::EulerDiscrete;
pub use files::{HubSource, ModelFiles};
pub use jobs::{JobEvent, JobSpec, JobState};
pub use lora::{ActiveLora, Lora, LoraFile, LoraGuard};
pub use model::{load_model, ImageModelSource, LoadOptions, LoadedModel, Provenance};
pub use pipeline::{Image, ImageParams, Noise, PromptEmbeds, SdxlPipeline};
pub use tiny::write_tiny_sdxl;
pub use tokenizer::ClipTokenizer;
pub use unet::SdxlUNet;
pub use vae::LatentDist;
pub use worker::{GeneratedImage, ImageWorker, StepObserver, Submitted, RETRY_AFTER};
