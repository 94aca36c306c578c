//! A GGUF file re-written with its matrices in another storage type: the same weights, metadata
//! and tokenizer, so that two files of one model (an F16 target and a Q4_0 draft, say) share a
//! vocabulary exactly. `hearth dev requantize` is the command.
//!
//! Every matrix is dequantized to f32 and quantized again, one tensor at a time (the memory
//! held is one tensor's f32 copy and its new encoding, never the model). Re-encoding cannot
//! restore what the source's quantization lost: an F16 file of a Q4_1 source holds the Q4_1
//! values, exactly.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::gguf::GgufFile;
use crate::gguf_write::{GgufWriter, TensorEntry, WeightType};
use crate::Error;

/// What [`requantize`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequantizeReport {
    /// Tensors in the file (the input's, all of them, in its order).
    pub tensors: usize,
    /// Tensors re-encoded: matrices into the target type (or F16, see `f16_fallback`), vectors
    /// stored otherwise than F32 into F32.
    pub converted: usize,
    /// Tensors whose bytes were copied as they were: F32 vectors, matrices already in the type
    /// they are written in.
    pub kept: usize,
    /// Matrices written as F16 because their rows are not a whole number of the target's blocks.
    pub f16_fallback: Vec<String>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Writes `input`'s tensors to `output` with every matrix whose rows are a whole number of
/// `to`'s blocks stored as `to`, the other matrices as F16 and vectors (norms, biases, RoPE
/// factors) as F32; the metadata is kept, key for key, except `general.file_type`, set to
/// `to`'s. `output` appears only complete (it is written beside and renamed), so it may be
/// `input` itself.
pub fn requantize(input: &Path, output: &Path, to: WeightType) -> Result<RequantizeReport, Error> {
    let file = GgufFile::open(input)?;
    let content = &file.content;

    let mut meta: Vec<(String, Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| k.as_str() != "general.file_type")
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain([("general.file_type".into(), Value::U32(to.file_type()))])
        .collect();
    // The reader keeps no order: the architecture first, as llama.cpp writes it, then by key.
    meta.sort_by(|a, b| {
        let rest = |k: &str| k != "general.architecture";
        (rest(&a.0), &a.0).cmp(&(rest(&b.0), &b.0))
    });

    let mut order: Vec<(&String, u64)> = content
        .tensor_infos
        .iter()
        .map(|(name, info)| (name, info.offset))
        .collect();
    order.sort_by_key(|&(name, offset)| (offset, name));

    let mut f16_fallback = Vec::new();
    let entries: Vec<TensorEntry> = order
        .iter()
        .map(|&(name, _)| {
            let info = &content.tensor_infos[name];
            let dims = info.shape.dims().to_vec();
            let dtype = match dims.as_slice() {
                [] | [_] => GgmlDType::F32,
                [.., row] if row.is_multiple_of(to.block_size()) => to.ggml(),
                _ => {
                    f16_fallback.push(name.clone());
                    GgmlDType::F16
                }
            };
            TensorEntry {
                name: name.clone(),
                dims,
                dtype,
            }
        })
        .collect();

    let mut out = GgufWriter::create(output, &meta, entries.clone())?;
    let (mut converted, mut kept) = (0, 0);
    for e in &entries {
        let source = file.tensor(&e.name, &Device::Cpu)?;
        if source.dtype() == e.dtype {
            out.tensor(&source)?;
            kept += 1;
        } else {
            let values = source.dequantize(&Device::Cpu)?;
            drop(source);
            out.tensor(&QTensor::quantize(&values, e.dtype)?)?;
            converted += 1;
        }
    }
    let bytes_out = out.finish()?;
    Ok(RequantizeReport {
        tensors: entries.len(),
        converted,
        kept,
        f16_fallback,
        bytes_in: file.file_bytes,
        bytes_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TextModelConfig;
    use crate::{Step, TextModel};
    use candle_core::quantized::gguf_file;
    use candle_core::Tensor;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/arch/{name}.gguf"))
    }

    fn load(path: &Path) -> TextModel {
        let mut cfg = TextModelConfig::local(path);
        cfg.threads = 1;
        TextModel::load(&cfg).unwrap()
    }

    /// The last position's logits after a short prompt.
    fn logits(model: &mut TextModel, ids: &[u32]) -> Vec<f32> {
        let mut seq = model.new_sequence(64).unwrap();
        logits_into(model, &mut seq, ids)
    }

    fn logits_into(model: &mut TextModel, seq: &mut crate::Sequence, ids: &[u32]) -> Vec<f32> {
        model
            .forward(&mut [Step { seq, tokens: ids }])
            .unwrap()
            .to_vec()
    }

    fn metadata(path: &Path) -> gguf_file::Content {
        gguf_file::Content::read(&mut std::fs::File::open(path).unwrap()).unwrap()
    }

    /// Each tensor's values in `out` against `src`'s: the largest relative error of one value
    /// (|a - b| / (|a| + 2^-14): at most 2^-11 for F16's rounding, subnormals included) and
    /// the tensor's relative RMS error (||a - b|| / ||a||).
    fn weight_errors(src: &Path, out: &Path) -> Vec<(String, f32, f32)> {
        let (s, o) = (GgufFile::open(src).unwrap(), GgufFile::open(out).unwrap());
        let mut names: Vec<&String> = s.content.tensor_infos.keys().collect();
        names.sort();
        let values = |f: &GgufFile, n: &str| -> Vec<f32> {
            let t = f.tensor(n, &Device::Cpu).unwrap();
            t.dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        names
            .into_iter()
            .map(|n| {
                let (a, b) = (values(&s, n), values(&o, n));
                assert_eq!(a.len(), b.len(), "{n}");
                let (mut worst, mut err, mut norm) = (0f32, 0f64, 0f64);
                for (x, y) in a.iter().zip(&b) {
                    worst = worst.max((x - y).abs() / (x.abs() + 2f32.powi(-14)));
                    err += f64::from(x - y).powi(2);
                    norm += f64::from(*x).powi(2);
                }
                (n.clone(), worst, (err / norm.max(1e-30)).sqrt() as f32)
            })
            .collect()
    }

    /// A Q4_K_M fixture (Q4_K, Q6_K and F32 tensors; qwen2's with biases) re-written in each
    /// type keeps its tokens, template and metadata, takes the new file type, and holds the
    /// source's weights: F16 exactly but for F16's rounding, Q8_0 and Q4_0 within the error of
    /// their blocks (relative RMS error per matrix measured at most 0.54% and 10.8%).
    ///
    /// The logits are compared too, but these random fixtures amplify small changes (a logit
    /// spread of about 20): the F16 file, whose weights are the source's, is 0.58 (llama) and
    /// 0.34 (qwen2) from the source at most, the source's Q4_K/Q6_K dot products quantizing
    /// their activations to 8 bits; Q8_0 measured 0.56 and 0.28, Q4_0 6.6 and 4.0, where
    /// llama.cpp's own Q4_0 of these models (quantized from F32) is 5.7 and 3.4 from its
    /// Q4_K_M. The tolerances below are those figures with headroom.
    #[test]
    fn requantized_fixtures_keep_tokens_metadata_and_weights_and_stay_near_the_source_logits() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["llama-q4_k_m", "qwen2-q4_k_m"] {
            let src = fixture(name);
            let mut original = load(&src);
            let text = "Hello world, the quick brown fox.";
            let ids = original.tokenizer().encode(text).unwrap();
            let want = logits(&mut original, &ids);
            let src_meta = metadata(&src);
            // (type, largest relative error of one value, of a matrix's RMS, of a logit)
            for (to, value_tol, rms_tol, logit_tol) in [
                (WeightType::F16, 2f32.powi(-11), 5e-4, 1.0),
                (WeightType::Q8_0, f32::INFINITY, 0.01, 1.0),
                (WeightType::Q4_0, f32::INFINITY, 0.15, 10.0),
            ] {
                let out = dir.path().join(format!("{name}-{to}.gguf"));
                let report = requantize(&src, &out, to).unwrap();
                assert_eq!(report.tensors, src_meta.tensor_infos.len());
                assert_eq!(report.converted + report.kept, report.tensors);
                assert!(report.f16_fallback.is_empty(), "{:?}", report.f16_fallback);
                assert_eq!(report.bytes_out, std::fs::metadata(&out).unwrap().len());

                let meta = metadata(&out);
                assert_eq!(
                    meta.metadata["general.file_type"].to_u32().unwrap(),
                    to.file_type()
                );
                for (k, v) in &src_meta.metadata {
                    if k != "general.file_type" {
                        assert_eq!(format!("{:?}", meta.metadata[k]), format!("{v:?}"), "{k}");
                    }
                }
                for (k, info) in &meta.tensor_infos {
                    let want = if info.shape.rank() == 1 {
                        GgmlDType::F32
                    } else {
                        to.ggml()
                    };
                    assert_eq!(info.ggml_dtype, want, "{k}");
                }
                for (tensor, value, rms) in weight_errors(&src, &out) {
                    assert!(value <= value_tol, "{name} -> {to}: {tensor} value {value}");
                    assert!(rms <= rms_tol, "{name} -> {to}: {tensor} rms {rms}");
                }

                let mut model = load(&out);
                let tok = model.tokenizer();
                assert_eq!(tok.encode(text).unwrap(), ids);
                assert_eq!(tok.id_mismatch(&original.tokenizer()), None);
                assert_eq!(tok.chat_template(), original.tokenizer().chat_template());
                let got = logits(&mut model, &ids);
                let worst = want
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst <= logit_tol, "{name} -> {to}: logit {worst}");
            }
        }
    }

    /// The real SmolLM2-135M-Instruct Q4_1 weights (skipped when `weights/` lacks them) as F16,
    /// Q8_0 and Q4_0, teacher-forced along the source's greedy answer to a chat prompt: each
    /// picks the source's token wherever the source's margin (its top logit over the next) is
    /// at least `margin`. F16 holds the Q4_1 values but its products do not quantize the
    /// activations, so near-ties can go either way (a shorter prompt's first token is one:
    /// "The" or "L'" by backend and type); Q4_0 is quantized twice.
    #[test]
    fn smollm2_requantized_picks_the_source_tokens_where_it_is_sure() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../weights/SmolLM2-135M-Instruct.Q4_1.gguf");
        if !src.exists() {
            eprintln!(
                "skipping: {} is missing (scripts/fetch-weights.sh)",
                src.display()
            );
            return;
        }
        let argmax = |l: &[f32]| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap();
        // The logits after the prompt and after each of `forced`, or of the model's own greedy
        // picks, and the tokens fed.
        let run = |model: &mut TextModel, forced: Option<&[u32]>| -> (Vec<u32>, Vec<Vec<f32>>) {
            let tok = model.tokenizer();
            let prompt = tok
                .apply_chat_template(&[crate::ChatMessage::new(
                    crate::Role::User,
                    "What is the capital of France? Answer in one sentence.",
                )])
                .unwrap();
            let mut next = tok.encode(&prompt).unwrap();
            let mut seq = model.new_sequence(next.len() + 16).unwrap();
            let (mut ids, mut all) = (Vec::new(), Vec::new());
            for step in 0..12 {
                let l = logits_into(model, &mut seq, &next);
                let id = forced.map_or(argmax(&l) as u32, |f| f[step]);
                all.push(l);
                ids.push(id);
                next = vec![id];
            }
            (ids, all)
        };
        let (path, want) = run(&mut load(&src), None);
        let dir = tempfile::tempdir().unwrap();
        for (to, margin) in [
            (WeightType::F16, 1.0),
            (WeightType::Q8_0, 1.0),
            (WeightType::Q4_0, 3.0),
        ] {
            let out = dir.path().join(format!("smollm2-{to}.gguf"));
            requantize(&src, &out, to).unwrap();
            let (_, got) = run(&mut load(&out), Some(&path));
            for (step, (w, g)) in want.iter().zip(&got).enumerate() {
                let top = argmax(w);
                let second = (0..w.len())
                    .filter(|&i| i != top)
                    .map(|i| w[i])
                    .fold(f32::MIN, f32::max);
                if w[top] - second >= margin {
                    assert_eq!(argmax(g), top, "{to}: step {step}");
                }
            }
            std::fs::remove_file(&out).unwrap();
        }
    }

    /// A matrix whose rows are not whole blocks of the target is written as F16 and named in
    /// the report; vectors in F16 come back as F32; re-encoding to the type a matrix already
    /// has copies it.
    #[test]
    fn rows_that_do_not_fit_the_blocks_fall_back_to_f16_and_vectors_become_f32() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = &Device::Cpu;
        let ramp = |n: usize| {
            Tensor::arange(0u32, n as u32, cpu)
                .unwrap()
                .to_dtype(candle_core::DType::F32)
                .unwrap()
                / n as f64
        };
        let odd = QTensor::quantize(
            &ramp(120).unwrap().reshape((3, 40)).unwrap(),
            GgmlDType::F32,
        )
        .unwrap();
        let fits = QTensor::quantize(
            &ramp(128).unwrap().reshape((4, 32)).unwrap(),
            GgmlDType::Q8_0,
        )
        .unwrap();
        let norm = QTensor::quantize(&ramp(40).unwrap(), GgmlDType::F16).unwrap();
        let src = dir.path().join("src.gguf");
        let tensors = [("odd", &odd), ("fits", &fits), ("norm", &norm)];
        let mut w = GgufWriter::create(
            &src,
            &[("general.architecture".into(), Value::String("llama".into()))],
            tensors.iter().map(|(n, t)| TensorEntry::of(n, t)).collect(),
        )
        .unwrap();
        for (_, t) in tensors {
            w.tensor(t).unwrap();
        }
        w.finish().unwrap();

        let out = dir.path().join("out.gguf");
        let report = requantize(&src, &out, WeightType::Q8_0).unwrap();
        assert_eq!(report.f16_fallback, ["odd"]);
        assert_eq!((report.tensors, report.converted, report.kept), (3, 2, 1));
        let c = metadata(&out);
        let types: Vec<_> = ["odd", "fits", "norm"]
            .iter()
            .map(|n| c.tensor_infos[*n].ggml_dtype)
            .collect();
        assert_eq!(types, [GgmlDType::F16, GgmlDType::Q8_0, GgmlDType::F32]);
        let mut f = std::fs::File::open(&out).unwrap();
        let back = c
            .tensor(&mut f, "odd", cpu)
            .unwrap()
            .dequantize(cpu)
            .unwrap();
        let diff = (back - odd.dequantize(cpu).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-3);
        assert_eq!(
            c.tensor(&mut f, "fits", cpu).unwrap().data().unwrap(),
            fits.data().unwrap()
        );
    }

    #[test]
    fn a_missing_or_non_gguf_input_is_a_typed_error_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.gguf");
        let err = requantize(&dir.path().join("absent.gguf"), &out, WeightType::F16).unwrap_err();
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{err:?}"
        );
        let text = dir.path().join("notes.gguf");
        std::fs::write(&text, "not a model, just some text long enough").unwrap();
        let err = requantize(&text, &out, WeightType::F16).unwrap_err();
        assert!(
            matches!(&err, Error::NotGguf { path, .. } if path == &text),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .ends_with("is not a GGUF file: unknown magic 0x20746f6e"),
            "{err}"
        );
        let empty = dir.path().join("empty.gguf");
        std::fs::write(&empty, "").unwrap();
        let err = requantize(&empty, &out, WeightType::F16).unwrap_err();
        assert!(matches!(&err, Error::NotGguf { .. }), "{err:?}");
        assert!(!out.exists());
    }
}
