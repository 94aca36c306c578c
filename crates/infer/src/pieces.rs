//! A step of more rows than [`MAX_ROWS`] runs as several backend calls of at most that many rows
//! (llama.cpp's `n_ubatch`): the backends' scratch buffers (activations, the MLP's hidden
//! rows) grow with the rows of one call, so a 2,048-token prompt fed in one step would otherwise
//! hold four times the memory of a 512-row call for no gain in speed. The rows of each call are
//! every step's next tokens in order, as the budget allows; the logits of a step's output rows
//! are those of the calls that fed them.

use crate::model::{output_rows, Backend, Step};
use crate::Error;

/// Most rows one backend call computes.
pub(crate) const MAX_ROWS: usize = 512;

/// Runs `steps` through `backend` in calls of at most `max_rows` rows, advancing each
/// sequence's `len` as its tokens are fed, and leaves the logits of each step's last
/// [`output_rows`] tokens in `logits` (their sum times `vocab`, the steps' in order). On error every
/// sequence is back at the length it had.
pub(crate) fn forward(
    backend: &mut dyn Backend,
    steps: &mut [Step<'_>],
    outputs: &[usize],
    logits: &mut Vec<f32>,
    vocab: usize,
    max_rows: usize,
) -> Result<(), Error> {
    let rows: usize = steps.iter().map(|s| s.tokens.len()).sum();
    if rows <= max_rows {
        backend.forward(steps, outputs, logits)?;
        for st in steps.iter_mut() {
            st.seq.len += st.tokens.len();
        }
        return Ok(());
    }
    let start: Vec<usize> = steps.iter().map(|s| s.seq.len).collect();
    match in_pieces(backend, steps, outputs, vocab, max_rows.max(1)) {
        Ok(out) => {
            *logits = out;
            Ok(())
        }
        Err(e) => {
            for (st, &len) in steps.iter_mut().zip(&start) {
                st.seq.len = len;
            }
            Err(e)
        }
    }
}

/// The calls themselves; returns the steps' output rows' logits, row-major. A call asks each
/// member for the logits of its last row at least (backends give every step one), and of all
/// its rows in the call that are among the step's last `outputs[i]`; those are its last rows
/// in the call.
fn in_pieces(
    backend: &mut dyn Backend,
    steps: &mut [Step<'_>],
    outputs: &[usize],
    vocab: usize,
    max_rows: usize,
) -> Result<Vec<f32>, Error> {
    let total: Vec<usize> = steps.iter().map(|s| s.tokens.len()).collect();
    // Where each step's output rows start in `out`, and how many of them are written.
    let counts: Vec<usize> = (0..steps.len()).map(|i| output_rows(outputs, i)).collect();
    let mut at: Vec<usize> = counts
        .iter()
        .scan(0, |sum, &o| {
            let here = *sum;
            *sum += o;
            Some(here)
        })
        .collect();
    let mut fed = vec![0usize; steps.len()];
    let mut out = vec![0.0f32; counts.iter().sum::<usize>() * vocab];
    let mut piece_logits = Vec::new();
    loop {
        // The next call: each unfinished step's next tokens, in order, within the row budget.
        let mut budget = max_rows;
        let mut members = Vec::new();
        let mut wanted = Vec::new();
        let mut asked = Vec::new();
        let mut piece: Vec<Step<'_>> = Vec::new();
        for (i, st) in steps.iter_mut().enumerate() {
            let left = total[i] - fed[i];
            if left == 0 || budget == 0 {
                continue;
            }
            let n = left.min(budget);
            budget -= n;
            members.push((i, n));
            let first_output = total[i] - counts[i];
            wanted.push((fed[i] + n).saturating_sub(first_output.max(fed[i])));
            asked.push(wanted.last().copied().unwrap_or(0).max(1));
            piece.push(Step {
                seq: &mut *st.seq,
                tokens: &st.tokens[fed[i]..fed[i] + n],
            });
        }
        if piece.is_empty() {
            break;
        }
        backend.forward(&mut piece, &asked, &mut piece_logits)?;
        let mut row = 0;
        for (((st, &(i, n)), &w), &a) in piece.iter_mut().zip(&members).zip(&wanted).zip(&asked) {
            st.seq.len += n;
            fed[i] += n;
            let from = row + a - w;
            out[at[i] * vocab..(at[i] + w) * vocab]
                .copy_from_slice(&piece_logits[from * vocab..(from + w) * vocab]);
            at[i] += w;
            row += a;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Sequence, TextModel};

    /// Feeds `steps` (prompt, cache length before) through `m`'s backend in calls of at most
    /// `max_rows`; the logits and the lengths after.
    fn run(
        m: &mut TextModel,
        seqs: &mut [crate::Sequence],
        prompts: &[&[u32]],
        max_rows: usize,
    ) -> Result<Vec<f32>, Error> {
        let vocab = m.hp.vocab_size;
        let mut steps: Vec<Step<'_>> = seqs
            .iter_mut()
            .zip(prompts)
            .map(|(seq, tokens)| Step { seq, tokens })
            .collect();
        let mut logits = Vec::new();
        forward(
            &mut *m.backend,
            &mut steps,
            &[],
            &mut logits,
            vocab,
            max_rows,
        )?;
        Ok(logits)
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
    }

    #[test]
    fn a_step_fed_in_pieces_gives_each_sequence_its_own_logits_and_cache() {
        let mut m = TextModel::tiny_random(5);
        let long: Vec<u32> = (10..40).collect();
        let short: Vec<u32> = vec![7, 8, 9];
        // In one call each, as a reference.
        let mut alone = vec![m.new_sequence(64).unwrap(), m.new_sequence(64).unwrap()];
        let a = run(&mut m, &mut alone[..1], &[&long], usize::MAX).unwrap();
        let b = run(&mut m, &mut alone[1..], &[&short], usize::MAX).unwrap();
        // Together, in calls of 8 rows: the short step rides in the first call only.
        let mut together = vec![m.new_sequence(64).unwrap(), m.new_sequence(64).unwrap()];
        let both = run(&mut m, &mut together, &[&long, &short], 8).unwrap();
        let vocab = m.hp.vocab_size;
        close(&both[..vocab], &a);
        close(&both[vocab..], &b);
        assert_eq!((together[0].len(), together[1].len()), (30, 3));
        // The caches hold the same positions: the next token's logits agree too.
        let next = run(&mut m, &mut alone, &[&[3], &[4]], usize::MAX).unwrap();
        let after = run(&mut m, &mut together, &[&[3], &[4]], usize::MAX).unwrap();
        close(&after, &next);
    }

    #[test]
    fn output_rows_split_over_calls_are_gathered_in_order() {
        let mut m = TextModel::tiny_random(5);
        let vocab = m.hp.vocab_size;
        let long: Vec<u32> = (10..30).collect();
        let short: Vec<u32> = vec![7, 8, 9];
        // The last 6 rows of the long step and all 3 of the short one, in calls of 8 rows: the
        // long step's outputs fall in its second and third calls.
        let rows = |m: &mut TextModel, max_rows: usize| {
            let mut seqs = [m.new_sequence(64).unwrap(), m.new_sequence(64).unwrap()];
            let [a, b] = &mut seqs;
            let mut steps = [
                Step {
                    seq: a,
                    tokens: &long,
                },
                Step {
                    seq: b,
                    tokens: &short,
                },
            ];
            let mut logits = Vec::new();
            forward(
                &mut *m.backend,
                &mut steps,
                &[6, 3],
                &mut logits,
                vocab,
                max_rows,
            )
            .unwrap();
            logits
        };
        let whole = rows(&mut m, usize::MAX);
        let pieces = rows(&mut m, 8);
        assert_eq!(whole.len(), 9 * vocab);
        close(&pieces, &whole);
        // Each row is that position's: the long step's last row is the plain forward's logits.
        let mut seq = m.new_sequence(64).unwrap();
        let last = run(&mut m, std::slice::from_mut(&mut seq), &[&long], usize::MAX).unwrap();
        close(&whole[5 * vocab..6 * vocab], &last);
    }

    /// The real backend, failing on its `fail_on`-th call.
    struct Failing<'a> {
        inner: &'a mut dyn Backend,
        calls: usize,
        fail_on: usize,
    }

    impl Backend for Failing<'_> {
        fn name(&self) -> &'static str {
            "failing"
        }
        fn new_sequence(
            &self,
            layers: usize,
            kv_dim: usize,
            cap: usize,
        ) -> Result<Sequence, Error> {
            self.inner.new_sequence(layers, kv_dim, cap)
        }
        fn accepts(&self, seq: &Sequence) -> bool {
            self.inner.accepts(seq)
        }
        fn kv_bytes(&self, values: usize) -> usize {
            self.inner.kv_bytes(values)
        }
        fn forward(
            &mut self,
            steps: &mut [Step<'_>],
            outputs: &[usize],
            logits: &mut Vec<f32>,
        ) -> Result<(), Error> {
            self.calls += 1;
            if self.calls == self.fail_on {
                return Err(Error::InvalidBatch("injected failure".into()));
            }
            self.inner.forward(steps, outputs, logits)
        }
    }

    #[test]
    fn a_failing_piece_leaves_every_sequence_at_its_length_before_the_step() {
        let mut m = TextModel::tiny_random(5);
        let vocab = m.hp.vocab_size;
        let mut seq = m.new_sequence(64).unwrap();
        run(&mut m, std::slice::from_mut(&mut seq), &[&[1, 2, 3]], 512).unwrap();
        let prompt: Vec<u32> = (10..40).collect();
        let mut failing = Failing {
            inner: &mut *m.backend,
            calls: 0,
            fail_on: 3,
        };
        let mut steps = [Step {
            seq: &mut seq,
            tokens: &prompt,
        }];
        let err = forward(&mut failing, &mut steps, &[1], &mut Vec::new(), vocab, 8).unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
        assert_eq!(
            seq.len(),
            3,
            "two pieces had run; their positions are forgotten"
        );
    }
}
