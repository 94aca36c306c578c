//! A stand-in for the Hugging Face hub on 127.0.0.1:0, answering the requests hf-hub 0.4.3's
//! sync client makes (`src/api/sync.rs`): `GET {endpoint}/{repo}/resolve/{revision}/{file}`
//! with `Range: bytes=0-0` for the metadata, then with `Range: bytes={start}-` for the body.
//!
//! A git file is answered directly (`etag` = its git blob id, `x-repo-commit`,
//! `Content-Range`); an LFS file the way the hub does it, with a `302` carrying `x-repo-commit`,
//! `x-linked-etag` (its SHA-256) and `x-linked-size`, whose absolute `Location` points at
//! `/cdn/...` on the same server, which serves the bytes. Each file may carry [`Quirks`]: a
//! connection cut midway, a `Range` ignored, extra bytes, headers replaced or removed. Every
//! request is logged with the body bytes sent, so a test can say what crossed the wire.
#![allow(dead_code)] // each test uses a different part

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sha2::Digest;

/// The commit every revision resolves to.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// How a file's answers depart from the hub's.
#[derive(Debug, Clone, Default)]
pub struct Quirks {
    /// The next `.1` body downloads send `.0` bytes of the body (with the full
    /// `Content-Length`) and close the connection.
    pub cut_after: Option<(u64, usize)>,
    /// A download asking for `bytes=N-` with N > 0 gets the whole file with a plain 200.
    pub ignore_range: bool,
    /// Bytes sent after the content on a body download (the metadata still gives the size of
    /// the content alone).
    pub extra: Vec<u8>,
    /// Headers of the `resolve` answer replaced (`Some`) or removed (`None`).
    pub headers: Vec<(&'static str, Option<String>)>,
    /// `headers` and `status` apply from this `resolve` answer on (0: all of them), so that a
    /// first answer can be sane and a later one not.
    pub garble_from: usize,
    /// The `resolve` answer's status, in place of 302 (LFS) or 206/200 (git).
    pub status: Option<u16>,
}

/// A file of a repository.
#[derive(Debug, Clone)]
pub struct HubFile {
    pub content: Vec<u8>,
    /// What the hub announces (`x-linked-etag` for LFS, `etag` for git).
    pub etag: String,
    pub lfs: bool,
    pub quirks: Quirks,
    /// `resolve` answers given so far.
    pub resolved: usize,
}

impl HubFile {
    /// An LFS file: its etag is its SHA-256.
    pub fn lfs(content: Vec<u8>) -> Self {
        let etag = sha256_hex(&content);
        Self {
            content,
            etag,
            lfs: true,
            quirks: Quirks::default(),
            resolved: 0,
        }
    }

    /// A plain git file: its etag is its git blob id.
    pub fn git(content: Vec<u8>) -> Self {
        let etag = git_blob_id(&content);
        Self {
            content,
            etag,
            lfs: false,
            quirks: Quirks::default(),
            resolved: 0,
        }
    }

    pub fn with_etag(mut self, etag: impl Into<String>) -> Self {
        self.etag = etag.into();
        self
    }

    pub fn with_quirks(mut self, quirks: Quirks) -> Self {
        self.quirks = quirks;
        self
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

pub fn git_blob_id(bytes: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()));
    h.update(bytes);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One request the server answered.
#[derive(Debug, Clone)]
pub struct Logged {
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
    /// Body bytes written.
    pub sent: u64,
}

struct Inner {
    addr: SocketAddr,
    /// `owner/name/file` -> the file.
    files: Mutex<HashMap<String, HubFile>>,
    log: Mutex<Vec<Logged>>,
    stop: AtomicBool,
}

/// The server; stops (and waits for its accept loop) when dropped.
pub struct FakeHub {
    inner: Arc<Inner>,
    accept: Option<JoinHandle<()>>,
}

impl FakeHub {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let inner = Arc::new(Inner {
            addr: listener.local_addr().unwrap(),
            files: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let accept = {
            let inner = inner.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if inner.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let inner = inner.clone();
                    std::thread::spawn(move || {
                        let _ = serve(&inner, stream);
                    });
                }
            })
        };
        Self {
            inner,
            accept: Some(accept),
        }
    }

    /// What `HF_ENDPOINT` would be.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    pub fn add(&self, repo: &str, file: &str, hub_file: HubFile) {
        self.inner
            .files
            .lock()
            .unwrap()
            .insert(format!("{repo}/{file}"), hub_file);
    }

    /// Replaces a file's quirks (say, to stop cutting connections).
    pub fn set_quirks(&self, repo: &str, file: &str, quirks: Quirks) {
        let mut files = self.inner.files.lock().unwrap();
        files.get_mut(&format!("{repo}/{file}")).unwrap().quirks = quirks;
    }

    /// Every request answered so far.
    pub fn log(&self) -> Vec<Logged> {
        self.inner.log.lock().unwrap().clone()
    }

    pub fn clear_log(&self) {
        self.inner.log.lock().unwrap().clear();
    }

    /// Body bytes sent since the log was last cleared.
    pub fn bytes_sent(&self) -> u64 {
        self.log().iter().map(|l| l.sent).sum()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.inner.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn serve(inner: &Inner, stream: TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let answer = answer(inner, &path, range.as_deref());
    // Logged before the answer goes out: once the client has it, a test may read the log.
    inner.log.lock().unwrap().push(Logged {
        path,
        range,
        status: answer.status,
        sent: answer.body_to_send(&method).len() as u64,
    });
    answer.write(stream, &method)
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send only this many body bytes, then close.
    cut: Option<u64>,
}

impl Answer {
    fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            cut: None,
        }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// The body bytes this answer sends: none for `HEAD`, the first `cut` of them when cut.
    fn body_to_send(&self, method: &str) -> &[u8] {
        if method == "HEAD" {
            return &[];
        }
        let n = self.cut.unwrap_or(u64::MAX).min(self.body.len() as u64) as usize;
        &self.body[..n]
    }

    fn write(&self, mut stream: TcpStream, method: &str) -> std::io::Result<()> {
        let mut head = format!("HTTP/1.1 {} X\r\n", self.status);
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        stream.write_all(head.as_bytes())?;
        stream.write_all(self.body_to_send(method))?;
        stream.flush()?;
        let _ = stream.shutdown(Shutdown::Write);
        Ok(())
    }
}

fn answer(inner: &Inner, path: &str, range: Option<&str>) -> Answer {
    let mut files = inner.files.lock().unwrap();
    if let Some(key) = path.strip_prefix("/cdn/") {
        return match files.get_mut(key) {
            Some(file) => bytes(file, range),
            None => Answer::new(404),
        };
    }
    let Some((repo, rest)) = path.trim_start_matches('/').split_once("/resolve/") else {
        return Answer::new(404);
    };
    let Some((revision, name)) = rest.split_once('/') else {
        return Answer::new(404);
    };
    let key = format!("{repo}/{name}");
    let file = match files.get_mut(&key) {
        Some(file) if revision == "main" || revision == COMMIT => file,
        _ => {
            return Answer::new(404)
                .header("x-error-code", "EntryNotFound")
                .header("x-repo-commit", COMMIT)
        }
    };
    let mut answer = if file.lfs {
        Answer::new(302)
            .header("Location", format!("http://{}/cdn/{key}", inner.addr))
            .header("x-linked-etag", format!("\"{}\"", file.etag))
            .header("x-linked-size", file.content.len().to_string())
            .header("etag", "\"0000000000000000000000000000000000000000\"")
    } else {
        bytes(file, range).header("etag", format!("\"{}\"", file.etag))
    };
    answer = answer.header("x-repo-commit", COMMIT);
    file.resolved += 1;
    if file.resolved <= file.quirks.garble_from {
        return answer;
    }
    if let Some(status) = file.quirks.status {
        answer.status = status;
    }
    for (name, value) in &file.quirks.headers {
        answer
            .headers
            .retain(|(have, _)| !have.eq_ignore_ascii_case(name));
        if let Some(value) = value {
            answer.headers.push((name.to_string(), value.clone()));
        }
    }
    answer
}

/// The file's bytes for `range` (`bytes=0-0`: the metadata answer; `bytes=N-`: a download).
fn bytes(file: &mut HubFile, range: Option<&str>) -> Answer {
    let len = file.content.len() as u64;
    if range == Some("bytes=0-0") {
        let mut answer = Answer::new(206).header("Content-Range", format!("bytes 0-0/{len}"));
        answer.body = file.content[..1.min(file.content.len())].to_vec();
        return answer;
    }
    let start = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<u64>().ok());
    let mut answer = match start {
        Some(start) if start > 0 && file.quirks.ignore_range => {
            let mut a = Answer::new(200);
            a.body = file.content.clone();
            a
        }
        Some(start) if start < len => {
            let mut a = Answer::new(206)
                .header("Content-Range", format!("bytes {start}-{}/{len}", len - 1));
            a.body = file.content[start as usize..].to_vec();
            a
        }
        Some(_) => {
            return Answer::new(416).header("Content-Range", format!("bytes */{len}"));
        }
        None => {
            let mut a = Answer::new(200);
            a.body = file.content.clone();
            a
        }
    };
    answer.body.extend_from_slice(&file.quirks.extra);
    if let Some((after, times)) = file.quirks.cut_after {
        if times > 0 {
            answer.cut = Some(after);
            file.quirks.cut_after = (times > 1).then_some((after, times - 1));
        }
    }
    answer
}
