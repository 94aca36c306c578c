//! The pool: warm workers, checked out as owned leases, replaced when they die.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use hearth_markdown::{Conversion, Limits, Options};
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::error::{classify, CrashCause, Error, WorkerLimits};
use crate::process::{Launch, Process, StartError};
use crate::protocol::{
    format_named, Reply, Request, Usage, WireLimits, WireOptions, WorkerConfig, BODY_SLACK_BYTES,
};

/// Time a worker gets past the time limit to deliver an answer already on its way.
const GRACE: Duration = Duration::from_millis(500);
/// Longest pause between attempts to start a worker while starting fails.
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(10);

/// How a [`Pool`] runs its workers.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The executable that serves as a worker (the `hearth` binary itself).
    pub program: PathBuf,
    /// Its arguments; `["convert-worker"]` by default.
    pub args: Vec<OsString>,
    /// Worker processes kept warm (at least one is).
    pub workers: usize,
    /// Wall-clock limit of one conversion, and the longest a request waits for a free worker.
    /// The converter's own cooperative limit (`limits.time_limit`) is held to it as well.
    pub time_limit: Duration,
    /// Address space a worker may add to what it maps at startup (`RLIMIT_AS`); at least
    /// [`MIN_MEMORY_LIMIT_BYTES`] is given.
    pub memory_limit_bytes: u64,
    /// CPU time one job may use (`RLIMIT_CPU`, moved before each job). A backstop behind the
    /// wall clock: it still ends a runaway whose host process has died. Counts every thread,
    /// and PDF parsing runs on all cores, so it should not be below `time_limit` times the
    /// cores a worker may use.
    pub cpu_time_limit: Duration,
    /// A worker whose peak RSS has passed this after a job is retired and replaced, so that
    /// one large document does not leave its memory held.
    pub retire_rss_bytes: u64,
    /// The converter's limits, sent with every job.
    pub limits: Limits,
}

/// The least address space a worker gets past what it maps at startup: below about 96 MiB the
/// converter cannot start its 64 MiB-stack conversion thread and falls back to converting on
/// the worker's main thread (8 MiB of stack), so deep documents would overflow sooner.
pub const MIN_MEMORY_LIMIT_BYTES: u64 = 256 * 1024 * 1024;

impl PoolConfig {
    /// The defaults for `program`.
    ///
    /// - `workers`: the cores, at most 4 (each may grow to the memory limit).
    /// - `time_limit`: the converter's own (30 s), which it checks cooperatively; the pool's
    ///   kill half a second later is for parsers that never return to check it.
    /// - `memory_limit_bytes`: 2 GiB past startup. A job may legitimately hold a 50 MiB input,
    ///   up to 512 MiB unpacked from archives, a 64 MiB output and parser trees several times
    ///   their input, plus the 64 MiB conversion-thread stack and PDF parsing's thread per core.
    ///   Measured with mimalloc: a worker maps about 1 GiB at startup (mimalloc's arena
    ///   reservation, barely resident: 10 MiB RSS idle), which is why the limit counts from
    ///   there; it needs about 96 MiB more to convert at all. A 5 MB CSV peaks at 58 MiB RSS; a
    ///   360 kB PDF at 60 MiB RSS but maps up to 300 MiB more (a thread and mimalloc heap per
    ///   core on this 2-core machine: hosts with more cores map more).
    /// - `cpu_time_limit`: `time_limit` times the cores, the most a job can burn in its wall
    ///   time, so that it never fires first in a live pool.
    /// - `retire_rss_bytes`: 1 GiB peak RSS, some 15 times what ordinary documents need.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        let limits = Limits::default();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        PoolConfig {
            program: program.into(),
            args: vec!["convert-worker".into()],
            workers: cores.min(4),
            time_limit: limits.time_limit,
            memory_limit_bytes: 2 * 1024 * 1024 * 1024,
            cpu_time_limit: limits.time_limit * u32::try_from(cores).unwrap_or(u32::MAX),
            retire_rss_bytes: 1024 * 1024 * 1024,
            limits,
        }
    }
}

/// The pool's state, as a health check reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    /// Workers the pool keeps.
    pub workers: usize,
    /// Workers running and ready (idle or busy).
    pub live: usize,
    /// Workers waiting for a job.
    pub idle: usize,
    /// Whether the last attempt to start a worker succeeded (or none failed yet).
    pub can_start: bool,
    /// Why the last attempt to start a worker failed, while it is the latest word.
    pub start_error: Option<String>,
}

impl Health {
    /// Degraded: no worker can be started now. A pool that lost workers but can replace them
    /// is not degraded.
    pub fn is_degraded(&self) -> bool {
        !self.can_start
    }
}

/// Warm worker processes that convert documents. Cheap to clone: clones share the workers.
/// The workers are killed when the last clone (and the last conversion in flight) is gone.
#[derive(Debug, Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: PoolConfig,
    launch: Launch,
    wire_limits: WireLimits,
    /// Idle workers; `ready` holds one permit for each.
    idle: Mutex<Vec<Worker>>,
    ready: Semaphore,
    /// Workers started and not yet dropped.
    live: AtomicUsize,
    /// The last start failure, cleared by the next success.
    start_error: Mutex<Option<String>>,
    runtime: Handle,
}

/// A ready worker process and its place in the pool: dropping it (whatever the path: retired,
/// crashed, abandoned mid-job) kills the process and has the pool start a replacement.
#[derive(Debug)]
struct Worker {
    process: Process,
    _slot: Slot,
}

#[derive(Debug)]
struct Slot {
    pool: Weak<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(shared) = self.pool.upgrade() {
            shared.live.fetch_sub(1, Ordering::SeqCst);
            shared.replace();
        }
    }
}

/// A checked-out worker. [`Lease::give_back`] returns it to the pool after a whole job; any
/// other end (a cancelled future, an error, a panic) drops the lease, which kills the worker,
/// since a half-done exchange leaves its pipes in an unknown state.
struct Lease {
    worker: Option<Worker>,
    shared: Arc<Shared>,
}

impl Lease {
    fn process(&mut self) -> &mut Process {
        // Some until the lease is consumed.
        &mut self.worker.as_mut().expect("lease holds a worker").process
    }

    fn give_back(mut self) {
        if let Some(worker) = self.worker.take() {
            self.shared.add_idle(worker);
        }
    }

    /// Takes the worker out to end it; dropping the result replaces it.
    fn take(mut self) -> Worker {
        self.worker.take().expect("lease holds a worker")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(mut worker) = self.worker.take() {
            tracing::debug!(
                pid = worker.process.pid,
                "conversion abandoned mid-job; killing its worker"
            );
            worker.process.kill();
        }
    }
}

impl Pool {
    /// Starts `config.workers` workers and waits until each has answered or failed to start.
    /// Always returns a pool: one whose workers cannot start reports it in [`Pool::health`],
    /// answers [`Error::Unavailable`], and keeps trying to start them in the background.
    /// Must be called within a tokio runtime (with I/O and time enabled).
    pub async fn start(config: PoolConfig) -> Pool {
        let workers = config.workers.max(1);
        if config.memory_limit_bytes < MIN_MEMORY_LIMIT_BYTES {
            tracing::warn!(
                configured = config.memory_limit_bytes,
                used = MIN_MEMORY_LIMIT_BYTES,
                "conversion worker memory limit raised to the minimum"
            );
        }
        let memory_limit_bytes = config.memory_limit_bytes.max(MIN_MEMORY_LIMIT_BYTES);
        let limits = Limits {
            time_limit: config.limits.time_limit.min(config.time_limit),
            ..config.limits.clone()
        };
        let launch = Launch {
            program: config.program.clone(),
            args: config.args.clone(),
            config: WorkerConfig {
                memory_limit_bytes,
                max_request_bytes: config.limits.max_input_bytes,
            },
        };
        let shared = Arc::new(Shared {
            config: PoolConfig {
                workers,
                memory_limit_bytes,
                ..config
            },
            launch,
            wire_limits: WireLimits::from(&limits),
            idle: Mutex::new(Vec::with_capacity(workers)),
            ready: Semaphore::new(0),
            live: AtomicUsize::new(0),
            start_error: Mutex::new(None),
            runtime: Handle::current(),
        });
        let mut starts = tokio::task::JoinSet::new();
        for _ in 0..workers {
            let shared = Arc::clone(&shared);
            starts.spawn(async move { shared.start_one().await });
        }
        for started in starts.join_all().await {
            match started {
                Ok(worker) => shared.add_idle(worker),
                Err(_) => shared.replace(),
            }
        }
        Pool { shared }
    }

    /// Converts `bytes` in a worker with `options` (attachments, OCR); `filename` (if known)
    /// breaks ties the content leaves open.
    ///
    /// Waits at most the time limit for a free worker ([`Error::Busy`]), then at most the time
    /// limit (and a short grace) for the answer, after which the worker is killed. Cancelling
    /// the returned future at any point kills the worker it held and starts a replacement.
    pub async fn convert(
        &self,
        bytes: Bytes,
        filename: Option<String>,
        options: &Options,
    ) -> Result<Conversion, Error> {
        let config = &self.shared.config;
        // What the converter would refuse first, refused without a round trip.
        let size = bytes.len() as u64;
        if size > config.limits.max_input_bytes {
            let limit = config.limits.max_input_bytes;
            return Err(hearth_markdown::Error::TooLarge { size, limit }.into());
        }
        if bytes.is_empty() {
            return Err(hearth_markdown::Error::Empty.into());
        }
        let mut lease = self.checkout().await?;
        let request = Request {
            filename,
            options: WireOptions::from(options),
            limits: self.shared.wire_limits.clone(),
            cpu_seconds: config.cpu_time_limit.as_secs_f64().ceil() as u64,
        };
        let max_answer = (config.limits.max_output_bytes as u64).saturating_add(BODY_SLACK_BYTES);
        let exchange = lease.process().exchange(&request, &bytes, max_answer);
        let answer = tokio::time::timeout(config.time_limit + GRACE, exchange).await;
        match answer {
            Ok(Ok((reply, body))) => self.shared.answer(lease, reply, body),
            Ok(Err(e)) if e.is_closed() => Err(self.shared.died(lease.take()).await),
            Ok(Err(e)) => Err(self.shared.broke(lease.take(), e.to_string())),
            Err(_) => {
                let mut worker = lease.take();
                worker.process.kill();
                let _ = worker.process.end().await;
                let cause = CrashCause::TimeLimit {
                    limit: config.time_limit,
                };
                tracing::warn!(pid = worker.process.pid, %cause, "conversion worker killed");
                Err(Error::Crashed { cause })
            }
        }
    }

    /// Live and idle workers, and whether workers can be started.
    pub fn health(&self) -> Health {
        self.shared.prune_idle();
        let idle = self.shared.lock_idle().len();
        let start_error = self.shared.start_error();
        Health {
            workers: self.shared.config.workers,
            live: self.shared.live.load(Ordering::SeqCst),
            idle,
            can_start: start_error.is_none(),
            start_error,
        }
    }

    /// Takes an idle worker, waiting at most the time limit for one.
    async fn checkout(&self) -> Result<Lease, Error> {
        let shared = &self.shared;
        let waited = shared.config.time_limit;
        let deadline = Instant::now() + waited;
        loop {
            if let Some(reason) = shared.unavailable() {
                return Err(Error::Unavailable { reason });
            }
            match tokio::time::timeout_at(deadline, shared.ready.acquire()).await {
                Ok(Ok(permit)) => permit.forget(),
                // The semaphore is never closed.
                Ok(Err(_)) => continue,
                Err(_) => {
                    return Err(match shared.unavailable() {
                        Some(reason) => Error::Unavailable { reason },
                        None => Error::Busy {
                            workers: shared.config.workers,
                            waited,
                        },
                    })
                }
            }
            // No await from here on: the permit stands for exactly this worker.
            let Some(mut worker) = shared.lock_idle().pop() else {
                continue;
            };
            if worker.process.has_exited() {
                tracing::debug!(
                    pid = worker.process.pid,
                    "an idle conversion worker had died"
                );
                continue;
            }
            return Ok(Lease {
                worker: Some(worker),
                shared: Arc::clone(shared),
            });
        }
    }
}

impl Shared {
    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Worker>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn start_error(&self) -> Option<String> {
        self.start_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why no conversion can run now, when that is so: no worker is live and none can start.
    fn unavailable(&self) -> Option<String> {
        if self.live.load(Ordering::SeqCst) > 0 {
            return None;
        }
        self.start_error()
    }

    fn add_idle(&self, worker: Worker) {
        self.lock_idle().push(worker);
        self.ready.add_permits(1);
    }

    fn limits(&self) -> WorkerLimits {
        WorkerLimits {
            memory_limit_bytes: self.config.memory_limit_bytes,
            cpu_time_limit: self.config.cpu_time_limit,
        }
    }

    /// Starts one worker, recording success or failure for [`Pool::health`].
    async fn start_one(self: &Arc<Self>) -> Result<Worker, StartError> {
        let started = Process::start(&self.launch).await;
        let mut error = self
            .start_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match started {
            Ok(process) => {
                *error = None;
                self.live.fetch_add(1, Ordering::SeqCst);
                Ok(Worker {
                    process,
                    _slot: Slot {
                        pool: Arc::downgrade(self),
                    },
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start a conversion worker");
                *error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Starts a replacement worker in the background, retrying with growing pauses while
    /// starting fails; gives up when the pool is gone.
    fn replace(self: &Arc<Self>) {
        let pool = Arc::downgrade(self);
        self.runtime.spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(shared) = pool.upgrade() else { return };
                if let Ok(worker) = shared.start_one().await {
                    shared.add_idle(worker);
                    return;
                }
                drop(shared);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RESTART_PAUSE);
            }
        });
    }

    /// Drops idle workers whose process has exited (each drop starts a replacement).
    fn prune_idle(&self) {
        let mut dead = Vec::new();
        {
            let mut idle = self.lock_idle();
            let mut i = 0;
            while i < idle.len() {
                if !idle[i].process.has_exited() {
                    i += 1;
                    continue;
                }
                // A checkout may hold the permit of this worker; then it will find it dead.
                let Ok(permit) = self.ready.try_acquire() else {
                    break;
                };
                permit.forget();
                dead.push(idle.swap_remove(i));
            }
        }
        drop(dead);
    }

    /// Turns a whole answer into the result, and returns or retires the worker.
    fn answer(&self, lease: Lease, reply: Reply, body: Vec<u8>) -> Result<Conversion, Error> {
        match reply {
            Reply::Converted {
                format,
                warnings,
                usage,
            } => {
                let Some(format) = format_named(&format) else {
                    return Err(self.broke(lease.take(), format!("unknown format {format:?}")));
                };
                let markdown = match String::from_utf8(body) {
                    Ok(markdown) => markdown,
                    Err(_) => return Err(self.broke(lease.take(), "Markdown not UTF-8".into())),
                };
                self.release(lease, usage);
                Ok(Conversion {
                    markdown,
                    format,
                    warnings,
                })
            }
            Reply::Failed {
                kind,
                message,
                usage,
            } => {
                self.release(lease, usage);
                Err(Error::Convert { kind, message })
            }
            Reply::Ready { .. } => Err(self.broke(lease.take(), "a second ready".into())),
        }
    }

    /// After a whole job: back to the pool, or retired if its peak memory grew too large.
    fn release(&self, lease: Lease, usage: Usage) {
        if usage.max_rss_bytes > self.config.retire_rss_bytes {
            let worker = lease.take();
            tracing::info!(
                pid = worker.process.pid,
                peak_rss_bytes = usage.max_rss_bytes,
                "retiring a conversion worker whose memory grew"
            );
        } else {
            lease.give_back();
        }
    }

    /// A worker whose pipe closed: wait for its end and read the cause.
    async fn died(&self, mut worker: Worker) -> Error {
        let ending = worker.process.end().await;
        let tail = worker.process.stderr_tail();
        let cause = classify(ending, &tail, self.limits());
        tracing::warn!(pid = worker.process.pid, %cause, stderr = tail.trim_end(), "conversion worker died");
        Error::Crashed { cause }
    }

    /// A worker that answered nonsense: kill it.
    fn broke(&self, mut worker: Worker, detail: String) -> Error {
        worker.process.kill();
        let cause = CrashCause::Protocol { detail };
        tracing::warn!(pid = worker.process.pid, %cause, "conversion worker killed");
        Error::Crashed { cause }
    }
}
