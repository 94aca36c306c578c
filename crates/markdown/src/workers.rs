//! Long-lived conversion threads, reused from one document to the next.
//!
//! Conversions run on threads with a large stack, since the parsers of nested documents recurse.
//! A fresh thread per conversion cost more than its creation: its allocator heap and its stack
//! were memory the process had not touched, so every document faulted its working memory in
//! (the kernel zeroing each page) anew. On the development VM that was a tenth of the test
//! corpus's conversion time. The pool keeps up to `keep` idle threads; a conversion takes one,
//! or starts a new one when none is idle, and gives it back when done (beyond `keep` idle
//! threads, it ends instead).

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Mutex;

use crate::CONVERSION_STACK_BYTES;

type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct Workers {
    /// The job queues of the idle threads; a thread ends when its queue is dropped.
    idle: Mutex<Vec<SyncSender<Job>>>,
    keep: usize,
}

impl Workers {
    pub(crate) fn new(keep: usize) -> Self {
        Workers {
            idle: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// Runs `job` on a pooled thread and waits for its result. `Err(job)` gives the job back
    /// when no thread could be started; `Ok(None)` means the job panicked.
    pub(crate) fn run<T, F>(&self, job: F) -> Result<Option<T>, F>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let worker = match self.take_idle() {
            Some(worker) => worker,
            None => match spawn() {
                Ok(worker) => worker,
                Err(_) => return Err(job),
            },
        };
        let (done, result) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = done.send(job());
        });
        // The thread only ends when its queue is dropped, so this send is taken.
        if worker.send(job).is_err() {
            return Ok(None);
        }
        // No result: the job panicked (the thread caught it and lives on).
        let out = result.recv().ok();
        self.give_back(worker);
        Ok(out)
    }

    fn take_idle(&self) -> Option<SyncSender<Job>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, worker: SyncSender<Job>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.keep {
            idle.push(worker);
        }
    }
}

/// A new conversion thread and its job queue.
fn spawn() -> std::io::Result<SyncSender<Job>> {
    let (queue, jobs) = mpsc::sync_channel::<Job>(1);
    std::thread::Builder::new()
        .name("hearth-markdown".into())
        .stack_size(CONVERSION_STACK_BYTES)
        .spawn(move || {
            for job in jobs {
                // A panic drops the job's result sender, which its caller sees.
                let _ = catch_unwind(AssertUnwindSafe(job));
            }
        })?;
    Ok(queue)
}

impl fmt::Debug for Workers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let idle = self.idle.lock().map(|i| i.len()).unwrap_or(0);
        f.debug_struct("Workers")
            .field("idle", &idle)
            .field("keep", &self.keep)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_reused_up_to_keep_and_a_panic_is_reported_without_losing_the_pool() {
        let workers = Workers::new(1);
        let name = || std::thread::current().id();
        let first = workers.run(name).ok().flatten().unwrap();
        let second = workers.run(name).ok().flatten().unwrap();
        assert_eq!(first, second, "the idle thread is reused");
        assert_ne!(first, std::thread::current().id());
        let panicked: Option<()> = workers.run(|| panic!("boom")).ok().flatten();
        assert!(panicked.is_none());
        // The thread that caught the panic serves the next job.
        assert_eq!(workers.run(name).ok().flatten(), Some(first));
        assert_eq!(workers.run(|| 2 + 2).ok().flatten(), Some(4));
    }

    #[test]
    fn concurrent_jobs_get_threads_of_their_own_and_at_most_keep_stay_idle() {
        let workers = std::sync::Arc::new(Workers::new(2));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (workers, barrier) = (workers.clone(), barrier.clone());
                std::thread::spawn(move || {
                    workers
                        .run(move || {
                            // All four run at once, or this would wait forever.
                            barrier.wait();
                            std::thread::current().id()
                        })
                        .ok()
                        .flatten()
                        .unwrap()
                })
            })
            .collect();
        let ids: std::collections::HashSet<_> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(ids.len(), 4);
        assert_eq!(workers.idle.lock().unwrap().len(), 2);
    }
}
