//! Drafting for speculative decoding. By prompt lookup, a stream whose last tokens occurred
//! earlier in its prompt or output drafts what followed them there; with a draft model
//! (`draft_model.rs`), the draft model's greedy tokens are the draft. Either way the draft rides in
//! the stream's next step after its last token, and `verify.rs` keeps what the model confirms.
//!
//! How much to draft is a trade: a drafted row costs the step some time whether or not the model
//! confirms it. [`StepCost`] learns from the engine's own steps what one more row costs, as a
//! share of the time a token takes (small for one stream on a CPU, where a step's time is the
//! reading of the weights; larger in a full batch, where the rows' arithmetic counts); each
//! stream's [`Drafter`] learns how often its drafted tokens are confirmed, and drafts a token
//! only while the chance that it and every token before it are confirmed is above that share.
//! A stream whose drafts keep missing rests from drafting for a while, so open-ended text, which
//! rarely repeats its context, pays little.

use super::batch::Active;
use crate::config::{DraftModel, Ngram};

/// Longest rest, in steps, after drafts that missed in a row.
const MAX_REST: u32 = 16;
/// How much a stream's earlier drafts still weigh at each new one.
const DRAFT_DECAY: f64 = 0.8;
/// How much earlier steps still weigh in the cost of a row, at each new step.
const STEP_DECAY: f64 = 0.97;
/// Steps seen before their cost is trusted.
const MIN_STEPS: f64 = 8.0;
/// The highest share asked of a draft: even a costly row is worth a token confirmed this often.
const MAX_SHARE: f64 = 0.9;
/// The highest share a draft model's token is known to cost: its draft steps may cost more than
/// the token it saves (a draft not much smaller than the model), and then it does not draft.
pub(super) const MAX_MODEL_SHARE: f64 = 4.0;
/// Drafted positions whose fate a stream must have been told before it judges its draft model.
const MIN_TOLD: f64 = 3.0;

/// One stream's drafter and what it learned of its acceptance.
#[derive(Debug)]
pub(super) struct Drafter {
    max_draft: usize,
    /// Prompt lookup's bounds; `None` when a draft model drafts.
    lookup: Option<Ngram>,
    /// Drafted positions the model confirmed, and positions whose fate a verification told
    /// (the confirmed ones and the first refused one), both decayed per draft.
    hits: f64,
    tries: f64,
    /// Steps left before this stream drafts again.
    rest: u32,
    /// Drafts in a row that missed at their first token.
    misses: u32,
    /// Whether a draft model's tokens were found not worth their cost even at one token.
    gave_up: bool,
}

impl Drafter {
    /// A prompt-lookup drafter.
    pub(super) fn new(bounds: Ngram) -> Drafter {
        Drafter {
            lookup: Some(bounds),
            ..Drafter::for_model(DraftModel {
                max_draft: bounds.max_draft,
            })
        }
    }

    /// A drafter whose tokens a draft model proposes.
    pub(super) fn for_model(bounds: DraftModel) -> Drafter {
        Drafter {
            max_draft: bounds.max_draft,
            lookup: None,
            hits: 0.0,
            tries: 0.0,
            rest: 0,
            misses: 0,
            gave_up: false,
        }
    }

    /// The chance that a drafted token is confirmed once the tokens before it were: what this
    /// stream's recent drafts showed, from a prior of one half worth one position (a light one:
    /// in a full batch a row costs nearly a token's time, and a stream copying its input, whose
    /// drafts are all confirmed, must be seen to be so).
    pub(super) fn acceptance(&self) -> f64 {
        (self.hits + 0.5) / (self.tries + 1.0)
    }

    /// How many tokens are worth drafting when a row costs `share` of a token's time: each one
    /// while the chance that it and all before it are confirmed stays at least `share`.
    fn worth(&self, share: f64) -> usize {
        let a = self.acceptance();
        let (mut chance, mut n) = (1.0, 0);
        while n < self.max_draft {
            chance *= a;
            if chance < share {
                break;
            }
            n += 1;
        }
        n
    }

    /// How many tokens this stream may draft for its next step: none while it rests, else as
    /// many as are worth their rows at `share`, at most `limit`; one when none is (to keep
    /// learning), unless a draft model drafts and the stream's acceptance is known: then none,
    /// from then on.
    pub(super) fn allowance(&mut self, limit: usize, share: f64) -> usize {
        if self.rest > 0 || self.gave_up {
            self.rest = self.rest.saturating_sub(1);
            return 0;
        }
        let n = self.worth(share);
        if n > 0 {
            return n.min(limit);
        }
        if self.by_model() && self.tries >= MIN_TOLD {
            // Not one drafted token pays for its draft steps, though the stream's acceptance is
            // known: it decodes undrafted from now on (the caller drops its draft cache).
            self.gave_up = true;
            return 0;
        }
        1.min(limit) // one token at least, to keep learning
    }

    /// Whether this stream's draft model was found not to pay for itself (see `allowance`).
    pub(super) fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// Prompt lookup: appends to `out` at most `limit` tokens expected after `ids`, as many as
    /// are worth their rows at `share` (none while resting, for a draft model's drafter, or when
    /// the last tokens occur nowhere earlier).
    pub(super) fn propose(&mut self, ids: &[u32], limit: usize, share: f64, out: &mut Vec<u32>) {
        let Some(bounds) = self.lookup else {
            return;
        };
        let want = self.allowance(limit, share);
        if want > 0 {
            lookup(ids, bounds.min_match, bounds.max_match, want, out);
        }
    }

    /// Whether a draft model proposes this stream's tokens.
    pub(super) fn by_model(&self) -> bool {
        self.lookup.is_none()
    }

    /// Learns from a verified draft: `accepted` of its `drafted` tokens were the model's.
    pub(super) fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let told = accepted + usize::from(accepted < drafted);
        self.hits = self.hits * DRAFT_DECAY + accepted as f64;
        self.tries = self.tries * DRAFT_DECAY + told as f64;
        if accepted > 0 {
            self.misses = 0;
        } else {
            self.misses += 1;
            // 1, 3, 7, 15, 16 … steps without a draft.
            self.rest = ((1u32 << self.misses.min(5)) - 1).min(MAX_REST);
        }
    }
}

/// What one more row costs a step, as a share of the time a token takes, learned from the
/// engine's decoding steps (those without prompt chunks): their time against the rows they fed,
/// fitted by least squares over recent steps, and the tokens they gave.
#[derive(Debug, Default)]
pub(super) struct StepCost {
    /// Decayed sums: weight, rows, seconds, rows², rows × seconds, tokens given.
    w: f64,
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
    tokens: f64,
}

impl StepCost {
    /// A decoding step fed `rows` rows, took `secs` and gave `tokens` tokens.
    pub(super) fn record(&mut self, rows: usize, tokens: usize, secs: f64) {
        let (n, d) = (rows as f64, STEP_DECAY);
        self.w = self.w * d + 1.0;
        self.n = self.n * d + n;
        self.t = self.t * d + secs;
        self.nn = self.nn * d + n * n;
        self.nt = self.nt * d + n * secs;
        self.tokens = self.tokens * d + tokens as f64;
    }

    /// What a token took, in seconds, over recent decoding steps (`None` before any).
    pub(super) fn token_secs(&self) -> Option<f64> {
        (self.tokens > 0.0).then(|| self.t / self.tokens)
    }

    /// The share of a token's time one more row costs (0 until the steps tell: draft freely,
    /// which is how the steps come to differ in rows).
    pub(super) fn share(&self) -> f64 {
        if self.w < MIN_STEPS || self.tokens <= 0.0 {
            return 0.0;
        }
        let mean = self.n / self.w;
        let var = self.nn / self.w - mean * mean;
        if var < 0.25 {
            return 0.0; // every step fed about as many rows: nothing to fit
        }
        let per_row = (self.nt / self.w - mean * self.t / self.w) / var;
        let per_token = self.t / self.tokens;
        (per_row / per_token).clamp(0.0, MAX_SHARE)
    }
}

impl Active {
    /// Drafts what this decoding stream's next step feeds after its last token (as many tokens
    /// as are worth their rows when a row costs `share` of a token's time), at most `budget`,
    /// within its cache and its `max_tokens` (the step samples one token for certain) and as far
    /// as its constraint allows; returns how many. The step's tokens go to `draft`, the last
    /// token first; nothing is drafted without a drafter. A draft model's drafter only sets
    /// `draft_allowed`, the most its draft model may propose before the step, and returns that.
    pub(super) fn plan_draft(&mut self, budget: usize, share: f64) -> usize {
        let after_last = self.fed() + 1;
        let room = self
            .capacity
            .min(self.seq.capacity())
            .saturating_sub(after_last);
        let left = self.max_tokens.saturating_sub(self.generated + 1);
        self.draft.clear();
        self.draft_allowed = 0;
        let (Some(drafter), Some(&last)) = (self.drafter.as_mut(), self.ids.last()) else {
            return 0;
        };
        let limit = budget.min(room).min(left);
        if drafter.by_model() {
            self.draft_allowed = drafter.allowance(limit, share);
            return self.draft_allowed;
        }
        self.draft.push(last);
        drafter.propose(&self.ids, limit, share, &mut self.draft);
        self.seal_draft()
    }

    /// Cuts the draft where the constraint stops allowing it (an empty draft when nothing is
    /// left after the last token) and returns how many tokens it drafts.
    pub(super) fn seal_draft(&mut self) -> usize {
        if let (Some(c), Some(drafted)) = (self.constraint.as_mut(), self.draft.get(1..)) {
            let allowed = c.allows_prefix(drafted);
            self.draft.truncate(1 + allowed);
        }
        if self.draft.len() <= 1 {
            self.draft.clear();
        }
        self.draft.len().saturating_sub(1)
    }
}

/// Prompt lookup: finds the latest earlier place where the last `min_match..=max_match` tokens
/// of `ids` occur (the longest match wins, then the latest), and writes into `out` up to `want`
/// of the tokens that followed it.
pub(super) fn lookup(
    ids: &[u32],
    min_match: usize,
    max_match: usize,
    want: usize,
    out: &mut Vec<u32>,
) {
    let n = ids.len();
    if min_match == 0 || n <= min_match {
        return;
    }
    let suffix = &ids[n - min_match..];
    let last = suffix[min_match - 1];
    // (match length, end of the matched run): runs end at `end` < n, so a token follows them.
    let mut best: Option<(usize, usize)> = None;
    for end in (min_match..n).rev() {
        if ids[end - 1] != last || &ids[end - min_match..end] != suffix {
            continue;
        }
        let mut len = min_match;
        while len < max_match && len < end && ids[end - 1 - len] == ids[n - 1 - len] {
            len += 1;
        }
        if best.is_none_or(|(l, _)| len > l) {
            best = Some((len, end));
            if len >= max_match {
                break;
            }
        }
    }
    if let Some((_, end)) = best {
        out.extend_from_slice(&ids[end..(end + want).min(n)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(ids: &[u32], min: usize, max: usize, want: usize) -> Vec<u32> {
        let mut out = Vec::new();
        lookup(ids, min, max, want, &mut out);
        out
    }

    #[test]
    fn the_tokens_after_the_latest_longest_match_are_drafted() {
        // "1 2 3" occurs at 0 and at 6; the suffix "2 3" matches both, the latest wins.
        let ids = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3];
        assert_eq!(found(&ids, 2, 2, 3), vec![7, 8, 1]);
        // A longer match beats a later one: "9 2 3" occurs only at the start.
        let ids = [9, 2, 3, 4, 5, 6, 1, 2, 3, 8, 9, 2, 3];
        assert_eq!(found(&ids, 2, 3, 2), vec![4, 5]);
        assert_eq!(
            found(&ids, 2, 2, 2),
            vec![8, 9],
            "without the longer run, the latest"
        );
        // The draft stops at the end of what is known.
        assert_eq!(found(&[5, 6, 5, 6], 2, 4, 8), vec![5, 6]);
    }

    #[test]
    fn nothing_is_drafted_without_an_earlier_match() {
        assert!(found(&[1, 2, 3, 4], 2, 4, 8).is_empty());
        assert!(
            found(&[1, 2], 2, 4, 8).is_empty(),
            "the suffix itself is no match"
        );
        assert!(found(&[], 1, 4, 8).is_empty());
        assert!(found(&[7, 7], 2, 2, 4).is_empty());
        assert_eq!(found(&[7, 7, 7], 2, 2, 4), vec![7]);
    }

    #[test]
    fn drafts_are_as_long_as_their_chance_of_confirmation_makes_them_worth() {
        let bounds = Ngram {
            max_draft: 8,
            min_match: 1,
            max_match: 2,
        };
        let mut d = Drafter::new(bounds);
        let ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1];
        let mut out = Vec::new();
        let propose = |d: &mut Drafter, limit: usize, share: f64, out: &mut Vec<u32>| {
            out.clear();
            d.propose(&ids, limit, share, out);
            out.len()
        };
        // Free rows: the whole lookup; the caller's limit holds.
        assert_eq!(propose(&mut d, 100, 0.0, &mut out), 8);
        assert_eq!(out, vec![2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(propose(&mut d, 3, 0.0, &mut out), 3);
        // A row at a fifth of a token, confirmation one half so far: 1/2, 1/4 pass, 1/8 not.
        assert_eq!(propose(&mut d, 100, 0.2, &mut out), 2);
        // Drafts confirmed whole make the next ones longer at the same cost.
        for _ in 0..3 {
            d.record(4, 4);
        }
        assert!(propose(&mut d, 100, 0.2, &mut out) >= 6);
        // Misses: shorter drafts (one at least) and longer rests.
        let mut rested = Vec::new();
        for _ in 0..4 {
            d.record(out.len(), 0);
            let mut steps = 0;
            while propose(&mut d, 100, 0.2, &mut out) == 0 {
                steps += 1;
            }
            rested.push(steps);
        }
        assert_eq!(rested, vec![1, 3, 7, 15]);
        assert!(out.len() <= 2, "drafts that miss shorten the next ones");
        d.record(1, 1);
        assert!(propose(&mut d, 100, 0.2, &mut out) >= 1);
        assert_eq!(d.rest, 0, "a confirmed draft ends the rests");
    }

    #[test]
    fn a_draft_model_that_costs_more_than_it_saves_stops_drafting_once_its_acceptance_is_known() {
        let mut d = Drafter::for_model(DraftModel { max_draft: 8 });
        // Unknown acceptance (a prior of one half) at a cost of 0.6: one token, to learn.
        assert_eq!(d.allowance(100, 0.6), 1);
        d.record(1, 1);
        assert_eq!(d.allowance(100, 0.6), 1);
        for _ in 0..4 {
            d.record(4, 4); // its drafts are confirmed
        }
        assert!(
            d.allowance(100, 0.3) >= 4,
            "cheap drafts that are confirmed go far"
        );
        assert!(!d.gave_up());
        // The same drafts at more than a token's time each: none, and none ever after.
        assert_eq!(d.allowance(100, 1.5), 0);
        assert!(d.gave_up());
        assert_eq!(d.allowance(100, 0.0), 0);
        // Prompt lookup costs only a row: it keeps drafting one token however costly that is.
        let mut lookup = Drafter::new(Ngram::default());
        for _ in 0..4 {
            lookup.record(4, 4);
        }
        assert_eq!(lookup.allowance(100, 1.5), 1);
        assert!(!lookup.gave_up());
    }

    #[test]
    fn a_rows_cost_is_learned_from_the_steps_as_a_share_of_a_tokens_time() {
        let mut cost = StepCost::default();
        // Steps of 5 ms plus 0.5 ms a row, each row a token: at 8 rows a token takes 1.125 ms.
        for i in 0..40 {
            let rows = 8 + (i * 7) % 9;
            cost.record(rows, rows, 0.005 + 0.0005 * rows as f64);
        }
        let mean_rows = 12.0;
        let expected = 0.0005 / ((0.005 + 0.0005 * mean_rows) / mean_rows);
        let share = cost.share();
        assert!(
            (share - expected).abs() < 0.05,
            "{share} vs about {expected}"
        );
        // Steps that all feed the same rows tell nothing: rows are taken as free.
        let mut flat = StepCost::default();
        for _ in 0..40 {
            flat.record(8, 8, 0.01);
        }
        assert_eq!(flat.share(), 0.0);
        assert_eq!(StepCost::default().share(), 0.0, "nothing seen yet");
    }
}
