//! Per-sequence token sampling: repetition penalty, then greedy argmax (temperature 0) or
//! temperature + top-k + min-p + top-p filtering and a draw from a seeded RNG.

use hearth_types::SamplingParams;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Chooses the next token of one sequence. Same params + seed + logits => same tokens.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Scratch: (token, logit or probability), reused across calls.
    candidates: Vec<(u32, f32)>,
    /// Scratch for the repetition penalty: tokens already penalised in this call.
    seen: Vec<u32>,
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Sampler {
        Sampler {
            params: params.clone(),
            rng: StdRng::seed_from_u64(params.seed),
            candidates: Vec::new(),
            seen: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// `context` = prompt + generated ids so far (for the repetition penalty). Empty `logits`
    /// yield token 0.
    pub fn sample(&mut self, logits: &[f32], context: &[u32]) -> u32 {
        if logits.is_empty() {
            return 0;
        }
        let penalty = self.params.repetition_penalty;
        let penalised =
            penalty.is_finite() && penalty > 0.0 && penalty != 1.0 && !context.is_empty();
        if penalised {
            self.seen.clear();
            self.seen.extend(
                context
                    .iter()
                    .copied()
                    .filter(|&t| (t as usize) < logits.len()),
            );
            self.seen.sort_unstable();
            self.seen.dedup();
        }
        let adjust = |id: u32, l: f32, seen: &[u32]| -> f32 {
            if penalised && seen.binary_search(&id).is_ok() {
                if l > 0.0 {
                    l / penalty
                } else {
                    l * penalty
                }
            } else {
                l
            }
        };

        let temperature = self.params.temperature;
        // NaN and non-positive temperatures both mean greedy.
        if temperature.is_nan() || temperature <= 0.0 || !temperature.is_finite() {
            // Greedy: the first index of the largest (adjusted) logit; NaN never wins.
            let mut best = 0u32;
            let mut best_l = f32::NEG_INFINITY;
            for (i, &l) in logits.iter().enumerate() {
                let l = adjust(i as u32, l, &self.seen);
                if l > best_l {
                    best_l = l;
                    best = i as u32;
                }
            }
            return best;
        }

        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, adjust(i as u32, l, &self.seen)))
                .filter(|(_, l)| !l.is_nan()),
        );
        if self.candidates.is_empty() {
            return 0;
        }
        // Most likely first; ties keep the lower id first.
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let top_k = self.params.top_k;
        if top_k > 0 && top_k < self.candidates.len() {
            self.candidates
                .select_nth_unstable_by(top_k - 1, by_logit_desc);
            self.candidates.truncate(top_k);
        }
        self.candidates.sort_unstable_by(by_logit_desc);

        // Softmax with temperature, in place.
        let max = self.candidates[0].1;
        let mut sum = 0.0f32;
        for c in self.candidates.iter_mut() {
            c.1 = ((c.1 - max) / temperature).exp();
            sum += c.1;
        }
        for c in self.candidates.iter_mut() {
            c.1 /= sum;
        }

        let min_p = self.params.min_p;
        if min_p > 0.0 && min_p <= 1.0 {
            let floor = self.candidates[0].1 * min_p;
            let keep = self
                .candidates
                .iter()
                .take_while(|c| c.1 >= floor)
                .count()
                .max(1);
            self.candidates.truncate(keep);
        }
        let top_p = self.params.top_p;
        if top_p > 0.0 && top_p < 1.0 {
            let mut acc = 0.0f32;
            let mut keep = self.candidates.len();
            for (i, c) in self.candidates.iter().enumerate() {
                acc += c.1;
                if acc >= top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.candidates.truncate(keep.max(1));
        }

        let total: f32 = self.candidates.iter().map(|c| c.1).sum();
        let mut r = self.rng.gen::<f32>() * total;
        for c in &self.candidates {
            r -= c.1;
            if r <= 0.0 {
                return c.0;
            }
        }
        self.candidates.last().map(|c| c.0).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn greedy_picks_the_largest_logit_and_the_first_on_ties() {
        let mut s = Sampler::new(&params(0.0));
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]), 1);
        assert_eq!(s.sample(&[1.0, 5.0, 5.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_steers_away_from_tokens_in_the_context() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0)
        };
        let mut s = Sampler::new(&p);
        // token 0 (logit 3) halves to 1.5 < 2.0; token 2 (negative) is pushed further down.
        assert_eq!(s.sample(&[3.0, 2.0, -1.0], &[0, 2]), 1);
        assert_eq!(s.sample(&[3.0, 2.0, -1.0], &[]), 0);
    }

    #[test]
    fn same_seed_and_logits_give_the_same_tokens() {
        let p = SamplingParams {
            temperature: 1.0,
            seed: 42,
            ..SamplingParams::default()
        };
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut a = Sampler::new(&p);
        let mut b = Sampler::new(&p);
        let ta: Vec<u32> = (0..32).map(|_| a.sample(&logits, &[])).collect();
        let tb: Vec<u32> = (0..32).map(|_| b.sample(&logits, &[])).collect();
        assert_eq!(ta, tb);
        let mut c = Sampler::new(&SamplingParams { seed: 43, ..p });
        let tc: Vec<u32> = (0..32).map(|_| c.sample(&logits, &[])).collect();
        assert_ne!(ta, tc, "a different seed should draw a different stream");
    }

    #[test]
    fn top_k_one_is_greedy_even_when_hot() {
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: 7,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p);
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5, 0.9], &[]), 1);
        }
    }

    #[test]
    fn top_p_and_min_p_drop_the_unlikely_tail() {
        // probabilities ~ [0.87, 0.12, 0.0005, ...]: with top_p 0.5 only token 0 survives.
        let logits = [5.0, 3.0, -2.5, -3.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: 1,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p);
        assert!((0..50).all(|_| s.sample(&logits, &[]) == 0));
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.05,
            seed: 1,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p);
        assert!((0..200).all(|_| s.sample(&logits, &[]) <= 1));
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let p = SamplingParams {
            temperature: 1.0,
            seed: 9,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p);
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let ones = (0..4000).filter(|_| s.sample(&logits, &[]) == 1).count();
        assert!(
            (2800..3200).contains(&ones),
            "{ones} of 4000 draws were token 1"
        );
    }
}
