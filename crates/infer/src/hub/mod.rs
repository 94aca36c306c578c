//! Hugging Face hub access, cache-first: a file already in the local hub cache is used without
//! any network; otherwise it is downloaded through `hf_hub::api::sync` into the same cache.
//!
//! [`pull`] (and [`HubClient::pull`]) is what the server calls, from a blocking thread, to fetch
//! a model on request: one file (a `.gguf`) or a safetensors snapshot, with progress, resumable
//! and checked:
//!
//! - **Resumable.** hf-hub writes into `blobs/<etag>.part` and, when that file exists, asks for
//!   `Range: bytes=<len>-`; an interrupted pull leaves it, the next pull continues after it.
//! - **Checked.** The blob's name is the hub's etag: for an LFS file (`x-linked-etag`, 64 hex)
//!   the SHA-256 of the content, for a plain git file (`etag`, 40 hex) the git blob id,
//!   `sha1("blob <len>\0" + content)` (what `huggingface_hub` verifies them against). After a
//!   download the blob's size and digest are compared with what the hub announced; on a mismatch
//!   the blob and its snapshot link are removed and [`PullFailure::WrongSize`] or
//!   [`PullFailure::Checksum`] is returned. An etag of another shape (a mirror's own) is not a
//!   digest we know: such a file is checked for size only.
//! - **Guarded.** Before hf-hub touches the disk a probe asks the same metadata question hf-hub
//!   will ask (`GET` with `Range: bytes=0-0`, relative redirects followed, then the absolute one)
//!   and refuses answers hf-hub 0.4.3 would mishandle: an etag or commit that is not a plain
//!   name (hf-hub joins both into cache paths unchecked), a redirect without a usable
//!   `Location` (it unwraps it), endless relative redirects (it follows them forever), a
//!   missing or non-numeric `Content-Range`. A panic inside hf-hub is still caught and answered
//!   as [`PullFailure::BadResponse`]. What the probe cannot stop is a server that answers the
//!   probe sanely and hf-hub's own request differently: the mismatch is then reported, but a
//!   file hf-hub already wrote under a hostile etag is beyond our reach.
//!
//! Cache-first, like the loading path always was: a file present under the revision's cached
//! commit is returned without asking whether the branch moved on. A snapshot's optional files
//! the hub does not have (say `tokenizer_config.json`) are asked about on every pull.
//!
//! Two pulls of the same file at once are serialised by hf-hub's lock file; the second waits a
//! few seconds and then fails with [`PullFailure::Busy`]. hf-hub's sync client sets no read
//! timeout: a server that stalls mid-body holds the calling thread until the connection drops.
//!
//! The parts, one concept each: `names` (what a repository, revision, file, etag or commit may
//! be before it becomes a URL or a cache path), `probe` (the guarded metadata request),
//! `session` (one file: cache lookup, hf-hub's download, its errors, the cleanup), `verify`
//! (size and digest of a downloaded blob), `progress` (hf-hub's progress, throttled) and
//! `snapshot` (which files make a safetensors snapshot).

mod names;
mod probe;
mod progress;
mod session;
mod snapshot;
mod verify;

use std::fmt;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use crate::Error;
use names::{check_relative, check_repo_id};
use session::Session;

/// The variable hf-hub's `ApiBuilder::from_env` reads for the hub's address.
const HF_ENDPOINT: &str = "HF_ENDPOINT";
const HF_HOME: &str = "HF_HOME";
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// What to pull: one file of a repository, or a safetensors snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubPull {
    /// `owner/name` (or `name`), a model repository.
    pub repo: String,
    /// A branch, tag or commit; `None` is `main`.
    pub revision: Option<String>,
    /// One file (typically a `.gguf`); `None` pulls a safetensors snapshot: `config.json`, the
    /// tokenizer files when the repository has them, and `model.safetensors` or its index with
    /// every shard the index names.
    pub file: Option<String>,
}

impl HubPull {
    /// One file of `repo` at `main`.
    pub fn file(repo: impl Into<String>, file: impl Into<String>) -> Self {
        Self {
            repo: repo.into(),
            revision: None,
            file: Some(file.into()),
        }
    }

    /// A safetensors snapshot of `repo` at `main`.
    pub fn snapshot(repo: impl Into<String>) -> Self {
        Self {
            repo: repo.into(),
            revision: None,
            file: None,
        }
    }

    /// The same pull at another revision.
    pub fn at_revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = Some(revision.into());
        self
    }
}

/// Progress of one file of a pull. `done` and `total` are bytes of `file`, the file being
/// fetched now: a snapshot pull reports its files one after the other, each from 0 (or from
/// where a resumed download starts) up to its size. A report comes each time 256 KiB or 1% of
/// the file (whichever is larger) more have arrived, and when the file is complete; a file found
/// in the cache is reported once, with `done == total`. The digest check after a download (a few
/// seconds for gigabytes) reports nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullProgress {
    pub file: String,
    pub done: u64,
    pub total: u64,
}

/// Why a file could not be pulled; carried by [`Error::Pull`] with the repository and file.
#[derive(Debug, thiserror::Error)]
pub enum PullFailure {
    /// The request names something that cannot be a repository, revision or file.
    #[error("invalid {what}: {reason}")]
    InvalidRequest { what: &'static str, reason: String },
    /// The hub has no such repository, revision or file (HTTP 404).
    #[error("not found on the hub")]
    NotFound,
    /// The hub refused (401/403): a private or gated repository (the hub also answers 401 for
    /// one that does not exist). A token in `$HF_HOME/token` may be needed.
    #[error("the hub refused access (HTTP {status}): the repository is private, gated or does not exist")]
    Denied { status: u16 },
    /// Any other HTTP error status.
    #[error("the hub answered HTTP {status}")]
    Status { status: u16 },
    /// The connection failed or was cut. `partial` bytes of the file are kept on disk; the next
    /// pull resumes after them.
    #[error("connection failed: {reason} ({partial} bytes kept for the next pull to resume from)")]
    Transport { reason: String, partial: u64 },
    /// The server's answer is not one the hub gives (missing or malformed headers, a redirect
    /// without a target, an answer that changed between two requests).
    #[error("unusable answer from the hub: {reason}")]
    BadResponse { reason: String },
    /// The downloaded file is not the size the hub announced; it was removed.
    #[error("the hub announced {expected} bytes but sent {got}; the download was removed")]
    WrongSize { expected: u64, got: u64 },
    /// The downloaded file's digest is not the one the hub announced; it was removed.
    #[error("{algorithm} mismatch: the hub announced {expected}, the download has {actual}; it was removed")]
    Checksum {
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    /// Another pull of the same file holds its lock.
    #[error("another pull of this file is in progress")]
    Busy,
    /// `model.safetensors.index.json` could not be read as an index.
    #[error("bad safetensors index: {reason}")]
    BadIndex { reason: String },
    /// The local disk (the hub cache) failed us.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The hub client: where the hub is and where its cache lives.
#[derive(Clone)]
pub struct HubClient {
    endpoint: String,
    cache: Cache,
    token: Option<String>,
    retries: usize,
}

impl fmt::Debug for HubClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubClient")
            .field("endpoint", &self.endpoint)
            .field("cache", self.cache.path())
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("retries", &self.retries)
            .finish()
    }
}

impl HubClient {
    /// The hub and cache hf-hub's `ApiBuilder::from_env` would use, from the variables `var`
    /// gives (an entry point hands in its process environment): `HF_ENDPOINT` (default
    /// `https://huggingface.co`), the cache under `HF_HOME` (default
    /// `~/.cache/huggingface/hub`) and the token saved beside it.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let cache = match var(HF_HOME) {
            Some(home) => Cache::new(PathBuf::from(home).join("hub")),
            None => Cache::default(),
        };
        let endpoint = var(HF_ENDPOINT).unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        Self::with_cache(endpoint, cache)
    }

    /// An explicit hub address and cache directory (the token is read from `<cache_dir>/../token`,
    /// as hf-hub does). Nothing is read from the environment.
    pub fn new(endpoint: impl Into<String>, cache_dir: impl Into<PathBuf>) -> Self {
        Self::with_cache(endpoint.into(), Cache::new(cache_dir.into()))
    }

    fn with_cache(endpoint: String, cache: Cache) -> Self {
        let token = cache.token();
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            cache,
            token,
            retries: 0,
        }
    }

    /// Another cache directory; the token stays (hf-hub's `with_cache_dir` does the same).
    pub fn with_cache_dir(mut self, cache_dir: impl Into<PathBuf>) -> Self {
        self.cache = Cache::new(cache_dir.into());
        self
    }

    /// How many times hf-hub retries a failed transfer within one pull, each resuming after the
    /// bytes already written (default 0: the caller pulls again, which resumes too). One hf-hub
    /// 0.4.3 flaw: a retry after an attempt that resumed a partial file but wrote nothing asks
    /// for the whole file again and appends it; the size check then removes the download.
    pub fn with_retries(mut self, retries: usize) -> Self {
        self.retries = retries;
        self
    }

    /// The hub's address.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The hub cache directory.
    pub fn cache_dir(&self) -> &Path {
        self.cache.path()
    }

    /// Pulls `req` into the cache and returns the local path: the file when `req.file` is set,
    /// otherwise the snapshot folder (the folder of `config.json`). Files already cached are
    /// used as they are, without network. Blocking: call it from a blocking thread.
    pub fn pull(
        &self,
        req: &HubPull,
        on_progress: &(dyn Fn(&PullProgress) + Sync),
    ) -> Result<PathBuf, Error> {
        let fail = |file: &str, failure: PullFailure| Error::Pull {
            repo: req.repo.clone(),
            file: file.to_string(),
            failure,
        };
        check_repo_id(&req.repo).map_err(|f| fail("", f))?;
        if let Some(revision) = &req.revision {
            check_relative(revision, "revision").map_err(|f| fail("", f))?;
        }
        let repo = Repo::with_revision(
            req.repo.clone(),
            RepoType::Model,
            req.revision.clone().unwrap_or_else(|| "main".to_string()),
        );
        let session = Session {
            client: self,
            repo,
            on_progress,
        };
        let get = |name: &str| session.file(name).map_err(|f| fail(name, f));
        if let Some(name) = &req.file {
            return get(name);
        }
        snapshot::walk(&get, &fail)
    }

    /// An hf-hub API with this client's settings; its own progress bar off (we report).
    fn api(&self) -> Result<hf_hub::api::sync::Api, PullFailure> {
        ApiBuilder::from_cache(self.cache.clone())
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_retries(self.retries)
            .with_progress(false)
            .build()
            .map_err(|e| PullFailure::BadResponse {
                reason: format!("cannot build the hub client: {e}"),
            })
    }
}

/// Resolves a hub source to a local path: the `.gguf` file when `file` is given, otherwise the
/// snapshot folder of a safetensors checkpoint (config.json, tokenizer files, weights).
pub(crate) fn fetch(
    id: &str,
    file: Option<&str>,
    revision: Option<&str>,
) -> Result<PathBuf, Error> {
    let req = HubPull {
        repo: id.to_string(),
        revision: revision.map(String::from),
        file: file.map(String::from),
    };
    // Loading a model straight from its config (tools and benchmarks) reads no environment of
    // its own: hf-hub's cache (`HF_HOME`) and the default hub, as before pulls existed. The
    // server pulls first, with the client its entry point made.
    HubClient::with_cache(DEFAULT_ENDPOINT.to_string(), Cache::from_env()).pull(&req, &|_| {})
}

fn status_failure(status: u16) -> PullFailure {
    match status {
        404 => PullFailure::NotFound,
        401 | 403 => PullFailure::Denied { status },
        _ => PullFailure::Status { status },
    }
}

fn bad(reason: impl Into<String>) -> PullFailure {
    PullFailure::BadResponse {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn repo(id: &str) -> Repo {
        Repo::with_revision(id.to_string(), RepoType::Model, "main".to_string())
    }

    #[test]
    fn a_cached_file_is_found_without_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let r = repo("someone/tiny");
        let snapshot = dir
            .path()
            .join(r.folder_name())
            .join("snapshots")
            .join("abc123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(snapshot.join("model.gguf"), b"GGUF").unwrap();
        Cache::new(dir.path().to_path_buf())
            .repo(r)
            .create_ref("abc123")
            .unwrap();
        // Port 9 (discard) on localhost: nothing there answers, so any request would fail.
        let client = HubClient::new("http://127.0.0.1:9", dir.path());
        let seen = Mutex::new(Vec::new());
        let got = client
            .pull(&HubPull::file("someone/tiny", "model.gguf"), &|p| {
                seen.lock().unwrap().push(p.clone())
            })
            .unwrap();
        assert_eq!(got, snapshot.join("model.gguf"));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![PullProgress {
                file: "model.gguf".into(),
                done: 4,
                total: 4
            }]
        );
    }

    #[test]
    fn the_variables_give_the_hub_and_the_cache_hf_hub_would_use() {
        let given = HubClient::from_vars(|k| match k {
            "HF_ENDPOINT" => Some("http://127.0.0.1:9/".into()),
            "HF_HOME" => Some("/srv/hf".into()),
            _ => None,
        });
        assert_eq!(given.endpoint(), "http://127.0.0.1:9");
        assert_eq!(given.cache_dir(), Path::new("/srv/hf/hub"));
        let defaults = HubClient::from_vars(|_| None);
        assert_eq!(defaults.endpoint(), DEFAULT_ENDPOINT);
        assert_eq!(defaults.cache_dir(), Cache::default().path());
    }
}
