//! What a pooled conversion can come back with: the converter's own verdict, the death of the
//! worker that ran it (with the cause), or no worker to run it.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why [`crate::Pool::convert`] failed.
///
/// Every Display reads well after "Conversion failed: ".
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The converter looked at the document and refused or failed it; the worker is fine.
    /// `message` is the Display of the library's [`hearth_markdown::Error`].
    #[error("{message}")]
    Convert {
        kind: ConvertErrorKind,
        message: String,
    },
    /// The worker process running the conversion died or was killed; it has been replaced.
    #[error("{cause}")]
    Crashed { cause: CrashCause },
    /// Every worker stayed busy for as long as a request may wait.
    #[error("no conversion worker came free within {} ({workers} in the pool); try again shortly", Secs(*waited))]
    Busy { workers: usize, waited: Duration },
    /// No worker is running and none can be started.
    #[error("no conversion worker can be started ({reason})")]
    Unavailable { reason: String },
}

impl Error {
    /// How long a client should wait before trying again: `Some` for the refusals about the
    /// pool's capacity (`Busy`, `Unavailable`), with the pool's figure, [`RETRY_AFTER`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Busy { .. } | Error::Unavailable { .. } => Some(RETRY_AFTER),
            Error::Convert { .. } | Error::Crashed { .. } => None,
        }
    }
}

/// The pool's retry figure: a worker frees as soon as one conversion ends, so a second is a
/// fair first wait.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The kind of a converter's own error: [`hearth_markdown::Error`]'s variants, without their
/// data (the message carries it), so they can cross the process boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ConvertErrorKind {
    Empty,
    Unsupported {
        what: String,
    },
    TooLarge,
    Malformed,
    Encrypted,
    ExpandsTooMuch,
    TooManyMembers,
    TooDeep,
    TimedOut,
    /// An image declares more pixels than a page may have (a decompression bomb).
    ImageTooLarge,
    /// A multi-page image has more pages than allowed.
    TooManyPages,
    /// The request named OCR language models this machine lacks (the caller's mistake).
    UnknownLanguage,
    /// OCR was needed and could not run: no engine on the machine, or the engine failed.
    Ocr,
    /// A converter panicked and the library caught it (the worker lives on).
    Crashed,
}

impl From<&hearth_markdown::Error> for ConvertErrorKind {
    fn from(e: &hearth_markdown::Error) -> Self {
        use hearth_markdown::Error as E;
        // No wildcard: a new library error must be given a kind here.
        match e {
            E::Empty => ConvertErrorKind::Empty,
            E::Unsupported { what } => ConvertErrorKind::Unsupported { what: what.clone() },
            E::TooLarge { .. } => ConvertErrorKind::TooLarge,
            E::Malformed { .. } => ConvertErrorKind::Malformed,
            E::Encrypted { .. } => ConvertErrorKind::Encrypted,
            E::ExpandsTooMuch { .. } => ConvertErrorKind::ExpandsTooMuch,
            E::TooManyMembers { .. } => ConvertErrorKind::TooManyMembers,
            E::TooDeep { .. } => ConvertErrorKind::TooDeep,
            E::TimedOut { .. } => ConvertErrorKind::TimedOut,
            E::ImageTooLarge { .. } => ConvertErrorKind::ImageTooLarge,
            E::TooManyPages { .. } => ConvertErrorKind::TooManyPages,
            E::UnknownLanguage { .. } => ConvertErrorKind::UnknownLanguage,
            E::Ocr { .. } => ConvertErrorKind::Ocr,
            E::Crashed { .. } => ConvertErrorKind::Crashed,
        }
    }
}

impl From<hearth_markdown::Error> for Error {
    fn from(e: hearth_markdown::Error) -> Self {
        Error::Convert {
            kind: ConvertErrorKind::from(&e),
            message: e.to_string(),
        }
    }
}

/// Why a worker process died during a conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashCause {
    /// The pool killed it: no answer within the time limit.
    TimeLimit { limit: Duration },
    /// An allocation failed against the address-space limit (Rust printed "memory allocation
    /// of N bytes failed" and aborted).
    OutOfMemory { limit_bytes: u64 },
    /// A thread ran off the end of its stack.
    StackOverflow,
    /// The kernel stopped it at its CPU-time limit (SIGXCPU).
    CpuTimeLimit { limit: Duration },
    /// Killed by a signal (SIGSEGV, SIGABRT from a plain abort, SIGKILL from outside ...).
    Signal { signal: i32 },
    /// It exited by itself.
    Exited { code: i32 },
    /// It answered something that is not the protocol.
    Protocol { detail: String },
}

impl fmt::Display for CrashCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashCause::TimeLimit { limit } => {
                write!(
                    f,
                    "the conversion was stopped at the time limit of {}",
                    Secs(*limit)
                )
            }
            CrashCause::OutOfMemory { limit_bytes } => write!(
                f,
                "the worker ran out of memory (limit {} MiB)",
                limit_bytes / (1024 * 1024)
            ),
            CrashCause::StackOverflow => f.write_str("the worker overflowed its stack"),
            CrashCause::CpuTimeLimit { limit } => {
                write!(
                    f,
                    "the worker used up its CPU time limit of {}",
                    Secs(*limit)
                )
            }
            CrashCause::Signal { signal } => {
                let name = nix::sys::signal::Signal::try_from(*signal)
                    .map_or("unknown signal", nix::sys::signal::Signal::as_str);
                write!(f, "the worker was killed by signal {signal} ({name})")
            }
            CrashCause::Exited { code } => write!(f, "the worker exited with code {code}"),
            CrashCause::Protocol { detail } => write!(f, "the worker broke the protocol: {detail}"),
        }
    }
}

/// What a worker process's end looked like, as [`classify`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Code(i32),
    Signal(i32),
    /// Still running when we stopped waiting (it was then killed).
    Unknown,
}

/// The limits a worker ran under, to name them in the cause.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerLimits {
    pub memory_limit_bytes: u64,
    pub cpu_time_limit: Duration,
}

/// Reads a dead worker's exit and the tail of its stderr. The Rust runtime's last words come
/// first: a stack overflow and an allocation failure both end in SIGABRT, which alone would
/// say nothing.
pub(crate) fn classify(ending: Ending, stderr_tail: &str, limits: WorkerLimits) -> CrashCause {
    if stderr_tail.contains("has overflowed its stack") {
        return CrashCause::StackOverflow;
    }
    if stderr_tail.contains("memory allocation of") && stderr_tail.contains("failed") {
        return CrashCause::OutOfMemory {
            limit_bytes: limits.memory_limit_bytes,
        };
    }
    match ending {
        Ending::Signal(s) if s == nix::sys::signal::Signal::SIGXCPU as i32 => {
            CrashCause::CpuTimeLimit {
                limit: limits.cpu_time_limit,
            }
        }
        Ending::Signal(signal) => CrashCause::Signal { signal },
        Ending::Code(code) => CrashCause::Exited { code },
        Ending::Unknown => CrashCause::Protocol {
            detail: "the worker closed its output but did not exit".into(),
        },
    }
}

/// A duration as people write it in a message: "30 s", "1.5 s", "250 ms".
struct Secs(Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            write!(f, "{ms} ms")
        } else if self.0.subsec_millis() == 0 {
            write!(f, "{} s", self.0.as_secs())
        } else {
            write!(f, "{:.1} s", self.0.as_secs_f64())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WorkerLimits = WorkerLimits {
        memory_limit_bytes: 2048 * 1024 * 1024,
        cpu_time_limit: Duration::from_secs(60),
    };

    #[test]
    fn stderr_names_the_death_before_the_signal_does() {
        let overflow =
            "\nthread 'main' has overflowed its stack\nfatal runtime error: stack overflow";
        assert_eq!(
            classify(Ending::Signal(6), overflow, LIMITS),
            CrashCause::StackOverflow
        );
        let oom = "memory allocation of 4294967296 bytes failed\n";
        let cause = classify(Ending::Signal(6), oom, LIMITS);
        assert_eq!(
            cause.to_string(),
            "the worker ran out of memory (limit 2048 MiB)"
        );
        assert_eq!(
            classify(Ending::Signal(6), "", LIMITS).to_string(),
            "the worker was killed by signal 6 (SIGABRT)"
        );
    }

    #[test]
    fn sigxcpu_is_the_cpu_limit_and_codes_are_exits() {
        let xcpu = nix::sys::signal::Signal::SIGXCPU as i32;
        assert_eq!(
            classify(Ending::Signal(xcpu), "", LIMITS).to_string(),
            "the worker used up its CPU time limit of 60 s"
        );
        assert_eq!(
            classify(Ending::Code(3), "", LIMITS).to_string(),
            "the worker exited with code 3"
        );
    }

    #[test]
    fn messages_read_after_conversion_failed() {
        let busy = Error::Busy {
            workers: 4,
            waited: Duration::from_millis(1500),
        };
        assert_eq!(
            busy.to_string(),
            "no conversion worker came free within 1.5 s (4 in the pool); try again shortly"
        );
        let timed = CrashCause::TimeLimit {
            limit: Duration::from_secs(30),
        };
        assert_eq!(
            timed.to_string(),
            "the conversion was stopped at the time limit of 30 s"
        );
        let e = Error::from(hearth_markdown::Error::Empty);
        assert!(matches!(
            e,
            Error::Convert {
                kind: ConvertErrorKind::Empty,
                ..
            }
        ));
        assert_eq!(e.to_string(), "the file is empty");
    }
}
