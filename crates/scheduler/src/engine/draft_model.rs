//! Drafting with a draft model: before the model's step, every stream that may draft (`plan`
//! set its `draft_allowed`) runs the draft model greedily over its own cache of the draft model,
//! one batched draft step per drafted token, all such streams together.
//!
//! A stream's draft cache starts with what the caches it can reuse hold of its prompt (the one
//! kept with the cache it was given, and a running stream's, as for the model's own cache), and
//! follows its tokens: it is fed the rest of the prompt chunk by chunk beside the
//! model's prefill, catches up with the tokens the last verification kept (one or two) in the
//! first draft step, and after a verification forgets the drafted positions the model refused
//! (`verify.rs`). A stream drafts only once its draft cache holds every token but the last.
//!
//! How far a stream drafts: token after token while the chance that all of them are confirmed
//! stays at least the share of a token's time that one drafted token costs (a row of the
//! model's step, [`StepCost`], plus a row of each draft step, [`DraftCost`]). That chance is the
//! product, over the drafted tokens, of the draft model's own probability for its token, capped
//! by how often the stream's drafts were confirmed so far.
//!
//! Drafting never changes the output, only how many steps it takes, so a draft step that fails
//! costs only the draft: its streams decode without drafting from then on, and a warning says
//! why.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use hearth_infer::{Sequence, Step, TextModel};
use tracing::warn;

use super::batch::Batch;
use super::draft::{StepCost, MAX_MODEL_SHARE};
use crate::queue::Pending;

/// How much earlier draft steps still weigh in the cost of a drafted token, at each new one.
const DRAFT_DECAY: f64 = 0.9;

/// What one stream's drafted token costs in draft steps, learned from the draft steps that fed
/// only decoding streams: each step's time shared among the streams it drafted for.
#[derive(Debug, Default)]
pub(super) struct DraftCost {
    /// Decayed sums: seconds, and streams drafted for.
    secs: f64,
    rows: f64,
}

impl DraftCost {
    fn record(&mut self, rows: usize, secs: f64) {
        self.secs = self.secs * DRAFT_DECAY + secs;
        self.rows = self.rows * DRAFT_DECAY + rows as f64;
    }

    /// A drafted token's draft steps as a share of what a token of the model takes (`cost`'s);
    /// 0 until both are known.
    pub(super) fn share(&self, cost: &StepCost) -> f64 {
        match cost.token_secs() {
            Some(token) if self.rows > 0.0 && token > 0.0 => {
                (self.secs / self.rows / token).min(MAX_MODEL_SHARE)
            }
            _ => 0.0,
        }
    }
}

/// How much earlier verifications still weigh in the draft model's acceptance, at each new one
/// (a full batch verifies a draft of each stream every step).
const ACCEPTANCE_DECAY: f64 = 0.95;

/// How often the draft model's first tokens were confirmed lately, over every stream: a drafted
/// token is worth its cost only if it is confirmed at least as often as that cost's share of a
/// token's time, and new streams get a draft cache only while it is (`Batch::gets_draft`).
#[derive(Debug, Default)]
pub(super) struct DraftAcceptance {
    /// Decayed sums: drafts verified, and those whose first token was confirmed.
    drafts: f64,
    confirmed: f64,
}

impl DraftAcceptance {
    /// A stream's draft was verified: `accepted` of its `drafted` tokens were the model's.
    pub(super) fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafts = self.drafts * ACCEPTANCE_DECAY + 1.0;
        self.confirmed = self.confirmed * ACCEPTANCE_DECAY + f64::from(u8::from(accepted > 0));
    }

    /// The chance that a first drafted token is confirmed, from a prior of certainty worth one
    /// draft (before any draft is verified, drafting may pay whatever it costs below a token).
    pub(super) fn first_token(&self) -> f64 {
        (self.confirmed + 1.0) / (self.drafts + 1.0)
    }
}

/// The most likely token of `logits` and its probability.
fn greedy(logits: &[f32]) -> (u32, f64) {
    let (mut best, mut max) = (0, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        if l > max {
            (best, max) = (i, l);
        }
    }
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    (best as u32, if sum > 0.0 { 1.0 / sum } else { 0.0 })
}

/// One stream in the current draft step: its index in the batch, the logits row its next token
/// is read from, and the chance so far that its drafted tokens are all confirmed.
struct Drafting {
    i: usize,
    row: usize,
    chance: f64,
}

impl Batch {
    /// The draft model's cache for `p`, admitted now, as long as the draft's context allows:
    /// the one `kept` with the cache `p` was given, or a new one holding what that one held;
    /// then, with prefix reuse, a running stream's draft cache's fed start of the prompt when
    /// that is longer (the draft model's prefill of a shared start is spared, as the model's).
    pub(super) fn draft_cache(
        &self,
        draft: &TextModel,
        p: &Pending,
        kept: Option<Sequence>,
    ) -> Result<Sequence, hearth_infer::Error> {
        let capacity = p.capacity.min(draft.info().context_length);
        let reused = &self.shared.metrics.draft_reused_tokens;
        let mut seq = match kept {
            Some(k) if k.capacity() >= capacity => k,
            Some(k) => {
                let mut seq = draft.new_sequence(capacity)?;
                seq.copy_prefix(&k, k.len());
                seq
            }
            None => draft.new_sequence(capacity)?,
        };
        if self.shared.config.prefix_reuse {
            self.copy_from_running(&mut seq, &p.prompt, |a| a.draft_seq.as_ref());
        }
        reused.fetch_add(seq.len() as u64, Relaxed);
        Ok(seq)
    }

    /// Runs `draft` for this step: feeds prefill chunks and catch-ups to the draft caches and
    /// drafts for every stream `plan` allowed to, then seals each draft into the step's plan.
    pub(super) fn run_draft_model(&mut self, draft: &mut TextModel) {
        let threshold = self.draft_share();
        let mut drafting = self.catch_up(draft, threshold);
        while !drafting.is_empty() {
            let started = Instant::now();
            let result = {
                let mut steps: Vec<Step<'_>> = Vec::with_capacity(drafting.len());
                let mut at = drafting.iter().map(|d| d.i).peekable();
                for (i, a) in self.active.iter_mut().enumerate() {
                    if at.peek() != Some(&i) {
                        continue;
                    }
                    at.next();
                    if let Some(seq) = a.draft_seq.as_mut() {
                        let last = a.draft.len() - 1;
                        steps.push(Step {
                            seq,
                            tokens: &a.draft[last..],
                        });
                    }
                }
                draft.forward(&mut steps)
            };
            match result {
                Ok(logits) => {
                    let secs = started.elapsed().as_secs_f64();
                    self.draft_cost.record(drafting.len(), secs);
                    for (row, d) in drafting.iter_mut().enumerate() {
                        d.row = row;
                    }
                    drafting = self.extend_drafts(drafting, logits, threshold);
                }
                Err(e) => {
                    self.draft_failed(&drafting, &e);
                    drafting.clear();
                }
            }
        }
        for a in self.active.iter_mut() {
            a.draft_allowed = 0;
            if a.draft.is_empty() {
                continue;
            }
            let drafted = a.seal_draft();
            if let Some((from, _)) = a.planned {
                a.planned = Some((from, from + 1 + drafted));
            }
        }
    }

    /// The first draft step: each stream's draft cache is fed what it lacks of the stream's
    /// tokens (a prefilling stream's up to the end of this step's chunk, a drafting stream's up to
    /// its last token; a prompt chunk at most). The streams whose cache then holds every token
    /// draft their first token; returns those that draft on.
    fn catch_up(&mut self, draft: &mut TextModel, threshold: f64) -> Vec<Drafting> {
        let chunk = self.shared.config.prefill_chunk;
        let vocab = draft.info().vocab_size;
        let started = Instant::now();
        let mut fed = Vec::new();
        let mut prefill = false;
        let mut freed = 0;
        let result = {
            let mut steps: Vec<Step<'_>> = Vec::new();
            for (i, a) in self.active.iter_mut().enumerate() {
                let (Some((from, to)), Some(seq)) = (a.planned, a.draft_seq.as_ref()) else {
                    continue;
                };
                let until = if a.draft_allowed > 0 {
                    a.ids.len()
                } else if from < a.prompt_len {
                    to
                } else {
                    continue;
                };
                let start = seq.len();
                let end = until.min(start + chunk).min(seq.capacity());
                // Drafting needs the logits after the last token.
                if end < a.ids.len() || start >= end {
                    a.draft_allowed = 0;
                }
                if start >= end {
                    continue;
                }
                if a.ids[start..end].iter().any(|&t| t as usize >= vocab) {
                    // An id the draft model does not have: this stream decodes undrafted, and
                    // its drafter goes with its cache (as after a failed draft step).
                    a.drafter = None;
                    freed += a.drop_draft_cache();
                    a.draft_allowed = 0;
                    continue;
                }
                prefill |= end - start > 2 || from < a.prompt_len;
                if let Some(seq) = a.draft_seq.as_mut() {
                    steps.push(Step {
                        seq,
                        tokens: &a.ids[start..end],
                    });
                    fed.push(i);
                }
            }
            if steps.is_empty() {
                None
            } else {
                Some(draft.forward(&mut steps))
            }
        };
        self.release_kv(freed);
        let Some(result) = result else {
            return Vec::new();
        };
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                let all: Vec<Drafting> = fed
                    .iter()
                    .map(|&i| Drafting {
                        i,
                        row: 0,
                        chance: 0.0,
                    })
                    .collect();
                self.draft_failed(&all, &e);
                return Vec::new();
            }
        };
        if !prefill {
            let secs = started.elapsed().as_secs_f64();
            self.draft_cost.record(fed.len(), secs);
        }
        let mut drafting = Vec::new();
        for (row, &i) in fed.iter().enumerate() {
            let a = &mut self.active[i];
            if a.draft_allowed > 0 {
                a.draft.clear();
                a.draft.extend(a.ids.last().copied());
                drafting.push(Drafting {
                    i,
                    row,
                    chance: 1.0,
                });
            }
        }
        self.extend_drafts(drafting, logits, threshold)
    }

    /// Appends each drafting stream's next token (read from its row of `logits`) and returns
    /// the streams that draft on: within their allowance and their draft cache, before a stop
    /// token, while the chance that all their drafts are confirmed stays at `threshold` (the
    /// first drafted token is always kept, so that acceptance keeps being learned).
    fn extend_drafts(
        &mut self,
        drafting: Vec<Drafting>,
        logits: &[f32],
        threshold: f64,
    ) -> Vec<Drafting> {
        let mut on = Vec::with_capacity(drafting.len());
        for mut d in drafting {
            let a = &mut self.active[d.i];
            let Some(row) = logits.get(d.row * self.draft_vocab..(d.row + 1) * self.draft_vocab)
            else {
                continue;
            };
            let (token, p) = greedy(row);
            if token as usize >= self.vocab {
                continue; // beyond the model's vocabulary: the draft ends before it
            }
            let acceptance = a.drafter.as_ref().map_or(0.0, |r| r.acceptance());
            d.chance *= p.min(acceptance);
            if d.chance < threshold && a.draft.len() > 1 {
                continue;
            }
            a.draft.push(token);
            let drafted = a.draft.len() - 1;
            let room = a.draft_seq.as_ref().is_some_and(|s| s.len() < s.capacity());
            if drafted < a.draft_allowed && room && !self.tokenizer.is_stop(token) {
                on.push(d);
            }
        }
        on
    }

    /// A draft step failed: its streams decode without drafting from now on.
    fn draft_failed(&mut self, drafting: &[Drafting], e: &hearth_infer::Error) {
        warn!(error = %e, streams = drafting.len(), "draft step failed; those streams decode undrafted");
        let mut freed = 0;
        for d in drafting {
            let a = &mut self.active[d.i];
            // The drafter goes with its cache, so no later step keeps budget for its drafts.
            a.drafter = None;
            freed += a.drop_draft_cache();
            a.draft_allowed = 0;
            a.draft.clear();
        }
        self.release_kv(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_most_likely_token_and_its_probability() {
        let (t, p) = greedy(&[0.0, 2.0_f32.ln(), 0.0]);
        assert_eq!(t, 1);
        assert!((p - 0.5).abs() < 1e-6, "{p}");
        let (t, p) = greedy(&[-1e30, 5.0]);
        assert_eq!((t, p), (1, 1.0));
    }

    #[test]
    fn the_draft_models_acceptance_is_how_often_its_first_tokens_were_confirmed_lately() {
        let mut a = DraftAcceptance::default();
        assert_eq!(a.first_token(), 1.0, "nothing verified yet");
        a.record(0, 0);
        assert_eq!(a.first_token(), 1.0, "no draft, nothing learned");
        for _ in 0..200 {
            a.record(4, 0); // refused at the first token
            a.record(4, 3);
            a.record(2, 2);
        }
        // Two drafts in three confirmed at their first token (the latest weigh a little more,
        // and the prior of one confirmed draft a little).
        let two_in_three = a.first_token();
        assert!((0.64..0.72).contains(&two_in_three), "{two_in_three}");
        for _ in 0..200 {
            a.record(8, 0);
        }
        assert!(a.first_token() < 0.1, "the latest drafts weigh most");
    }

    #[test]
    fn a_drafted_tokens_cost_is_its_draft_steps_against_a_tokens_time() {
        let mut cost = StepCost::default();
        let mut draft = DraftCost::default();
        assert_eq!(draft.share(&cost), 0.0, "nothing known yet");
        for _ in 0..20 {
            cost.record(1, 1, 0.010); // a token takes 10 ms
            draft.record(2, 0.004); // a draft step of two streams, 2 ms each
        }
        assert!(
            (draft.share(&cost) - 0.2).abs() < 1e-9,
            "{}",
            draft.share(&cost)
        );
        draft.record(1, 10.0);
        assert_eq!(draft.share(&cost), MAX_MODEL_SHARE, "capped");
    }
}
