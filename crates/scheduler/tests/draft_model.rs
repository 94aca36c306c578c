//! Draft-model speculation changes how many steps a generation takes, never what it generates:
//! on every architecture fixture, the q4_0 file drafting for the q8_0 file of the same seeded
//! model gives the q8_0 file's greedy output token for token, with drafts confirmed; so does a
//! Q4_0 copy of SmolLM2 drafting for SmolLM2, greedy, sampled with a seed, under a grammar, with
//! stop strings and `max_tokens` inside a draft. A draft whose vocabulary is not the model's, a
//! draft configuration without its draft, and a draft without the configuration, are refused.

mod support;

use std::path::{Path, PathBuf};

use hearth_grammar::Grammars;
use hearth_infer::{BackendChoice, SamplingParams, TextModel, TextModelConfig, WeightType};
use hearth_scheduler::{DraftModel, Error, Scheduler, SchedulerConfig, Speculation};
use support::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/arch")
        .join(name)
}

fn load(path: &Path) -> TextModel {
    TextModel::load(&TextModelConfig {
        threads: 2,
        backend: BackendChoice::Fast,
        ..TextModelConfig::local(path)
    })
    .expect("load fixture")
}

fn drafting(name: &str) -> SchedulerConfig {
    SchedulerConfig {
        name: name.into(),
        speculation: Speculation::Draft(DraftModel::default()),
        ..SchedulerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_model_leaves_greedy_output_unchanged_on_every_architecture_fixture() {
    let mut archs: Vec<String> = std::fs::read_dir(fixture(""))
        .expect("fixtures")
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix("-q8_0.gguf").map(str::to_string)
        })
        .filter(|arch| fixture(&format!("{arch}-q4_0.gguf")).exists())
        .collect();
    archs.sort();
    assert!(archs.len() >= 6, "every architecture: {archs:?}");
    // How much an engine drafts is its cost rule's call, and on these tiny fixtures a q4_0
    // draft may cost about what the model does: each engine must draft (a stream whose
    // acceptance is unknown always does) and some drafts must be confirmed overall.
    let mut confirmed = 0;
    for arch in &archs {
        let target = fixture(&format!("{arch}-q8_0.gguf"));
        let draft = fixture(&format!("{arch}-q4_0.gguf"));
        let on = Scheduler::spawn_with_draft(load(&target), load(&draft), drafting("draft"))
            .expect("spawn with draft");
        let off = Scheduler::spawn(load(&target), SchedulerConfig::default()).expect("spawn");
        let tok = on.tokenizer();
        let mut accepted = 0;
        for (n, text) in ["one two three four one two", "hello", "the sea is"]
            .iter()
            .enumerate()
        {
            let ids = tok.encode(text).unwrap();
            let params = SamplingParams {
                logprobs: Some(0),
                ..greedy(40)
            };
            let (id_on, id_off) = (format!("on-{n}"), format!("off-{n}"));
            let (w, wo) = tokio::join!(
                run(&on, ids.clone(), params.clone(), &id_on),
                run(&off, ids.clone(), params.clone(), &id_off)
            );
            assert_eq!(
                w.text, wo.text,
                "{arch}: the draft changed a greedy generation"
            );
            assert_eq!(w.usage, wo.usage, "{arch}");
            accepted = on.metrics().accepted_tokens;
        }
        assert!(
            on.metrics().drafted_tokens > 0,
            "{arch}: nothing was drafted"
        );
        if accepted > 0 {
            assert!(
                on.metrics().steps < off.metrics().steps,
                "{arch}: fewer steps with confirmed drafts"
            );
        }
        confirmed += accepted;
    }
    assert!(confirmed > 0, "no q4_0 draft was ever confirmed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_configuration_without_its_draft_or_a_draft_without_it_is_refused() {
    let refused = Scheduler::spawn_with_draft(
        smollm2_model(),
        weights_model("gemma-3-270m-Q4_K_M.gguf"),
        drafting("mismatch"),
    );
    assert!(
        matches!(&refused, Err(Error::InvalidConfig(why)) if why.contains("vocabulary")),
        "{:?}",
        refused.err()
    );
    let qwen = fixture("qwen3-q8_0.gguf");
    let refused = Scheduler::spawn(load(&qwen), drafting("no-draft"));
    assert!(matches!(refused, Err(Error::InvalidConfig(_))));
    let refused = Scheduler::spawn_with_draft(load(&qwen), load(&qwen), SchedulerConfig::default());
    assert!(matches!(refused, Err(Error::InvalidConfig(_))));
}

/// SmolLM2's weights re-written as Q4_0 (`hearth dev requantize`), in a folder of the test's.
fn smollm2_q4_0() -> TextModel {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../weights/SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = std::env::temp_dir().join(format!("hearth-draft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smollm2-q4_0.gguf");
    hearth_infer::requantize(&source, &out, WeightType::Q4_0).expect("requantize");
    let model = load(&out);
    let _ = std::fs::remove_dir_all(&dir);
    model
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_q4_0_copy_drafting_for_smollm2_changes_no_output_greedy_sampled_or_constrained() {
    let on = Scheduler::spawn_with_draft(smollm2_model(), smollm2_q4_0(), drafting("draft"))
        .expect("spawn with draft");
    let off = Scheduler::spawn(smollm2_model(), SchedulerConfig::default()).expect("spawn");
    let same = |label: String, params: SamplingParams, ids: Vec<u32>| {
        let (on, off) = (on.clone(), off.clone());
        async move {
            let (a, b) = (format!("on-{label}"), format!("off-{label}"));
            let (w, wo) = tokio::join!(
                run(&on, ids.clone(), params.clone(), &a),
                run(&off, ids.clone(), params.clone(), &b)
            );
            assert_eq!(w.text, wo.text, "{label}: the draft changed the output");
            assert_eq!(w.usage, wo.usage, "{label}");
            w
        }
    };
    let tasks = [
        "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog.",
        "Write a short poem about the sea.",
        "List the days of the week.",
    ];
    for (n, task) in tasks.iter().enumerate() {
        same(format!("greedy-{n}"), greedy(48), prompt(&on, task)).await;
    }
    assert!(on.metrics().accepted_tokens > 0, "{:?}", on.metrics());
    assert!(on.metrics().steps < off.metrics().steps, "fewer steps");
    // Sampled: each verified position draws as plain decoding would, so one seed, one output.
    for seed in [1, 2, 3] {
        let params = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed,
            max_tokens: 40,
            ..SamplingParams::default()
        };
        same(format!("seed-{seed}"), params, prompt(&on, tasks[1])).await;
    }
    // Stop strings and max_tokens that fall inside a draft.
    let copy = prompt(&on, tasks[0]);
    for (stop, max) in [
        (vec!["lazy dog".to_string()], 48),
        (vec![], 5),
        (vec![], 13),
    ] {
        let params = SamplingParams {
            stop: stop.clone(),
            ..greedy(max)
        };
        let w = same(format!("stop-{max}"), params, copy.clone()).await;
        assert!(w.usage.completion_tokens <= max);
    }
    // Under a grammar: drafts the grammar refuses are cut before the step.
    let grammars = Grammars::new(&on.tokenizer()).expect("token table");
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
        "required": ["name", "city"],
        "additionalProperties": false
    });
    let ids = prompt(
        &on,
        "Extract as JSON with keys name and city: Maria Rossi lives in the city of Bologna.",
    );
    let request = |s: &str| hearth_scheduler::Request {
        constraint: Some(grammars.json_schema(&schema).expect("compiles")),
        ..request(ids.clone(), greedy(64), s)
    };
    let (w, wo) = tokio::join!(
        async { on.submit(request("on-json")).await.unwrap().collect().await },
        async {
            off.submit(request("off-json"))
                .await
                .unwrap()
                .collect()
                .await
        }
    );
    assert_eq!(w.text, wo.text);
    let value: serde_json::Value = serde_json::from_str(&w.text).expect("valid JSON");
    assert!(value["city"].is_string(), "{value}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_draft_models_cache_is_reused_with_the_models_and_changes_no_output() {
    let on = Scheduler::spawn_with_draft(smollm2_model(), smollm2_q4_0(), drafting("draft"))
        .expect("spawn with draft");
    let off = Scheduler::spawn(smollm2_model(), SchedulerConfig::default()).expect("spawn");
    let ids = prompt(
        &on,
        "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog.",
    );
    // One token: the prompt's prefill step only, so no step's cost is known yet and the next
    // stream is sure to get a draft cache.
    let first = run(&on, ids.clone(), greedy(1), "first").await;
    assert_eq!(first.usage.completion_tokens, 1);
    assert_eq!(
        on.metrics().draft_reused_tokens,
        0,
        "nothing was kept before"
    );
    // The same prompt again: the draft cache kept with the model's holds all of it but the last
    // token (fed again for its logits), and drafting from it changes nothing.
    let drafted = on.metrics().drafted_tokens;
    let (again, plain) = tokio::join!(
        run(&on, ids.clone(), greedy(40), "again"),
        run(&off, ids.clone(), greedy(40), "plain")
    );
    assert_eq!(
        on.metrics().draft_reused_tokens as usize,
        ids.len() - 1,
        "the kept draft cache's positions of the prompt"
    );
    assert!(on.metrics().drafted_tokens > drafted, "it drafted");
    assert_eq!(
        again.text, plain.text,
        "a reused draft cache changed the output"
    );
    assert_eq!(again.usage, plain.usage);
}
