//! Draft-model speculation changes how many steps a generation takes, never what it generates:
//! on every architecture fixture, the q4_0 file drafting for the q8_0 file of the same seeded
//! model gives the q8_0 file's greedy output token for token, with drafts confirmed; a draft configuration
//! without its draft, and a draft without the configuration, are refused.

mod support;

use std::path::{Path, PathBuf};

use hearth_infer::{BackendChoice, SamplingParams, TextModel, TextModelConfig};
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
        assert!(accepted > 0, "{arch}: the q4_0 draft is never confirmed");
        assert!(
            on.metrics().steps < off.metrics().steps,
            "{arch}: fewer steps with a draft"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_configuration_without_its_draft_or_a_draft_without_it_is_refused() {
    let qwen = fixture("qwen3-q8_0.gguf");
    let refused = Scheduler::spawn(load(&qwen), drafting("no-draft"));
    assert!(matches!(refused, Err(Error::InvalidConfig(_))));
    let refused = Scheduler::spawn_with_draft(load(&qwen), load(&qwen), SchedulerConfig::default());
    assert!(matches!(refused, Err(Error::InvalidConfig(_))));
}
