//! Where a component's weights come from: memory-mapped safetensors (the crate's one `unsafe`
//! site), or random values made on the device for benchmarks of full-size shapes whose weights
//! cannot be had (`SdxlPipeline::random`).
#![allow(unsafe_code)]

use std::path::Path;

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use crate::error::{Error, Result};

/// A `VarBuilder` over a memory-mapped safetensors file.
///
/// Mapping avoids holding a second copy of multi-gigabyte weights in memory while they are
/// converted to `dtype`. It is unsafe because the file must not be modified while mapped;
/// Hearth only maps its own model files, which nothing rewrites while the server runs.
pub(crate) fn mmap_var_builder(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<VarBuilder<'static>> {
    if !path.is_file() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "not found"),
        ));
    }
    // SAFETY: see above; the mapping lives inside the VarBuilder's backend.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[path], dtype, device)? };
    Ok(vb)
}

/// A `VarBuilder` whose every tensor is made on request, on the device: normal values scaled as
/// the layer's initialisation hint says (norms at their constant). Nothing is read from disk, so
/// a full-size model of billions of weights is ready in seconds on a GPU.
pub(crate) fn random_var_builder(dtype: DType, device: &Device) -> VarBuilder<'static> {
    VarBuilder::from_backend(Box::new(RandomWeights), dtype, device.clone())
}

struct RandomWeights;

impl SimpleBackend for RandomWeights {
    fn get(
        &self,
        s: Shape,
        _name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let dims = s.dims();
        let fan_in = if dims.len() > 1 {
            s.elem_count() / dims[0]
        } else {
            1
        };
        let t = match h {
            Init::Const(c) => Tensor::full(c as f32, s, dev)?,
            Init::Randn { mean, stdev } => Tensor::randn(mean as f32, stdev as f32, s, dev)?,
            Init::Uniform { lo, up } => Tensor::rand(lo as f32, up as f32, s, dev)?,
            Init::Kaiming { .. } => {
                Tensor::randn(0f32, 1.0 / (fan_in.max(1) as f32).sqrt(), s, dev)?
            }
        };
        t.to_dtype(dtype)
    }

    fn get_unchecked(
        &self,
        name: &str,
        _dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        Err(candle_core::Error::Msg(format!(
            "random weights have no shape for {name} until asked with one"
        )))
    }

    fn contains_tensor(&self, _name: &str) -> bool {
        true
    }
}
