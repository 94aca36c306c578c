//! Embeddings from a decoder: a model's final normed hidden states pooled as an embedding
//! model's file declares (`{arch}.pooling_type`), as llama.cpp computes them
//! (`hearth-embed`'s `tests/decoder.rs` holds them against llama.cpp's server).

use crate::gguf::Pooling;
use crate::model::{Step, TextModel};
use crate::Error;

impl TextModel {
    /// How the file says its final hidden states pool into an embedding (`{arch}.pooling_type`),
    /// `None` for a chat model.
    pub fn pooling(&self) -> Option<Pooling> {
        self.hp.pooling
    }

    /// The width of the final hidden state: an embedding's dimensions.
    pub fn embedding_length(&self) -> usize {
        self.hp.n_embd
    }

    /// The embedding of `tokens`: the final normed hidden states pooled by `pooling`, not
    /// normalised, as llama.cpp computes an embedding model's (causal attention over the one
    /// sequence). Runs in pieces of the backend's most rows, each attending to the pieces
    /// before it through the sequence's cache, which is dropped afterwards.
    pub fn embed(&mut self, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>, Error> {
        if tokens.is_empty() {
            return Err(Error::InvalidBatch("nothing to embed".into()));
        }
        let mut seq = self.new_sequence(tokens.len())?;
        let e = self.hp.n_embd;
        let max_rows = self.backend.max_rows().max(1);
        let mut pooled = vec![0f32; e];
        let mut hidden = Vec::new();
        for (i, piece) in tokens.chunks(max_rows).enumerate() {
            let mut steps = [Step {
                seq: &mut seq,
                tokens: piece,
            }];
            self.hidden(&mut steps, &mut hidden)?;
            seq.len += piece.len();
            fold(pooling, &mut pooled, &hidden, i == 0);
        }
        Ok(finish(pooling, pooled, tokens.len()))
    }

    /// [`Self::embed`] of each input, several short inputs in one forward (each its own
    /// sequence; rows do not see one another's); the same vectors as one at a time.
    pub fn embed_batch(
        &mut self,
        inputs: &[&[u32]],
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, Error> {
        let max_rows = self.backend.max_rows().max(1);
        let e = self.hp.n_embd;
        let mut out = Vec::with_capacity(inputs.len());
        let mut hidden = Vec::new();
        let mut i = 0;
        while i < inputs.len() {
            if inputs[i].is_empty() || inputs[i].len() > max_rows {
                out.push(self.embed(inputs[i], pooling)?);
                i += 1;
                continue;
            }
            let (mut j, mut rows) = (i, 0);
            while j < inputs.len() && !inputs[j].is_empty() && rows + inputs[j].len() <= max_rows {
                rows += inputs[j].len();
                j += 1;
            }
            let group = &inputs[i..j];
            let mut seqs = group
                .iter()
                .map(|t| self.new_sequence(t.len()))
                .collect::<Result<Vec<_>, _>>()?;
            let mut steps: Vec<Step<'_>> = seqs
                .iter_mut()
                .zip(group)
                .map(|(seq, tokens)| Step { seq, tokens })
                .collect();
            self.hidden(&mut steps, &mut hidden)?;
            let mut r = 0;
            for t in group {
                let mut pooled = vec![0f32; e];
                fold(
                    pooling,
                    &mut pooled,
                    &hidden[r * e..(r + t.len()) * e],
                    true,
                );
                out.push(finish(pooling, pooled, t.len()));
                r += t.len();
            }
            i = j;
        }
        Ok(out)
    }

    /// One backend call for hidden states, the steps checked first.
    fn hidden(&mut self, steps: &mut [Step<'_>], out: &mut Vec<f32>) -> Result<(), Error> {
        self.validate(steps)?;
        let TextModel { pool, backend, .. } = self;
        pool.install(|| backend.hidden(steps, out))
    }
}

/// Folds one piece's rows (`pooled.len()` wide; the input's first piece when `first`) into
/// `pooled`: their sum for the mean, the first row of the first piece, the last row (a
/// reranker's too).
fn fold(pooling: Pooling, pooled: &mut [f32], rows: &[f32], first: bool) {
    let e = pooled.len();
    match pooling {
        Pooling::Mean => {
            for row in rows.chunks_exact(e) {
                pooled.iter_mut().zip(row).for_each(|(s, v)| *s += v);
            }
        }
        Pooling::Cls if first => pooled.copy_from_slice(&rows[..e]),
        Pooling::Cls => {}
        Pooling::Last | Pooling::Rank => pooled.copy_from_slice(&rows[rows.len() - e..]),
    }
}

/// The pooled vector of an input of `n` tokens once every piece is folded in.
fn finish(pooling: Pooling, mut pooled: Vec<f32>, n: usize) -> Vec<f32> {
    if pooling == Pooling::Mean {
        pooled.iter_mut().for_each(|p| *p /= n as f32);
    }
    pooled
}
