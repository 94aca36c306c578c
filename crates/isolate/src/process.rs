//! One worker process seen from the pool: start and handshake, one job's exchange, and the
//! reading of its death.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;

use crate::error::Ending;
use crate::protocol::{
    recv_frame, send_frame, FrameError, Reply, Request, WorkerConfig, CONFIG_ENV,
};

/// How long a new worker may take to say it is ready.
const STARTUP_LIMIT: Duration = Duration::from_secs(10);
/// How much of a worker's stderr is kept for diagnosis.
const STDERR_TAIL_BYTES: usize = 16 * 1024;
/// How long a worker whose pipe closed may take to exit before it is killed.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// How long the stderr reader may take to see the end of a dead worker's stderr.
const STDERR_DRAIN_WAIT: Duration = Duration::from_millis(500);

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} did not start as a conversion worker: {detail}")]
    Handshake { program: String, detail: String },
}

/// What starting a worker takes.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub config: WorkerConfig,
}

/// A running worker that has said it is ready. It leads its own process group, so that what
/// it starts (the OCR engine) is killed with it. Dropping it kills the group.
#[derive(Debug)]
pub(crate) struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: StderrTail,
    pub pid: u32,
    /// The worker's process group (its own pid); `None` if the pid was not known, and then
    /// only the worker itself is killed, never a group 0 (which would be the host's own).
    group: Option<Pid>,
}

impl Drop for Process {
    fn drop(&mut self) {
        // Also after the worker was reaped: its children may outlive it, and while one lives
        // the group's id is not given to another process (with none left, killpg finds no
        // group). `kill_on_drop` then kills and reaps the worker if it still runs.
        self.kill_group();
    }
}

impl Process {
    /// Starts a worker and waits for its `Ready`.
    pub async fn start(launch: &Launch) -> Result<Process, StartError> {
        let program = launch.program.display().to_string();
        let config = serde_json::to_string(&launch.config).unwrap_or_default();
        let mut child = Command::new(&launch.program)
            .args(&launch.args)
            .env(CONFIG_ENV, config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| StartError::Spawn {
                program: program.clone(),
                source,
            })?;
        let handshake = |detail: String| StartError::Handshake {
            program: program.clone(),
            detail,
        };
        let pid = child.id().unwrap_or(0);
        let group = i32::try_from(pid)
            .ok()
            .filter(|&p| p > 0)
            .map(Pid::from_raw);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(handshake("its pipes were not set up".into()));
        };
        let mut process = Process {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr: StderrTail::read(stderr),
            pid,
            group,
        };
        let ready =
            tokio::time::timeout(STARTUP_LIMIT, recv_frame::<Reply>(&mut process.stdout, 0));
        match ready.await {
            Ok(Ok((
                Reply::Ready {
                    address_space_bytes,
                    usage,
                    ..
                },
                _,
            ))) => {
                tracing::debug!(
                    pid,
                    address_space_bytes,
                    rss_bytes = usage.max_rss_bytes,
                    "conversion worker ready"
                );
                Ok(process)
            }
            Ok(Ok((other, _))) => Err(handshake(format!("it answered {other:?} first"))),
            Ok(Err(e)) => {
                let ending = process.end().await;
                let tail = process.stderr_tail();
                Err(handshake(format!(
                    "{e} ({}); its stderr ends: {:?}",
                    describe(ending),
                    tail.trim_end()
                )))
            }
            Err(_) => Err(handshake(format!(
                "no answer within {} s",
                STARTUP_LIMIT.as_secs()
            ))),
        }
    }

    /// Sends one job and reads its answer.
    pub async fn exchange(
        &mut self,
        request: &Request,
        body: &[u8],
        max_answer_bytes: u64,
    ) -> Result<(Reply, Vec<u8>), FrameError> {
        send_frame(&mut self.stdin, request, body).await?;
        recv_frame(&mut self.stdout, max_answer_bytes).await
    }

    /// Sends SIGKILL to the worker and every process in its group (the process is reaped when
    /// it is dropped or [`Process::end`]ed).
    pub fn kill(&mut self) {
        self.kill_group();
        let _ = self.child.start_kill();
    }

    /// SIGKILL to the worker's process group. No group left (all exited) is no error.
    fn kill_group(&self) {
        if let Some(group) = self.group {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }

    /// Whether the process has exited (an idle worker can die of outside causes).
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the process to end (killing it if it will not), then for its stderr to be
    /// read to the end, and says how it ended.
    pub async fn end(&mut self) -> Ending {
        let ending = match tokio::time::timeout(EXIT_WAIT, self.child.wait()).await {
            Ok(Ok(status)) => match (status.code(), status.signal()) {
                (Some(code), _) => Ending::Code(code),
                (None, Some(signal)) => Ending::Signal(signal),
                (None, None) => Ending::Unknown,
            },
            Ok(Err(_)) => Ending::Unknown,
            Err(_) => {
                self.kill();
                let _ = self.child.wait().await;
                Ending::Unknown
            }
        };
        let _ = tokio::time::timeout(STDERR_DRAIN_WAIT, &mut self.stderr.task).await;
        ending
    }

    /// The last [`STDERR_TAIL_BYTES`] of the process's stderr, lossily decoded.
    pub fn stderr_tail(&self) -> String {
        let ring = self
            .stderr
            .ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (a, b) = ring.as_slices();
        let mut bytes = Vec::with_capacity(ring.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn describe(ending: Ending) -> String {
    match ending {
        Ending::Code(code) => format!("exited with code {code}"),
        Ending::Signal(signal) => format!("killed by signal {signal}"),
        Ending::Unknown => "did not exit".into(),
    }
}

/// A task reading a worker's stderr into a bounded ring, so that the pipe never fills (which
/// would stall the worker) and the last words of a crash are at hand.
#[derive(Debug)]
struct StderrTail {
    ring: Arc<Mutex<VecDeque<u8>>>,
    task: JoinHandle<()>,
}

impl StderrTail {
    fn read(mut stderr: ChildStderr) -> StderrTail {
        let ring = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL_BYTES)));
        let kept = Arc::clone(&ring);
        let task = tokio::spawn(async move {
            let mut chunk = [0u8; 4096];
            loop {
                match stderr.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut ring = kept.lock().unwrap_or_else(PoisonError::into_inner);
                        ring.extend(&chunk[..n]);
                        let excess = ring.len().saturating_sub(STDERR_TAIL_BYTES);
                        ring.drain(..excess);
                    }
                }
            }
        });
        StderrTail { ring, task }
    }
}
