//! Decode steps replayed as CUDA graphs. A one-stream decode step on a GPU is some 170 kernel
//! launches, each a candle op with its allocation, and the host spends longer issuing them than
//! the GPU spends running them. So the first decode step of each shape (rows, and blocks per
//! row in the attention's table, rounded up: `plan.rs`) runs as usual and is then captured once
//! (cudarc's stream capture; allocations and frees become the graph's own memory nodes); every
//! later step of that shape writes its plan into the captured plan's tensors, copies its
//! embeddings into the captured input, launches the graph and reads the logits back: a
//! handful of calls where there were hundreds.
//!
//! A graph reads the KV pool at the addresses it was captured with, so the graphs go when the
//! pool grows (a new allocation). The pool's lock is held while a step is captured, so nothing
//! else queues work on the model's stream then (reservations and prefix copies take it too). A
//! shape whose capture fails (an operation that cannot be captured, on some file's path) is run
//! the usual way from then on, with a warning; its logits were already computed before the
//! capture.

use std::collections::{HashMap, HashSet};

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
use candle_core::{CudaDevice, DType, Device, Tensor};

use super::plan::{fault, HostPlan, Plan};
use super::{read_logits, CandleModel};
use crate::device_kv::Pool;
use crate::Error;

/// The most graphs a model keeps (the least recently used goes first); each holds its step's
/// activations, a few MB for a 1B model at 32 rows.
const MAX_GRAPHS: usize = 32;

/// A captured step's shape: decode rows, and blocks per row in the attention's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    rows: usize,
    blocks: usize,
}

/// One captured decode step and the tensors it reads and writes at fixed addresses.
struct Captured {
    plan: Plan,
    /// `[rows, hidden]`, the activation dtype: the step's embeddings.
    x: Tensor,
    /// `[rows, vocab]` f32: the step's logits.
    out: Tensor,
    graph: Replay,
    last_used: u64,
}

/// A captured graph, held by one model.
struct Replay(CudaGraph);

// SAFETY: the driver's graph objects are not internally synchronized, so calls on one must not
// overlap; they have no affinity to a thread (cudarc binds the context on every call). A
// `Replay` is reached only through its model's `&mut self` (`Backend::forward`), one thread at
// a time, wherever the model has moved.
#[allow(unsafe_code)]
unsafe impl Send for Replay {}

/// A model's captured decode steps.
#[derive(Default)]
pub(super) struct Graphs {
    captured: HashMap<Shape, Captured>,
    /// Shapes whose capture failed: run the usual way.
    refused: HashSet<Shape>,
    /// The pool's size the graphs were captured against.
    pool_blocks: usize,
    clock: u64,
}

impl Graphs {
    /// A decode-only step (`host.decode_only()`): replayed when its shape was captured, else
    /// run and then captured.
    pub(super) fn forward(
        &mut self,
        m: &CandleModel,
        host: HostPlan,
        logits: &mut Vec<f32>,
    ) -> Result<(), Error> {
        let Device::Cuda(dev) = &m.device else {
            return Err(fault("CUDA graphs need a GPU"));
        };
        let shape = Shape {
            rows: host.rows.len(),
            blocks: host.decode_blocks(),
        };
        let pool = m.pool.lock();
        if pool.blocks() != self.pool_blocks {
            self.captured.clear();
            self.refused.clear();
            self.pool_blocks = pool.blocks();
        }
        self.clock += 1;
        if let Some(c) = self.captured.get_mut(&shape) {
            c.last_used = self.clock;
            c.plan.refill(host)?;
            let x = m.embed(&c.plan.ids)?;
            hearth_gpu::kernels::copy_into(&c.x, &x)?;
            c.graph
                .0
                .launch()
                .map_err(|e| fault(format!("replaying a decode step: {e}")))?;
            return read_logits(&c.out, logits);
        }
        let plan = host.upload(&m.device)?;
        let x = m.embed(&plan.ids)?;
        let refused = self.refused.contains(&shape);
        // Unless the shape was refused: candle's small host-to-device copies (a strided op's
        // dims) are kept on the device from here on, so that the capture finds them there.
        let _kept = (!refused).then(|| dev.enable_cuda_graph_htod_cache());
        let out = m.run(x.clone(), &plan, &pool)?;
        read_logits(&out, logits)?;
        drop(out);
        if refused {
            return Ok(());
        }
        let vocab = logits.len() / shape.rows.max(1);
        match capture(m, dev, &pool, plan, x, vocab) {
            Ok(mut c) => {
                c.last_used = self.clock;
                if self.captured.len() >= MAX_GRAPHS {
                    if let Some(oldest) = self
                        .captured
                        .iter()
                        .min_by_key(|(_, c)| c.last_used)
                        .map(|(s, _)| *s)
                    {
                        self.captured.remove(&oldest);
                    }
                }
                tracing::debug!(?shape, "captured a decode step as a CUDA graph");
                self.captured.insert(shape, c);
            }
            Err(e) => {
                tracing::warn!(error = %e, ?shape, "cannot capture this decode step as a CUDA graph; it runs launch by launch");
                // A failed capture may leave an error recorded on the context for its next call.
                let _ = dev.cuda_stream().context().check_err();
                self.refused.insert(shape);
            }
        }
        Ok(())
    }
}

/// Captures `plan`'s step from `x` into a graph (not launched: the step already ran).
fn capture(
    m: &CandleModel,
    dev: &CudaDevice,
    pool: &Pool,
    plan: Plan,
    x: Tensor,
    vocab: usize,
) -> Result<Captured, Error> {
    let rows = x.dim(0)?;
    let out = Tensor::zeros((rows, vocab), DType::F32, &m.device)?;
    let stream = dev.cuda_stream();
    let failed = |e: candle_core::cuda_backend::cudarc::driver::DriverError| {
        fault(format!("capturing a decode step: {e}"))
    };
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(failed)?;
    // Every tensor made in here is dropped in here: the graph frees what it allocates.
    let ran = (|| -> Result<(), Error> {
        let y = m.run(x.clone(), &plan, pool)?.to_dtype(DType::F32)?;
        Ok(hearth_gpu::kernels::copy_into(&out, &y)?)
    })();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    ran?;
    let graph = graph
        .map_err(failed)?
        .ok_or_else(|| fault("capturing a decode step: an empty graph"))?;
    graph.upload().map_err(failed)?;
    Ok(Captured {
        plan,
        x,
        out,
        graph: Replay(graph),
        last_used: 0,
    })
}
