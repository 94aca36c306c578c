//! A cross-encoder: a BERT-family encoder with a sequence-classification head of one label
//! (`BertForSequenceClassification`, as the `cross-encoder/*` models and sentence-transformers'
//! `CrossEncoder` save them). It reads a query and a document together and scores how well the
//! document answers the query: the `[CLS]` vector through the pooler (dense, tanh) and the
//! classifier, then the model's activation (sigmoid unless the folder says otherwise, as
//! `CrossEncoder.predict` does). Checked against sentence-transformers in `tests/rerank.rs`.
//! Or a GGUF decoder reranker (`decoder.rs`: Qwen3-Reranker's yes/no head), checked against
//! llama.cpp in `tests/decoder.rs`.

use std::path::Path;

use candle_nn::VarBuilder;

use crate::decoder::Decoder;
use crate::encoder::{load_error, Encoder, Folder, Precision, Tokens};
use crate::engine::Encode;
use crate::error::Result;

/// What the classifier's logit goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// 1 / (1 + e^-x): scores between 0 and 1.
    Sigmoid,
    /// The logit as it is.
    Identity,
    /// The first label's probability over all labels (a decoder reranker's "yes" against "no").
    Softmax,
}

/// A loaded reranker.
pub struct Reranker {
    kind: Kind,
}

enum Kind {
    CrossEncoder(Box<CrossEncoder>),
    Decoder(Box<Decoder>),
}

/// A cross-encoder's encoder and head.
struct CrossEncoder {
    encoder: Encoder,
    /// The pooler's dense layer (`hidden x hidden`, row-major) and bias.
    pooler: (Vec<f32>, Vec<f32>),
    /// The classifier's one row and bias.
    classifier: (Vec<f32>, f32),
    activation: Activation,
}

impl std::fmt::Debug for Reranker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reranker")
            .field("activation", &self.activation())
            .field("max_tokens", &self.max_tokens())
            .finish_non_exhaustive()
    }
}

/// The head's weights, under the `bert.` prefix or without it.
fn head(vb: &VarBuilder, h: usize) -> candle_core::Result<Head> {
    let pooler = if vb.contains_tensor("bert.pooler.dense.weight") {
        vb.pp("bert.pooler.dense")
    } else {
        vb.pp("pooler.dense")
    };
    let classifier = vb.pp("classifier");
    Ok((
        (
            pooler.get((h, h), "weight")?.flatten_all()?.to_vec1()?,
            pooler.get(h, "bias")?.to_vec1()?,
        ),
        (
            classifier.get((1, h), "weight")?.flatten_all()?.to_vec1()?,
            classifier.get(1, "bias")?.to_vec1::<f32>()?[0],
        ),
    ))
}

/// The pooler's weights and bias, the classifier's row and bias.
type Head = ((Vec<f32>, Vec<f32>), (Vec<f32>, f32));

impl Reranker {
    /// Loads the folder `dir` onto the CPU, or onto CUDA device `gpu` (with the `cuda` feature);
    /// its products in f32, so that scores are the reference's to the last digits shown.
    pub fn load(dir: &Path, gpu: Option<usize>) -> Result<Reranker> {
        Self::load_with(dir, gpu, Precision::F32)
    }

    /// [`Self::load`] at the precision given. A `.gguf` file is a decoder reranker, run on the
    /// CPU whatever the precision.
    pub fn load_with(dir: &Path, gpu: Option<usize>, precision: Precision) -> Result<Reranker> {
        if crate::decoder::is_gguf(dir) {
            if gpu.is_some() {
                return Err(load_error(dir, "GGUF rerankers run on the CPU"));
            }
            return Ok(Reranker {
                kind: Kind::Decoder(Box::new(Decoder::load_ranker(dir)?)),
            });
        }
        let Folder {
            encoder,
            config,
            weights,
        } = Folder::load(dir, gpu, None, precision)?;
        let config_path = dir.join("config.json");
        let labels = config["id2label"]
            .as_object()
            .map(|m| m.len())
            .or_else(|| config["num_labels"].as_u64().map(|n| n as usize))
            .unwrap_or(1);
        if labels != 1 {
            return Err(load_error(
                &config_path,
                format!("a reranker scores with one label; this model has {labels}"),
            ));
        }
        // Where sentence-transformers writes the activation (newer, then older versions).
        let named = config["sentence_transformers"]["activation_fn"]
            .as_str()
            .or_else(|| config["sbert_ce_default_activation_function"].as_str());
        let activation = match named.map(|n| n.rsplit('.').next().unwrap_or(n)) {
            None | Some("Sigmoid") => Activation::Sigmoid,
            Some("Identity") => Activation::Identity,
            Some(other) => {
                return Err(load_error(
                    &config_path,
                    format!("the activation {other} is not supported"),
                ))
            }
        };
        let path = dir.join("model.safetensors");
        let (pooler, classifier) = head(&weights, encoder.hidden())
            .map_err(|e| load_error(&path, format!("no classifier head: {e}")))?;
        Ok(Reranker {
            kind: Kind::CrossEncoder(Box::new(CrossEncoder {
                encoder,
                pooler,
                classifier,
                activation,
            })),
        })
    }

    /// The longest pair, in tokens; longer pairs are cut: a cross-encoder's longer text first,
    /// a decoder's document.
    pub fn max_tokens(&self) -> usize {
        match &self.kind {
            Kind::CrossEncoder(c) => c.encoder.max_tokens(),
            Kind::Decoder(d) => d.max_tokens(),
        }
    }

    /// What the scores go through.
    pub fn activation(&self) -> Activation {
        match &self.kind {
            Kind::CrossEncoder(c) => c.activation,
            Kind::Decoder(_) => Activation::Softmax,
        }
    }

    /// A query and one document as the model reads them together (`index` names the document
    /// in errors).
    pub fn tokenize(&self, index: usize, query: &str, document: &str) -> Result<Tokens> {
        match &self.kind {
            Kind::CrossEncoder(c) => c.encoder.tokenize_pair(index, query, document),
            Kind::Decoder(d) => d.pair(index, query, document),
        }
    }

    /// Each pair's score, in order; each as it would be alone.
    pub fn score(&self, inputs: &[&Tokens]) -> Result<Vec<f32>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        match &self.kind {
            Kind::CrossEncoder(c) => c.score(inputs),
            Kind::Decoder(d) => d.score(inputs),
        }
    }
}

impl CrossEncoder {
    fn score(&self, inputs: &[&Tokens]) -> Result<Vec<f32>> {
        let hidden = self.encoder.forward(inputs)?;
        let h = hidden.width;
        let ((w, b), (c, cb)) = (&self.pooler, &self.classifier);
        Ok((0..hidden.len())
            .map(|i| {
                let first = &hidden.input(i)[..h];
                let logit = w
                    .chunks_exact(h)
                    .zip(b)
                    .map(|(row, b)| (hearth_kernels::ops::dot(row, first) + b).tanh())
                    .zip(c)
                    .map(|(p, c)| p * c)
                    .sum::<f32>()
                    + cb;
                match self.activation {
                    Activation::Sigmoid => 1.0 / (1.0 + (-logit).exp()),
                    // A cross-encoder's activation is read as sigmoid or identity only.
                    Activation::Identity | Activation::Softmax => logit,
                }
            })
            .collect())
    }
}

impl Encode for Reranker {
    type Output = f32;

    fn encode(&self, inputs: &[&Tokens]) -> Result<Vec<f32>> {
        self.score(inputs)
    }
}
