//! Reading the emulator's tensors out of a GGUF file, as the file stores them.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, TensorInfo};
use candle_core::quantized::GgmlDType;
use hearth_infer::Error;

use super::{f16_at, metadata, unsupported};

/// Streams tensors out of a GGUF file through one reusable buffer.
pub(super) struct Reader<'a> {
    pub(super) path: &'a Path,
    pub(super) file: File,
    pub(super) content: &'a Content,
    pub(super) buf: Vec<u8>,
}

impl<'a> Reader<'a> {
    pub(super) fn info(&self, name: &str) -> Result<&'a TensorInfo, Error> {
        self.content
            .tensor_infos
            .get(name)
            .ok_or_else(|| metadata(name, "tensor missing from the GGUF file"))
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// `len` bytes at `offset` of the file into `buf`.
    pub(super) fn read_at(&mut self, offset: u64, len: usize) -> Result<(), Error> {
        let io = |source| Error::Io {
            path: self.path.to_path_buf(),
            source,
        };
        self.buf.resize(len, 0);
        self.file.seek(SeekFrom::Start(offset)).map_err(io)?;
        self.file.read_exact(&mut self.buf[..len]).map_err(io)
    }

    /// A tensor of `len` f32 or f16 values (the norms), as f32.
    pub(super) fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, Error> {
        let info = self.info(name)?;
        let n = info.shape.elem_count();
        if n != len {
            return Err(metadata(name, format!("has {n} elements, expected {len}")));
        }
        let size = match info.ggml_dtype {
            GgmlDType::F32 => 4,
            GgmlDType::F16 => 2,
            other => return Err(unsupported(name, format_args!("a {other:?} vector"))),
        };
        self.read_at(self.content.tensor_data_offset + info.offset, n * size)?;
        Ok(if size == 4 {
            self.buf
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        } else {
            self.buf.chunks_exact(2).map(f16_at).collect()
        })
    }
}
