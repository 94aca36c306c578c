//! Tesseract 5 as a child process: one page part in (PGM on stdin), its words out (TSV on
//! stdout), killed at the conversion's deadline. The child inherits the worker's memory limit
//! and process group, so whatever ends the worker ends it too.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::limits::Ctx;

use super::raster::Gray;

/// How often a running child is checked on.
const POLL: Duration = Duration::from_millis(5);
/// The most output kept from a child (a page's TSV is tens of kilobytes).
const MAX_OUTPUT_BYTES: usize = 16 << 20;

/// The OCR engine found on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OcrEngine {
    /// The program run (`tesseract` on the `PATH`).
    pub program: PathBuf,
    /// Its version line (`tesseract 5.3.0`).
    pub version: String,
    /// The language models it has (`eng`, `fra`, ...; `osd` left out).
    pub languages: Vec<String>,
}

impl OcrEngine {
    /// The engine on this machine, looked for once per process; `None` without one.
    pub fn installed() -> Option<&'static OcrEngine> {
        static FOUND: OnceLock<Option<OcrEngine>> = OnceLock::new();
        FOUND.get_or_init(|| OcrEngine::find("tesseract")).as_ref()
    }

    fn find(program: &str) -> Option<OcrEngine> {
        let run = |arg: &str| {
            Command::new(program)
                .arg(arg)
                .stdin(Stdio::null())
                .output()
                .ok()
        };
        let version = run("--version")?;
        let version = String::from_utf8_lossy(&version.stdout)
            .lines()
            .next()?
            .trim()
            .to_string();
        let list = run("--list-langs")?;
        let languages = String::from_utf8_lossy(&list.stdout)
            .lines()
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty() && *l != "osd")
            .map(str::to_string)
            .collect();
        Some(OcrEngine {
            program: PathBuf::from(program),
            version,
            languages,
        })
    }

    /// Whether every model `languages` names is here.
    pub fn has(&self, languages: &super::Languages) -> bool {
        languages
            .parts()
            .all(|l| self.languages.iter().any(|h| h == l))
    }

    /// The words of `page` as Tesseract's TSV (page segmentation mode 3: automatic layout).
    pub(crate) fn words(&self, ctx: &Ctx<'_>, page: &Gray, languages: &str) -> Result<String> {
        let args = [
            "stdin",
            "stdout",
            "-l",
            languages,
            "--psm",
            "3",
            "-c",
            "tessedit_do_invert=0",
            "tsv",
        ];
        self.run(ctx, page, &args)
    }

    /// How far `page` should be turned clockwise, in quarter turns, by orientation detection;
    /// `None` when it cannot tell.
    pub(crate) fn orientation(&self, ctx: &Ctx<'_>, page: &Gray) -> Result<Option<u32>> {
        let out = match self.run(ctx, page, &["stdin", "stdout", "--psm", "0"]) {
            Ok(out) => out,
            Err(Error::TimedOut { limit }) => return Err(Error::TimedOut { limit }),
            // Too few characters to tell is an error exit; it means "leave it".
            Err(_) => return Ok(None),
        };
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        match (field("Rotate:"), field("Orientation confidence:")) {
            (Some(rotate), Some(confidence)) if confidence >= 1.0 => {
                Ok(Some(((rotate as i64).rem_euclid(360) / 90) as u32))
            }
            _ => Ok(None),
        }
    }

    fn run(&self, ctx: &Ctx<'_>, page: &Gray, args: &[&str]) -> Result<String> {
        ctx.check_time()?;
        let mut child = Command::new(&self.program)
            .args(args)
            // One thread each: the pages' parts run side by side instead (the engine gains
            // nothing from a second thread on one part).
            .env("OMP_THREAD_LIMIT", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Ocr {
                reason: format!("cannot run {}: {e}", self.program.display()),
            })?;
        let finished = std::thread::scope(|scope| {
            let stdin = child.stdin.take();
            let feed = scope.spawn(move || {
                if let Some(mut stdin) = stdin {
                    // A child that exits early closes the pipe; its status says why.
                    let _ = stdin.write_all(&page.pgm());
                }
            });
            let stdout = child.stdout.take();
            let read = scope.spawn(move || drain(stdout));
            let stderr = child.stderr.take();
            let errors = scope.spawn(move || drain(stderr));
            let status = wait(ctx, &mut child);
            let _ = feed.join();
            let out = read.join().unwrap_or_default();
            let err = errors.join().unwrap_or_default();
            status.map(|status| (status, out, err))
        });
        let (status, out, err) = finished?;
        if !status.success() {
            let err = String::from_utf8_lossy(&err);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(Error::Ocr {
                reason: format!("tesseract {status}: {}", last.trim()),
            });
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// Waits for `child` until the conversion's deadline, killing it then.
fn wait(ctx: &Ctx<'_>, child: &mut Child) -> Result<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() > ctx.deadline() => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::TimedOut {
                    limit: ctx.limits().time_limit,
                });
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Ocr {
                    reason: format!("waiting for tesseract: {e}"),
                });
            }
        }
    }
}

/// Everything a pipe gives until it closes, up to [`MAX_OUTPUT_BYTES`] kept.
fn drain(pipe: Option<impl Read>) -> Vec<u8> {
    let Some(mut pipe) = pipe else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while let Ok(n) = pipe.read(&mut chunk) {
        if n == 0 {
            break;
        }
        if out.len() < MAX_OUTPUT_BYTES {
            out.extend_from_slice(&chunk[..n]);
        }
    }
    out
}
