//! Writes the logits Hearth computes after feeding `prompt ids + the first STEP greedy ids` of a
//! llama.cpp fixture case, as raw little-endian f32 (for comparing against llama.cpp and an
//! exact reference when chasing a parity divergence).
//! Usage: dump_logits WEIGHTS FIXTURE CASE STEP BACKEND(auto|candle|fast) OUT [KV(f32|f16)]
use hearth_infer::{Step, TextModel, TextModelConfig};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a[2]).unwrap()).unwrap();
    let case = &fx["cases"][a[3].parse::<usize>().unwrap()];
    let step: usize = a[4].parse().unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut cfg = TextModelConfig::local(a[1].clone());
    cfg.threads = 2;
    cfg.backend = a[5].parse().unwrap();
    if let Some(kv) = a.get(7) {
        cfg.kv_precision = kv.parse().unwrap();
    }
    let mut model = TextModel::load(&cfg).unwrap();
    let prompt = ids(&case["prompt_ids"]);
    let gen = ids(&case["greedy_ids"]);
    let mut seq = model.new_sequence(prompt.len() + step + 1).unwrap();
    let mut logits = model
        .forward(&mut [Step {
            seq: &mut seq,
            tokens: &prompt,
        }])
        .unwrap()
        .to_vec();
    for &t in &gen[..step] {
        logits = model
            .forward(&mut [Step {
                seq: &mut seq,
                tokens: &[t],
            }])
            .unwrap()
            .to_vec();
    }
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&a[6], bytes).unwrap();
}
