//! What the hub pull tests (hub_pull.rs, hub_hostile.rs) share besides the server: the
//! repository they pull, content that looks like a GGUF file, a look at what a pull left in the
//! cache (hf-hub's layout: `models--owner--name/{blobs,snapshots}`), the failure inside
//! `Error::Pull`, and a progress sink that keeps every report.
//!
//! Included with `#[path]` next to `hub_server.rs`, which the including file declares as
//! `mod hub_server` (for [`COMMIT`]).
#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hearth_infer::hub::{PullFailure, PullProgress};
use hearth_infer::Error;

use super::hub_server::COMMIT;

pub const REPO: &str = "someone/tiny-gguf";

/// Deterministic bytes that start like a GGUF file.
pub fn gguf_like(len: usize) -> Vec<u8> {
    let mut bytes = b"GGUF\x03\x00\x00\x00".to_vec();
    let mut x: u32 = 0x9e37_79b9;
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.push(x as u8);
    }
    bytes.truncate(len);
    bytes
}

pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// The snapshot link of `file`.
pub fn pointer(cache: &Path, repo: &str, file: &str) -> PathBuf {
    repo_dir(cache, repo)
        .join("snapshots")
        .join(COMMIT)
        .join(file)
}

/// Blobs that claim to be complete (not hf-hub's `.part` and `.lock` files).
pub fn complete_blobs(cache: &Path, repo: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(repo_dir(cache, repo).join("blobs")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            !matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("part" | "lock")
            )
        })
        .collect()
}

/// Every file or link under the repository's `snapshots/`.
pub fn snapshot_entries(cache: &Path, repo: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo_dir(cache, repo).join("snapshots"), &mut out);
    out
}

pub fn part_len(cache: &Path, repo: &str, etag: &str) -> Option<u64> {
    let part = repo_dir(cache, repo)
        .join("blobs")
        .join(format!("{etag}.part"));
    std::fs::metadata(part).ok().map(|m| m.len())
}

/// The pull failure inside `Error::Pull`, checking it names `file`.
pub fn failure(result: Result<PathBuf, Error>, file: &str) -> PullFailure {
    match result {
        Ok(path) => panic!("pulled {} when a failure was expected", path.display()),
        Err(Error::Pull {
            file: named,
            failure,
            ..
        }) => {
            assert_eq!(named, file, "the error names the file");
            failure
        }
        Err(other) => panic!("not a pull error: {other}"),
    }
}

/// A progress sink that keeps every report.
#[derive(Default)]
pub struct Reports(Mutex<Vec<PullProgress>>);

impl Reports {
    pub fn sink(&self) -> impl Fn(&PullProgress) + Sync + '_ {
        |p: &PullProgress| self.0.lock().unwrap().push(p.clone())
    }

    pub fn take(&self) -> Vec<PullProgress> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}
