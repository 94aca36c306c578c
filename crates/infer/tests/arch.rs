//! Every architecture, on both backends (the fast CPU path and candle, the GPU's), against
//! llama.cpp on generated models: tiny seeded
//! random models of each family, quantized by llama.cpp's `llama-quantize` to Q8_0, Q4_0 and
//! Q4_K_M (llama and qwen3 also to Q5_K_M: Q5_K and Q5_1 tensors), with llama.cpp's own outputs
//! on them (`tests/fixtures/arch/`, made by
//! `scripts/tiny-models.sh`; how, in that folder's README). For every model and case: the chat
//! template renders as the generator's Jinja engine rendered the GGUF's own template, the file
//! runs on the fast CPU backend (not a fallback to candle), the prompt
//! tokenizes to llama.cpp's ids, and teacher-forced along llama.cpp's greedy path Hearth picks
//! llama.cpp's token at every step where llama.cpp's margin is at least 1.0. The RMS difference of
//! the top-8 logits is printed per architecture, type and backend (`--nocapture`). A model
//! whose heads are whole blocks of 32 (qwen3) also has runs of llama.cpp with its q8_0 and its
//! q4_0 KV cache and flash attention, to which the fast backend with `kv_precision = "q8_0"` and
//! `"q4_0"` is held the same way.

mod support;

use std::path::{Path, PathBuf};

use hearth_infer::{
    BackendChoice, ChatMessage, KvPrecision, Role, Step, TextModel, TextModelConfig,
};
use serde_json::Value;
use support::{argmax, ids};

/// The margin under which llama.cpp's choice is a near-tie that 8-bit activation rounding may
/// flip either way (crates/infer/tests/parity.rs explains the figure).
const NEAR_TIE: f64 = 1.0;
const TYPES: [&str; 3] = ["q8_0", "q4_0", "q4_k_m"];
/// Made for two families only, to keep the fixtures small.
const Q5_K_M: &[&str] = &["q5_k_m"];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/arch")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// One model's verdict.
#[derive(Default)]
struct Tally {
    steps: usize,
    agree: usize,
    decisive: usize,
    /// (case, step, hearth, llama.cpp, margin) on decisive steps where Hearth differs.
    wrong: Vec<(String, usize, u32, u32, f64)>,
    sq_diff: f64,
    compared: usize,
}

/// The run of the fixture that is what Hearth does: for a file with a sliding window that
/// llama.cpp ignores (Mistral's, on the `llama` architecture), the run that emulates the window
/// in llama.cpp (Hearth applies it as the file says); for LongRoPE files, the run with the short
/// factors (Hearth serves such files within their original context); else llama.cpp as it runs.
/// Among the runs with the KV cache `kv` (`"f32"`, `"q8_0"` or `"q4_0"`); `None` if there is
/// none.
fn reference_run<'a>(fx: &'a Value, kv: &str) -> Option<&'a Value> {
    let runs: Vec<&Value> = fx["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["llama_cpp_settings"]["type_k"].as_str() == Some(kv))
        .collect();
    let short = |r: &&&Value| {
        r["rope_factors_used"]
            .as_str()
            .is_none_or(|f| f == "rope_factors_short")
    };
    runs.iter()
        .find(|r| r["sliding_window_emulated"].is_u64())
        .or_else(|| runs.iter().find(short))
        .copied()
}

fn fixture(name: &str, ty: &str) -> Value {
    let path = dir().join(format!("{name}-{ty}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The KV cache type of the llama.cpp run Hearth's `kv` is held to, as the fixture names it,
/// and whether that run's flash attention was on (llama.cpp's quantized caches need it; the f32
/// reference has it off).
fn cache_of(kv: KvPrecision) -> (&'static str, bool) {
    (kv.name(), kv.quant().is_some())
}

fn check_model(name: &str, ty: &str, backend: BackendChoice, kv: KvPrecision, tally: &mut Tally) {
    let fx = fixture(name, ty);
    let (kv_name, flash) = cache_of(kv);
    let run = reference_run(&fx, kv_name)
        .unwrap_or_else(|| panic!("{name}-{ty}: no run of llama.cpp with a {kv_name} cache"));
    let s = &run["llama_cpp_settings"];
    assert_eq!(
        (s["type_v"].as_str(), s["flash_attn"].as_bool()),
        (Some(kv_name), Some(flash)),
        "{name}-{ty}: the run's V cache and flash attention"
    );
    let mut cfg = TextModelConfig::local(dir().join(format!("{name}-{ty}.gguf")));
    cfg.threads = 2;
    cfg.backend = backend;
    cfg.kv_precision = kv;
    let mut model = TextModel::load(&cfg)
        .unwrap_or_else(|e| panic!("{name}-{ty} does not load on {backend:?}: {e}"));
    // The backend asked for, never a fallback (the fast path must run every fixture itself).
    let expected = match backend {
        BackendChoice::Fast => "fast",
        _ => "candle",
    };
    assert_eq!(
        model.info().backend,
        expected,
        "{name}-{ty}: runs on the {expected} backend"
    );
    let vocab = model.info().vocab_size;
    for case in run["cases"].as_array().unwrap() {
        let case_name = format!("{name}-{ty} {backend:?} {}", case["name"].as_str().unwrap());
        let prompt = case["prompt"].as_str().unwrap();
        if let Some(messages) = case["messages"].as_array() {
            let messages: Vec<ChatMessage> = messages
                .iter()
                .map(|m| {
                    ChatMessage::new(
                        m["role"].as_str().unwrap().parse::<Role>().unwrap(),
                        m["content"].as_str().unwrap(),
                    )
                })
                .collect();
            let rendered = model.tokenizer().apply_chat_template(&messages).unwrap();
            assert_eq!(
                rendered, prompt,
                "{case_name}: the chat template renders differently"
            );
        }
        let prompt_ids = model.tokenizer().encode(prompt).unwrap();
        assert_eq!(
            prompt_ids,
            ids(&case["prompt_ids"]),
            "{case_name}: prompt token ids differ"
        );
        let want = ids(&case["greedy_ids"]);
        let margins = floats(&case["margins"]);
        let tops = case["top_ids"].as_array().unwrap();
        let top_logits = case["top_logits"].as_array().unwrap();
        let mut seq = model.new_sequence(prompt_ids.len() + want.len()).unwrap();
        let mut next = prompt_ids;
        for (k, &id) in want.iter().enumerate() {
            let logits = model
                .forward(&mut [Step {
                    seq: &mut seq,
                    tokens: &next,
                }])
                .unwrap();
            let logits = &logits[..vocab];
            let got = argmax(logits);
            tally.steps += 1;
            tally.agree += usize::from(got == id);
            if margins[k] >= NEAR_TIE {
                tally.decisive += 1;
                if got != id {
                    tally
                        .wrong
                        .push((case_name.clone(), k, got, id, margins[k]));
                }
            }
            for (t, l) in ids(&tops[k]).iter().zip(floats(&top_logits[k])) {
                let d = f64::from(logits[*t as usize]) - l;
                tally.sq_diff += d * d;
                tally.compared += 1;
            }
            next = vec![id];
        }
    }
}

/// Every type of `name` (`TYPES`, then `extra`), then one verdict listing every decisive step
/// Hearth got wrong.
fn check(name: &str, extra: &[&str]) {
    let mut failures = Vec::new();
    let runs = TYPES.iter().chain(extra).flat_map(|&ty| {
        // The quantized caches where llama.cpp made a run with them (heads of whole blocks), on
        // the fast backend, the only one that keeps them.
        let fx = fixture(name, ty);
        let quantized = [KvPrecision::Q8_0, KvPrecision::Q4_0]
            .into_iter()
            .filter(move |kv| reference_run(&fx, kv.name()).is_some())
            .map(move |kv| (ty, BackendChoice::Fast, kv));
        [
            (ty, BackendChoice::Fast, KvPrecision::F32),
            (ty, BackendChoice::Candle, KvPrecision::F32),
        ]
        .into_iter()
        .chain(quantized)
    });
    for (ty, backend, kv) in runs {
        let mut t = Tally::default();
        check_model(name, ty, backend, kv, &mut t);
        let rms = (t.sq_diff / t.compared.max(1) as f64).sqrt();
        println!(
            "{name} {ty} {backend:?} {kv:?} cache: {} of {} steps agree with llama.cpp, {} decisive; top-8 logit RMS difference {rms:.4}",
            t.agree, t.steps, t.decisive
        );
        assert!(
            t.decisive >= 10,
            "{name}-{ty}: only {} of {} steps decisive: the fixture no longer tests much",
            t.decisive,
            t.steps
        );
        failures.extend(t.wrong);
    }
    assert!(
        failures.is_empty(),
        "(case, step, hearth, llama.cpp, llama.cpp's margin) where Hearth differs on a decisive step: {failures:?}"
    );
}

#[test]
fn llama_picks_llama_cpps_token_at_every_decisive_step() {
    check("llama", Q5_K_M);
}

#[test]
fn llama3_with_rope_factors_picks_llama_cpps_token_at_every_decisive_step() {
    check("llama3", &[]);
}

#[test]
fn qwen2_with_qkv_biases_picks_llama_cpps_token_at_every_decisive_step() {
    check("qwen2", &[]);
}

#[test]
fn qwen3_with_qk_norms_picks_llama_cpps_token_at_every_decisive_step() {
    check("qwen3", Q5_K_M);
}

#[test]
fn mistral_with_its_sliding_window_picks_llama_cpps_token_at_every_decisive_step() {
    check("mistral", &[]);
}

#[test]
fn phi3_with_fused_matrices_picks_llama_cpps_token_at_every_decisive_step() {
    check("phi3", &[]);
}

/// The quantized caches are held to llama.cpp's wherever the fixtures have a run of them: on
/// every type of qwen3, whose heads (64) are whole blocks.
#[test]
fn the_fixtures_with_heads_of_whole_blocks_have_quantized_cache_runs() {
    for ty in TYPES.iter().chain(Q5_K_M) {
        for kv in ["q8_0", "q4_0"] {
            assert!(
                reference_run(&fixture("qwen3", ty), kv).is_some(),
                "qwen3-{ty}: no {kv} run: rerun scripts/tiny-models.sh qwen3"
            );
        }
    }
}

/// A quantized cache needs heads of whole blocks of 32, as llama.cpp's does: a model with
/// 16-wide heads is refused at load, by name, on either backend (candle keeps no quantized
/// cache at all).
#[test]
fn a_quantized_cache_for_heads_that_split_a_block_is_refused_by_name() {
    for kv in [KvPrecision::Q8_0, KvPrecision::Q4_0] {
        for backend in [
            BackendChoice::Fast,
            BackendChoice::Candle,
            BackendChoice::Auto,
        ] {
            let mut cfg = TextModelConfig::local(dir().join("llama-q8_0.gguf"));
            cfg.threads = 2;
            cfg.backend = backend;
            cfg.kv_precision = kv;
            let err = match TextModel::load(&cfg) {
                Ok(_) => panic!("{backend:?}: a {kv:?} cache of 16-wide heads loaded"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains("kv_precision"), "{backend:?}: {err}");
            assert!(err.contains(kv.name()), "{backend:?}: {err}");
        }
    }
}
