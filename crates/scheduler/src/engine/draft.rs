//! Drafting for speculative decoding: prompt lookup. A stream whose last tokens occurred earlier
//! in its prompt or output drafts what followed them there; the draft rides in the stream's next
//! step after its last token, and `verify.rs` keeps what the model confirms. How long a draft may
//! be adapts to what the stream accepts, and a stream whose drafts keep missing rests from
//! drafting for a while, so open-ended text, which rarely repeats its context, pays little.

use super::batch::Active;
use crate::config::Ngram;

/// Longest rest, in steps, after drafts that missed in a row.
const MAX_REST: u32 = 16;

/// One stream's prompt-lookup drafter and what it learned of its acceptance.
#[derive(Debug)]
pub(super) struct Drafter {
    bounds: Ngram,
    /// Most tokens the next draft may have (1..=max_draft).
    len: usize,
    /// Steps left before this stream drafts again.
    rest: u32,
    /// Drafts in a row that missed at their first token.
    misses: u32,
}

impl Drafter {
    pub(super) fn new(bounds: Ngram) -> Drafter {
        Drafter {
            bounds,
            len: bounds.max_draft,
            rest: 0,
            misses: 0,
        }
    }

    /// Appends to `out` at most `limit` tokens expected after `ids` (none while resting or when
    /// the last tokens occur nowhere earlier).
    pub(super) fn propose(&mut self, ids: &[u32], limit: usize, out: &mut Vec<u32>) {
        if self.rest > 0 {
            self.rest -= 1;
            return;
        }
        let want = self.len.min(limit);
        if want > 0 {
            lookup(ids, self.bounds.min_match, self.bounds.max_match, want, out);
        }
    }

    /// Learns from a verified draft: `accepted` of its `drafted` tokens were the model's.
    pub(super) fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let max = self.bounds.max_draft;
        if accepted == drafted {
            self.len = (self.len + 2).min(max);
            self.misses = 0;
        } else if accepted > 0 {
            self.len = (accepted + 1).max(self.len / 2).min(max);
            self.misses = 0;
        } else {
            self.len = (self.len / 2).max(1);
            self.misses += 1;
            // 0, 1, 3, 7, 15, 16 … steps without a draft.
            self.rest = ((1u32 << self.misses.min(5)) - 1).min(MAX_REST);
        }
    }
}

impl Active {
    /// Drafts what this decoding stream's next step feeds after its last token, at most
    /// `budget` tokens, within its cache and its `max_tokens` (the step samples one token for
    /// certain) and as far as its constraint allows; returns how many. The step's tokens go to
    /// `draft`, the last token first; nothing is drafted without a drafter.
    pub(super) fn plan_draft(&mut self, budget: usize) -> usize {
        let after_last = self.fed() + 1;
        let room = self
            .capacity
            .min(self.seq.capacity())
            .saturating_sub(after_last);
        let left = self.max_tokens.saturating_sub(self.generated + 1);
        let (Some(drafter), Some(&last)) = (self.drafter.as_mut(), self.ids.last()) else {
            return 0;
        };
        self.draft.clear();
        self.draft.push(last);
        drafter.propose(&self.ids, budget.min(room).min(left), &mut self.draft);
        if let Some(c) = self.constraint.as_mut() {
            let allowed = c.allows_prefix(&self.draft[1..]);
            self.draft.truncate(1 + allowed);
        }
        if self.draft.len() == 1 {
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
    fn drafts_grow_while_taken_and_rest_after_misses() {
        let bounds = Ngram {
            max_draft: 8,
            min_match: 1,
            max_match: 2,
        };
        let mut d = Drafter::new(bounds);
        let ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1];
        let mut out = Vec::new();
        let propose = |d: &mut Drafter, limit: usize, out: &mut Vec<u32>| {
            out.clear();
            d.propose(&ids, limit, out);
        };
        propose(&mut d, 100, &mut out);
        assert_eq!(out, vec![2, 3, 4, 5, 6, 7, 8, 9]);
        propose(&mut d, 3, &mut out);
        assert_eq!(out.len(), 3, "the caller's limit holds");
        d.record(8, 2);
        propose(&mut d, 100, &mut out);
        assert_eq!(
            out.len(),
            4,
            "half the length, at least one past what was taken"
        );
        // Misses: each halves the length and rests longer.
        let mut rested = Vec::new();
        for _ in 0..4 {
            d.record(out.len().max(1), 0);
            let mut steps = 0;
            loop {
                propose(&mut d, 100, &mut out);
                if !out.is_empty() {
                    break;
                }
                steps += 1;
            }
            rested.push(steps);
        }
        assert_eq!(rested, vec![1, 3, 7, 15]);
        assert_eq!(out.len(), 1);
        d.record(1, 1);
        propose(&mut d, 100, &mut out);
        assert_eq!(out.len(), 3, "a taken draft grows the next one at once");
    }
}
