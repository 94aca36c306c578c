//! Greedy ids Hearth generates from each prompt of a llama.cpp fixture, for comparing backends
//! and KV precisions against references made with different llama.cpp settings
//! (scripts/parity/grid.py reads the output).
//! Usage: greedy_ids WEIGHTS FIXTURE BACKEND(auto|candle|fast) KV(f32|f16) N OUT.json
use hearth_infer::{Sampler, SamplingParams, Step, TextModel, TextModelConfig};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 7 {
        eprintln!("usage: greedy_ids WEIGHTS FIXTURE BACKEND KV N OUT.json");
        std::process::exit(2);
    }
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a[2]).expect("fixture")).expect("json");
    let mut cfg = TextModelConfig::local(a[1].clone());
    cfg.threads = 2;
    cfg.backend = a[3].parse().expect("backend");
    cfg.kv_precision = a[4].parse().expect("kv precision");
    let n: usize = a[5].parse().expect("N");
    let mut model = TextModel::load(&cfg).expect("load");
    let vocab = model.info().vocab_size;
    let tok = model.tokenizer();
    let mut sampler = Sampler::new(&SamplingParams::default());
    let mut cases = Vec::new();
    for case in fx["cases"].as_array().expect("cases") {
        let prompt: Vec<u32> = case["prompt_ids"]
            .as_array()
            .expect("prompt_ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        let mut seq = model.new_sequence(prompt.len() + n).expect("sequence");
        let mut next = prompt;
        let mut out = Vec::new();
        while out.len() < n {
            let logits = model
                .forward(&mut [Step {
                    seq: &mut seq,
                    tokens: &next,
                }])
                .expect("forward");
            let id = sampler.sample(&logits[..vocab], &[]);
            out.push(id);
            if tok.is_stop(id) {
                break;
            }
            next = vec![id];
        }
        cases.push(serde_json::json!({ "greedy_ids": out }));
    }
    let doc = serde_json::json!({
        "backend": model.info().backend,
        "kv_precision": a[4],
        "cases": cases,
    });
    std::fs::write(&a[6], serde_json::to_string(&doc).expect("json")).expect("write");
}
