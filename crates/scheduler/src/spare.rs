//! KV caches of ended sequences, kept for the next requests.
//!
//! A fresh KV cache is memory the process has not touched yet: every page of it faults on first
//! write, which on the development VM cost 5-35 ms for SmolLM2's 5 MB cache (most likely its
//! host reclaims freed guest memory). Paid at admission, it held a burst of requests behind one
//! another. Like llama.cpp and vLLM, which allocate their caches
//! once, the engine keeps the caches it has allocated and hands them to new sequences of about
//! the same size. Kept caches count against the KV budget: they are dropped (oldest first) when
//! a new allocation needs their room.

use hearth_infer::Sequence;

/// How much larger than asked a kept cache may be and still be handed out: a quarter more,
/// plus a few positions, so that requests of similar sizes share caches without a short
/// request pinning a long one's.
fn close_enough(capacity: usize, need: usize) -> bool {
    capacity >= need && capacity - need <= need / 4 + 32
}

#[derive(Default)]
pub(crate) struct Spares {
    /// Oldest first.
    kept: Vec<Sequence>,
    bytes: u64,
}

impl Spares {
    /// The smallest kept cache that holds `need` positions, is close enough in size and takes
    /// at most `max_bytes`; emptied.
    pub(crate) fn take(&mut self, need: usize, max_bytes: u64) -> Option<Sequence> {
        let best = self
            .kept
            .iter()
            .enumerate()
            .filter(|(_, s)| close_enough(s.capacity(), need) && s.kv_bytes() as u64 <= max_bytes)
            .min_by_key(|(_, s)| s.capacity())
            .map(|(i, _)| i)?;
        let seq = self.kept.remove(best);
        self.bytes -= seq.kv_bytes() as u64;
        Some(seq)
    }

    /// Keeps `seq` for reuse if, with the caches already kept, it stays within `room` bytes
    /// and `max_kept` caches; drops the oldest kept caches to make space for it.
    pub(crate) fn put(&mut self, mut seq: Sequence, room: u64, max_kept: usize) {
        let bytes = seq.kv_bytes() as u64;
        if bytes > room || max_kept == 0 {
            return;
        }
        self.shrink_to(room - bytes);
        while self.kept.len() >= max_kept {
            self.drop_oldest();
        }
        seq.truncate(0);
        self.bytes += bytes;
        self.kept.push(seq);
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
        let seq = self.kept.remove(0);
        self.bytes -= seq.kv_bytes() as u64;
    }

    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.bytes
    }

    #[cfg(test)]
    fn capacities(&self) -> Vec<usize> {
        self.kept.iter().map(Sequence::capacity).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_infer::TextModel;

    fn model() -> TextModel {
        TextModel::tiny_random(7)
    }

    #[test]
    fn a_kept_cache_is_reused_emptied_and_only_for_a_similar_size() {
        let m = model();
        let mut spares = Spares::default();
        let mut seq = m.new_sequence(100).unwrap();
        seq.truncate(0);
        let bytes = seq.kv_bytes() as u64;
        spares.put(seq, u64::MAX, 8);
        assert_eq!(spares.bytes(), bytes);
        // Far larger than needed: a 10-position request does not pin a 100-position cache.
        assert!(spares.take(10, u64::MAX).is_none());
        // Too small.
        assert!(spares.take(101, u64::MAX).is_none());
        // Larger than the budget left.
        assert!(spares.take(90, bytes - 1).is_none());
        let reused = spares.take(90, bytes).expect("a close size is reused");
        assert_eq!(reused.capacity(), 100);
        assert!(reused.is_empty());
        assert_eq!(spares.bytes(), 0);
    }

    #[test]
    fn the_best_fit_is_taken_and_the_room_and_count_limits_hold() {
        let m = model();
        let mut spares = Spares::default();
        for cap in [120, 100, 110] {
            spares.put(m.new_sequence(cap).unwrap(), u64::MAX, 8);
        }
        assert_eq!(spares.take(95, u64::MAX).map(|s| s.capacity()), Some(100));
        // Count limit: the oldest (120) goes.
        spares.put(m.new_sequence(104).unwrap(), u64::MAX, 2);
        assert_eq!(spares.capacities(), vec![110, 104]);
        // Room limit: only as many bytes as the budget leaves.
        let one = m.new_sequence(104).unwrap().kv_bytes() as u64;
        spares.put(m.new_sequence(104).unwrap(), one, 8);
        assert_eq!(spares.capacities(), vec![104]);
        spares.put(m.new_sequence(104).unwrap(), one - 1, 8);
        assert_eq!(
            spares.capacities(),
            vec![104],
            "a cache bigger than the room is dropped"
        );
        spares.shrink_to(0);
        assert_eq!((spares.bytes(), spares.capacities().len()), (0, 0));
    }
}
