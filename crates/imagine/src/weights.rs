//! Memory-mapped safetensors loading: the crate's one `unsafe` site.
#![allow(unsafe_code)]

use std::path::Path;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;

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
