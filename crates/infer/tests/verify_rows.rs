//! `TextModel::forward_rows`, speculative decoding's verification step: feeding a token and the
//! tokens drafted after it in one step gives each of their positions the logits that feeding
//! them one step at a time gives: bit for bit on the fast CPU path (whose rows never depend on
//! the other rows of their call), closely on candle. Bad output counts are typed errors.

use std::path::{Path, PathBuf};

use hearth_infer::{BackendChoice, Error, Step, TextModel, TextModelConfig};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/arch/{name}.gguf"))
}

fn load(name: &str, backend: BackendChoice) -> TextModel {
    TextModel::load(&TextModelConfig {
        threads: 2,
        backend,
        ..TextModelConfig::local(fixture(name))
    })
    .expect("load fixture")
}

/// The logits of `draft`'s positions after `prompt`: all in one step, and one step each.
fn both_ways(m: &mut TextModel, prompt: &[u32], draft: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let mut at_once = m.new_sequence(64).unwrap();
    let mut by_token = m.new_sequence(64).unwrap();
    for seq in [&mut at_once, &mut by_token] {
        m.forward(&mut [Step {
            seq,
            tokens: prompt,
        }])
        .unwrap();
    }
    let together = m
        .forward_rows(
            &mut [Step {
                seq: &mut at_once,
                tokens: draft,
            }],
            &[draft.len()],
        )
        .unwrap()
        .to_vec();
    let mut alone = Vec::new();
    for t in draft {
        let step = Step {
            seq: &mut by_token,
            tokens: std::slice::from_ref(t),
        };
        alone.extend_from_slice(m.forward(&mut [step]).unwrap());
    }
    assert_eq!(at_once.len(), by_token.len());
    (together, alone)
}

#[test]
fn a_drafted_step_gives_every_position_the_logits_of_one_step_each() {
    let prompt: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 200).collect();
    let draft = [5u32, 17, 99, 3, 42, 42, 8];
    for name in ["llama-q4_k_m", "qwen3-q8_0", "phi3-q4_0", "mistral-q4_k_m"] {
        let mut fast = load(name, BackendChoice::Fast);
        let (together, alone) = both_ways(&mut fast, &prompt, &draft);
        assert_eq!(together.len(), draft.len() * fast.info().vocab_size);
        let differ = together
            .iter()
            .zip(&alone)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differ, None,
            "{name} on the fast path: differs at that logit"
        );

        let mut candle = load(name, BackendChoice::Candle);
        let (together, alone) = both_ways(&mut candle, &prompt, &draft);
        let worst = together
            .iter()
            .zip(&alone)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-3, "{name} on candle: {worst}");
    }
}

#[test]
fn output_counts_outside_a_steps_tokens_are_refused_and_nothing_advances() {
    let mut m = load("llama-q8_0", BackendChoice::Fast);
    let mut seq = m.new_sequence(16).unwrap();
    for (outputs, tokens) in [
        (vec![0], &[1u32, 2][..]),
        (vec![3], &[1, 2]),
        (vec![1, 1], &[1]),
    ] {
        let err = m
            .forward_rows(
                &mut [Step {
                    seq: &mut seq,
                    tokens,
                }],
                &outputs,
            )
            .unwrap_err();
        assert!(matches!(err, Error::InvalidBatch(_)), "{outputs:?}: {err}");
        assert_eq!(seq.len(), 0);
    }
    let logits = m
        .forward_rows(
            &mut [Step {
                seq: &mut seq,
                tokens: &[1, 2, 3],
            }],
            &[2],
        )
        .unwrap();
    assert_eq!(logits.len(), 2 * m.info().vocab_size);
    assert_eq!(seq.len(), 3);
}
