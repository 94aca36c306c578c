//! One file of a pull, end to end: the cache lookup (a cached file is used without network), the
//! probe, hf-hub's download with progress (its errors and panics turned into [`PullFailure`]s),
//! the check that hf-hub wrote what the probe saw, the verification, and the removal of whatever
//! failed it.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiError, ApiRepo};
use hf_hub::Repo;

use super::names::check_relative;
use super::progress::Reporter;
use super::verify::verify;
use super::{bad, status_failure, HubClient, PullFailure, PullProgress};

/// One pull: the client, the repository at its revision, where progress goes.
pub(super) struct Session<'a> {
    pub(super) client: &'a HubClient,
    pub(super) repo: Repo,
    pub(super) on_progress: &'a (dyn Fn(&PullProgress) + Sync),
}

impl Session<'_> {
    /// One file: from the cache if present, else downloaded, checked and linked.
    pub(super) fn file(&self, name: &str) -> Result<PathBuf, PullFailure> {
        check_relative(name, "file name")?;
        let cache = &self.client.cache;
        if let Some(path) = cache.repo(self.repo.clone()).get(name) {
            let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            (self.on_progress)(&PullProgress {
                file: name.to_string(),
                done: len,
                total: len,
            });
            return Ok(path);
        }
        let api = self.client.api()?;
        let api = api.repo(self.repo.clone());
        let probe = self.client.probe(&api.url(name))?;
        let repo_dir = cache.path().join(self.repo.folder_name());
        let blob = repo_dir.join("blobs").join(&probe.etag);
        let pointer = repo_dir.join("snapshots").join(&probe.commit).join(name);
        // A link left dangling (its blob removed as bad while another link shared it) would
        // make hf-hub fail to link the fresh blob: it goes first.
        if pointer.is_symlink() && !pointer.exists() {
            remove(&pointer);
        }
        let got = self.download(&api, name, &blob)?;
        let same_blob = match (std::fs::canonicalize(&got), std::fs::canonicalize(&blob)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if got != pointer || !same_blob {
            // hf-hub used another etag or commit than the probe saw: what it wrote is unchecked.
            // Its blob and link are removed where they lie inside this repository's folder.
            let inside = |path: &Path| {
                path.starts_with(&repo_dir) && path.components().all(|c| c.as_os_str() != "..")
            };
            if inside(&got) {
                let blobs = std::fs::canonicalize(repo_dir.join("blobs"));
                if let (Ok(target), Ok(blobs)) = (std::fs::canonicalize(&got), blobs) {
                    if target.starts_with(&blobs) {
                        remove(&target);
                    }
                }
                remove(&got);
            }
            return Err(bad("the server's answers changed between two requests"));
        }
        if let Err(failure) = verify(&blob, &probe) {
            remove(&blob);
            remove(&pointer);
            return Err(failure);
        }
        Ok(pointer)
    }

    /// hf-hub's download with progress; its errors (and panics) turned into ours.
    fn download(&self, api: &ApiRepo, name: &str, blob: &Path) -> Result<PathBuf, PullFailure> {
        let in_callback = Cell::new(false);
        let reporter = Reporter::new(name, self.on_progress, &in_callback);
        let part = blob.with_extension("part");
        match catch_unwind(AssertUnwindSafe(|| {
            api.download_with_progress(name, reporter)
        })) {
            Ok(Ok(path)) => Ok(path),
            Ok(Err(e)) => Err(failure_of(e, &part)),
            // A panic of the caller's own callback is the caller's: let it go on.
            Err(payload) if in_callback.get() => resume_unwind(payload),
            Err(_) => Err(bad(
                "the hub client (hf-hub) panicked on the server's answer",
            )),
        }
    }
}

/// hf-hub's error as ours. `part` is the partial download of the file being fetched.
fn failure_of(e: ApiError, part: &Path) -> PullFailure {
    let partial = || std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    match e {
        ApiError::RequestError(e) => match *e {
            ureq::Error::Status(status, _) => status_failure(status),
            ureq::Error::Transport(t) => PullFailure::Transport {
                reason: t.to_string(),
                partial: partial(),
            },
        },
        ApiError::MissingHeader(h) => bad(format!("no {h} header")),
        ApiError::InvalidHeader(h) => bad(format!("bad {h} header")),
        ApiError::ParseIntError(e) => bad(format!("a size that is not a number ({e})")),
        ApiError::IoError(source) => {
            use std::io::ErrorKind as K;
            match source.kind() {
                K::StorageFull | K::PermissionDenied | K::ReadOnlyFilesystem | K::FileTooLarge => {
                    PullFailure::Io {
                        path: part.to_path_buf(),
                        source,
                    }
                }
                _ => PullFailure::Transport {
                    reason: source.to_string(),
                    partial: partial(),
                },
            }
        }
        ApiError::TooManyRetries(inner) => failure_of(*inner, part),
        ApiError::InvalidResume => {
            // Longer than the file: no resume can fix it, so the next pull starts over.
            remove(part);
            bad("the partial download was longer than the file; it was removed")
        }
        ApiError::LockAcquisition(_) => PullFailure::Busy,
        // Variants behind hf-hub features this build does not enable (native-tls).
        #[allow(unreachable_patterns)]
        other => bad(other.to_string()),
    }
}

/// Removes a file or link if it is there; a failure is logged (there is nothing better to do).
fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a bad download")
        }
    }
}
