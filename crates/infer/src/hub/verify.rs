//! Checksum verification of a downloaded blob against what the probe announced: its size, then
//! its digest when the etag is one, by its shape: 64 hex is an LFS file's SHA-256, 40 hex a git
//! file's blob id, `sha1("blob <len>\0" + content)`. An etag of another shape (a mirror's own)
//! is not a digest we know: such a file is checked for size only.

use std::io::Read;
use std::path::Path;

use sha2::Digest;

use super::probe::Probe;
use super::PullFailure;

/// The digest an etag is, by its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DigestKind {
    /// 64 hex: an LFS file's SHA-256.
    Sha256,
    /// 40 hex: a git file's blob id, `sha1("blob <len>\0" + content)`.
    GitSha1,
}

fn digest_kind(etag: &str) -> Option<DigestKind> {
    if !etag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match etag.len() {
        64 => Some(DigestKind::Sha256),
        40 => Some(DigestKind::GitSha1),
        _ => None,
    }
}

/// The downloaded blob against the probe: its size, then its digest when the etag is one.
pub(super) fn verify(blob: &Path, probe: &Probe) -> Result<(), PullFailure> {
    let io = |source| PullFailure::Io {
        path: blob.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(blob).map_err(io)?.len();
    if len != probe.size {
        return Err(PullFailure::WrongSize {
            expected: probe.size,
            got: len,
        });
    }
    let Some(kind) = digest_kind(&probe.etag) else {
        tracing::debug!(etag = %probe.etag, "etag is not a digest; only the size was checked");
        return Ok(());
    };
    let actual = file_digest(blob, kind).map_err(io)?;
    let expected = probe.etag.to_ascii_lowercase();
    if actual != expected {
        return Err(PullFailure::Checksum {
            algorithm: match kind {
                DigestKind::Sha256 => "sha256",
                DigestKind::GitSha1 => "git blob sha1",
            },
            expected,
            actual,
        });
    }
    Ok(())
}

/// A file's digest of `kind`, lowercase hex.
fn file_digest(path: &Path, kind: DigestKind) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    match kind {
        DigestKind::Sha256 => hash_reader(sha2::Sha256::new(), &mut file),
        DigestKind::GitSha1 => {
            let mut hasher = sha1::Sha1::new();
            hasher.update(format!("blob {}\0", file.metadata()?.len()));
            hash_reader(hasher, &mut file)
        }
    }
}

fn hash_reader<D: Digest>(mut hasher: D, reader: &mut impl Read) -> std::io::Result<String> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_digests_by_their_shape() {
        assert_eq!(digest_kind(&"a".repeat(64)), Some(DigestKind::Sha256));
        assert_eq!(digest_kind(&"0".repeat(40)), Some(DigestKind::GitSha1));
        assert_eq!(digest_kind("W/abc"), None);
        assert_eq!(digest_kind(&"g".repeat(64)), None);
        assert_eq!(digest_kind(&"a".repeat(32)), None);
    }

    #[test]
    fn a_git_file_digest_is_its_blob_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"Hello, World!").unwrap();
        // `printf 'Hello, World!' | git hash-object --stdin`
        assert_eq!(
            file_digest(&path, DigestKind::GitSha1).unwrap(),
            "b45ef6fec89518d314f546fd6c3025367b721684"
        );
        assert_eq!(
            file_digest(&path, DigestKind::Sha256).unwrap(),
            "dffd6021bb2bd5b0af676290809ec3a53191dd81c7f70a4b28688a362182986f"
        );
    }
}
