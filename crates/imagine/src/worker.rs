//! One OS thread per image model owns the loaded pipeline and serves a bounded queue.
//!
//! A full queue answers [`Error::Overloaded`] at once. Each job carries a one-shot reply
//! channel: when the caller stops waiting (its HTTP client disconnected and the handler future
//! was dropped) the channel closes, and the worker skips the job if it has not started, or stops
//! it before the next denoising step if it has.
//!
//! A [`StepObserver`] given at spawn hears the wall-clock time of every denoising step (the
//! server exports it as a histogram).

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::pipeline::{ImageParams, SdxlPipeline};

/// How long a refused request is told to wait when the queue is full (`Error::Overloaded`): one
/// place for the figure that reaches `Retry-After`.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A finished image.
#[derive(Debug, Clone)]
pub struct GeneratedImage {
    pub width: usize,
    pub height: usize,
    /// PNG file bytes.
    pub png: Vec<u8>,
    /// Wall-clock seconds the worker spent on it (sampling, decoding, PNG).
    pub seconds: f64,
}

/// Called on the worker thread with the duration of each denoising step; it must be quick.
pub type StepObserver = Box<dyn Fn(Duration) + Send>;

struct Job {
    params: ImageParams,
    reply: oneshot::Sender<Result<GeneratedImage>>,
    span: tracing::Span,
}

/// Cloneable handle to a model's worker thread.
#[derive(Clone)]
pub struct ImageWorker {
    tx: mpsc::Sender<Job>,
    waiting: Arc<AtomicUsize>,
}

impl std::fmt::Debug for ImageWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageWorker")
            .field("waiting", &self.waiting.load(Ordering::Relaxed))
            .finish()
    }
}

impl ImageWorker {
    /// Starts the worker thread. `queue` is how many requests may wait behind the running one
    /// (at least 1). The thread ends when every handle is dropped.
    pub fn spawn(pipeline: SdxlPipeline, queue: usize, name: &str) -> Result<Self> {
        Self::spawn_observed(pipeline, queue, name, Box::new(|_| {}))
    }

    /// [`ImageWorker::spawn`], telling `on_step` how long each denoising step took.
    pub fn spawn_observed(
        pipeline: SdxlPipeline,
        queue: usize,
        name: &str,
        on_step: StepObserver,
    ) -> Result<Self> {
        let (tx, mut rx) = mpsc::channel::<Job>(queue.max(1));
        let waiting = Arc::new(AtomicUsize::new(0));
        let counter = waiting.clone();
        std::thread::Builder::new()
            .name(format!("imagine-{name}"))
            .spawn(move || {
                while let Some(job) = rx.blocking_recv() {
                    counter.fetch_sub(1, Ordering::Relaxed);
                    run_job(&pipeline, job, &on_step);
                }
            })
            .map_err(|e| Error::io("worker thread", e))?;
        Ok(ImageWorker { tx, waiting })
    }

    /// Queues a request and waits for its image. Dropping the returned future cancels the job.
    pub async fn generate(&self, params: ImageParams) -> Result<GeneratedImage> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            params,
            reply,
            span: tracing::Span::current(),
        };
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tx.try_send(job) {
            let waiting = self
                .waiting
                .fetch_sub(1, Ordering::Relaxed)
                .saturating_sub(1);
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => Error::Overloaded {
                    waiting,
                    retry_after: RETRY_AFTER,
                },
                mpsc::error::TrySendError::Closed(_) => Error::WorkerStopped,
            });
        }
        rx.await.map_err(|_| Error::WorkerStopped)?
    }

    /// Whether the worker thread is still running.
    pub fn is_alive(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Requests queued and not started yet.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

fn run_job(pipeline: &SdxlPipeline, job: Job, on_step: &StepObserver) {
    let _enter = job.span.enter();
    if job.reply.is_closed() {
        tracing::info!("image request dropped before start: client gone");
        return;
    }
    let start = Instant::now();
    let reply = &job.reply;
    // `generate` polls this before every denoising step and once after the last, so the time
    // from one poll to the next is one step (`a_worker_times_every_denoising_step` holds that).
    let last_poll = Cell::new(None::<Instant>);
    let should_stop = || {
        let now = Instant::now();
        if let Some(previous) = last_poll.replace(Some(now)) {
            on_step(now - previous);
        }
        reply.is_closed()
    };
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let image = pipeline.generate(&job.params, &should_stop)?;
        let png = image.to_png()?;
        Ok(GeneratedImage {
            width: image.width,
            height: image.height,
            png,
            seconds: start.elapsed().as_secs_f64(),
        })
    }))
    .unwrap_or_else(|_| Err(Error::Panicked));
    match &result {
        Ok(img) => tracing::info!(
            steps = job.params.steps,
            width = img.width,
            height = img.height,
            ms = (img.seconds * 1000.0) as u64,
            "image generated"
        ),
        Err(Error::Cancelled) => tracing::info!("image request cancelled: client gone"),
        Err(e) => tracing::error!(error = %e, "image generation failed"),
    }
    // The receiver may be gone by now; nothing else to do then.
    let _ = job.reply.send(result);
}
