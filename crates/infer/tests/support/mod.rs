//! What the comparison tests (and examples/device_check.rs, and hearth-infer-parity's
//! parity.rs) share: reading fixture ids, the greedy pick and its margin.
#![allow(dead_code)] // each test file uses a different part

/// A JSON array of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The first index of the largest logit, as llama.cpp's greedy sampler picks.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The largest logit's margin over the second.
pub fn margin(v: &[f32]) -> f32 {
    let best = argmax(v) as usize;
    let second = v
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &x)| x)
        .fold(f32::NEG_INFINITY, f32::max);
    v[best] - second
}
