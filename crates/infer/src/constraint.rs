//! Constrained decoding, engine side: a [`TokenConstraint`] says which tokens may come next
//! (a [`TokenMask`]) and follows the tokens chosen. The sampler gives every token the mask
//! forbids a logit of -inf before choosing; the engine commits the chosen token and ends the
//! sequence when the constraint is finished. Grammars (JSON schemas, Lark) live in
//! hearth-grammar, which implements the trait; nothing here knows how a mask is computed.

use std::fmt;

/// A set of token ids, one bit each: bit `i % 32` of word `i / 32` is token `i` (the layout of
/// llguidance's `SimpleVob`, so a grammar copies its mask in word by word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// A mask over `len` tokens that allows none of them.
    pub fn none(len: usize) -> TokenMask {
        TokenMask {
            words: vec![0; len.div_ceil(32)],
            len,
        }
    }

    /// A mask over `len` tokens that allows all of them.
    pub fn all(len: usize) -> TokenMask {
        let mut mask = TokenMask {
            words: vec![u32::MAX; len.div_ceil(32)],
            len,
        };
        mask.clear_tail();
        mask
    }

    /// Number of token ids the mask covers; ids at or past it are never allowed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_allowed(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 32] >> (i % 32) & 1 == 1
    }

    /// Allows or forbids one token; ids past `len` are ignored.
    pub fn set(&mut self, id: u32, allowed: bool) {
        let i = id as usize;
        if i >= self.len {
            return;
        }
        let bit = 1u32 << (i % 32);
        if allowed {
            self.words[i / 32] |= bit;
        } else {
            self.words[i / 32] &= !bit;
        }
    }

    /// The bits, 32 tokens a word; bits past `len` are zero.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Replaces the mask with `len` tokens' bits from `words` (missing words forbid their
    /// tokens), reusing this mask's memory.
    pub fn copy_from_words(&mut self, words: &[u32], len: usize) {
        let n = len.div_ceil(32);
        self.words.clear();
        self.words
            .extend(words.iter().copied().chain(std::iter::repeat(0)).take(n));
        self.len = len;
        self.clear_tail();
    }

    /// How many tokens are allowed.
    pub fn count_allowed(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed ids, ascending.
    pub fn allowed(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &bits)| {
            (0..32u32)
                .filter(move |b| bits >> b & 1 == 1)
                .map(move |b| w as u32 * 32 + b)
        })
    }

    /// Sets every logit the mask forbids to -inf, including those past `len`.
    pub fn apply(&self, logits: &mut [f32]) {
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = self.words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits >> b & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    fn clear_tail(&mut self) {
        if !self.len.is_multiple_of(32) {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u32 << (self.len % 32)) - 1;
            }
        }
    }
}

/// Why a constraint could not go on. The engine aborts that one sequence with
/// `AbortReason::EngineFailure(message)`; the batch goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The constraint cannot follow `token` (a mask/commit mismatch, never a sampled token).
    #[error("the output constraint rejected token {token}: {reason}")]
    Rejected { token: u32, reason: String },
    /// Computing the mask failed, e.g. the grammar ran past its per-token budget.
    #[error("the output constraint failed: {0}")]
    Failed(String),
    /// The mask allows no token (none with a finite logit) and the output may not end here.
    #[error("the output constraint allows no token here")]
    NoTokenAllowed,
}

/// What the next token may be, for one sequence. The engine, each step of the sequence: takes
/// [`allowed`](TokenConstraint::allowed), samples among those tokens, then either ends the
/// sequence (the token is a stop token) or [`commit`](TokenConstraint::commit)s it and ends the
/// sequence with `FinishReason::Stop` once [`is_finished`](TokenConstraint::is_finished).
///
/// Stop tokens (end of sequence, end of turn) in the mask mean the constrained output may end
/// here; a constraint that forbids them keeps the model generating until the output is complete.
pub trait TokenConstraint: Send {
    /// The tokens that may come next. Called once per step, before sampling; the mask stays
    /// valid until the next `commit`, so calling it again before then should be cheap.
    fn allowed(&mut self) -> Result<&TokenMask, ConstraintError>;

    /// Advances past `token`, which the last mask allowed.
    fn commit(&mut self, token: u32) -> Result<(), ConstraintError>;

    /// True when the output is complete and nothing may follow it.
    fn is_finished(&self) -> bool;

    /// How many of `tokens`, from the first, could be committed in turn from the current state;
    /// the state does not change. Speculative decoding cuts a draft there. The default takes
    /// them all: each verified position is sampled under its own mask anyway, so a longer
    /// draft costs rows, never correctness.
    fn allows_prefix(&mut self, tokens: &[u32]) -> usize {
        tokens.len()
    }
}

impl fmt::Debug for dyn TokenConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenConstraint")
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_sets_and_reads_bits_and_forbids_logits_it_does_not_allow() {
        let mut m = TokenMask::none(40);
        m.set(3, true);
        m.set(35, true);
        m.set(99, true); // past len: ignored
        assert!(m.is_allowed(3) && m.is_allowed(35) && !m.is_allowed(4) && !m.is_allowed(99));
        assert_eq!(m.allowed().collect::<Vec<_>>(), vec![3, 35]);
        assert_eq!(m.count_allowed(), 2);
        let mut logits = vec![1.0f32; 45];
        m.apply(&mut logits);
        let finite: Vec<usize> = (0..45).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(finite, vec![3, 35]);
        assert_eq!(TokenMask::all(33).count_allowed(), 33);
    }

    #[test]
    fn copying_words_clears_the_bits_past_the_length() {
        let mut m = TokenMask::none(0);
        m.copy_from_words(&[u32::MAX, u32::MAX], 40);
        assert_eq!(m.count_allowed(), 40);
        m.copy_from_words(&[1], 70);
        assert_eq!(m.allowed().collect::<Vec<_>>(), vec![0]);
        assert_eq!(m.words().len(), 3);
    }
}
