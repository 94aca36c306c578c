//! `TextModel` (immutable weights + a forward backend) and the batched `forward` over `Step`s of
//! [`Sequence`]s (`sequence.rs`).

use std::sync::Arc;

use candle_core::Device;

use crate::config::{BackendChoice, DeviceSpec, GpuTuning, TextModelConfig};
use crate::gguf::Hparams;
use crate::sequence::Sequence;
use crate::tokenizer::TextTokenizer;
use crate::Error;

/// What the scheduler and server need to know about a loaded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// "llama", "gemma3", ...
    pub architecture: String,
    pub context_length: usize,
    pub vocab_size: usize,
    /// KV cache bytes one token position takes (all layers, K and V), for memory budgets.
    pub kv_bytes_per_token: usize,
    pub weights_bytes: u64,
    /// Which forward runs the model ("candle" or "fast").
    pub backend: String,
}

/// One entry of a batched step: append `tokens` to `seq` (a prefill chunk, or one token).
pub struct Step<'a> {
    pub seq: &'a mut Sequence,
    pub tokens: &'a [u32],
}

/// How many of step `i`'s last rows give logits: `outputs[i]`, or one where `outputs` has no
/// entry (a plain step, [`TextModel::forward`]).
pub(crate) fn output_rows(outputs: &[usize], i: usize) -> usize {
    outputs.get(i).copied().unwrap_or(1)
}

/// A forward implementation. Writes K/V of every step's tokens at positions `seq.len..` (the
/// caller advances `len` afterwards) and, into `logits`, the logits of the last `outputs[i]`
/// rows of each step `i` ([`output_rows`]: at most its tokens, possibly 0), the steps' in order and
/// each step's rows in order: `sum(outputs) * vocab_size`, row-major.
pub(crate) trait Backend: Send {
    fn name(&self) -> &'static str;
    fn forward(
        &mut self,
        steps: &mut [Step<'_>],
        outputs: &[usize],
        logits: &mut Vec<f32>,
    ) -> Result<(), Error>;
    /// As `forward`, but writes every row's final (normed) hidden state instead of the last
    /// rows' logits: `[rows * n_embd]`, the steps' rows in order. For embedding models.
    fn hidden(&mut self, steps: &mut [Step<'_>], out: &mut Vec<f32>) -> Result<(), Error> {
        let _ = (steps, out);
        Err(Error::InvalidConfig {
            key: "backend",
            reason: format!("the {} backend does not give hidden states", self.name()),
        })
    }
    /// A fresh cache for `capacity` positions where this backend keeps it, stamped with this
    /// backend's `Maker`.
    fn new_sequence(
        &self,
        layers: usize,
        kv_dim: usize,
        capacity: usize,
    ) -> Result<Sequence, Error>;
    /// Whether `seq` is one this backend made and can run (checked before every step; a
    /// sequence of another model or backend is refused, however alike in shape).
    fn accepts(&self, seq: &Sequence) -> bool;
    /// Bytes `values` cached values take in the caches this backend makes.
    fn kv_bytes(&self, values: usize) -> usize;
    /// Most rows one call computes; a step of more runs as several calls (`pieces.rs`).
    fn max_rows(&self) -> usize {
        crate::pieces::MAX_ROWS
    }
}

/// A loaded text model: immutable weights, one forward backend, its tokenizer. Owned by one
/// engine thread; sequences (KV caches) live outside it so one model serves many.
pub struct TextModel {
    pub(crate) hp: Hparams,
    pub(crate) backend: Box<dyn Backend>,
    info: ModelInfo,
    tokenizer: Arc<TextTokenizer>,
    pub(crate) pool: rayon::ThreadPool,
    logits: Vec<f32>,
    /// A reranker's head (`rank.rs`), read from the file beside the backend.
    pub(crate) rank: Option<crate::rank::RankHead>,
}

impl std::fmt::Debug for TextModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextModel")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

pub(crate) fn device_for(spec: DeviceSpec, tuning: GpuTuning) -> Result<Device, Error> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(n) => cuda_device(n, tuning),
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(n) => {
            let _ = tuning;
            Err(Error::DeviceUnavailable(format!("cuda:{n}")))
        }
    }
}

/// A GPU for a text model: `hearth_gpu`'s device (one stream, no event tracking, the memory
/// pool kept), or candle's default and a trimmed pool where [`GpuTuning`] asks, to compare.
#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize, tuning: GpuTuning) -> Result<Device, Error> {
    let tuning = hearth_gpu::Tuning {
        candle_device: tuning.candle_device,
        trim_pool: tuning.trim_pool,
    };
    Ok(hearth_gpu::cuda_device(ordinal, tuning)?)
}

impl TextModel {
    pub(crate) fn assemble(
        hp: Hparams,
        backend: Box<dyn Backend>,
        tokenizer: TextTokenizer,
        weights_bytes: u64,
        threads: usize,
    ) -> Result<TextModel, Error> {
        let threads = if threads == 0 {
            hearth_kernels::physical_cores()
        } else {
            threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hearth-infer-{i}"))
            .build()
            .map_err(|source| Error::ThreadPool { threads, source })?;
        // What one position of the backend's own cache takes (f16 caches half, q8_0 17/32).
        let kv_bytes_per_token = 2 * hp.n_layer * backend.kv_bytes(hp.kv_dim());
        let info = ModelInfo {
            architecture: hp.arch_name.clone(),
            context_length: hp.context_length,
            vocab_size: hp.vocab_size,
            kv_bytes_per_token,
            weights_bytes,
            backend: backend.name().to_string(),
        };
        Ok(TextModel {
            hp,
            backend,
            info,
            tokenizer: Arc::new(tokenizer),
            pool,
            logits: Vec::new(),
            rank: None,
        })
    }

    /// Loads the model `cfg` names (GGUF file, safetensors folder, or a Hugging Face repo).
    pub fn load(cfg: &TextModelConfig) -> Result<TextModel, Error> {
        crate::load::load(cfg)
    }

    /// A llama-shaped model with small dims (2 layers, hidden 64, 4 heads / 2 KV heads), seeded
    /// random weights, and a real byte-level BPE tokenizer with ChatML template, for fast tests
    /// of everything above the model. Same seed => same model => same tokens.
    pub fn tiny_random(seed: u64) -> TextModel {
        let tokenizer = crate::tokenizer::tiny();
        let hp = crate::random::tiny_hparams(tokenizer.vocab_size());
        let tensors =
            crate::random::tiny_tensors(&hp, seed).expect("tiny tensors build on the CPU");
        let backend = crate::candle_llama::from_hf_tensors(tensors, hp.clone(), &Device::Cpu)
            .expect("tiny tensors have every llama weight");
        TextModel::assemble(hp, Box::new(backend), tokenizer, 0, 1).expect("one thread starts")
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> Arc<TextTokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// Threads the forward runs on.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// A fresh sequence with its KV cache preallocated for `max_tokens` positions (prompt +
    /// output). Memory is zero-filled lazily by the OS, so it becomes resident as it fills, and
    /// it goes back to the OS when the sequence is dropped (`kv.rs`).
    pub fn new_sequence(&self, max_tokens: usize) -> Result<Sequence, Error> {
        if max_tokens > self.hp.context_length {
            return Err(Error::SequenceTooLong {
                requested: max_tokens,
                max: self.hp.context_length,
            });
        }
        self.backend
            .new_sequence(self.hp.n_layer, self.hp.kv_dim(), max_tokens)
    }

    /// One batched step: appends each step's tokens to its sequence and returns the logits of
    /// each step's last position, row-major `[steps.len() * vocab_size]`. On error no sequence
    /// advances. More rows than the backend takes at once (512 on the CPU) run as several
    /// backend calls (`pieces.rs`).
    pub fn forward(&mut self, steps: &mut [Step<'_>]) -> Result<&[f32], Error> {
        self.validate(steps)?;
        self.run(steps, &[])
    }

    /// As [`forward`](TextModel::forward), but returns the logits of the last `outputs[i]`
    /// positions of each step `i` (at least 1, at most its tokens): `sum(outputs)` rows, the
    /// steps' in order and each step's positions in order. A step that feeds a token and the
    /// tokens drafted after it gets, in one pass over the weights, what feeding them one step
    /// at a time would give (speculative decoding's verification).
    pub fn forward_rows(
        &mut self,
        steps: &mut [Step<'_>],
        outputs: &[usize],
    ) -> Result<&[f32], Error> {
        self.validate(steps)?;
        if outputs.len() != steps.len() {
            return Err(Error::InvalidBatch(format!(
                "{} output counts for {} steps",
                outputs.len(),
                steps.len()
            )));
        }
        if let Some(i) =
            (0..steps.len()).find(|&i| outputs[i] == 0 || outputs[i] > steps[i].tokens.len())
        {
            return Err(Error::InvalidBatch(format!(
                "step {i} asks for the logits of {} of its {} positions",
                outputs[i],
                steps[i].tokens.len()
            )));
        }
        self.run(steps, outputs)
    }

    /// A validated step's forward; `outputs` as [`output_rows`] reads it.
    fn run(&mut self, steps: &mut [Step<'_>], outputs: &[usize]) -> Result<&[f32], Error> {
        if steps.is_empty() {
            self.logits.clear();
            return Ok(&self.logits);
        }
        let TextModel {
            pool,
            backend,
            logits,
            hp,
            ..
        } = self;
        let (vocab, max_rows) = (hp.vocab_size, backend.max_rows());
        pool.install(|| {
            crate::pieces::forward(&mut **backend, steps, outputs, logits, vocab, max_rows)
        })?;
        Ok(&self.logits)
    }

    pub(crate) fn validate(&self, steps: &[Step<'_>]) -> Result<(), Error> {
        let vocab = self.hp.vocab_size;
        for (i, st) in steps.iter().enumerate() {
            if st.tokens.is_empty() {
                return Err(Error::InvalidBatch(format!("step {i} has no tokens")));
            }
            if !self.backend.accepts(st.seq) {
                return Err(Error::ForeignSequence { step: i });
            }
            let needed = st.seq.len + st.tokens.len();
            if needed > st.seq.capacity() {
                return Err(Error::ContextFull {
                    needed,
                    capacity: st.seq.capacity(),
                });
            }
            if let Some(&id) = st.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::InvalidToken {
                    id,
                    vocab_size: vocab,
                });
            }
        }
        for (i, a) in steps.iter().enumerate() {
            for b in &steps[i + 1..] {
                if std::ptr::eq(a.seq, b.seq) {
                    return Err(Error::InvalidBatch(
                        "a sequence appears twice in one step".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Which backend to build for a device and choice. The hand-written CPU path (`src/fast/`) slots
/// in here; until it exists, `auto` means candle and `fast` is an error.
pub(crate) fn resolve_backend(
    choice: BackendChoice,
    device: &Device,
) -> Result<BackendChoice, Error> {
    match choice {
        // Auto: the hand-written CPU path on the CPU (GGUF files; see load.rs), candle elsewhere.
        BackendChoice::Auto if device.is_cpu() => Ok(BackendChoice::Fast),
        BackendChoice::Auto | BackendChoice::Candle => Ok(BackendChoice::Candle),
        BackendChoice::Fast if !device.is_cpu() => Err(Error::InvalidConfig {
            key: "backend",
            reason: "\"fast\" runs on the CPU only".into(),
        }),
        // GGUF files only; safetensors folders always load on candle (see load.rs).
        BackendChoice::Fast => Ok(BackendChoice::Fast),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_types::{ChatMessage, Role, SamplingParams};

    fn greedy(model: &mut TextModel, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut seq = model.new_sequence(prompt.len() + n).unwrap();
        let mut out = Vec::new();
        let mut next = prompt.to_vec();
        for _ in 0..n {
            let logits = model
                .forward(&mut [Step {
                    seq: &mut seq,
                    tokens: &next,
                }])
                .unwrap();
            let id = crate::Sampler::new(&SamplingParams::default()).sample(logits, &[]);
            out.push(id);
            next = vec![id];
        }
        out
    }

    #[test]
    fn tiny_random_is_deterministic_per_seed() {
        let mut a = TextModel::tiny_random(1);
        let mut b = TextModel::tiny_random(1);
        let mut c = TextModel::tiny_random(2);
        let tok = a.tokenizer();
        let prompt = tok
            .encode(
                &tok.apply_chat_template(&[ChatMessage::new(Role::User, "hello")])
                    .unwrap(),
            )
            .unwrap();
        let ga = greedy(&mut a, &prompt, 12);
        assert_eq!(ga, greedy(&mut b, &prompt, 12));
        assert_ne!(ga, greedy(&mut c, &prompt, 12));
        assert_eq!(a.info().vocab_size, tok.vocab_size());
    }

    #[test]
    fn chunked_prefill_gives_the_same_logits_as_one_chunk() {
        let mut m = TextModel::tiny_random(3);
        let prompt: Vec<u32> = (10..40).collect();
        let mut s1 = m.new_sequence(64).unwrap();
        let one = m
            .forward(&mut [Step {
                seq: &mut s1,
                tokens: &prompt,
            }])
            .unwrap()
            .to_vec();
        let mut s2 = m.new_sequence(64).unwrap();
        m.forward(&mut [Step {
            seq: &mut s2,
            tokens: &prompt[..17],
        }])
        .unwrap();
        let two = m
            .forward(&mut [Step {
                seq: &mut s2,
                tokens: &prompt[17..],
            }])
            .unwrap()
            .to_vec();
        assert_eq!(s1.len(), 30);
        assert_eq!(s2.len(), 30);
        for (a, b) in one.iter().zip(&two) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }

    #[test]
    fn a_batch_of_mixed_prefill_and_decode_matches_each_sequence_alone() {
        let mut m = TextModel::tiny_random(4);
        let vocab = m.info().vocab_size;
        let prompts: Vec<Vec<u32>> = (0..5)
            .map(|i| {
                (0..(3 + 4 * i))
                    .map(|j| (7 * j + 13 * i) as u32 % 250)
                    .collect()
            })
            .collect();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&mut m, p, 6)).collect();
        // Batched: sequence i starts i steps late, so prefills and decodes mix in one call.
        let mut seqs: Vec<Sequence> = prompts
            .iter()
            .map(|p| m.new_sequence(p.len() + 6).unwrap())
            .collect();
        let mut next: Vec<Vec<u32>> = prompts.clone();
        let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
        for t in 0..(6 + prompts.len()) {
            let active: Vec<usize> = (0..prompts.len())
                .filter(|&i| t >= i && got[i].len() < 6)
                .collect();
            if active.is_empty() {
                continue;
            }
            let mut steps: Vec<Step> = Vec::new();
            let mut order = Vec::new();
            for (i, seq) in seqs.iter_mut().enumerate() {
                if active.contains(&i) {
                    steps.push(Step {
                        seq,
                        tokens: &next[i],
                    });
                    order.push(i);
                }
            }
            let logits = m.forward(&mut steps).unwrap().to_vec();
            assert_eq!(logits.len(), order.len() * vocab);
            for (row, &i) in order.iter().enumerate() {
                let id = crate::Sampler::new(&SamplingParams::default())
                    .sample(&logits[row * vocab..(row + 1) * vocab], &[]);
                got[i].push(id);
                next[i] = vec![id];
            }
        }
        assert_eq!(got, alone);
    }

    #[test]
    fn a_full_sequence_is_a_typed_error_and_does_not_advance() {
        let mut m = TextModel::tiny_random(5);
        let mut s = m.new_sequence(4).unwrap();
        let err = m
            .forward(&mut [Step {
                seq: &mut s,
                tokens: &[1, 2, 3, 4, 5],
            }])
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::ContextFull {
                    needed: 5,
                    capacity: 4
                }
            ),
            "{err}"
        );
        assert_eq!(s.len(), 0);
        let err = m
            .forward(&mut [Step {
                seq: &mut s,
                tokens: &[u32::MAX],
            }])
            .unwrap_err();
        assert!(matches!(err, Error::InvalidToken { .. }));
        let err = m
            .forward(&mut [Step {
                seq: &mut s,
                tokens: &[],
            }])
            .unwrap_err();
        assert!(matches!(err, Error::InvalidBatch(_)));
        assert!(matches!(
            m.new_sequence(1 << 30),
            Err(Error::SequenceTooLong { .. })
        ));
    }

    #[test]
    fn a_cache_made_by_another_model_is_refused_and_a_copied_prefix_gives_the_same_logits() {
        let (mut a, b) = (TextModel::tiny_random(6), TextModel::tiny_random(6));
        let mut foreign = b.new_sequence(8).unwrap();
        let err = a
            .forward(&mut [Step {
                seq: &mut foreign,
                tokens: &[1, 2],
            }])
            .unwrap_err();
        assert!(matches!(err, Error::ForeignSequence { step: 0 }), "{err}");
        let maker = crate::sequence::Maker::new();
        let mut host = Sequence::on_host(&maker, 2, 32, 8, crate::KvPrecision::F32).unwrap();
        let err = a
            .forward(&mut [Step {
                seq: &mut host,
                tokens: &[1],
            }])
            .unwrap_err();
        assert!(matches!(err, Error::ForeignSequence { step: 0 }), "{err}");
        // Another model's cache copies nothing; this model's copies its positions.
        let mut src = a.new_sequence(40).unwrap();
        let prompt: Vec<u32> = (3..33).collect();
        a.forward(&mut [Step {
            seq: &mut src,
            tokens: &prompt,
        }])
        .unwrap();
        let mut dst = a.new_sequence(40).unwrap();
        assert_eq!(dst.copy_prefix(&foreign, 5), 0);
        assert_eq!(dst.copy_prefix(&src, 20), 20);
        let copied = a
            .forward(&mut [Step {
                seq: &mut dst,
                tokens: &prompt[20..],
            }])
            .unwrap()
            .to_vec();
        let mut fresh = a.new_sequence(40).unwrap();
        let whole = a
            .forward(&mut [Step {
                seq: &mut fresh,
                tokens: &prompt,
            }])
            .unwrap();
        assert_eq!(copied, whole);
    }

    /// Two fast models loaded from one file (same shape, same weights) do not take each
    /// other's sequences, nor does the candle backend of that file take theirs, or they its.
    #[test]
    fn a_sequence_another_fast_model_made_is_refused_however_alike_the_models() {
        let dir = tempfile::tempdir().unwrap();
        let path = crate::fast::tests::write_model(dir.path(), &crate::fast::tests::llama_q8(), 1);
        let file = crate::gguf::GgufFile::open(&path).unwrap();
        let hp = Hparams::from_gguf(&file.content).unwrap();
        let fast = || {
            let m = crate::fast::from_gguf(&path, &file.content, hp.clone(), 1).unwrap();
            TextModel::assemble(hp.clone(), Box::new(m), crate::tokenizer::tiny(), 0, 1).unwrap()
        };
        let (mut a, mut b) = (fast(), fast());
        let candle = crate::candle_gguf::from_gguf(&file, hp.clone(), &Device::Cpu).unwrap();
        let mut candle =
            TextModel::assemble(hp.clone(), Box::new(candle), crate::tokenizer::tiny(), 0, 1)
                .unwrap();
        let mut of_a = a.new_sequence(8).unwrap();
        let mut of_candle = candle.new_sequence(8).unwrap();
        fn refused(model: &mut TextModel, seq: &mut Sequence) {
            let err = model
                .forward(&mut [Step {
                    seq,
                    tokens: &[1, 2],
                }])
                .unwrap_err();
            assert!(matches!(err, Error::ForeignSequence { step: 0 }), "{err}");
            assert_eq!(seq.len(), 0);
        }
        refused(&mut b, &mut of_a);
        refused(&mut candle, &mut of_a);
        refused(&mut a, &mut of_candle);
        // Its own model runs it, and the other fast model copies none of it.
        a.forward(&mut [Step {
            seq: &mut of_a,
            tokens: &[1, 2],
        }])
        .unwrap();
        let mut of_b = b.new_sequence(8).unwrap();
        assert_eq!(of_b.copy_prefix(&of_a, 2), 0);
    }

    #[test]
    fn info_accounts_kv_bytes_per_token() {
        let m = TextModel::tiny_random(0);
        // 2 layers * (K + V) * 2 kv heads * 16 dims * 4 bytes
        assert_eq!(m.info().kv_bytes_per_token, 2 * 2 * 32 * 4);
        let s = m.new_sequence(10).unwrap();
        assert_eq!(s.kv_bytes(), 10 * m.info().kv_bytes_per_token);
    }
}
