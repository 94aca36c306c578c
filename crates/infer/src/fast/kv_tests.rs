//! The fast backend's KV caches: f16 and q8_0 against f32, prefill against one token a step.

use candle_core::quantized::GgmlDType;

use super::tests::{new_seq, run_schedule_on, write_model, Spec, VOCAB};
use super::*;
use crate::gguf::GgufFile;
use crate::kv::Layer;
use crate::sequence::HostKv;
use crate::Sequence;

/// The first `n` keys of layer `il`, widened to f32.
fn keys(c: &HostKv, il: usize, n: usize) -> Vec<f32> {
    match c.k.layer(il) {
        Layer::F32(k) => k[..n].to_vec(),
        Layer::F16(k) => k[..n].iter().map(|x| x.to_f32()).collect(),
        Layer::Quant(k) => (0..n).map(|i| k.value(i)).collect(),
    }
}

/// `kv_precision = "f16"` keeps the cache in f16, half the bytes, and gives the logits, bit for
/// bit, of an f32 cache holding the same f16-rounded values (the attention kernels widen f16
/// keys and values as they load them, `ops::attend` over f16).
#[test]
fn an_f16_cache_gives_the_logits_of_an_f32_cache_with_the_same_values_in_half_the_memory() {
    for (spec, seed) in [
        (
            Spec {
                arch: "gemma3",
                embd: GgmlDType::Q8_0,
                layer: [GgmlDType::Q8_0; 7],
            },
            4,
        ),
        (
            Spec {
                arch: "llama",
                embd: GgmlDType::Q8_0,
                layer: [GgmlDType::Q4_1; 7],
            },
            5,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = write_model(dir.path(), &spec, seed);
        let file = GgufFile::open(&path).unwrap();
        let hp = Hparams::from_gguf(&file.content).unwrap();
        let mut m = from_gguf(&path, &file.content, hp.clone(), 2).unwrap();
        m.set_kv(KvPrecision::F16).unwrap();
        let maker = m.maker.clone();
        let host = |e| Sequence::on_host(&maker, hp.n_layer, hp.kv_dim(), 64, e).unwrap();
        let halves = new_seq(&m, &hp, 64);
        assert_eq!(halves.host().unwrap().k.elem(), KvPrecision::F16);
        assert_eq!(2 * halves.kv_bytes(), host(KvPrecision::F32).kv_bytes());
        let want = run_schedule_on(&mut m, host(KvPrecision::F32), host(KvPrecision::F32));
        let other = new_seq(&m, &hp, 64);
        let got = run_schedule_on(&mut m, halves, other);
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let (g, w): (Vec<u32>, Vec<u32>) = (
                g.iter().map(|x| x.to_bits()).collect(),
                w.iter().map(|x| x.to_bits()).collect(),
            );
            assert!(
                g == w,
                "{} step {step}: the f16 cache changed the logits",
                spec.arch
            );
        }
        // An f16 cache is refused by a model that keeps f32 values.
        m.set_kv(KvPrecision::F32).unwrap();
        assert!(!m.accepts(&host(KvPrecision::F16)));
        assert!(m.accepts(&host(KvPrecision::F32)));
    }
}

/// A prompt prefilled in one step (its rows attend together, a tile at a time) leaves exactly
/// the cache that feeding it one token per step leaves, in every layer: each row's attention
/// is the same, bit for bit, whether it runs alone or beside the other rows of its chunk. With
/// an f32 cache, an f16 one, a q8_0 one and a q4_0 one.
#[test]
fn a_prompt_prefilled_at_once_leaves_the_cache_one_token_a_step_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec {
        arch: "llama",
        embd: GgmlDType::Q8_0,
        layer: [GgmlDType::Q4_1; 7],
    };
    let path = write_model(dir.path(), &spec, 5);
    let file = GgufFile::open(&path).unwrap();
    let hp = Hparams::from_gguf(&file.content).unwrap();
    let prompt: Vec<u32> = (0..100).map(|i| (i * 29 + 3) % VOCAB as u32).collect();
    for kv in [
        KvPrecision::F32,
        KvPrecision::F16,
        KvPrecision::Q8_0,
        KvPrecision::Q4_0,
    ] {
        let mut fast = from_gguf(&path, &file.content, hp.clone(), 2).unwrap();
        fast.set_kv(kv).unwrap();
        let mut logits = Vec::new();
        let mut at_once = new_seq(&fast, &hp, 128);
        fast.forward(
            &mut [Step {
                seq: &mut at_once,
                tokens: &prompt,
            }],
            &[1],
            &mut logits,
        )
        .unwrap();
        let last_at_once = logits.clone();
        let mut by_token = new_seq(&fast, &hp, 128);
        for (i, t) in prompt.iter().enumerate() {
            by_token.len = i;
            fast.forward(
                &mut [Step {
                    seq: &mut by_token,
                    tokens: std::slice::from_ref(t),
                }],
                &[1],
                &mut logits,
            )
            .unwrap();
        }
        let n = prompt.len() * hp.kv_dim();
        for il in 0..hp.n_layer {
            let (at_once, by_token) = (at_once.host().unwrap(), by_token.host().unwrap());
            let (a, b) = (keys(at_once, il, n), keys(by_token, il, n));
            let differ = a
                .iter()
                .zip(&b)
                .position(|(x, y)| x.to_bits() != y.to_bits());
            assert_eq!(
                differ, None,
                "{kv:?}: keys of layer {il} differ at that index"
            );
        }
        let differ =
            (last_at_once.iter().zip(&logits)).position(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(
            differ, None,
            "{kv:?}: the last position's logits differ at that index"
        );
    }
}

/// `kv_precision = "q8_0"` keeps 34 bytes a block of 32 values (17/32 of an f16 cache), and
/// through a schedule of prefill chunks beside decode rows its logits stay within the rounding
/// of 8-bit keys, values and queries of an f32 cache's; a model that keeps q8_0 refuses an f16
/// cache and runs an f32 one.
#[test]
fn a_q8_cache_takes_17_32_of_the_f16_memory_and_keeps_the_f32_logits_near() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec {
        arch: "llama",
        embd: GgmlDType::Q8_0,
        layer: [GgmlDType::Q8_0; 7],
    };
    let path = write_model(dir.path(), &spec, 9);
    let file = GgufFile::open(&path).unwrap();
    let hp = Hparams::from_gguf(&file.content).unwrap();
    let mut m = from_gguf(&path, &file.content, hp.clone(), 2).unwrap();
    let maker = m.maker.clone();
    let host = |e| Sequence::on_host(&maker, hp.n_layer, hp.kv_dim(), 64, e).unwrap();
    let want = run_schedule_on(&mut m, host(KvPrecision::F32), host(KvPrecision::F32));
    m.set_kv(KvPrecision::Q8_0).unwrap();
    let (a, b) = (new_seq(&m, &hp, 64), new_seq(&m, &hp, 64));
    assert_eq!(a.host().unwrap().k.elem(), KvPrecision::Q8_0);
    assert_eq!(32 * a.kv_bytes(), 17 * host(KvPrecision::F16).kv_bytes());
    let got = run_schedule_on(&mut m, a, b);
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        let spread = w.iter().map(|x| x * x).sum::<f32>().sqrt() / (w.len() as f32).sqrt();
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(g != w, "step {step}: q8_0 changed nothing: is it in use?");
        assert!(
            worst < 0.05 * spread,
            "step {step}: a logit moved {worst} against a spread of {spread}"
        );
    }
    assert!(!m.accepts(&host(KvPrecision::F16)));
    assert!(m.accepts(&host(KvPrecision::F32)));
}
