//! GGUF decoder rerankers against llama.cpp: two Qwen3 architecture fixtures made into rerankers
//! the way llama.cpp's converter makes Qwen3-Reranker's file (rank pooling, a yes/no classifier
//! head cut out of the output matrix; one with a rerank prompt template, one without) and scored
//! by llama.cpp's own server (`tests/fixtures/embed/decoders/rerankers.json`, written by
//! scripts/embed/decoder_fixture.py). Hearth must write the same prompts, give the same scores in
//! the same order, alone, in a batch and through the engine, cut a document too long for the
//! context, and keep rerankers and embedders apart.

use std::path::PathBuf;

use hearth_embed::{Activation, EmbeddingModel, Engine, EngineConfig, Error, Reranker, Tokens};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    documents: Vec<String>,
    models: Vec<Model>,
}

#[derive(Deserialize)]
struct Model {
    file: String,
    template: bool,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    query: String,
    documents: Vec<Scored>,
}

#[derive(Deserialize)]
struct Scored {
    tokens: Vec<u32>,
    n_tokens: usize,
    score: f32,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/embed/decoders")
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(fixtures().join("rerankers.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn pairs(model: &Reranker, query: &str, documents: &[String]) -> Vec<Tokens> {
    documents
        .iter()
        .enumerate()
        .map(|(i, d)| model.tokenize(i, query, d).unwrap())
        .collect()
}

fn order(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}

/// How far a score (a probability) may be from llama.cpp's in a file of `file`'s block types.
/// Both engines round activations to 8 bits in the quantized products, and that rounding moves
/// a score on these tiny models far more than the engines differ: computed exactly from the
/// same dequantized weights (scripts/embed/rank_f64.py), llama.cpp's scores are up to 0.06 off
/// on the Q8_0 file and 0.03 on the Q4_K_M one, Hearth's within 3e-3 and 0.019 of llama.cpp's.
fn tolerance(file: &str) -> f32 {
    if file.contains("q8_0") {
        5e-3
    } else {
        0.025
    }
}

#[test]
fn decoder_rerankers_give_llama_cpps_prompts_scores_and_order() {
    let r = reference();
    assert_eq!(r.models.len(), 2);
    assert!(r.models.iter().any(|m| m.template) && r.models.iter().any(|m| !m.template));
    for m in &r.models {
        let model = Reranker::load(&fixtures().join(&m.file), None).unwrap();
        assert_eq!(model.activation(), Activation::Softmax);
        for case in &m.cases {
            let pairs = pairs(&model, &case.query, &r.documents);
            for (p, want) in pairs.iter().zip(&case.documents) {
                assert_eq!(p.ids, want.tokens, "{}: {:?}", m.file, case.query);
                assert_eq!(p.len(), want.n_tokens);
            }
            let batch: Vec<&Tokens> = pairs.iter().collect();
            let together = model.score(&batch).unwrap();
            let want: Vec<f32> = case.documents.iter().map(|d| d.score).collect();
            for ((p, got), want) in pairs.iter().zip(&together).zip(&want) {
                let alone = model.score(&[p]).unwrap()[0];
                assert_eq!(alone, *got, "{}: batched differs from alone", m.file);
                println!(
                    "{}, {} tokens: {got:.6} against llama.cpp's {want:.6}",
                    m.file,
                    p.len()
                );
                assert!(
                    (got - want).abs() <= tolerance(&m.file),
                    "{}: {got} vs {want}",
                    m.file
                );
            }
            assert_eq!(
                order(&together),
                order(&want),
                "{}: {:?}",
                m.file,
                case.query
            );
        }
    }
}

#[test]
fn the_engine_serves_a_decoder_reranker() {
    let r = reference();
    let model = Reranker::load(&fixtures().join(&r.models[0].file), None).unwrap();
    let pairs = pairs(&model, &r.models[0].cases[0].query, &r.documents);
    let direct = model.score(&pairs.iter().collect::<Vec<_>>()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let engine = Engine::start(model, EngineConfig::default());
    assert_eq!(rt.block_on(engine.encode(pairs)).unwrap(), direct);
}

#[test]
fn a_document_past_the_context_is_cut_and_a_query_past_it_refused() {
    let r = reference();
    let model = Reranker::load(&fixtures().join(&r.models[0].file), None).unwrap();
    let max = model.max_tokens();
    let short = model.tokenize(0, "a query", "a document").unwrap();
    let long = model
        .tokenize(1, "a query", &"word ".repeat(max + 100))
        .unwrap();
    assert!(
        long.len() <= max && long.len() + 16 >= max,
        "{}",
        long.len()
    );
    // The document was cut, not the prompt: it ends as every prompt does.
    let tail = 3;
    assert_eq!(
        long.ids[long.len() - tail..],
        short.ids[short.len() - tail..]
    );
    let err = model
        .tokenize(2, &"word ".repeat(max + 10), "a document")
        .unwrap_err();
    assert!(matches!(err, Error::TooLong { index: 2, .. }), "{err}");
}

#[test]
fn rerankers_and_embedders_stay_apart() {
    let r = reference();
    let ranker = fixtures().join(&r.models[0].file);
    let err = EmbeddingModel::load(&ranker, None).unwrap_err();
    assert!(
        matches!(&err, Error::Load { reason, .. } if reason.contains("reranker")),
        "{err}"
    );
    let embedder = fixtures().join("qwen3-q8_0-embed-last.gguf");
    let err = Reranker::load(&embedder, None).unwrap_err();
    assert!(
        matches!(&err, Error::Load { reason, .. } if reason.contains("not a reranker")),
        "{err}"
    );
    let chat = fixtures().join("../../arch/qwen3-q8_0.gguf");
    let err = Reranker::load(&chat, None).unwrap_err();
    assert!(
        matches!(&err, Error::Load { reason, .. } if reason.contains("pooling")),
        "{err}"
    );
}
