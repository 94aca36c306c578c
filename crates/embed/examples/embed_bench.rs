//! Embedding throughput of an embedding model (a sentence-transformers folder or a GGUF decoder
//! embedder) through Hearth's engine: for each batch size and text length given, texts of
//! exactly that many tokens ("the cat sat on the mat ..."), sent as requests of `batch` texts one after another; the best of `--runs` runs.
//! Prints one JSON line per case. Used by scripts/bench-embed.sh.
//!
//!     embed_bench MODEL_DIR --batches 1,32 --tokens 16,256 --texts 256 --runs 3

use std::path::PathBuf;
use std::time::Instant;

use hearth_embed::{EmbeddingModel, Engine, EngineConfig};

fn list(v: &str) -> Vec<usize> {
    v.split(',')
        .map(|x| x.trim().parse().expect("a number"))
        .collect()
}

/// A text of exactly `tokens` tokens for `model` (its special tokens included): common words,
/// one token each in the tokenizers here, as many as make the count.
pub fn text(model: &EmbeddingModel, tokens: usize) -> String {
    let words = ["the", "cat", "sat", "on", "the", "mat"];
    (1..=tokens)
        .rev()
        .map(|k| {
            (0..k)
                .map(|i| words[i % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .find(|t| {
            model
                .tokenize(0, t, false)
                .is_ok_and(|ids| ids.len() == tokens)
        })
        .unwrap_or_else(|| panic!("no text of {tokens} tokens"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().expect("MODEL_DIR"));
    let (mut batches, mut tokens, mut texts, mut runs) = (vec![1, 32], vec![16, 256], 256, 3);
    let mut config = EngineConfig::default();
    while let Some(a) = args.next() {
        let v = args.next().expect("a value");
        match a.as_str() {
            "--batches" => batches = list(&v),
            "--tokens" => tokens = list(&v),
            "--texts" => texts = v.parse().unwrap(),
            "--runs" => runs = v.parse().unwrap(),
            "--max-batch-tokens" => config.max_batch_tokens = v.parse().unwrap(),
            other => panic!("unknown argument {other}"),
        }
    }
    let model = EmbeddingModel::load(&dir, None).expect("the model");
    let engine = Engine::start(model, config);
    for &n in &tokens {
        let ids = engine
            .model()
            .tokenize(0, &text(engine.model(), n), false)
            .unwrap();
        assert_eq!(ids.len(), n, "the text is {} tokens", ids.len());
        for &b in &batches {
            // Warm up once, then the best of the runs.
            engine.encode(vec![ids.clone(); b]).await.unwrap();
            let mut best = f64::MAX;
            for _ in 0..runs {
                let started = Instant::now();
                let mut done = 0;
                while done < texts {
                    let k = b.min(texts - done);
                    engine.encode(vec![ids.clone(); k]).await.unwrap();
                    done += k;
                }
                best = best.min(started.elapsed().as_secs_f64());
            }
            println!(
                "{{\"engine\": \"hearth\", \"batch\": {b}, \"tokens\": {n}, \"texts\": {texts}, \"s\": {best:.4}, \"texts_per_s\": {:.1}}}",
                texts as f64 / best
            );
        }
    }
}
