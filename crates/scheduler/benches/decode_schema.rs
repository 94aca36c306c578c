//! The decode bench's `--schema` mode: the schema every constrained stream follows, a wrapper
//! that clocks the constraint's own work (mask and commit) on the engine thread, and the
//! sampler's cost per token with and without a mask.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use hearth_infer::{ConstraintError, Sampler, SamplingParams, TokenConstraint, TokenMask};

/// More objects than any stream can write, each with free text (strings are where a mask allows
/// most of the vocabulary, its costly case).
pub fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 200,
                "items": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string"},
                        "year": {"type": "integer"},
                        "notes": {"type": "string"}
                    },
                    "required": ["title", "year", "notes"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["items"],
        "additionalProperties": false
    })
}

/// Time spent inside constraints, summed over streams.
#[derive(Default)]
pub struct Clock {
    nanos: AtomicU64,
    masks: AtomicU64,
}

impl Clock {
    /// (mean µs per mask + commit, masks) since the last call.
    pub fn take(&self) -> (f64, u64) {
        let nanos = self.nanos.swap(0, Relaxed);
        let masks = self.masks.swap(0, Relaxed);
        (nanos as f64 / 1e3 / masks.max(1) as f64, masks)
    }
}

/// A constraint whose `allowed` and `commit` are clocked.
pub struct Timed {
    pub inner: Box<dyn TokenConstraint>,
    pub clock: Arc<Clock>,
}

impl TokenConstraint for Timed {
    fn allowed(&mut self) -> Result<&TokenMask, ConstraintError> {
        let started = Instant::now();
        let r = self.inner.allowed();
        self.clock
            .nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        self.clock.masks.fetch_add(1, Relaxed);
        r
    }
    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        let started = Instant::now();
        let r = self.inner.commit(token);
        self.clock
            .nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        r
    }
    fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }
}

/// Mean µs of one greedy `sample` over `vocab` logits, unmasked and with a mask that leaves
/// part of every 32-token word allowed (no word is skipped whole: the mask's slowest case).
pub fn sampler_cost(vocab: usize) -> (f64, f64) {
    let logits: Vec<f32> = (0..vocab).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
    let mut mask = TokenMask::none(vocab);
    for id in (0..vocab as u32).step_by(3) {
        mask.set(id, true);
    }
    let mut sampler = Sampler::new(&SamplingParams::default());
    let rounds = 2_000;
    let time = |f: &mut dyn FnMut() -> u32| {
        let started = Instant::now();
        let mut sink = 0u32;
        for _ in 0..rounds {
            sink = sink.wrapping_add(f());
        }
        std::hint::black_box(sink);
        started.elapsed().as_secs_f64() * 1e6 / rounds as f64
    };
    let plain = time(&mut || sampler.sample(&logits, &[]));
    let masked = time(&mut || {
        sampler
            .sample_masked(&logits, &[], Some(&mask))
            .unwrap_or(0)
    });
    (plain, masked)
}
