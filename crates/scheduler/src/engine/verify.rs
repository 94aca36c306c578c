//! After a step: each stream that caught up with its tokens samples its next token, and a stream
//! that fed a draft samples each drafted position in turn, exactly as plain decoding would have
//! sampled it (the same sampler, mask, context and random draws), keeping the draft up to the
//! first position where the sampled token differs. Its cache then forgets the rejected positions.

use super::batch::Batch;
use super::emit::logprob_entry;
use super::*;
use crate::engine::batch::{flush, Flush};

/// What sampling one position did to its stream.
struct Taken {
    /// The sampled token (`None` when sampling itself failed).
    id: Option<u32>,
    /// The stream goes on (nothing ended it).
    goes_on: bool,
}

impl Batch {
    /// Samples the next tokens of every sequence that caught up with its tokens this step:
    /// `rows` are the active indices of the step's rows, `outputs` how many logits rows each
    /// has in `logits` (one, or one more than its draft). Returns the tokens the streams took.
    pub(super) fn after_step(
        &mut self,
        rows: &[usize],
        outputs: &[usize],
        logits: &[f32],
    ) -> usize {
        let vocab = self.vocab;
        let mut took = 0;
        let mut ended: Vec<(usize, Result<FinishReason, AbortReason>)> = Vec::new();
        let now = Instant::now();
        let mut base = 0;
        for (&i, &outs) in rows.iter().zip(outputs) {
            let first = base;
            base += outs;
            let a = &self.active[i];
            let drafted = a.draft.len().saturating_sub(1);
            let fed_before = a.fed() - drafted;
            if fed_before < a.ids.len() {
                continue; // mid-prefill chunk: its logits are not needed
            }
            let generated = a.generated;
            let mut matched = 0;
            for j in 0..=drafted {
                let Some(row) = logits.get((first + j) * vocab..(first + j + 1) * vocab) else {
                    let why = "logits shorter than the batch".into();
                    ended.push((i, Err(AbortReason::EngineFailure(why))));
                    break;
                };
                let taken = self.take(i, row, now, &mut ended);
                if j < drafted && taken.id == Some(self.active[i].draft[1 + j]) {
                    matched += 1;
                    if taken.goes_on {
                        continue;
                    }
                }
                break;
            }
            took += self.active[i].generated - generated;
            if drafted > 0 {
                let a = &mut self.active[i];
                // Positions past the last kept token held a rejected draft.
                let kept = (fed_before + matched).min(a.ids.len());
                a.seq.truncate(kept);
                // The draft cache was fed the drafts but the last: it keeps the confirmed ones.
                if let Some(d) = a.draft_seq.as_mut() {
                    d.truncate(d.len().min(kept + 1));
                }
                if let Some(d) = a.drafter.as_mut() {
                    d.record(drafted, matched);
                    if d.by_model() {
                        self.draft_acceptance.record(drafted, matched);
                    }
                }
                let metrics = &self.shared.metrics;
                metrics.drafted_tokens.fetch_add(drafted as u64, Relaxed);
                metrics.accepted_tokens.fetch_add(matched as u64, Relaxed);
            }
        }
        for (i, outcome) in ended.into_iter().rev() {
            self.end(i, outcome);
        }
        took
    }

    /// Samples stream `i`'s next token from `row_logits` and delivers it, noting in `ended`
    /// when the token (or a failure) ends the stream.
    fn take(
        &mut self,
        i: usize,
        row_logits: &[f32],
        now: Instant,
        ended: &mut Vec<(usize, Result<FinishReason, AbortReason>)>,
    ) -> Taken {
        let a = &mut self.active[i];
        // Unconstrained: the sampler reads the logits in place, as it always has.
        let sampled = match a.constraint.as_mut() {
            None => Ok(a.sampler.sample(row_logits, &a.ids)),
            Some(c) => c.allowed().and_then(|mask| {
                a.sampler
                    .sample_masked(row_logits, &a.ids, Some(mask))
                    .ok_or(ConstraintError::NoTokenAllowed)
            }),
        };
        let id = match sampled {
            Ok(id) => id,
            Err(e) => {
                a.span
                    .in_scope(|| warn!(error = %e, "output constraint failed"));
                ended.push((i, Err(AbortReason::EngineFailure(e.to_string()))));
                return Taken {
                    id: None,
                    goes_on: false,
                };
            }
        };
        let metrics = &self.shared.metrics;
        match a.last_token {
            None => metrics
                .time_to_first_token
                .record_duration(now - a.enqueued),
            Some(last) => metrics.inter_token_latency.record_duration(now - last),
        }
        a.last_token = Some(now);
        let outcome = if !a.ignore_eos && self.tokenizer.is_stop(id) {
            Some(Ok(FinishReason::Stop))
        } else if let Some(Err(e)) = a.constraint.as_mut().map(|c| c.commit(id)) {
            a.span
                .in_scope(|| warn!(error = %e, "output constraint failed"));
            Some(Err(AbortReason::EngineFailure(e.to_string())))
        } else {
            a.ids.push(id);
            a.generated += 1;
            a.progress.store(a.generated, Relaxed);
            metrics.generated_tokens.fetch_add(1, Relaxed);
            let logprob = a
                .sampler
                .logprobs()
                .map(|step| logprob_entry(&self.tokenizer, id, step));
            if let Some(stop) = a.emit.push(id, logprob, &mut a.outbox) {
                Some(Ok(FinishReason::StopString(stop)))
            } else if a.constraint.as_ref().is_some_and(|c| c.is_finished()) {
                Some(Ok(FinishReason::Stop)) // the grammar is complete
            } else if a.generated >= a.max_tokens {
                Some(Ok(FinishReason::Length))
            } else if a.ids.len() > a.capacity {
                // The next step would feed this token past the cache's end.
                Some(Ok(FinishReason::ContextFull))
            } else {
                if let Flush::Full = flush(&a.tx, &mut a.outbox) {
                    a.paused_since.get_or_insert(now);
                }
                None
            }
        };
        let goes_on = outcome.is_none();
        if let Some(outcome) = outcome {
            ended.push((i, outcome));
        }
        Taken {
            id: Some(id),
            goes_on,
        }
    }
}
