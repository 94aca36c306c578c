//! The candle backend (the one a GPU runs: weights, KV cache and attention on the device) run on
//! candle's CPU device against the fast CPU path, on the two default models' real weights
//! (skipped when `weights/` lacks them; scripts/fetch-weights.sh):
//! - teacher-forced along the fast path's greedy tokens, candle picks the same token wherever the
//!   fast path's margin is at least 1.0 (the near-tie margin of the llama.cpp parity tests: the
//!   fast path rounds activations to 8 bits, candle's quantized matmul does too, differently);
//! - batched rows equal single rows: sequences stepped together (prefill chunks beside decode
//!   rows, each sequence at its own length) get the logits they get alone, to rounding: the
//!   batch pads each sequence's keys to the longest, and candle's CPU matmul may sum a row's
//!   products in another order when the padded length changes its blocking (the softmax is
//!   summed in f64 so that it does not). A last-bit difference can move one 8-bit rounding of
//!   the next quantized matmul's input, so the check is the near-tie rule again: the same token
//!   wherever the single row's margin is at least 1.0, and logits within 5% of the row's largest.
//!   SmolLM2's rows come out bit-identical; Gemma 3's (256-wide heads) within about 4%.

mod support;

use std::path::{Path, PathBuf};

use hearth_infer::{BackendChoice, ChatMessage, Role, Step, TextModel, TextModelConfig};
use support::{argmax, margin};

const NEAR_TIE: f32 = 1.0;

fn weights(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../weights")
        .join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping {name}: missing (scripts/fetch-weights.sh)");
        None
    }
}

fn load(path: &Path, backend: BackendChoice) -> TextModel {
    let mut cfg = TextModelConfig::local(path);
    cfg.backend = backend;
    cfg.threads = 2;
    if path.to_string_lossy().contains("gemma") {
        // The base model's GGUF has no chat template.
        cfg.chat_template = Some(
            "{% for m in messages %}<start_of_turn>user\n{{ m.content }}<end_of_turn>\n\
             {% endfor %}<start_of_turn>model\n"
                .into(),
        );
    }
    let m = TextModel::load(&cfg).unwrap();
    assert_eq!(
        m.info().backend,
        match backend {
            BackendChoice::Candle => "candle",
            _ => "fast",
        }
    );
    m
}

fn prompt(m: &TextModel, text: &str) -> Vec<u32> {
    let tok = m.tokenizer();
    tok.encode(
        &tok.apply_chat_template(&[ChatMessage::new(Role::User, text)])
            .unwrap(),
    )
    .unwrap()
}

fn teacher_forced(file: &str) {
    let Some(path) = weights(file) else { return };
    let mut fast = load(&path, BackendChoice::Fast);
    let mut candle = load(&path, BackendChoice::Candle);
    let ids = prompt(
        &fast,
        "Name three rivers of Europe and say where each one rises.",
    );
    let n = 40;
    let mut sf = fast.new_sequence(ids.len() + n).unwrap();
    let mut sc = candle.new_sequence(ids.len() + n).unwrap();
    let mut next = ids.clone();
    let (mut decisive, mut wrong) = (0, Vec::new());
    for step in 0..n {
        let lf = fast
            .forward(&mut [Step {
                seq: &mut sf,
                tokens: &next,
            }])
            .unwrap()
            .to_vec();
        let lc = candle
            .forward(&mut [Step {
                seq: &mut sc,
                tokens: &next,
            }])
            .unwrap()
            .to_vec();
        let (want, got) = (argmax(&lf), argmax(&lc));
        if margin(&lf) >= NEAR_TIE {
            decisive += 1;
            if want != got {
                wrong.push((step, want, got, margin(&lf)));
            }
        }
        next = vec![want];
    }
    eprintln!("{file}: {decisive} of {n} steps decisive");
    assert!(
        decisive >= n / 2,
        "too few decisive steps to judge: {decisive}"
    );
    assert!(
        wrong.is_empty(),
        "{file}: (step, fast, candle, margin) {wrong:?}"
    );
}

#[test]
fn candle_picks_the_fast_paths_tokens_on_smollm2() {
    teacher_forced("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn candle_picks_the_fast_paths_tokens_on_gemma3() {
    teacher_forced("gemma-3-270m-Q4_K_M.gguf");
}

/// Each sequence's logits, one list per sequence per step, with `starts[i]` the step at which
/// sequence `i` joins; `together` steps every live sequence in one call.
fn run(
    m: &mut TextModel,
    prompts: &[Vec<u32>],
    starts: &[usize],
    together: bool,
) -> Vec<Vec<Vec<f32>>> {
    let n = 6;
    let vocab = m.info().vocab_size;
    let mut seqs: Vec<_> = prompts
        .iter()
        .map(|p| m.new_sequence(p.len() + n).unwrap())
        .collect();
    let mut next = prompts.to_vec();
    let mut out = vec![Vec::new(); prompts.len()];
    let last = starts.iter().max().unwrap() + n;
    for t in 0..last {
        let live: Vec<usize> = (0..prompts.len())
            .filter(|&i| t >= starts[i] && out[i].len() < n)
            .collect();
        let groups: Vec<Vec<usize>> = if together {
            vec![live]
        } else {
            live.into_iter().map(|i| vec![i]).collect()
        };
        for g in groups.into_iter().filter(|g| !g.is_empty()) {
            let mut steps = Vec::new();
            for (i, seq) in seqs.iter_mut().enumerate() {
                if g.contains(&i) {
                    steps.push(Step {
                        seq,
                        tokens: &next[i],
                    });
                }
            }
            let logits = m.forward(&mut steps).unwrap().to_vec();
            for (row, &i) in g.iter().enumerate() {
                let l = logits[row * vocab..(row + 1) * vocab].to_vec();
                next[i] = vec![argmax(&l)];
                out[i].push(l);
            }
        }
    }
    out
}

fn batched_equals_single(file: &str) {
    let Some(path) = weights(file) else { return };
    let mut m = load(&path, BackendChoice::Candle);
    let prompts: Vec<Vec<u32>> = [
        "Hello!",
        "Write a haiku about the sea.",
        "What is the capital of France? Answer in one word.",
        "List the planets of the solar system in order from the sun, with one fact about each.",
    ]
    .iter()
    .map(|t| prompt(&m, t))
    .collect();
    // Sequences join at steps 0, 0, 2 and 3: prefills run beside other sequences' decode rows.
    let starts = [0, 0, 2, 3];
    let alone = run(&mut m, &prompts, &starts, false);
    let together = run(&mut m, &prompts, &starts, true);
    let mut worst = 0f32;
    for (a, b) in alone.iter().zip(&together) {
        for (la, lb) in a.iter().zip(b) {
            if margin(la) >= NEAR_TIE {
                assert_eq!(
                    argmax(la),
                    argmax(lb),
                    "{file}: a batched row picked another token"
                );
            }
            let scale = la.iter().fold(1f32, |m, x| m.max(x.abs()));
            for (x, y) in la.iter().zip(lb) {
                worst = worst.max((x - y).abs() / scale);
            }
        }
    }
    eprintln!("{file}: largest batched-vs-single logit difference {worst:e} (relative to the row's largest)");
    assert!(
        worst < 5e-2,
        "{file}: batched rows differ from single rows by {worst}"
    );
}

#[test]
fn batched_rows_equal_single_rows_on_smollm2() {
    batched_equals_single("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn batched_rows_equal_single_rows_on_gemma3() {
    batched_equals_single("gemma-3-270m-Q4_K_M.gguf");
}
