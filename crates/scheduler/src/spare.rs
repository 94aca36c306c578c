//! KV caches of ended sequences, kept for the next requests, for their memory and for their
//! content.
//!
//! A fresh KV cache is memory the process has not touched yet: every page of it faults on first
//! write, which on the development VM cost 5-35 ms for SmolLM2's 5 MB cache (most likely its
//! host reclaims freed guest memory). Paid at admission, it held a burst of requests behind one
//! another. Like llama.cpp and vLLM, which allocate their caches
//! once, the engine keeps the caches it has allocated and hands them to new sequences of about
//! the same size. Kept caches count against the KV budget: they are dropped (oldest first) when
//! a new allocation needs their room.
//!
//! **Prefix reuse.** A kept cache also keeps its keys and values and the tokens they are of. A
//! new request whose prompt starts with those tokens (the next turn of a chat, whose prompt is
//! the previous turn's prompt and answer and a new message; or a shared system prompt) takes
//! that cache and prefills only the rest of its prompt. The cached positions hold exactly what
//! a fresh prefill would compute: the forward computes each row on its own (the engine's batch
//! invariance), so greedy output does not change (`tests/prefix.rs`). It works across users and
//! routes: the cache is matched by tokens only. The caches of running sequences are matched too
//! (`Batch::copy_from_running`): their fed positions are copied into the new request's cache.
//!
//! With a draft model, a stream's draft cache is kept with its cache and handed out with it: the
//! draft model's prefill of a reused prefix is spared as the model's is.

use hearth_infer::Sequence;

/// How much larger than asked a kept cache may be and still be handed out: a quarter more,
/// plus a few positions, so that requests of similar sizes share caches without a short
/// request pinning a long one's.
fn close_enough(capacity: usize, need: usize) -> bool {
    capacity >= need && capacity - need <= need / 4 + 32
}

/// A cached prefix at least this long is worth taking a cache of any size that holds the
/// request (about one prefill chunk of work saved).
const WORTH_A_LARGER_CACHE: usize = 64;

/// A cached prefix at least this long is worth copying into a new, larger cache (from a kept
/// cache, or from a running sequence's).
pub(crate) const WORTH_A_COPY: usize = 16;

/// What [`Spares::take`] hands out, with the positions of the prompt it holds.
pub(crate) enum Taken {
    /// A cache to run the request in.
    Whole(Sequence, usize),
    /// A cache too small for the request whose first positions are the prompt's: copy them
    /// into a new cache, then drop it.
    CopyFrom(Sequence, usize),
}

/// A kept cache, the draft model's cache kept with it, and the tokens their positions hold
/// (`seq.len()` of them; the draft cache holds the first `draft.len()`, no more).
struct Kept {
    seq: Sequence,
    draft: Option<Sequence>,
    tokens: Vec<u32>,
}

impl Kept {
    fn bytes(&self) -> u64 {
        (self.seq.kv_bytes() + self.draft.as_ref().map_or(0, Sequence::kv_bytes)) as u64
    }
}

#[derive(Default)]
pub(crate) struct Spares {
    /// Oldest first.
    kept: Vec<Kept>,
    bytes: u64,
}

/// How many leading tokens `a` and `b` share.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Spares {
    /// A kept cache for a request of `need` positions whose prompt is `prompt`, taking at most
    /// `max_bytes`, and how many of its positions are the prompt's own (kept; the rest is
    /// emptied). With `reuse`, the cache sharing the longest prefix with the prompt wins (at
    /// most all but the prompt's last token, which must be fed for its logits); otherwise, and
    /// between equal prefixes, the smallest cache close enough in size. When the longest prefix
    /// is in a cache too small for the request (the previous, shorter turn of a chat), that
    /// cache is handed over to be copied from ([`Taken::CopyFrom`]). The draft cache kept with
    /// it comes too, holding no more of the prompt than the cache does.
    pub(crate) fn take(
        &mut self,
        need: usize,
        max_bytes: u64,
        prompt: &[u32],
        reuse: bool,
    ) -> Option<(Taken, Option<Sequence>)> {
        let usable = prompt.len().saturating_sub(1);
        let shared = |k: &Kept| {
            if reuse {
                common_prefix(&k.tokens, prompt).min(usable)
            } else {
                0
            }
        };
        let fit = self
            .kept
            .iter()
            .enumerate()
            .filter(|(_, k)| k.seq.capacity() >= need && k.bytes() <= max_bytes)
            .map(|(i, k)| (i, shared(k), k.seq.capacity()))
            .filter(|&(i, shared, _)| {
                shared >= WORTH_A_LARGER_CACHE || close_enough(self.kept[i].seq.capacity(), need)
            })
            .min_by_key(|&(_, shared, capacity)| (std::cmp::Reverse(shared), capacity))
            .map(|(i, shared, _)| (i, shared));
        let smaller = self
            .kept
            .iter()
            .enumerate()
            .filter(|(_, k)| k.seq.capacity() < need)
            .map(|(i, k)| (i, shared(k)))
            .max_by_key(|&(_, shared)| shared)
            .filter(|&(_, shared)| shared >= WORTH_A_COPY && shared > fit.map_or(0, |f| f.1));
        let (i, shared, copy) = match (smaller, fit) {
            (Some((i, shared)), _) => (i, shared, true),
            (None, Some((i, shared))) => (i, shared, false),
            (None, None) => return None,
        };
        let kept = self.kept.remove(i);
        self.bytes -= kept.bytes();
        let Kept {
            mut seq, mut draft, ..
        } = kept;
        seq.truncate(shared);
        if let Some(d) = draft.as_mut() {
            d.truncate(shared.min(d.len()));
        }
        let taken = if copy {
            Taken::CopyFrom(seq, shared)
        } else {
            Taken::Whole(seq, shared)
        };
        Some((taken, draft))
    }

    /// Keeps `seq`, whose positions hold `tokens`, with its stream's draft cache `draft` (whose
    /// positions hold the first of them), for reuse if, with the caches already kept, they stay
    /// within `room` bytes and `max_kept` caches; drops the oldest kept caches to make space.
    pub(crate) fn put(
        &mut self,
        seq: Sequence,
        mut draft: Option<Sequence>,
        mut tokens: Vec<u32>,
        room: u64,
        max_kept: usize,
    ) {
        tokens.truncate(seq.len());
        if let Some(d) = draft.as_mut() {
            d.truncate(d.len().min(tokens.len()));
        }
        let kept = Kept { seq, draft, tokens };
        let bytes = kept.bytes();
        if bytes > room || max_kept == 0 {
            return;
        }
        self.shrink_to(room - bytes);
        while self.kept.len() >= max_kept {
            self.drop_oldest();
        }
        self.bytes += bytes;
        self.kept.push(kept);
    }

    /// Drops kept caches, oldest first, until they hold at most `bytes`.
    pub(crate) fn shrink_to(&mut self, bytes: u64) {
        while self.bytes > bytes {
            self.drop_oldest();
        }
    }

    fn drop_oldest(&mut self) {
        if self.kept.is_empty() {
            return;
        }
        let k = self.kept.remove(0);
        self.bytes -= k.bytes();
    }

    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.bytes
    }

    #[cfg(test)]
    fn capacities(&self) -> Vec<usize> {
        self.kept.iter().map(|k| k.seq.capacity()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_infer::{Step, TextModel};

    fn model() -> TextModel {
        TextModel::tiny_random(7)
    }

    /// A cache of `capacity` positions holding `tokens`.
    fn filled(m: &mut TextModel, capacity: usize, tokens: &[u32]) -> Sequence {
        let mut seq = m.new_sequence(capacity).unwrap();
        if !tokens.is_empty() {
            m.forward(&mut [Step {
                seq: &mut seq,
                tokens,
            }])
            .unwrap();
        }
        assert_eq!(seq.len(), tokens.len());
        seq
    }

    #[test]
    fn a_kept_cache_is_reused_emptied_and_only_for_a_similar_size() {
        let m = model();
        let mut spares = Spares::default();
        let seq = m.new_sequence(100).unwrap();
        let bytes = seq.kv_bytes() as u64;
        spares.put_one(seq, Vec::new(), u64::MAX, 8);
        assert_eq!(spares.bytes(), bytes);
        let prompt = [1, 2, 3];
        // Far larger than needed: a 10-position request does not pin a 100-position cache.
        assert!(spares.take(10, u64::MAX, &prompt, true).is_none());
        // Too small.
        assert!(spares.take(101, u64::MAX, &prompt, true).is_none());
        // Larger than the budget left.
        assert!(spares.take(90, bytes - 1, &prompt, true).is_none());
        let (reused, shared) = whole(spares.take(90, bytes, &prompt, true));
        assert_eq!((reused.capacity(), shared), (100, 0));
        assert!(reused.is_empty());
        assert_eq!(spares.bytes(), 0);
    }

    #[test]
    fn the_best_fit_is_taken_and_the_room_and_count_limits_hold() {
        let m = model();
        let mut spares = Spares::default();
        for cap in [120, 100, 110] {
            spares.put_one(m.new_sequence(cap).unwrap(), Vec::new(), u64::MAX, 8);
        }
        let taken = whole(spares.take(95, u64::MAX, &[], true)).0.capacity();
        assert_eq!(taken, 100);
        // Count limit: the oldest (120) goes.
        spares.put_one(m.new_sequence(104).unwrap(), Vec::new(), u64::MAX, 2);
        assert_eq!(spares.capacities(), vec![110, 104]);
        // Room limit: only as many bytes as the budget leaves.
        let one = m.new_sequence(104).unwrap().kv_bytes() as u64;
        spares.put_one(m.new_sequence(104).unwrap(), Vec::new(), one, 8);
        assert_eq!(spares.capacities(), vec![104]);
        spares.put_one(m.new_sequence(104).unwrap(), Vec::new(), one - 1, 8);
        assert_eq!(
            spares.capacities(),
            vec![104],
            "a cache bigger than the room is dropped"
        );
        spares.shrink_to(0);
        assert_eq!((spares.bytes(), spares.capacities().len()), (0, 0));
    }

    #[test]
    fn the_cache_sharing_the_longest_prefix_is_taken_and_keeps_it() {
        let mut m = model();
        let mut spares = Spares::default();
        let history: Vec<u32> = (1..=80).collect();
        let other: Vec<u32> = (1..=10).chain(200..270).collect();
        let long_history = filled(&mut m, 400, &history);
        spares.put_one(long_history, history.clone(), u64::MAX, 8);
        spares.put_one(filled(&mut m, 120, &other), other.clone(), u64::MAX, 8);
        // The next turn: the history and more. The 400-position cache is far larger than needed,
        // but 80 shared tokens are worth it.
        let prompt: Vec<u32> = history.iter().copied().chain(300..310).collect();
        let (seq, shared) = whole(spares.take(100, u64::MAX, &prompt, true));
        assert_eq!((seq.capacity(), shared, seq.len()), (400, 80, 80));
        // Without reuse the same request gets the close-sized cache, emptied.
        spares.put_one(seq, history.clone(), u64::MAX, 8);
        let (seq, shared) = whole(spares.take(100, u64::MAX, &prompt, false));
        assert_eq!((seq.capacity(), shared, seq.len()), (120, 0, 0));
        // The same prompt again: all but its last token is reused (that one is fed for logits).
        let (seq, shared) = whole(spares.take(60, u64::MAX, &history, true));
        assert_eq!((seq.capacity(), shared), (400, 79));
        // A longer next turn than the only cache holding its start can take: that cache (now
        // holding 79 of the history's tokens) is handed over to copy from.
        spares.put_one(seq, history.clone(), u64::MAX, 8);
        let longer: Vec<u32> = history.iter().copied().chain(500..900).collect();
        match spares.take(500, u64::MAX, &longer, true) {
            Some((Taken::CopyFrom(from, shared), None)) => {
                assert_eq!((from.capacity(), shared, from.len()), (400, 79, 79));
            }
            _ => panic!("expected the cache to copy from"),
        }
    }

    fn whole(taken: Option<(Taken, Option<Sequence>)>) -> (Sequence, usize) {
        match taken {
            Some((Taken::Whole(seq, shared), None)) => (seq, shared),
            Some((Taken::Whole(..), Some(_))) => panic!("a draft cache nobody kept"),
            Some((Taken::CopyFrom(..), _)) => panic!("a cache to copy from, not to run in"),
            None => panic!("no cache"),
        }
    }

    impl Spares {
        /// Keeps a cache without a draft cache.
        fn put_one(&mut self, seq: Sequence, tokens: Vec<u32>, room: u64, max_kept: usize) {
            self.put(seq, None, tokens, room, max_kept);
        }
    }

    #[test]
    fn a_streams_draft_cache_is_kept_and_handed_out_with_its_cache_and_counted_with_it() {
        let mut m = model();
        let mut d = TextModel::tiny_random(8);
        let history: Vec<u32> = (1..=40).collect();
        let seq = filled(&mut m, 100, &history);
        // The draft cache lags the stream by its last tokens.
        let draft = filled(&mut d, 100, &history[..36]);
        let both = (seq.kv_bytes() + draft.kv_bytes()) as u64;
        let mut spares = Spares::default();
        // Both count against the room: not kept when only the cache would fit.
        spares.put(seq, Some(draft), history.clone(), both - 1, 8);
        assert_eq!(spares.bytes(), 0);
        let (seq, draft) = (
            filled(&mut m, 100, &history),
            filled(&mut d, 100, &history[..36]),
        );
        spares.put(seq, Some(draft), history.clone(), both, 8);
        assert_eq!(spares.bytes(), both);
        // A prompt sharing 30 tokens: both caches hold those 30 and no more.
        let prompt: Vec<u32> = (1..=30).chain(500..520).collect();
        match spares.take(90, u64::MAX, &prompt, true) {
            Some((Taken::Whole(seq, 30), Some(draft))) => {
                assert_eq!((seq.len(), draft.len()), (30, 30));
            }
            _ => panic!("expected both caches, holding the shared 30 tokens"),
        }
        assert_eq!(spares.bytes(), 0);
        // The same history again: the draft cache holds only what it held (36 of 39).
        let (seq, draft) = (
            filled(&mut m, 100, &history),
            filled(&mut d, 100, &history[..36]),
        );
        spares.put(seq, Some(draft), history.clone(), u64::MAX, 8);
        match spares.take(90, u64::MAX, &history, true) {
            Some((Taken::Whole(seq, 39), Some(draft))) => {
                assert_eq!((seq.len(), draft.len()), (39, 36));
            }
            _ => panic!("expected both caches"),
        }
    }
}
