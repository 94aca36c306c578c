//! A generated tiny cross-encoder (tests/fixtures/rerank, written with its reference scores by
//! scripts/embed/rerank_fixture.py through Hugging Face transformers and sentence-transformers'
//! `CrossEncoder`) scored by Hearth: the same tokens, the same scores, the same order, alone and
//! padded in a batch with other pairs, and through the engine.

use std::path::PathBuf;

use hearth_embed::{Activation, Engine, EngineConfig, Precision, Reranker, Tokens};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    max_length: usize,
    documents: Vec<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    query: String,
    scores: Vec<f32>,
    logits: Vec<f32>,
    tokens: Vec<usize>,
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/rerank")
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(fixture().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `query` paired with each of the reference's documents.
fn pairs(model: &Reranker, r: &Reference, query: &str) -> Vec<Tokens> {
    r.documents
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

#[test]
fn scores_match_sentence_transformers_cross_encoder_alone_and_batched() {
    let model = Reranker::load(&fixture(), None).unwrap();
    let r = reference();
    assert_eq!(model.max_tokens(), r.max_length);
    assert_eq!(model.activation(), Activation::Sigmoid);
    for case in &r.cases {
        let pairs = pairs(&model, &r, &case.query);
        let lengths: Vec<usize> = pairs.iter().map(Tokens::len).collect();
        // The long document is cut to the model's length, as the reference cut it.
        assert_eq!(lengths, case.tokens, "{}", case.query);
        let batch: Vec<&Tokens> = pairs.iter().collect();
        let together = model.score(&batch).unwrap();
        for (i, pair) in pairs.iter().enumerate() {
            let alone = model.score(&[pair]).unwrap()[0];
            let logit = (alone / (1.0 - alone)).ln();
            assert!(
                (logit - case.logits[i]).abs() < 1e-3,
                "{} / document {i}: logit {logit}, reference {}",
                case.query,
                case.logits[i]
            );
            assert!(
                (alone - case.scores[i]).abs() <= 1e-5 + 1e-3 * case.scores[i],
                "{} / document {i}: score {alone}, reference {}",
                case.query,
                case.scores[i]
            );
            assert!((together[i] - alone).abs() <= 1e-6 + 1e-4 * alone);
        }
        assert_eq!(order(&together), order(&case.scores), "{}", case.query);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_scores_pairs_of_several_clients_in_their_order() {
    let model = Reranker::load(&fixture(), None).unwrap();
    let r = reference();
    let pairs: Vec<(usize, Vec<Tokens>)> = r
        .cases
        .iter()
        .enumerate()
        .map(|(c, case)| {
            let tokens = r
                .documents
                .iter()
                .enumerate()
                .map(|(i, d)| model.tokenize(i, &case.query, d).unwrap())
                .collect();
            (c, tokens)
        })
        .collect();
    let engine = Engine::start(model, EngineConfig::default());
    let clients: Vec<_> = pairs
        .into_iter()
        .map(|(c, tokens)| {
            let engine = engine.clone();
            tokio::spawn(async move { (c, engine.encode(tokens).await.unwrap()) })
        })
        .collect();
    for client in clients {
        let (c, scores) = client.await.unwrap();
        for (got, want) in scores.iter().zip(&r.cases[c].scores) {
            assert!((got - want).abs() <= 1e-5 + 1e-3 * want, "{got} vs {want}");
        }
    }
}

#[test]
fn a_folder_with_several_labels_or_no_head_is_refused_at_load() {
    let dir = std::env::temp_dir().join(format!("hearth-rerank-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture().join(file), dir.join(file)).unwrap();
    }
    let config = std::fs::read_to_string(fixture().join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["id2label"] = serde_json::json!({"0": "no", "1": "yes"});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = Reranker::load(&dir, None).unwrap_err().to_string();
    assert!(err.contains("one label"), "{err}");
    // An embedding model's folder has no classifier.
    let minilm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../weights/all-MiniLM-L6-v2");
    if minilm.exists() {
        let err = Reranker::load(&minilm, None).unwrap_err().to_string();
        assert!(err.contains("classifier"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// In bf16 (the products on Hearth's kernels where the CPU has AVX-512 BF16; f32 on candle
/// elsewhere) the scores stay within 1e-3 of the reference's (measured 9e-5) and rank the
/// documents as it does.
#[test]
fn bf16_scores_rank_as_the_reference_does() {
    let model = Reranker::load_with(&fixture(), None, Precision::Bf16).unwrap();
    let r = reference();
    for case in &r.cases {
        let pairs = pairs(&model, &r, &case.query);
        let scores = model.score(&pairs.iter().collect::<Vec<_>>()).unwrap();
        let worst = scores
            .iter()
            .zip(&case.scores)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!(
            "{}: largest score difference in bf16 {worst:.2e}",
            case.query
        );
        assert!(worst < 1e-3, "{}: {worst}", case.query);
        assert_eq!(order(&scores), order(&case.scores), "{}", case.query);
    }
}
