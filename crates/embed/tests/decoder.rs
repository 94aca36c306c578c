//! GGUF decoder embedders against llama.cpp: two of the architecture fixtures' generated models
//! (Qwen3 with last-token pooling, Llama 3 with mean pooling, Qwen2 with the first tokens), copied with `{arch}.pooling_type`
//! and embedded by llama.cpp's own server (`tests/fixtures/embed/decoders`, written by
//! scripts/embed/decoder_fixture.py). Hearth must read the same tokens and give the same unit
//! vectors, alone, in a batch and through the engine, and refuse a chat model as an embedder.

use std::path::PathBuf;

use hearth_embed::{EmbeddingModel, Engine, EngineConfig, Error, Tokens};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    models: Vec<Model>,
}

#[derive(Deserialize)]
struct Model {
    file: String,
    pooling: String,
    inputs: Vec<Input>,
}

#[derive(Deserialize)]
struct Input {
    text: String,
    tokens: Vec<u32>,
    embedding: Vec<f32>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/embed/decoders")
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(fixtures().join("decoders.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The model of `m` and its inputs' tokens.
fn load(m: &Model) -> (EmbeddingModel, Vec<Tokens>) {
    let model = EmbeddingModel::load(&fixtures().join(&m.file), None).unwrap();
    let tokens = m
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| model.tokenize(i, &input.text, false).unwrap())
        .collect();
    (model, tokens)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn decoder_embedders_give_llama_cpps_tokens_and_vectors() {
    let reference = reference();
    assert_eq!(reference.models.len(), 3);
    for m in &reference.models {
        let (model, tokens) = load(m);
        assert_eq!(
            model.dimensions(),
            m.inputs[0].embedding.len(),
            "{}",
            m.file
        );
        assert!(model.normalizes());
        for (t, input) in tokens.iter().zip(&m.inputs) {
            assert_eq!(
                t.ids, input.tokens,
                "{}: tokens of {:?}",
                m.file, input.text
            );
        }
        // Alone, then all in one batch: the same vectors.
        let batch: Vec<&Tokens> = tokens.iter().collect();
        let together = model.embed(&batch).unwrap();
        for ((t, input), v) in tokens.iter().zip(&m.inputs).zip(&together) {
            let alone = model.embed(&[t]).unwrap().remove(0);
            assert_eq!(&alone, v, "{}: batched differs from alone", m.file);
            let c = cosine(v, &input.embedding);
            let worst = v
                .iter()
                .zip(&input.embedding)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            println!(
                "{} ({} pooling), {} tokens: cosine {c:.7}, largest difference {worst:.2e}",
                m.file,
                m.pooling,
                t.len()
            );
            assert!(c >= 0.9999, "{}: cosine {c} for {:?}", m.file, input.text);
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5);
        }
    }
}

#[test]
fn the_engine_serves_a_decoder_embedder() {
    let reference = reference();
    let (model, tokens) = load(&reference.models[0]);
    let direct = model.embed(&tokens.iter().collect::<Vec<_>>()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let engine = Engine::start(model, EngineConfig::default());
    let got = rt.block_on(engine.encode(tokens)).unwrap();
    assert_eq!(got, direct);
}

#[test]
fn a_chat_model_is_not_an_embedder_and_long_inputs_are_refused_or_cut() {
    let arch = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/arch");
    let err = EmbeddingModel::load(&arch.join("qwen3-q8_0.gguf"), None).unwrap_err();
    assert!(
        matches!(&err, Error::Load { reason, .. } if reason.contains("pooling")),
        "{err}"
    );
    let reference = reference();
    let model = EmbeddingModel::load(&fixtures().join(&reference.models[0].file), None).unwrap();
    let max = model.max_tokens();
    let long = "word ".repeat(max + 10);
    assert!(matches!(
        model.tokenize(3, &long, false),
        Err(Error::TooLong { index: 3, .. })
    ));
    assert_eq!(model.tokenize(3, &long, true).unwrap().len(), max);
    let ids = vec![1u64; max + 1];
    assert!(matches!(
        model.check_ids(0, &ids, false),
        Err(Error::TooLong { .. })
    ));
    assert!(matches!(
        model.check_ids(0, &[model.vocab() as u64], false),
        Err(Error::UnknownToken { .. })
    ));
}
