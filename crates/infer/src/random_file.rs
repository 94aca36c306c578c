//! GGUF files of a llama shape with seeded random weights and a real tokenizer copied from
//! another GGUF file: models of any size for a machine that cannot be sent real weights (the
//! GPU benchmark writes a 1.1B model there, serves it with `hearth serve` and hands the same
//! file to llama.cpp). `hearth dev random-model` is the command.

use std::fs::File;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::gguf_write::{GgufWriter, TensorEntry, WeightType};
use crate::random::LlamaShape;
use crate::Error;

/// The `tokenizer.*` metadata of a GGUF file (the tokens, merges, special ids, chat template).
fn tokenizer_metadata(from: &Path) -> Result<Vec<(String, Value)>, Error> {
    let io = |source| Error::Io {
        path: from.to_path_buf(),
        source,
    };
    let mut f = File::open(from).map_err(io)?;
    let content = gguf_file::Content::read(&mut f)
        .map_err(|e| Error::metadata("tokenizer", format!("{}: {e}", from.display())))?;
    let mut meta: Vec<(String, Value)> = content
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    if !meta.iter().any(|(k, _)| k == "tokenizer.ggml.tokens") {
        return Err(Error::metadata(
            "tokenizer.ggml.tokens",
            format!("{} carries no tokenizer", from.display()),
        ));
    }
    Ok(meta)
}

fn vocab_of(meta: &[(String, Value)]) -> Result<usize, Error> {
    match meta.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, Value::Array(tokens))) => Ok(tokens.len()),
        _ => Err(Error::metadata("tokenizer.ggml.tokens", "not an array")),
    }
}

fn write(
    path: &Path,
    meta: &[(String, Value)],
    tensors: &[(String, QTensor)],
) -> Result<(), Error> {
    let entries = tensors.iter().map(|(k, t)| TensorEntry::of(k, t)).collect();
    let mut w = GgufWriter::create(path, meta, entries)?;
    for (_, t) in tensors {
        w.tensor(t)?;
    }
    w.finish().map(drop)
}

/// Writes a GGUF file holding only the tokenizer of `from` (a megabyte or two where the model
/// is many): what `--tokenizer-from` of [`write_random_gguf`] needs, small enough to carry.
pub fn write_tokenizer_gguf(from: &Path, to: &Path) -> Result<usize, Error> {
    let mut meta = tokenizer_metadata(from)?;
    let vocab = vocab_of(&meta)?;
    meta.insert(
        0,
        ("general.architecture".into(), Value::String("llama".into())),
    );
    write(to, &meta, &[])?;
    Ok(vocab)
}

/// Writes a llama-architecture GGUF of `shape` to `path`: uniform random matrices scaled by
/// 1/sqrt(fan-in) from `seed` (the same file for the same arguments), stored as `weights`,
/// norms of ones, an untied output head, and the tokenizer of `tokenizer_from`, whose token
/// count replaces `shape.vocab`. Tensors are made on all cores (rayon). Returns the vocabulary size.
pub fn write_random_gguf(
    path: &Path,
    shape: LlamaShape,
    weights: WeightType,
    tokenizer_from: &Path,
    seed: u64,
) -> Result<usize, Error> {
    let tok = tokenizer_metadata(tokenizer_from)?;
    let vocab = vocab_of(&tok)?;
    let (e, f, heads, kv_heads) = (shape.hidden, shape.ff, shape.heads, shape.kv_heads);
    if shape.layers == 0 || heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(Error::InvalidConfig {
            key: "shape",
            reason: "layers, heads and kv-heads must be positive, heads a multiple of kv-heads"
                .into(),
        });
    }
    if !e.is_multiple_of(heads) || !(e / heads).is_multiple_of(2) {
        return Err(Error::InvalidConfig {
            key: "shape",
            reason: format!("hidden {e} must split into {heads} heads of an even size"),
        });
    }
    if shape.pooling == Some(crate::Pooling::Rank) {
        return Err(Error::InvalidConfig {
            key: "pooling",
            reason: "rank pooling is a Qwen3 reranker's, with a classifier head; random models \
                     are llama (mean, cls or last)"
                .into(),
        });
    }
    let block = weights.ggml().block_size();
    if !e.is_multiple_of(block) || !f.is_multiple_of(block) {
        return Err(Error::InvalidConfig {
            key: "shape",
            reason: format!("hidden {e} and ff {f} must be multiples of {block} for {weights:?}"),
        });
    }
    let hd = e / heads;
    // (name, rows, cols, matrix?) in file order; a matrix is random, a norm ones.
    let mut plan: Vec<(String, usize, usize, bool)> =
        vec![("token_embd.weight".into(), vocab, e, true)];
    for il in 0..shape.layers {
        let p = |n: &str| format!("blk.{il}.{n}.weight");
        plan.push((p("attn_norm"), 1, e, false));
        plan.push((p("attn_q"), heads * hd, e, true));
        plan.push((p("attn_k"), kv_heads * hd, e, true));
        plan.push((p("attn_v"), kv_heads * hd, e, true));
        plan.push((p("attn_output"), e, heads * hd, true));
        plan.push((p("ffn_norm"), 1, e, false));
        plan.push((p("ffn_gate"), f, e, true));
        plan.push((p("ffn_up"), f, e, true));
        plan.push((p("ffn_down"), e, f, true));
    }
    plan.push(("output_norm.weight".into(), 1, e, false));
    plan.push(("output.weight".into(), vocab, e, true));

    let make = |i: usize| -> Result<QTensor, Error> {
        let (_, rows, cols, matrix) = &plan[i];
        let (rows, cols) = (*rows, *cols);
        if !*matrix {
            let ones = Tensor::ones(cols, candle_core::DType::F32, &Device::Cpu)?;
            return Ok(QTensor::quantize(&ones, GgmlDType::F32)?);
        }
        let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let s = 1.0 / (cols as f32).sqrt();
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * s)
            .collect();
        let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu)?;
        Ok(QTensor::quantize(&t, weights.ggml())?)
    };
    let made = (0..plan.len())
        .into_par_iter()
        .map(make)
        .collect::<Result<Vec<QTensor>, Error>>()?;
    let tensors: Vec<(String, QTensor)> = plan.iter().map(|p| p.0.clone()).zip(made).collect();

    let a = "llama";
    let u = |v: usize| Value::U32(v as u32);
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!("hearth random llama {}", shape_name(&shape))),
        ),
        ("general.file_type".into(), Value::U32(weights.file_type())),
        (format!("{a}.block_count"), u(shape.layers)),
        (format!("{a}.context_length"), u(shape.context)),
        (format!("{a}.embedding_length"), u(e)),
        (format!("{a}.feed_forward_length"), u(f)),
        (format!("{a}.attention.head_count"), u(heads)),
        (format!("{a}.attention.head_count_kv"), u(kv_heads)),
        (format!("{a}.rope.dimension_count"), u(hd)),
        (format!("{a}.vocab_size"), u(vocab)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(500_000.0)),
    ];
    if let Some(p) = shape.pooling {
        meta.push((format!("{a}.pooling_type"), Value::U32(p.gguf_value())));
    }
    meta.extend(tok);
    write(path, &meta, &tensors)?;
    Ok(vocab)
}

fn shape_name(s: &LlamaShape) -> String {
    format!(
        "{}L-{}h-{}x{}kv-ff{}",
        s.layers, s.hidden, s.heads, s.kv_heads, s.ff
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TextModelConfig;
    use crate::{Step, TextModel};

    /// A small llama vocabulary in a GGUF file, as a real model's tokenizer would be.
    fn tokenizer_file(dir: &Path) -> std::path::PathBuf {
        let tokens: Vec<Value> = (0..300u32)
            .map(|i| match i {
                0 => Value::String("<unk>".into()),
                1 => Value::String("<s>".into()),
                2 => Value::String("</s>".into()),
                i if i < 259 => Value::String(format!("<0x{:02X}>", i - 3)),
                i => Value::String(format!("▁w{i}")),
            })
            .collect();
        let types: Vec<Value> = (0..300)
            .map(|i| {
                Value::I32(if i < 3 {
                    3
                } else if i < 259 {
                    6
                } else {
                    1
                })
            })
            .collect();
        let scores: Vec<Value> = (0..300).map(|i| Value::F32(-(i as f32))).collect();
        let meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("tokenizer.ggml.model".into(), Value::String("llama".into())),
            ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
            ("tokenizer.ggml.scores".into(), Value::Array(scores)),
            ("tokenizer.ggml.token_type".into(), Value::Array(types)),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ];
        let path = dir.join("tok-source.gguf");
        write(&path, &meta, &[]).unwrap();
        path
    }

    fn small() -> LlamaShape {
        LlamaShape {
            layers: 2,
            hidden: 256,
            heads: 4,
            kv_heads: 2,
            ff: 512,
            vocab: 0,
            context: 512,
            pooling: None,
        }
    }

    fn load(path: &Path) -> TextModel {
        let mut cfg = TextModelConfig::local(path);
        cfg.threads = 1;
        TextModel::load(&cfg).unwrap()
    }

    /// The tokenizer-only file and a random model written through it load as a model that
    /// encodes text with the copied vocabulary and generates; the same seed writes the same
    /// bytes, another seed other weights.
    #[test]
    fn random_files_load_generate_and_are_seeded() {
        let dir = tempfile::tempdir().unwrap();
        let source = tokenizer_file(dir.path());
        let tok = dir.path().join("tok.gguf");
        assert_eq!(write_tokenizer_gguf(&source, &tok).unwrap(), 300);
        for (weights, name) in [
            (WeightType::F16, "f16"),
            (WeightType::Q8_0, "q8"),
            (WeightType::Q4_0, "q4_0"),
            (WeightType::Q4K, "q4k"),
        ] {
            let path = dir.path().join(format!("{name}.gguf"));
            assert_eq!(
                write_random_gguf(&path, small(), weights, &tok, 7).unwrap(),
                300
            );
            let model = load(&path);
            assert_eq!(model.info().vocab_size, 300);
            let ids = model.tokenizer().encode("w300 w301").unwrap();
            assert!(!ids.is_empty());
            let mut model = model;
            let mut seq = model.new_sequence(64).unwrap();
            let logits = model
                .forward(&mut [Step {
                    seq: &mut seq,
                    tokens: &ids,
                }])
                .unwrap();
            assert_eq!(logits.len(), 300);
            assert!(logits.iter().all(|x| x.is_finite()));
        }
        let (a, b, c) = (
            dir.path().join("a.gguf"),
            dir.path().join("b.gguf"),
            dir.path().join("c.gguf"),
        );
        write_random_gguf(&a, small(), WeightType::Q8_0, &tok, 7).unwrap();
        write_random_gguf(&b, small(), WeightType::Q8_0, &tok, 7).unwrap();
        write_random_gguf(&c, small(), WeightType::Q8_0, &tok, 8).unwrap();
        let read = |p: &Path| std::fs::read(p).unwrap();
        assert_eq!(read(&a), read(&b));
        assert_ne!(read(&a), read(&c));
    }

    #[test]
    fn shapes_that_cannot_be_stored_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let tok = tokenizer_file(dir.path());
        let mut bad = small();
        bad.hidden = 200; // not a multiple of Q4_K's 256-value blocks
        let err = write_random_gguf(&dir.path().join("x.gguf"), bad, WeightType::Q4K, &tok, 1)
            .unwrap_err();
        assert!(err.to_string().contains("multiples of 256"), "{err}");
        let no_tok = dir.path().join("no-tok.gguf");
        write(
            &no_tok,
            &[("general.architecture".into(), Value::String("llama".into()))],
            &[],
        )
        .unwrap();
        let err = write_tokenizer_gguf(&no_tok, &dir.path().join("y.gguf")).unwrap_err();
        assert!(err.to_string().contains("carries no tokenizer"), "{err}");
        assert!("q5_k".parse::<WeightType>().is_err());
    }
}
