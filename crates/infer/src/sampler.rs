//! Per-sequence token sampling: repetition, presence and frequency penalties and a constraint's
//! mask, then greedy argmax (temperature 0) or temperature + top-k + min-p + top-p filtering and
//! a draw from a seeded RNG; optionally the log-probabilities of the step.
//!
//! A request that asks for none of the newer adjustments (presence/frequency penalties, a mask,
//! log-probabilities) takes the original path: the logits are read in place, nothing is copied
//! or allocated per token. Otherwise they are copied once into a scratch buffer and adjusted
//! there.

use hearth_types::{SamplingParams, MAX_TOP_LOGPROBS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::constraint::TokenMask;

/// Chooses the next token of one sequence. Same params + seed + logits => same tokens.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Scratch: (token, logit or probability), reused across calls.
    candidates: Vec<(u32, f32)>,
    /// Scratch for the repetition penalty: tokens already penalised in this call.
    seen: Vec<u32>,
    /// (token, times chosen) of the tokens this sampler has chosen, by id: the presence and
    /// frequency penalties' context. Kept only when one of them is on.
    counts: Vec<(u32, u32)>,
    /// Scratch: the logits after penalties and mask, when any of the newer adjustments applies.
    adjusted: Vec<f32>,
    /// The last step's log-probabilities, when asked for.
    last: StepLogprobs,
}

/// Log-probabilities of the last sampled token: the log-softmax of the logits after the
/// penalties and the mask, before temperature and the top-k/top-p/min-p filters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepLogprobs {
    /// The chosen token's log-probability.
    pub chosen: f32,
    /// The most likely tokens (id, log-probability), most likely first, lower id first on ties.
    pub top: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Sampler {
        Sampler {
            params: params.clone(),
            rng: StdRng::seed_from_u64(params.seed),
            candidates: Vec::new(),
            seen: Vec::new(),
            counts: Vec::new(),
            adjusted: Vec::new(),
            last: StepLogprobs::default(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// `context` = prompt + generated ids so far (for the repetition penalty). Empty `logits`
    /// yield token 0.
    pub fn sample(&mut self, logits: &[f32], context: &[u32]) -> u32 {
        self.sample_masked(logits, context, None).unwrap_or(0)
    }

    /// Like [`sample`](Sampler::sample), choosing only among the tokens `mask` allows. `None`
    /// when no token can be chosen: the mask allows none with a finite logit, or `logits` is
    /// empty. The presence and frequency penalties count the tokens this sampler returns.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        context: &[u32],
        mask: Option<&TokenMask>,
    ) -> Option<u32> {
        if logits.is_empty() {
            return None;
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
        let repetition = |id: u32, l: f32, seen: &[u32]| -> f32 {
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
        let (presence, frequency) = self.count_penalties();
        let counting = presence != 0.0 || frequency != 0.0;
        let id = if !counting && mask.is_none() && self.params.logprobs.is_none() {
            let seen = &self.seen;
            choose(
                &self.params,
                &mut self.rng,
                &mut self.candidates,
                logits,
                |id, l| repetition(id, l, seen),
            )?
        } else {
            let seen = &self.seen;
            self.adjusted.clear();
            self.adjusted.extend(
                logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| repetition(i as u32, l, seen)),
            );
            for &(id, n) in &self.counts {
                if let Some(l) = self.adjusted.get_mut(id as usize) {
                    *l -= presence + frequency * n as f32;
                }
            }
            if let Some(mask) = mask {
                mask.apply(&mut self.adjusted);
            }
            let id = choose(
                &self.params,
                &mut self.rng,
                &mut self.candidates,
                &self.adjusted,
                |_, l| l,
            )?;
            if let Some(n) = self.params.logprobs {
                log_softmax_top(&self.adjusted, id, n.min(MAX_TOP_LOGPROBS), &mut self.last);
            }
            id
        };
        if counting {
            match self.counts.binary_search_by_key(&id, |&(t, _)| t) {
                Ok(i) => self.counts[i].1 += 1,
                Err(i) => self.counts.insert(i, (id, 1)),
            }
        }
        Some(id)
    }

    /// The log-probabilities of the token the last call chose, when the params ask for them.
    pub fn logprobs(&self) -> Option<&StepLogprobs> {
        self.params.logprobs.map(|_| &self.last)
    }

    /// (presence, frequency), each 0.0 when off or not a finite number.
    fn count_penalties(&self) -> (f32, f32) {
        let finite = |p: f32| if p.is_finite() { p } else { 0.0 };
        (
            finite(self.params.presence_penalty),
            finite(self.params.frequency_penalty),
        )
    }
}

/// Greedy or temperature sampling over `logits` as `adjust` changes them. `None` when no logit
/// is finite.
fn choose(
    params: &SamplingParams,
    rng: &mut StdRng,
    candidates: &mut Vec<(u32, f32)>,
    logits: &[f32],
    adjust: impl Fn(u32, f32) -> f32,
) -> Option<u32> {
    let temperature = params.temperature;
    // NaN and non-positive temperatures both mean greedy.
    if temperature.is_nan() || temperature <= 0.0 || !temperature.is_finite() {
        // Greedy: the first index of the largest (adjusted) logit; NaN and -inf never win.
        let mut best = None;
        let mut best_l = f32::NEG_INFINITY;
        for (i, &l) in logits.iter().enumerate() {
            let l = adjust(i as u32, l);
            if l > best_l {
                best_l = l;
                best = Some(i as u32);
            }
        }
        return best;
    }

    candidates.clear();
    candidates.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, adjust(i as u32, l)))
            .filter(|(_, l)| !l.is_nan() && *l != f32::NEG_INFINITY),
    );
    if candidates.is_empty() {
        return None;
    }
    // Most likely first; ties keep the lower id first.
    let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let top_k = params.top_k;
    if top_k > 0 && top_k < candidates.len() {
        candidates.select_nth_unstable_by(top_k - 1, by_logit_desc);
        candidates.truncate(top_k);
    }
    candidates.sort_unstable_by(by_logit_desc);

    // Softmax with temperature, in place.
    let max = candidates[0].1;
    let mut sum = 0.0f32;
    for c in candidates.iter_mut() {
        c.1 = ((c.1 - max) / temperature).exp();
        sum += c.1;
    }
    for c in candidates.iter_mut() {
        c.1 /= sum;
    }

    let min_p = params.min_p;
    if min_p > 0.0 && min_p <= 1.0 {
        let floor = candidates[0].1 * min_p;
        let keep = candidates
            .iter()
            .take_while(|c| c.1 >= floor)
            .count()
            .max(1);
        candidates.truncate(keep);
    }
    let top_p = params.top_p;
    if top_p > 0.0 && top_p < 1.0 {
        let mut acc = 0.0f32;
        let mut keep = candidates.len();
        for (i, c) in candidates.iter().enumerate() {
            acc += c.1;
            if acc >= top_p {
                keep = i + 1;
                break;
            }
        }
        candidates.truncate(keep.max(1));
    }

    let total: f32 = candidates.iter().map(|c| c.1).sum();
    let mut r = rng.gen::<f32>() * total;
    for c in candidates.iter() {
        r -= c.1;
        if r <= 0.0 {
            return Some(c.0);
        }
    }
    candidates.last().map(|c| c.0)
}

/// Fills `out` with the log-softmax of `logits` at `chosen` and its `n` largest entries. Two
/// passes over the logits (max, then the sum of exponentials and the running top `n`).
fn log_softmax_top(logits: &[f32], chosen: u32, n: usize, out: &mut StepLogprobs) {
    out.top.clear();
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        out.chosen = f32::NEG_INFINITY;
        return;
    }
    let mut sum = 0.0f64;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        sum += f64::from(l - max).exp();
        // The running top `n`, most likely first; an equal logit goes after (lower id first).
        if n > 0 && (out.top.len() < n || out.top.last().is_some_and(|&(_, t)| l > t)) {
            let at = out.top.partition_point(|&(_, t)| t >= l);
            out.top.insert(at, (i as u32, l));
            out.top.truncate(n);
        }
    }
    let log_z = max + sum.ln() as f32;
    let logprob = |l: f32| (l - log_z).min(0.0);
    out.chosen = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |&l| logprob(l));
    for t in out.top.iter_mut() {
        t.1 = logprob(t.1);
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

    #[test]
    fn presence_and_frequency_penalties_count_only_the_tokens_generated() {
        let p = SamplingParams {
            presence_penalty: 1.0,
            frequency_penalty: 0.5,
            ..params(0.0)
        };
        let mut s = Sampler::new(&p);
        // The prompt (context) does not count: token 0 wins the first step despite being in it.
        assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[0, 0, 0]), 0);
        // Token 0 has been generated once: 3.0 - 1.0 - 0.5 = 1.5 < 2.5.
        assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[0, 0, 0, 0]), 1);
        // Token 1 once too: 2.5 - 1.5 = 1.0 < 1.5.
        assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[]), 0);
        // Token 0 twice: 3.0 - 1.0 - 1.0 = 1.0, token 1 once: 1.0; the lower id wins the tie.
        assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[]), 0);
        // Token 0 three times: 0.5 < 1.0.
        assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[]), 1);
        // A negative presence penalty encourages repeats.
        let mut s = Sampler::new(&SamplingParams {
            presence_penalty: -2.0,
            ..params(0.0)
        });
        assert_eq!(s.sample(&[1.0, 2.0], &[]), 1);
        assert_eq!(s.sample(&[3.5, 2.0], &[]), 1);
    }

    #[test]
    fn penalties_of_zero_leave_the_tokens_unchanged() {
        let logits: Vec<f32> = (0..64).map(|i| (i as f32 * 0.71).cos() * 3.0).collect();
        let base = SamplingParams {
            temperature: 0.8,
            top_k: 20,
            seed: 3,
            ..SamplingParams::default()
        };
        let mut a = Sampler::new(&base);
        let mut b = Sampler::new(&SamplingParams {
            logprobs: Some(2),
            ..base.clone()
        });
        for _ in 0..50 {
            assert_eq!(a.sample(&logits, &[]), b.sample(&logits, &[]));
        }
    }

    #[test]
    fn logprobs_are_a_distribution_and_report_the_chosen_token() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 0.0, -3.0];
        let mut s = Sampler::new(&SamplingParams {
            logprobs: Some(20),
            ..params(0.0)
        });
        let id = s.sample(&logits, &[]);
        assert_eq!(id, 1);
        let lp = s.logprobs().expect("asked for").clone();
        assert_eq!(
            lp.top.len(),
            logits.len(),
            "fewer tokens than asked: all of them"
        );
        let total: f32 = lp.top.iter().map(|&(_, l)| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "sum of probabilities {total}");
        assert_eq!(lp.top[0].0, 1, "ties: lower id first");
        assert_eq!(lp.top[1].0, 3);
        assert!((lp.chosen - lp.top[0].1).abs() < 1e-6);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((lp.chosen - (2.0f32.exp() / z).ln()).abs() < 1e-5);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));

        // Sampled tokens report their own logprob, which is the entry with their id; the
        // temperature does not change the distribution reported.
        let mut s = Sampler::new(&SamplingParams {
            logprobs: Some(3),
            temperature: 2.0,
            seed: 11,
            ..SamplingParams::default()
        });
        for _ in 0..20 {
            let id = s.sample(&logits, &[]);
            let lp = s.logprobs().expect("asked for");
            assert_eq!(lp.top.len(), 3);
            let expected = (logits[id as usize].exp() / z).ln();
            assert!((lp.chosen - expected).abs() < 1e-5);
            if let Some(&(_, l)) = lp.top.iter().find(|&&(t, _)| t == id) {
                assert_eq!(l, lp.chosen);
            }
        }
        assert!(Sampler::new(&params(0.0)).logprobs().is_none());
    }

    #[test]
    fn a_mask_limits_the_choice_and_the_reported_distribution() {
        let logits = [5.0f32, 1.0, 3.0, 4.0];
        let mut mask = TokenMask::none(4);
        mask.set(1, true);
        mask.set(2, true);
        let mut s = Sampler::new(&SamplingParams {
            logprobs: Some(4),
            ..params(0.0)
        });
        assert_eq!(s.sample_masked(&logits, &[], Some(&mask)), Some(2));
        let lp = s.logprobs().expect("asked for");
        assert_eq!(lp.top.len(), 2, "forbidden tokens are never listed");
        let total: f32 = lp.top.iter().map(|&(_, l)| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        let mut hot = Sampler::new(&SamplingParams {
            temperature: 1.5,
            seed: 5,
            ..SamplingParams::default()
        });
        for _ in 0..100 {
            let id = hot.sample_masked(&logits, &[], Some(&mask)).unwrap();
            assert!(id == 1 || id == 2);
        }
        assert_eq!(
            s.sample_masked(&logits, &[], Some(&TokenMask::none(4))),
            None
        );
        // Logits past the mask's length are forbidden too.
        assert_eq!(
            s.sample_masked(&[0.0, 0.0, 0.0, 0.0, 9.0], &[], Some(&mask)),
            Some(1)
        );
    }
}
