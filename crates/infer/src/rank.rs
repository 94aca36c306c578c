//! Rerankers from a decoder: a Qwen3 GGUF file whose `{arch}.pooling_type` is rank (4), as
//! llama.cpp's converter writes Qwen3-Reranker (the one decoder family llama.cpp reranks with).
//! The query and a document are written into one prompt (the file's
//! `tokenizer.chat_template.rerank`, or the two texts in a row), the prompt's last final hidden
//! state goes through the classifier head `cls.output` (one row per label, as the converter cut
//! the "yes" and "no" rows out of the output matrix), and the score is the first label's
//! probability over the labels, as llama.cpp takes it. `hearth-embed`'s `tests/decoder.rs` holds
//! the prompts' tokens and the scores to llama.cpp's server's on generated models.

use std::sync::Arc;

use candle_core::Device;

use crate::gguf::{Arch, GgufFile, Hparams, Meta, Pooling};
use crate::model::TextModel;
use crate::tokenizer::TextTokenizer;
use crate::Error;

/// The head's tensor: read here rather than by a backend's forward.
const WEIGHT: &str = "cls.output.weight";

/// Whether `name` is a tensor the rank head reads (so a backend need not), for a file of `hp`.
pub(crate) fn reads(hp: &Hparams, name: &str) -> bool {
    hp.pooling == Some(Pooling::Rank) && name == WEIGHT
}

/// How a query and a document become one prompt.
#[derive(Debug, Clone)]
enum Format {
    /// The file's template, `{query}` and `{document}` replaced; special tokens written in it
    /// become their ids and nothing is added, as llama.cpp tokenizes it.
    Template(String),
    /// BOS where the file adds one, the query, EOS where the file adds one, SEP where it adds
    /// one, the document, EOS again where the file adds one (llama.cpp's rule for a file
    /// without a template); the texts' special-token spellings stay text.
    Pair { eos: Option<u32>, sep: Option<u32> },
}

/// A decoder reranker's classifier head and prompt format.
#[derive(Debug, Clone)]
pub(crate) struct RankHead {
    /// `labels × n_embd`, row-major.
    weight: Vec<f32>,
    format: Format,
}

impl RankHead {
    /// The head of `file` (`hp` its hyperparameters, rank pooling).
    pub(crate) fn from_gguf(file: &GgufFile, hp: &Hparams) -> Result<RankHead, Error> {
        if hp.arch != Arch::Qwen3 {
            return Err(Error::metadata(
                format!("{}.pooling_type", hp.arch_name),
                format!(
                    "rank pooling is Qwen3's (as llama.cpp reranks); this file's architecture is {}",
                    hp.arch_name
                ),
            ));
        }
        if !file.has_tensor(WEIGHT) {
            return Err(Error::metadata(
                WEIGHT,
                "missing: a reranker (pooling type rank) scores through its classifier head",
            ));
        }
        let t = file
            .tensor(WEIGHT, &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        let labels = match t.dims() {
            [labels, width] if *width == hp.n_embd && *labels >= 2 => *labels,
            dims => {
                return Err(Error::metadata(
                    WEIGHT,
                    format!(
                        "shape {dims:?}, expected [labels (2 or more), {}]",
                        hp.n_embd
                    ),
                ))
            }
        };
        let weight = t.flatten_all()?.to_vec1::<f32>()?;
        let meta = Meta(&file.content);
        let labels_key = format!("{}.classifier.output_labels", hp.arch_name);
        if file.content.metadata.contains_key(&labels_key) {
            let named = meta.string_array(&labels_key)?.len();
            if named != labels {
                return Err(Error::metadata(
                    labels_key,
                    format!("{named} labels, but {WEIGHT} has {labels} rows"),
                ));
            }
        }
        let format = match meta.opt_string("tokenizer.chat_template.rerank")? {
            Some(template) => Format::Template(template),
            None => {
                let flag = |key: &str| Ok::<_, Error>(meta.opt_bool(key)?.unwrap_or(false));
                let eos = meta.opt_u32("tokenizer.ggml.eos_token_id")?;
                let sep = meta.opt_u32("tokenizer.ggml.seperator_token_id")?;
                Format::Pair {
                    eos: match flag("tokenizer.ggml.add_eos_token")? {
                        true => eos.or(sep),
                        false => None,
                    },
                    sep: match flag("tokenizer.ggml.add_sep_token")? {
                        true => sep,
                        false => None,
                    },
                }
            }
        };
        Ok(RankHead { weight, format })
    }

    /// The score of a prompt whose last final hidden state is `hidden`: the first label's
    /// probability.
    fn score(&self, hidden: &[f32]) -> f32 {
        let out: Vec<f32> = self
            .weight
            .chunks_exact(hidden.len())
            .map(|row| hearth_kernels::ops::dot(row, hidden))
            .collect();
        let max = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = out.iter().map(|o| (o - max).exp()).sum();
        (out[0] - max).exp() / sum
    }
}

/// How a reranker writes a query and a document into one prompt: shared with the threads that
/// tokenize requests while the model computes.
#[derive(Debug, Clone)]
pub struct RankPrompt {
    format: Format,
    tokenizer: Arc<TextTokenizer>,
}

impl RankPrompt {
    /// The prompt's tokens for `query` and `document`, as llama.cpp's server writes them.
    pub fn tokens(&self, query: &str, document: &str) -> Result<Vec<u32>, Error> {
        match &self.format {
            Format::Template(template) => {
                // `{query}` first, then `{document}`, each everywhere it stands, as llama.cpp
                // replaces them (a query that spells `{document}` is filled in too).
                let prompt = template
                    .replace("{query}", query)
                    .replace("{document}", document);
                self.tokenizer.encode_plain(&prompt)
            }
            Format::Pair { eos, sep } => {
                let mut ids: Vec<u32> = self.tokenizer.bos_to_add().into_iter().collect();
                ids.extend(self.tokenizer.encode_literal(query)?);
                ids.extend(eos.iter().chain(sep));
                ids.extend(self.tokenizer.encode_literal(document)?);
                ids.extend(eos);
                Ok(ids)
            }
        }
    }
}

impl TextModel {
    /// A reranker's prompt format (`None` for a model whose pooling type is not rank).
    pub fn rank_prompt(&self) -> Option<RankPrompt> {
        self.rank.as_ref().map(|head| RankPrompt {
            format: head.format.clone(),
            tokenizer: self.tokenizer(),
        })
    }

    /// Each prompt's score (prompts from [`RankPrompt::tokens`]), several prompts in one
    /// forward where they fit, each as it would be alone.
    pub fn rank(&mut self, prompts: &[&[u32]]) -> Result<Vec<f32>, Error> {
        let not_ranker = || Error::InvalidConfig {
            key: "pooling",
            reason: "the model is not a reranker (its pooling type is not rank)".into(),
        };
        if self.rank.is_none() {
            return Err(not_ranker());
        }
        let hidden = self.embed_batch(prompts, Pooling::Rank)?;
        let head = self.rank.as_ref().ok_or_else(not_ranker)?;
        Ok(hidden.iter().map(|h| head.score(h)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_score_is_the_first_labels_probability() {
        let head = RankHead {
            weight: vec![1.0, 0.0, 0.0, 1.0],
            format: Format::Pair {
                eos: None,
                sep: None,
            },
        };
        let p = head.score(&[2.0, 0.0]);
        assert!((p - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
        // Large logits do not overflow.
        assert!((head.score(&[1000.0, 0.0]) - 1.0).abs() < 1e-6);
        assert!(head.score(&[0.0, 1000.0]) < 1e-6);
    }

    /// An architecture fixture read as if it declared rank pooling.
    fn as_ranker(name: &str) -> Result<RankHead, Error> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/arch")
            .join(name);
        let file = GgufFile::open(&path)?;
        let mut hp = Hparams::from_gguf(&file.content)?;
        hp.pooling = Some(Pooling::Rank);
        RankHead::from_gguf(&file, &hp)
    }

    #[test]
    fn rank_pooling_is_qwen3s_and_needs_its_head() {
        let err = as_ranker("llama-q8_0.gguf").unwrap_err().to_string();
        assert!(err.contains("Qwen3") && err.contains("llama"), "{err}");
        let err = as_ranker("qwen3-q8_0.gguf").unwrap_err().to_string();
        assert!(err.contains("cls.output.weight"), "{err}");
    }
}
