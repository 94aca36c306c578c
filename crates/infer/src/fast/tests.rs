//! The fast backend against the candle backend on the same GGUF file: small llama and
//! Gemma 3 models written here with seeded random weights in the block types the default
//! models use, plus the real SmolLM2 weights when `weights/` has them.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::gguf::GgufFile;
use crate::Sequence;

pub(crate) struct Spec {
    pub(crate) arch: &'static str,
    pub(crate) embd: GgmlDType,
    /// Types of attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down.
    pub(crate) layer: [GgmlDType; 7],
}

const E: usize = 256;
const FF: usize = 512;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 64;
const LAYERS: usize = 2;
pub(crate) const VOCAB: usize = 300;

/// A small model of `spec`'s block types with seeded random weights, written as a GGUF file
/// in `dir` (no tokenizer: tests assemble a [`crate::TextModel`] with the tiny one).
pub(crate) fn write_model(dir: &Path, spec: &Spec, seed: u64) -> PathBuf {
    write_model_with(dir, spec, seed, |_, _| {})
}

/// [`write_model`] with the tensors and metadata changed by `edit` before writing.
fn write_model_with(
    dir: &Path,
    spec: &Spec,
    seed: u64,
    edit: impl FnOnce(&mut Vec<(String, QTensor)>, &mut Vec<(String, Value)>),
) -> PathBuf {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rand = |rows: usize, cols: usize, scale: f32| -> Tensor {
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * scale)
            .collect();
        Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap()
    };
    let q = |t: Tensor, ty: GgmlDType| QTensor::quantize(&t, ty).unwrap();
    let norm = |len: usize, rng: &mut StdRng| -> QTensor {
        let data: Vec<f32> = (0..len).map(|_| 0.8 + 0.4 * rng.gen::<f32>()).collect();
        QTensor::quantize(
            &Tensor::from_vec(data, len, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap()
    };
    let s = 1.0 / (E as f32).sqrt();
    let mut tensors: Vec<(String, QTensor)> = vec![(
        "token_embd.weight".into(),
        q(rand(VOCAB, E, 1.0), spec.embd),
    )];
    let mut nrng = StdRng::seed_from_u64(seed ^ 0xABCD);
    for il in 0..LAYERS {
        let p = |n: &str| format!("blk.{il}.{n}.weight");
        let l = &spec.layer;
        tensors.push((p("attn_q"), q(rand(HEADS * HD, E, s), l[0])));
        tensors.push((p("attn_k"), q(rand(KV_HEADS * HD, E, s), l[1])));
        tensors.push((p("attn_v"), q(rand(KV_HEADS * HD, E, s), l[2])));
        tensors.push((p("attn_output"), q(rand(E, HEADS * HD, s), l[3])));
        tensors.push((p("ffn_gate"), q(rand(FF, E, s), l[4])));
        tensors.push((p("ffn_up"), q(rand(FF, E, s), l[5])));
        tensors.push((
            p("ffn_down"),
            q(rand(E, FF, 1.0 / (FF as f32).sqrt()), l[6]),
        ));
        tensors.push((p("attn_norm"), norm(E, &mut nrng)));
        tensors.push((p("ffn_norm"), norm(E, &mut nrng)));
        if spec.arch == "gemma3" {
            tensors.push((p("attn_q_norm"), norm(HD, &mut nrng)));
            tensors.push((p("attn_k_norm"), norm(HD, &mut nrng)));
            tensors.push((p("post_attention_norm"), norm(E, &mut nrng)));
            tensors.push((p("post_ffw_norm"), norm(E, &mut nrng)));
        }
    }
    tensors.push(("output_norm.weight".into(), norm(E, &mut nrng)));
    let a = spec.arch;
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (format!("{a}.block_count"), Value::U32(LAYERS as u32)),
        (format!("{a}.embedding_length"), Value::U32(E as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(FF as u32)),
        (
            format!("{a}.attention.head_count"),
            Value::U32(HEADS as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(KV_HEADS as u32),
        ),
        (format!("{a}.attention.key_length"), Value::U32(HD as u32)),
        (format!("{a}.context_length"), Value::U32(256)),
        (format!("{a}.vocab_size"), Value::U32(VOCAB as u32)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(10_000.0)),
    ];
    if a == "gemma3" {
        meta.push((format!("{a}.attention.sliding_window"), Value::U32(5)));
        meta.push((format!("{a}.attention.sliding_window_type"), Value::U32(2)));
    }
    edit(&mut tensors, &mut meta);
    let path = dir.join(format!("{a}-{seed}.gguf"));
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &t_refs).unwrap();
    path
}

/// A cache of `cap` positions where backend `b` keeps it.
pub(crate) fn new_seq(b: &dyn Backend, hp: &Hparams, cap: usize) -> Sequence {
    b.new_sequence(hp.n_layer, hp.kv_dim(), cap).unwrap()
}

/// Runs the same schedule (two sequences: a prefill, then mixed prefill-chunk + decode steps)
/// through a backend and returns every step's logits.
fn run_schedule(b: &mut dyn Backend, hp: &Hparams) -> Vec<Vec<f32>> {
    let (s1, s2) = (new_seq(b, hp, 64), new_seq(b, hp, 64));
    run_schedule_on(b, s1, s2)
}

/// [`run_schedule`] on the given sequences.
pub(crate) fn run_schedule_on(
    b: &mut dyn Backend,
    mut s1: Sequence,
    mut s2: Sequence,
) -> Vec<Vec<f32>> {
    let p1: Vec<u32> = (0..9).map(|i| (i * 31 + 7) % VOCAB as u32).collect();
    let p2: Vec<u32> = (0..13).map(|i| (i * 17 + 3) % VOCAB as u32).collect();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    b.forward(
        &mut [Step {
            seq: &mut s1,
            tokens: &p1,
        }],
        &[1],
        &mut logits,
    )
    .unwrap();
    s1.len += p1.len();
    out.push(logits.clone());
    for t in 0..6u32 {
        // s2 prefills in two chunks while s1 decodes, then both decode.
        let tok1 = [(t * 37 + 11) % VOCAB as u32];
        let tok2: Vec<u32> = match t {
            0 => p2[..6].to_vec(),
            1 => p2[6..].to_vec(),
            _ => vec![(t * 13 + 5) % VOCAB as u32],
        };
        b.forward(
            &mut [
                Step {
                    seq: &mut s1,
                    tokens: &tok1,
                },
                Step {
                    seq: &mut s2,
                    tokens: &tok2,
                },
            ],
            &[1, 1],
            &mut logits,
        )
        .unwrap();
        s1.len += 1;
        s2.len += tok2.len();
        out.push(logits.clone());
    }
    out
}

fn compare(spec: &Spec, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path(), spec, seed);
    let file = GgufFile::open(&path).unwrap();
    let hp = Hparams::from_gguf(&file.content).unwrap();
    let mut candle: Box<dyn Backend> =
        Box::new(crate::candle_gguf::from_gguf(&file, hp.clone(), &Device::Cpu).unwrap());
    let reference = run_schedule(candle.as_mut(), &hp);
    let mut fast = from_gguf(&path, &file.content, hp.clone(), 2).unwrap();
    for path in KernelPath::available() {
        assert!(fast.set_kernel_path(path));
        let got = run_schedule(&mut fast, &hp);
        for (step, (g, r)) in got.iter().zip(&reference).enumerate() {
            assert_eq!(g.len(), r.len());
            let rms = (r.iter().map(|v| v * v).sum::<f32>() / r.len() as f32).sqrt();
            let max_diff = g
                .iter()
                .zip(r)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                max_diff <= 0.05 * rms + 1e-3,
                "{} {path:?} step {step}: max |fast - candle| = {max_diff}, logits rms {rms}",
                spec.arch
            );
        }
    }
}

#[test]
fn llama_q4_1_logits_match_the_candle_backend_on_every_kernel_path() {
    let l = [GgmlDType::Q4_1; 7];
    compare(
        &Spec {
            arch: "llama",
            embd: GgmlDType::Q8_0,
            layer: l,
        },
        1,
    );
}

#[test]
fn llama_with_mixed_block_types_matches_the_candle_backend() {
    use GgmlDType::*;
    // V and down differ from their neighbours, so Q/K/V and gate/up cannot all be fused.
    let l = [Q4K, Q4K, Q6K, Q5_0, Q4_0, Q4_0, Q6K];
    compare(
        &Spec {
            arch: "llama",
            embd: Q6K,
            layer: l,
        },
        2,
    );
}

#[test]
fn gemma3_q4_k_m_shaped_model_matches_the_candle_backend() {
    use GgmlDType::*;
    let l = [Q4K, Q4K, Q6K, Q4K, Q4K, Q4K, Q6K];
    compare(
        &Spec {
            arch: "gemma3",
            embd: Q6K,
            layer: l,
        },
        3,
    );
}

#[test]
fn llama_q5_k_m_shaped_model_matches_the_candle_backend() {
    use GgmlDType::*;
    // The types of llama-quantize's Q5_K_M: Q5_K, Q6_K for V (the layers given more bits), and
    // Q5_1 (its fallback for rows that are not whole 256-element blocks) for the embeddings and
    // attn_output.
    let l = [Q5K, Q5K, Q6K, Q5_1, Q5K, Q5K, Q5K];
    compare(
        &Spec {
            arch: "llama",
            embd: Q5_1,
            layer: l,
        },
        5,
    );
}

#[test]
fn unsupported_block_types_are_a_typed_error() {
    use GgmlDType::*;
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec {
        arch: "llama",
        embd: Q8_0,
        layer: [Q3K, Q4_0, Q4_0, Q4_0, Q4_0, Q4_0, Q4_0],
    };
    let path = write_model(dir.path(), &spec, 4);
    let file = GgufFile::open(&path).unwrap();
    let hp = Hparams::from_gguf(&file.content).unwrap();
    let err = from_gguf(&path, &file.content, hp, 1)
        .err()
        .expect("Q3_K is refused");
    assert!(matches!(err, Error::Metadata { .. }), "{err}");
    assert!(
        err.to_string().contains("Q3K"),
        "the error names the type: {err}"
    );
}

/// Greedy decoding on the real SmolLM2-135M-Instruct Q4_1 weights: the fast backend's tokens
/// equal the candle backend's (skipped when `weights/` does not have the file).
#[test]
fn smollm2_greedy_tokens_equal_the_candle_backend() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../weights/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!(
            "skipping: {} is missing (scripts/fetch-weights.sh)",
            path.display()
        );
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    let hp = Hparams::from_gguf(&file.content).unwrap();
    let mut candle = crate::candle_gguf::from_gguf(&file, hp.clone(), &Device::Cpu).unwrap();
    let mut fast = from_gguf(&path, &file.content, hp.clone(), 2).unwrap();
    // "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    let prompt: Vec<u32> = vec![
        1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
    ];
    let greedy = |b: &mut dyn Backend| -> Vec<u32> {
        let mut seq = new_seq(b, &hp, 64);
        let mut logits = Vec::new();
        let mut next = prompt.clone();
        let mut out = Vec::new();
        for _ in 0..24 {
            b.forward(
                &mut [Step {
                    seq: &mut seq,
                    tokens: &next,
                }],
                &[1],
                &mut logits,
            )
            .unwrap();
            seq.len += next.len();
            let id = logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as u32)
                .unwrap();
            out.push(id);
            next = vec![id];
        }
        out
    };
    assert_eq!(greedy(&mut fast), greedy(&mut candle));
}

pub(crate) fn llama_q8() -> Spec {
    Spec {
        arch: "llama",
        embd: GgmlDType::Q8_0,
        layer: [GgmlDType::Q8_0; 7],
    }
}

/// The error of loading `path` on the fast backend.
fn load_error(path: &Path) -> String {
    let file = GgufFile::open(path).unwrap();
    let hp = match Hparams::from_gguf(&file.content) {
        Ok(hp) => hp,
        Err(e) => return e.to_string(),
    };
    match from_gguf(path, &file.content, hp, 1) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_tensor_the_forward_would_ignore_is_a_load_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let bias = || {
        QTensor::quantize(
            &Tensor::zeros(E, candle_core::DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap()
    };
    let path = write_model_with(dir.path(), &llama_q8(), 3, |t, _| {
        t.push(("blk.1.attn_output.bias".into(), bias()));
    });
    let err = load_error(&path);
    assert!(
        err.contains("blk.1.attn_output.bias") && err.contains("not understood"),
        "{err}"
    );
    // The candle backend refuses it the same way.
    let file = GgufFile::open(&path).unwrap();
    let hp = Hparams::from_gguf(&file.content).unwrap();
    let err = match crate::candle_gguf::from_gguf(&file, hp, &Device::Cpu) {
        Ok(_) => panic!("the candle backend loaded it"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("blk.1.attn_output.bias") && err.contains("candle"),
        "{err}"
    );
}

#[test]
fn rope_scaling_and_rotary_widths_the_forward_lacks_are_load_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Value, &str); 3] = [
        (
            "llama.rope.scaling.type",
            Value::String("yarn".into()),
            "llama.rope.scaling.type",
        ),
        (
            "llama.rope.dimension_count",
            Value::U32(HD as u32 / 2),
            "llama.rope.dimension_count",
        ),
        (
            "llama.rope.scaling.type",
            Value::String("linear".into()),
            "llama.rope.scaling.factor",
        ),
    ];
    for (i, (key, value, named)) in cases.into_iter().enumerate() {
        let path = write_model_with(dir.path(), &llama_q8(), 10 + i as u64, |_, m| {
            m.push((key.to_string(), value));
        });
        let err = load_error(&path);
        assert!(err.contains(named), "{key}: {err}");
    }
}

/// Linear RoPE scaling by 2 is RoPE at half the positions: the second token of a scaled model
/// sits where a plain model's position 0.5 would, so its logits differ from the plain model's
/// at position 1; at position 0 (no rotation) they are the same.
#[test]
fn linear_rope_scaling_rotates_by_scaled_positions() {
    let dir = tempfile::tempdir().unwrap();
    let plain = write_model_with(dir.path(), &llama_q8(), 20, |_, _| {});
    let scaled_dir = tempfile::tempdir().unwrap();
    let scaled = write_model_with(scaled_dir.path(), &llama_q8(), 20, |_, m| {
        m.push((
            "llama.rope.scaling.type".into(),
            Value::String("linear".into()),
        ));
        m.push(("llama.rope.scaling.factor".into(), Value::F32(2.0)));
    });
    let logits = |path: &Path| {
        let file = GgufFile::open(path).unwrap();
        let hp = Hparams::from_gguf(&file.content).unwrap();
        let mut m = from_gguf(path, &file.content, hp.clone(), 1).unwrap();
        let mut seq = new_seq(&m, &hp, 8);
        let mut out = Vec::new();
        for t in [5u32, 9] {
            let mut logits = Vec::new();
            m.forward(
                &mut [Step {
                    seq: &mut seq,
                    tokens: &[t],
                }],
                &[1],
                &mut logits,
            )
            .unwrap();
            seq.len += 1;
            out.push(logits);
        }
        out
    };
    let (a, b) = (logits(&plain), logits(&scaled));
    assert_eq!(a[0], b[0], "position 0 is not rotated");
    assert_ne!(a[1], b[1], "position 1 is rotated by half the angle");
}

/// A prompt longer than two MLP blocks ([`MLP_ROWS`]), and not a multiple of one, in one step
/// gives bit for bit the logits it gives fed in chunks of at most one block, on every kernel
/// path: the blocks take the right rows and put their sums back where they belong.
#[test]
fn a_long_prompt_in_one_step_gives_what_it_gives_in_chunks_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec {
        arch: "llama",
        embd: GgmlDType::Q8_0,
        layer: [GgmlDType::Q4K; 7],
    };
    let path = write_model(dir.path(), &spec, 5);
    let file = GgufFile::open(&path).unwrap();
    let hp = Hparams::from_gguf(&file.content).unwrap();
    let mut fast = from_gguf(&path, &file.content, hp.clone(), 2).unwrap();
    let len = 2 * MLP_ROWS + 44;
    let prompt: Vec<u32> = (0..len).map(|i| ((i * 53 + 11) % VOCAB) as u32).collect();
    let outputs = 3;
    for path in KernelPath::available() {
        assert!(fast.set_kernel_path(path));
        let mut whole = new_seq(&fast, &hp, len);
        let mut once = Vec::new();
        let mut step = [Step {
            seq: &mut whole,
            tokens: &prompt,
        }];
        fast.forward(&mut step, &[outputs], &mut once).unwrap();
        assert_eq!(once.len(), outputs * VOCAB);

        let mut chunked = new_seq(&fast, &hp, len);
        let mut last = Vec::new();
        for piece in prompt.chunks(100) {
            let wanted = if chunked.len + piece.len() == len {
                outputs
            } else {
                0
            };
            let mut step = [Step {
                seq: &mut chunked,
                tokens: piece,
            }];
            fast.forward(&mut step, &[wanted], &mut last).unwrap();
            chunked.len += piece.len();
        }
        let same = once
            .iter()
            .zip(&last)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{path:?}: one step and chunks disagree");
    }
}
