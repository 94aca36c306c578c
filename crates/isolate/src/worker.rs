//! The worker process's side: limits itself, then converts one framed job after another.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::process::ExitCode;

use bytes::Bytes;
use hearth_markdown::{Conversion, Converter, Limits, Options};
use nix::sys::resource::{getrlimit, getrusage, setrlimit, Resource, UsageWho};

use crate::protocol::{
    read_frame, write_frame, Reply, Request, Usage, WireLimits, WorkerConfig, BODY_SLACK_BYTES,
    CONFIG_ENV,
};

/// Address space a worker started by hand (without the pool's configuration) may add.
const DEFAULT_MEMORY_LIMIT_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// Why a worker gave up. It then exits with a failure code; the pool replaces it.
#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error("{CONFIG_ENV} is not valid JSON for a worker configuration: {0}")]
    Config(serde_json::Error),
    #[error("could not set up the protocol pipe: {0}")]
    Pipe(io::Error),
    #[error("could not set a resource limit: {0}")]
    Limit(nix::Error),
    #[error("reading a request failed: {0}")]
    Read(#[from] crate::protocol::FrameError),
    #[error("writing a reply failed: {0}")]
    Write(io::Error),
    #[error("bad request: {0}")]
    Request(String),
}

/// The worker process: `hearth convert-worker` runs this and nothing else.
///
/// Reads its configuration from the pool (in the environment), sets its own limits (address
/// space, CPU time, no core files), answers `Ready`, then converts one request frame from stdin
/// after another and answers each on stdout, until stdin closes. File descriptor 1 is pointed
/// at stderr first, so that nothing a parser prints can break a frame. Expects no other work in
/// the process: it neither installs a tracing subscriber nor reads anything but stdin.
pub fn worker_main() -> ExitCode {
    serve_with(|converter, bytes, filename| converter.convert(bytes, filename))
}

/// [`worker_main`] with the conversion itself supplied by the caller: for tests whose worker
/// must misbehave on cue (abort, overflow its stack, exhaust its memory, spin) and otherwise
/// call `converter.convert`. The converter passed in carries the request's limits and
/// [`Options`] (attachments, OCR mode and languages).
pub fn serve_with<F>(convert: F) -> ExitCode
where
    F: FnMut(&Converter, Bytes, Option<&str>) -> hearth_markdown::Result<Conversion>,
{
    match serve(convert) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The process's own last words: the pool keeps the tail of stderr for diagnosis.
            tracing::error!(error = %e, "conversion worker stops");
            eprintln!("hearth convert-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve<F>(mut convert: F) -> Result<(), WorkerError>
where
    F: FnMut(&Converter, Bytes, Option<&str>) -> hearth_markdown::Result<Conversion>,
{
    let config = match std::env::var(CONFIG_ENV) {
        Ok(json) => serde_json::from_str(&json).map_err(WorkerError::Config)?,
        Err(_) => WorkerConfig {
            memory_limit_bytes: DEFAULT_MEMORY_LIMIT_BYTES,
            max_request_bytes: Limits::default().max_input_bytes,
        },
    };
    let mut out = protocol_pipe().map_err(WorkerError::Pipe)?;
    let address_space_bytes = limit_memory(config.memory_limit_bytes)?;
    let ready = Reply::Ready {
        pid: std::process::id(),
        address_space_bytes,
        usage: usage(),
    };
    write_frame(&mut out, &ready, &[]).map_err(WorkerError::Write)?;
    tracing::debug!(address_space_bytes, "conversion worker ready");

    let mut input = io::stdin().lock();
    // One converter per set of limits, kept while they stay the same: its conversion threads
    // (64 MiB stacks) are then reused from one job to the next.
    let mut current: Option<(WireLimits, Converter)> = None;
    let max_body = config.max_request_bytes.saturating_add(BODY_SLACK_BYTES);
    while let Some((request, body)) = read_frame::<Request>(&mut input, max_body)? {
        limit_cpu(request.cpu_seconds)?;
        let options = Options::try_from(&request.options).map_err(WorkerError::Request)?;
        let converter = match &current {
            Some((limits, converter)) if *limits == request.limits => converter.clone(),
            _ => {
                let converter = Converter::new(Limits::from(&request.limits));
                current = Some((request.limits.clone(), converter.clone()));
                converter
            }
        }
        .with_options(options);
        let result = convert(&converter, Bytes::from(body), request.filename.as_deref());
        let usage = usage();
        let written = match result {
            Ok(conversion) => {
                let reply = Reply::Converted {
                    format: conversion.format.name().to_owned(),
                    warnings: conversion.warnings,
                    usage,
                };
                write_frame(&mut out, &reply, conversion.markdown.as_bytes())
            }
            Err(e) => {
                let reply = Reply::Failed {
                    kind: (&e).into(),
                    message: e.to_string(),
                    usage,
                };
                write_frame(&mut out, &reply, &[])
            }
        };
        written.map_err(WorkerError::Write)?;
    }
    tracing::debug!("conversion worker: stdin closed, exiting");
    Ok(())
}

/// Takes file descriptor 1 for the protocol and points 1 at stderr, so that a stray `println!`
/// in a parser lands in the log instead of inside a frame. The protocol's duplicate is
/// close-on-exec: a child of the worker (the OCR engine) must not hold the pipe open, or the
/// pool would not see it close when the worker dies.
fn protocol_pipe() -> io::Result<File> {
    // `try_clone_to_owned` duplicates with F_DUPFD_CLOEXEC.
    let protocol = io::stdout().as_fd().try_clone_to_owned()?;
    nix::unistd::dup2_stdout(io::stderr())?;
    Ok(File::from(protocol))
}

/// Caps the address space at what is mapped now plus `extra` bytes, and turns core files off
/// (a crash's diagnosis is its stderr; a core of a 2 GiB process is disk nobody asked for).
/// Counting from what is mapped now makes the limit independent of the binary's size and of
/// the libraries it maps. Returns the RLIMIT_AS set.
fn limit_memory(extra: u64) -> Result<u64, WorkerError> {
    let mapped = mapped_bytes().unwrap_or(0);
    let (_, hard) = getrlimit(Resource::RLIMIT_AS).map_err(WorkerError::Limit)?;
    let limit = mapped.saturating_add(extra).min(hard);
    setrlimit(Resource::RLIMIT_AS, limit, limit).map_err(WorkerError::Limit)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(WorkerError::Limit)?;
    Ok(limit)
}

/// Moves the CPU-time soft limit to the CPU used so far plus `budget_secs`, so that a reused
/// worker still has a per-job CPU limit. Past it the kernel sends SIGXCPU, which ends the
/// process. The hard limit stays where it is (a process may not raise it again).
fn limit_cpu(budget_secs: u64) -> Result<(), WorkerError> {
    let used_secs = usage().cpu_ms.div_ceil(1000);
    let (_, hard) = getrlimit(Resource::RLIMIT_CPU).map_err(WorkerError::Limit)?;
    let soft = used_secs.saturating_add(budget_secs.max(1)).min(hard);
    setrlimit(Resource::RLIMIT_CPU, soft, hard).map_err(WorkerError::Limit)
}

/// The process's peak RSS and CPU time so far.
fn usage() -> Usage {
    let Ok(u) = getrusage(UsageWho::RUSAGE_SELF) else {
        return Usage::default();
    };
    let ms = |t: nix::sys::time::TimeVal| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1000
            + u64::try_from(t.tv_usec()).unwrap_or(0) / 1000
    };
    Usage {
        // Linux reports ru_maxrss in KiB.
        max_rss_bytes: u64::try_from(u.max_rss()).unwrap_or(0) * 1024,
        cpu_ms: ms(u.user_time()) + ms(u.system_time()),
    }
}

/// The process's mapped address space (VmSize), from /proc.
fn mapped_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
