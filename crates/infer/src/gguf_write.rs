//! Writing GGUF files: the storage types Hearth writes matrices in ([`WeightType`]) and the one
//! writer ([`GgufWriter`]), which streams tensors one at a time so that a converter holds one
//! tensor, not the model, and which writes beside the destination and renames only a complete
//! file into place. Random models (`random_file.rs`) and requantized ones (`requantize.rs`) are
//! written through it. Reading stays with candle's `gguf_file::Content` (`gguf.rs`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};

use crate::Error;

/// How Hearth stores the matrices of a GGUF file it writes (vectors are always F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightType {
    F16,
    Q8_0,
    Q4_0,
    Q4K,
}

impl WeightType {
    pub(crate) fn ggml(self) -> GgmlDType {
        match self {
            WeightType::F16 => GgmlDType::F16,
            WeightType::Q8_0 => GgmlDType::Q8_0,
            WeightType::Q4_0 => GgmlDType::Q4_0,
            WeightType::Q4K => GgmlDType::Q4K,
        }
    }

    /// Values per block: a matrix's rows must be a whole number of them.
    pub fn block_size(self) -> usize {
        self.ggml().block_size()
    }

    /// `general.file_type` as llama.cpp numbers it (MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_0,
    /// MOSTLY_Q4_K_M).
    pub fn file_type(self) -> u32 {
        match self {
            WeightType::F16 => 1,
            WeightType::Q8_0 => 7,
            WeightType::Q4_0 => 2,
            WeightType::Q4K => 15,
        }
    }

    /// The name users type and read (`q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F16 => "f16",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
            WeightType::Q4K => "q4_k",
        }
    }
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(WeightType::F16),
            "q8_0" => Ok(WeightType::Q8_0),
            "q4_0" => Ok(WeightType::Q4_0),
            "q4_k" => Ok(WeightType::Q4K),
            other => Err(format!("{other:?}: choose f16, q8_0, q4_0 or q4_k")),
        }
    }
}

/// One tensor of a file to write: its name, its dimensions in candle's order (rows first) and
/// its storage type.
#[derive(Debug, Clone)]
pub(crate) struct TensorEntry {
    pub name: String,
    pub dims: Vec<usize>,
    pub dtype: GgmlDType,
}

impl TensorEntry {
    pub fn of(name: &str, t: &QTensor) -> Self {
        TensorEntry {
            name: name.to_string(),
            dims: t.shape().dims().to_vec(),
            dtype: t.dtype(),
        }
    }

    /// Bytes of its data, or why it cannot be stored so (a row not a whole number of blocks).
    fn bytes(&self) -> Result<usize, Error> {
        let block = self.dtype.block_size();
        let row = self.dims.last().copied().unwrap_or(1);
        if !row.is_multiple_of(block) {
            return Err(Error::metadata(
                &self.name,
                format!(
                    "rows of {row} values cannot be stored as {:?} (blocks of {block})",
                    self.dtype
                ),
            ));
        }
        let elems: usize = self.dims.iter().product();
        Ok(elems / block * self.dtype.type_size())
    }
}

/// A GGUF file being written: the header, metadata and tensor table are written by
/// [`GgufWriter::create`], then each tensor's data in the table's order by
/// [`GgufWriter::tensor`]. The bytes go to `<path>.partial`; [`GgufWriter::finish`] syncs it
/// and renames it to `path`, and a writer dropped before that removes it.
pub(crate) struct GgufWriter {
    out: BufWriter<File>,
    path: PathBuf,
    partial: Option<PathBuf>,
    entries: Vec<TensorEntry>,
    sizes: Vec<usize>,
    next: usize,
    alignment: usize,
    written: u64,
}

impl GgufWriter {
    /// Starts `path` (GGUF v3) with `meta` in the order given and a table of `entries`, whose
    /// data must then come in that order. The data alignment is `general.alignment` when
    /// `meta` has it (as candle and llama.cpp read it), else GGUF's default 32.
    pub fn create(
        path: &Path,
        meta: &[(String, Value)],
        entries: Vec<TensorEntry>,
    ) -> Result<Self, Error> {
        let alignment = alignment_of(meta)?;
        let sizes = entries
            .iter()
            .map(TensorEntry::bytes)
            .collect::<Result<Vec<_>, _>>()?;
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(".partial");
        let partial = path.with_file_name(name);
        let file = File::create(&partial).map_err(|source| Error::Io {
            path: partial.clone(),
            source,
        })?;
        let mut w = GgufWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            path: path.to_path_buf(),
            partial: Some(partial),
            entries,
            sizes,
            next: 0,
            alignment,
            written: 0,
        };
        w.header(meta)?;
        Ok(w)
    }

    fn header(&mut self, meta: &[(String, Value)]) -> Result<(), Error> {
        let mut h: Vec<u8> = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        h.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        for (key, value) in meta {
            put_string(&mut h, key);
            h.extend_from_slice(&value_type(value).to_le_bytes());
            put_value(&mut h, value).map_err(|reason| Error::metadata(key, reason))?;
        }
        let mut offset = 0u64;
        for (e, &size) in self.entries.iter().zip(&self.sizes) {
            put_string(&mut h, &e.name);
            h.extend_from_slice(&(e.dims.len() as u32).to_le_bytes());
            for &d in e.dims.iter().rev() {
                h.extend_from_slice(&(d as u64).to_le_bytes());
            }
            h.extend_from_slice(&ggml_type_id(e.dtype).to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset += (size + self.padding(size)) as u64;
        }
        h.resize(h.len() + self.padding(h.len()), 0);
        self.put(&h)
    }

    fn padding(&self, len: usize) -> usize {
        len.next_multiple_of(self.alignment) - len
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let partial = self.partial.as_ref().expect("open until finished");
        self.out.write_all(bytes).map_err(|source| Error::Io {
            path: partial.clone(),
            source,
        })?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Writes the data of the next tensor of the table, which `t` must match.
    pub fn tensor(&mut self, t: &QTensor) -> Result<(), Error> {
        let Some(e) = self.entries.get(self.next) else {
            return Err(Error::metadata(
                "tensors",
                format!("more tensors than the {} of the table", self.entries.len()),
            ));
        };
        if t.dtype() != e.dtype || t.shape().dims() != e.dims.as_slice() {
            return Err(Error::metadata(
                &e.name,
                format!(
                    "the table says {:?} {:?}, the data is {:?} {:?}",
                    e.dtype,
                    e.dims,
                    t.dtype(),
                    t.shape().dims()
                ),
            ));
        }
        let data = t.data()?;
        let size = self.sizes[self.next];
        if data.len() != size {
            return Err(Error::metadata(
                &e.name,
                format!("{} bytes of data where the table says {size}", data.len()),
            ));
        }
        self.put(&data)?;
        self.put(&vec![0u8; self.padding(size)])?;
        self.next += 1;
        Ok(())
    }

    /// Syncs the file and renames it into place; returns its size in bytes.
    pub fn finish(mut self) -> Result<u64, Error> {
        if self.next != self.entries.len() {
            return Err(Error::metadata(
                "tensors",
                format!(
                    "{} of the table's {} tensors were written",
                    self.next,
                    self.entries.len()
                ),
            ));
        }
        let partial = self.partial.clone().expect("open until finished");
        let io = |source| Error::Io {
            path: partial.clone(),
            source,
        };
        self.out.flush().map_err(io)?;
        self.out.get_ref().sync_all().map_err(io)?;
        std::fs::rename(&partial, &self.path).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        self.partial = None;
        Ok(self.written)
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        if let Some(partial) = self.partial.take() {
            let _ = std::fs::remove_file(partial);
        }
    }
}

/// The data alignment `meta` declares, read as candle reads it; 32 when absent.
fn alignment_of(meta: &[(String, Value)]) -> Result<usize, Error> {
    let key = "general.alignment";
    let v = match meta.iter().find(|(k, _)| k == key).map(|(_, v)| v) {
        None => return Ok(32),
        Some(Value::U8(v)) => *v as i64,
        Some(Value::U16(v)) => *v as i64,
        Some(Value::U32(v)) => *v as i64,
        Some(Value::I8(v)) => *v as i64,
        Some(Value::I16(v)) => *v as i64,
        Some(Value::I32(v)) => *v as i64,
        Some(other) => {
            return Err(Error::metadata(
                key,
                format!("{other:?}: readers take an integer of at most 32 bits"),
            ))
        }
    };
    if v <= 0 || !(v as u64).is_power_of_two() {
        return Err(Error::metadata(key, format!("{v} is not a power of two")));
    }
    Ok(v as usize)
}

/// GGML's number of a tensor type (candle keeps its own table private).
fn ggml_type_id(t: GgmlDType) -> u32 {
    match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

/// GGUF's number of a metadata value's type.
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_string(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

/// A value without its type tag (an array's elements share the one before its length).
fn put_value(h: &mut Vec<u8>, v: &Value) -> Result<(), String> {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(u8::from(*x)),
        Value::String(s) => put_string(h, s),
        Value::Array(items) => {
            // An empty array's element type does not matter; candle writes U32.
            let t = items.first().map_or(4, value_type);
            if items.iter().any(|x| value_type(x) != t) {
                return Err("an array of values of more than one type".into());
            }
            h.extend_from_slice(&t.to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                put_value(h, x)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file;
    use candle_core::{Device, Tensor};

    /// What the writer writes, candle reads back: every value type, nested arrays, an
    /// alignment of 64, the tensors where the table puts them; a writer dropped unfinished
    /// leaves nothing behind.
    #[test]
    fn written_files_read_back_and_unfinished_ones_vanish() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let meta: Vec<(String, Value)> = vec![
            ("general.alignment".into(), Value::U32(64)),
            ("a.u8".into(), Value::U8(7)),
            ("a.i64".into(), Value::I64(-3)),
            ("a.f64".into(), Value::F64(0.5)),
            ("a.bool".into(), Value::Bool(true)),
            ("a.s".into(), Value::String("héllo".into())),
            (
                "a.nested".into(),
                Value::Array(vec![
                    Value::Array(vec![Value::I32(1), Value::I32(2)]),
                    Value::Array(vec![]),
                ]),
            ),
        ];
        let m = Tensor::arange(0f32, 96., &Device::Cpu)
            .unwrap()
            .reshape((3, 32))
            .unwrap();
        let m = QTensor::quantize(&m, GgmlDType::Q8_0).unwrap();
        let v = QTensor::quantize(
            &Tensor::new(&[1f32, 2., 3.], &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap();
        let entries = vec![TensorEntry::of("m", &m), TensorEntry::of("v", &v)];
        let mut w = GgufWriter::create(&path, &meta, entries.clone()).unwrap();
        w.tensor(&m).unwrap();
        w.tensor(&v).unwrap();
        w.finish().unwrap();

        let mut f = File::open(&path).unwrap();
        let c = gguf_file::Content::read(&mut f).unwrap();
        assert_eq!(c.tensor_data_offset % 64, 0);
        for (k, v) in &meta {
            assert_eq!(format!("{:?}", c.metadata[k]), format!("{v:?}"), "{k}");
        }
        let back = c.tensor(&mut f, "v", &Device::Cpu).unwrap();
        let vals: Vec<f32> = back.dequantize(&Device::Cpu).unwrap().to_vec1().unwrap();
        assert_eq!(vals, [1., 2., 3.]);
        assert_eq!(
            c.tensor(&mut f, "m", &Device::Cpu).unwrap().data().unwrap(),
            m.data().unwrap()
        );

        let gone = dir.path().join("gone.gguf");
        let mut w = GgufWriter::create(&gone, &meta, entries).unwrap();
        w.tensor(&m).unwrap();
        assert!(w.tensor(&m).is_err(), "the second entry is v, not m");
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn weight_types_parse_by_their_names_and_refuse_others_with_the_list() {
        for t in [
            WeightType::F16,
            WeightType::Q8_0,
            WeightType::Q4_0,
            WeightType::Q4K,
        ] {
            assert_eq!(t.name().parse::<WeightType>(), Ok(t));
        }
        let err = "q5_k".parse::<WeightType>().unwrap_err();
        assert_eq!(err, "\"q5_k\": choose f16, q8_0, q4_0 or q4_k");
    }
}
