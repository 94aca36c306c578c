//! Document conversions in warm worker processes, so that a crash, abort, stack overflow,
//! allocation failure or runaway of a third-party parser costs one upload, never the host.
//!
//! This crate owns both ends of that arrangement: the worker loop ([`worker_main`], which the
//! `hearth` binary runs as `hearth convert-worker`; the worker limits itself with `setrlimit`)
//! and the [`Pool`] in the host, which keeps workers warm, hands each conversion to one as an
//! owned lease, enforces the wall-clock limit, reads a dead worker's exit status and stderr
//! into a [`CrashCause`], and replaces workers that die or grow. It deliberately knows nothing
//! of HTTP, statuses or wire DTOs (the server maps [`Error`] to those), nor of formats and
//! parsing (that is `hearth-markdown`, whose public API is all it uses).
//!
//! # Protocol
//!
//! The pool starts `program args...` with stdin, stdout and stderr piped, and the worker's
//! configuration (memory limit, largest request) as JSON in `HEARTH_CONVERT_WORKER`, as the
//! leader of its own process group: killing a worker kills the group, so the OCR engine it
//! runs as a child dies with it. The worker points its file descriptor 1 at stderr (keeping a
//! close-on-exec duplicate for the protocol, so a parser's stray `println!` cannot corrupt a
//! frame and a child cannot hold the pipe open), sets `RLIMIT_AS` to what it maps at startup
//! plus the memory limit, turns core files off, and answers a `Ready` frame.
//!
//! Each frame is `b"HIW1"`, the header length (u32 LE), the body length (u64 LE), a JSON
//! header, then the raw body. Both lengths are checked against the reader's maximum before
//! anything is allocated. A request's header carries the file name, the converter's options
//! (attachment mode, OCR mode and languages, by the names their `FromStr` reads), its limits
//! and the job's CPU budget; its body is the document. Before each job the
//! worker moves its `RLIMIT_CPU` soft limit to the CPU used so far plus that budget. The answer's
//! header is `converted` (format, warnings) with the Markdown as body, or `failed` (the
//! converter's error kind and message) with an empty body; both report the worker's peak RSS
//! and CPU time. One job at a time per worker; the worker exits when stdin closes.
//!
//! # Defaults
//!
//! [`PoolConfig::new`] lists them with the measurements behind them;
//! `cargo test -p hearth-isolate --test pool -- --measure` measures again.

mod error;
mod pool;
mod process;
mod protocol;
mod worker;

pub use error::{ConvertErrorKind, CrashCause, Error, RETRY_AFTER};
pub use pool::{Health, Pool, PoolConfig, MIN_MEMORY_LIMIT_BYTES};
pub use worker::{serve_with, worker_main};

pub use bytes::Bytes;
pub use hearth_markdown::{Attachments, Conversion, Converter, Languages, Limits, Ocr, Options};
