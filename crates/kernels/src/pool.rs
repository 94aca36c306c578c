//! A persistent thread pool for the kernels: `threads - 1` workers plus the calling thread.
//!
//! Work is a number of chunks claimed dynamically through one atomic word that packs
//! `(job epoch, next chunk)`, so a worker that the OS has descheduled (another process took
//! its core) never holds the job up: the caller simply claims every chunk itself. The word is
//! closed while a job is published, so a claim read from the last job can never succeed
//! against the next one's chunk count. Idle workers
//! spin for a short, bounded time (the gap between two matmuls of one forward pass), then
//! sleep on a condition variable; the caller waiting for the last chunks does the same.

// Unsafe is needed here for one thing: handing a borrowed, non-'static job closure to the
// workers. Soundness argument: the closure pointer is only dereferenced by a thread that has
// successfully claimed a chunk of the job's epoch, and `run` does not return (so the closure
// outlives every use) until every claimed chunk has reported completion.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type JobFn = dyn Fn(usize) + Sync;

/// A half of the claim word as a mask: the epoch is the upper half, the next chunk the lower.
const HALF: u64 = 0xFFFF_FFFF;
/// The chunk half while a job is being published: nothing can be claimed.
const CLOSED: u64 = HALF;

struct Shared {
    /// `(epoch << 32) | next_chunk`, or `(epoch << 32) | CLOSED` while the job is published.
    claim: AtomicU64,
    /// Chunks of the current job.
    n_chunks: AtomicUsize,
    /// Chunks not yet completed.
    pending: AtomicUsize,
    job: UnsafeCell<Option<*const JobFn>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    caller_sleeping: AtomicBool,
    lock: Mutex<()>,
    work_cv: Condvar,
    done_cv: Condvar,
    spin: u32,
}

// SAFETY: `job` is written only by the thread inside `ThreadPool::run` before it publishes a
// new epoch (Release), and read only after a successful claim of that epoch (Acquire).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// Persistent worker threads sized to the physical cores (see [`physical_cores`]).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    /// Serializes `run` calls from different threads sharing the pool.
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads)
            .finish()
    }
}

/// Physical cores of this machine (hyper-threads share a core's SIMD units, so they are not
/// counted): read from `/sys` on Linux, else the available parallelism.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    #[cfg(target_os = "linux")]
    {
        let mut cores = std::collections::HashSet::new();
        for cpu in 0..logical.min(1024) {
            let base = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
            let core = std::fs::read_to_string(format!("{base}/core_id"));
            let pkg = std::fs::read_to_string(format!("{base}/physical_package_id"));
            if let (Ok(c), Ok(p)) = (core, pkg) {
                cores.insert((p.trim().to_string(), c.trim().to_string()));
            }
        }
        if !cores.is_empty() {
            return cores.len().min(logical);
        }
    }
    logical
}

impl ThreadPool {
    /// A pool running jobs on `threads` threads in all (the caller counts as one);
    /// `0` means one per physical core.
    pub fn new(threads: usize) -> ThreadPool {
        let threads = if threads == 0 {
            physical_cores()
        } else {
            threads
        }
        .max(1);
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            n_chunks: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_sleeping: AtomicBool::new(false),
            lock: Mutex::new(()),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            spin: 20_000,
        });
        let workers = (1..threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("hearth-kern-{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawning a kernel worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            threads,
            run_lock: Mutex::new(()),
        }
    }

    /// Threads taking part in a job, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(chunk)` for every chunk in `0..n_chunks`, spread over the pool, and returns when
    /// all have finished. Re-raises a panic from any chunk.
    pub fn run(&self, n_chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_chunks == 0 {
            return;
        }
        if self.threads == 1 || n_chunks == 1 {
            (0..n_chunks).for_each(f);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let epoch = (s.claim.load(Relaxed) >> 32).wrapping_add(1) & HALF;
        // Close the word first: a worker that read the last job's word and is about to claim
        // from it now fails its compare-exchange, instead of succeeding against the new chunk
        // count (and running a chunk of this job outside its epoch, counted twice).
        s.claim.store((epoch << 32) | CLOSED, SeqCst);
        // SAFETY: no chunk of any earlier epoch is outstanding (the previous `run` waited for
        // them), and workers only read `job` after claiming a chunk of the new epoch.
        unsafe {
            let erased: *const JobFn =
                std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const JobFn>(f);
            *s.job.get() = Some(erased);
        }
        s.n_chunks.store(n_chunks, Relaxed);
        s.pending.store(n_chunks, Relaxed);
        s.panicked.store(false, Relaxed);
        s.claim.store(epoch << 32, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.work_cv.notify_all();
        }
        work_on(s, epoch);
        // Wait for chunks other threads claimed.
        let mut spins = 0u32;
        while s.pending.load(Acquire) != 0 {
            if spins < s.spin {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.caller_sleeping.store(true, SeqCst);
            while s.pending.load(SeqCst) != 0 {
                g = s.done_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.caller_sleeping.store(false, SeqCst);
        }
        // SAFETY: every chunk is complete; nobody reads `job` until the next epoch.
        unsafe {
            *s.job.get() = None;
        }
        if s.panicked.load(Acquire) {
            panic!("a kernel job panicked on a pool thread");
        }
    }
}

impl ThreadPool {
    /// Splits `data` into pieces of `piece` elements (the last may be shorter) and runs
    /// `f(index, piece)` for each, spread over the pool.
    pub fn for_each_piece_mut<T: Send>(
        &self,
        data: &mut [T],
        piece: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        if data.is_empty() || piece == 0 {
            return;
        }
        let len = data.len();
        let n = len.div_ceil(piece);
        let base = SendPtr(data.as_mut_ptr());
        self.run(n, &|i| {
            let base = &base;
            let start = i * piece;
            let end = (start + piece).min(len);
            // SAFETY: pieces `start..end` are disjoint for distinct `i`, inside `data`, and
            // `data` stays mutably borrowed until `run` returns.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
            f(i, chunk);
        });
    }
}

struct SendPtr<T>(*mut T);
// SAFETY: used only to hand out disjoint pieces of one slice (see `for_each_piece_mut`).
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

/// Claims and runs chunks of `epoch` until none are left (or the epoch moved on).
fn work_on(s: &Shared, epoch: u64) {
    loop {
        let cur = s.claim.load(Acquire);
        if cur >> 32 != epoch {
            return;
        }
        if cur & HALF == CLOSED {
            // The caller is publishing this epoch's job: a few stores away.
            std::hint::spin_loop();
            continue;
        }
        let idx = (cur & HALF) as usize;
        if idx >= s.n_chunks.load(Acquire) {
            return;
        }
        if s.claim
            .compare_exchange_weak(cur, cur + 1, AcqRel, Relaxed)
            .is_err()
        {
            continue;
        }
        // SAFETY: we hold a claimed chunk of `epoch`, so `run` is still waiting and the
        // closure it published for this epoch is alive.
        let f = unsafe { (*s.job.get()).expect("a job is published with its epoch") };
        let ok = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(idx) })).is_ok();
        if !ok {
            s.panicked.store(true, Release);
        }
        if s.pending.fetch_sub(1, SeqCst) == 1 && s.caller_sleeping.load(SeqCst) {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.done_cv.notify_all();
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Short bounded spin, then sleep until a new epoch (or shutdown) is published.
        let mut spins = 0u32;
        let epoch = loop {
            if s.shutdown.load(Acquire) {
                return;
            }
            let e = s.claim.load(Acquire) >> 32;
            if e != seen {
                break e;
            }
            if spins < s.spin {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            while s.claim.load(SeqCst) >> 32 == seen && !s.shutdown.load(SeqCst) {
                g = s.work_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, SeqCst);
            spins = 0;
        };
        seen = epoch;
        work_on(s, epoch);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.work_cv.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_chunk_runs_exactly_once_across_many_jobs() {
        let pool = ThreadPool::new(3);
        for n in [1usize, 2, 7, 64, 1000] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
        }
    }

    /// Back-to-back jobs whose chunk count grows by one: a worker that read the previous job's
    /// claim word just before the next job was published must not claim a chunk of the new
    /// one under the old epoch (it would run twice and its completion would be counted twice,
    /// leaving the caller waiting forever for a count that wrapped below zero).
    #[test]
    fn a_worker_late_from_the_last_job_never_claims_a_chunk_of_the_next() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // More threads than cores, so that one is often descheduled at the wrong moment.
            let pool = ThreadPool::new(8);
            for round in 0..200_000 {
                let n = 2 + round % 2;
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                let counts: Vec<u32> = hits.iter().map(|h| h.load(Relaxed)).collect();
                if counts.iter().any(|&c| c != 1) {
                    let _ = done_tx.send(Err(format!("round {round}: chunk runs {counts:?}")));
                    return;
                }
            }
            let _ = done_tx.send(Ok(()));
        });
        match done_rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(result) => result.unwrap(),
            Err(_) => panic!("a job never completed: its caller waits for a chunk nobody runs"),
        }
    }

    #[test]
    fn jobs_after_workers_fell_asleep_still_complete() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        pool.run(8, &|i| {
            total.fetch_add(i, Relaxed);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        pool.run(8, &|i| {
            total.fetch_add(i, Relaxed);
        });
        assert_eq!(total.load(Relaxed), 2 * 28);
    }

    #[test]
    fn a_panicking_chunk_is_reported_to_the_caller() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, &|i| {
                if i == 5 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool is still usable afterwards.
        let n = AtomicUsize::new(0);
        pool.run(4, &|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 4);
    }

    #[test]
    fn pieces_cover_the_slice_once_with_their_indices() {
        let pool = ThreadPool::new(2);
        let mut v = vec![0usize; 103];
        pool.for_each_piece_mut(&mut v, 10, &|i, piece| {
            for x in piece.iter_mut() {
                *x += i + 1;
            }
        });
        for (k, &x) in v.iter().enumerate() {
            assert_eq!(x, k / 10 + 1);
        }
    }

    #[test]
    fn physical_cores_is_at_least_one() {
        assert!(physical_cores() >= 1);
    }
}
