//! One OS thread per image model owns the loaded pipeline and serves a bounded queue that is
//! fair between users (`jobs.rs`).
//!
//! A full queue answers [`Error::Overloaded`] at once. Each job carries a one-shot reply
//! channel and an events channel: when its owner stops waiting (the HTTP client disconnected
//! and the handler dropped both) the reply closes, and the worker skips the job if it has not
//! started, or stops it before the next denoising step if it has; [`ImageWorker::cancel`] does
//! the same by id. While a job waits it hears its place in the queue, while it runs each step
//! (with a preview every few steps when asked).
//!
//! A [`StepObserver`] given at spawn hears the wall-clock time of every denoising step (the
//! server exports it as a histogram).

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::jobs::{Job, JobEvent, JobSpec, JobState, Queue};
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

/// A job handed to the worker: its id (for [`ImageWorker::cancel`] and
/// [`ImageWorker::state`]), what it hears while it waits and runs, and its image. Dropping
/// `result` (or both) cancels the job.
pub struct Submitted {
    pub id: String,
    pub events: mpsc::UnboundedReceiver<JobEvent>,
    pub result: oneshot::Receiver<Result<GeneratedImage>>,
}

/// What the worker thread and the handles share.
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    alive: AtomicBool,
}

impl Shared {
    /// The queue, even if a thread panicked while holding it (its data stays consistent: every
    /// change is made whole under the lock).
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Closes the queue when the last handle goes, so the thread ends.
struct Closer(Arc<Shared>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.ready.notify_all();
    }
}

/// Cloneable handle to a model's worker thread.
#[derive(Clone)]
pub struct ImageWorker {
    shared: Arc<Shared>,
    _closer: Arc<Closer>,
}

impl std::fmt::Debug for ImageWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageWorker")
            .field("waiting", &self.waiting())
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
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::new(queue)),
            ready: Condvar::new(),
            alive: AtomicBool::new(true),
        });
        let thread = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("imagine-{name}"))
            .spawn(move || {
                while let Some(job) = next_job(&thread) {
                    run_job(&pipeline, &thread, job, &on_step);
                }
                thread.alive.store(false, Ordering::Relaxed);
            })
            .map_err(|e| Error::io("worker thread", e))?;
        Ok(ImageWorker {
            _closer: Arc::new(Closer(Arc::clone(&shared))),
            shared,
        })
    }

    /// Queues a job (refused at once when the queue is full); it is told its place in the
    /// queue at once.
    pub fn submit(&self, spec: JobSpec) -> Result<Submitted> {
        let (reply, result) = oneshot::channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        let id = uuid::Uuid::new_v4().to_string();
        let job = Job {
            id: id.clone(),
            spec,
            events: events_tx,
            reply,
            cancel: Arc::new(AtomicBool::new(false)),
            span: tracing::Span::current(),
        };
        let mut queue = self.shared.lock();
        if queue.closed || !self.is_alive() {
            return Err(Error::WorkerStopped);
        }
        if !queue.push(job) {
            return Err(Error::Overloaded {
                waiting: queue.waiting(),
                retry_after: RETRY_AFTER,
            });
        }
        drop(queue);
        self.shared.ready.notify_one();
        Ok(Submitted { id, events, result })
    }

    /// Queues a request and waits for its image. Dropping the returned future cancels the job.
    pub async fn generate(&self, params: ImageParams) -> Result<GeneratedImage> {
        let job = self.submit(JobSpec {
            user: String::new(),
            params,
            preview_every: 0,
        })?;
        job.result.await.map_err(|_| Error::WorkerStopped)?
    }

    /// Stops job `id`: a waiting one leaves the queue at once, a running one before its next
    /// denoising step; either ends with [`Error::Cancelled`]. False for an unknown or finished
    /// job.
    pub fn cancel(&self, id: &str) -> bool {
        let mut queue = self.shared.lock();
        if let Some(job) = queue.remove(id) {
            queue.set_state(id, JobState::Cancelled);
            let _ = job.reply.send(Err(Error::Cancelled));
            return true;
        }
        match &queue.running {
            Some((running, stop)) if running == id => {
                stop.store(true, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Where job `id` stands (finished jobs are remembered a while).
    pub fn state(&self, id: &str) -> Option<JobState> {
        self.shared.lock().state(id)
    }

    /// Whether the worker thread is still running.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::Relaxed)
    }

    /// Requests queued and not started yet.
    pub fn waiting(&self) -> usize {
        self.shared.lock().waiting()
    }

    /// Requests queued or running.
    pub fn in_flight(&self) -> usize {
        let queue = self.shared.lock();
        queue.waiting() + usize::from(queue.running.is_some())
    }

    /// Tells, once every handle is dropped, whether the thread has ended (and so dropped the
    /// model's weights).
    pub fn ended(&self) -> impl Fn() -> bool + Send + 'static {
        let shared = Arc::clone(&self.shared);
        move || !shared.alive.load(Ordering::Relaxed)
    }
}

/// The next job to run, waiting for one; `None` once every handle is gone and nothing waits.
fn next_job(shared: &Shared) -> Option<Job> {
    let mut queue = shared.lock();
    loop {
        if let Some(job) = queue.pop() {
            let steps = job.spec.params.steps_to_run();
            queue.set_state(&job.id, JobState::Running { step: 0, steps });
            queue.running = Some((job.id.clone(), Arc::clone(&job.cancel)));
            return Some(job);
        }
        if queue.closed {
            return None;
        }
        queue = shared.ready.wait(queue).unwrap_or_else(|p| p.into_inner());
    }
}

fn run_job(pipeline: &SdxlPipeline, shared: &Shared, job: Job, on_step: &StepObserver) {
    let _enter = job.span.enter();
    let finish = |state: JobState| {
        let mut queue = shared.lock();
        queue.set_state(&job.id, state);
        queue.running = None;
    };
    if job.reply.is_closed() {
        tracing::info!("image request dropped before start: client gone");
        finish(JobState::Cancelled);
        return;
    }
    let start = Instant::now();
    let reply = &job.reply;
    let steps = job.spec.params.steps_to_run();
    let every = job.spec.preview_every;
    // The pipeline calls this before every denoising step and once after the last, so the time
    // from one call to the next is one step (`a_worker_times_every_denoising_step` holds that).
    let last_poll = Cell::new(None::<Instant>);
    let mut observe = |done: usize, latents: &candle_core::Tensor| {
        let now = Instant::now();
        if let Some(previous) = last_poll.replace(Some(now)) {
            on_step(now - previous);
        }
        if done > 0 {
            shared
                .lock()
                .set_state(&job.id, JobState::Running { step: done, steps });
            let preview = (every > 0 && done.is_multiple_of(every))
                .then(|| pipeline.preview_png(latents))
                .and_then(|p| {
                    p.map_err(|e| tracing::warn!(error = %e, "preview failed"))
                        .ok()
                });
            let _ = job.events.send(JobEvent::Step {
                step: done,
                steps,
                preview,
            });
        }
        reply.is_closed() || job.cancel.load(Ordering::Relaxed)
    };
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let image = pipeline.generate_observed(&job.spec.params, &mut observe)?;
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
            steps,
            width = img.width,
            height = img.height,
            ms = (img.seconds * 1000.0) as u64,
            "image generated"
        ),
        Err(Error::Cancelled) => tracing::info!("image request cancelled"),
        Err(e) => tracing::error!(error = %e, "image generation failed"),
    }
    finish(match &result {
        Ok(_) => JobState::Completed,
        Err(Error::Cancelled) => JobState::Cancelled,
        Err(e) => JobState::Failed(e.to_string()),
    });
    // The receiver may be gone by now; nothing else to do then.
    let _ = job.reply.send(result);
}
