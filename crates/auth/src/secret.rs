//! Secrets kept in the data dir: created once with 0600 permissions, then reused.

use crate::Error;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

const SECRET_BYTES: usize = 32;

/// A new secret: 32 random bytes from the OS, in hex.
pub fn new_secret() -> String {
    let mut bytes = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex(&bytes)
}

/// Reads the hex-encoded secret at `path`, or creates it (32 random bytes, mode 0600) when the
/// file does not exist yet. Returns the hex text, which is also what the key material is made of.
pub fn load_or_create_secret(path: &Path) -> Result<String, Error> {
    match std::fs::read_to_string(path) {
        Ok(text) => return parse(path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    }
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let hex = new_secret();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(mut f) => {
            f.write_all(format!("{hex}\n").as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(hex)
        }
        // Another process created it between our read and our create: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(path).map_err(io)?;
            parse(path, &text)
        }
        Err(e) => Err(io(e)),
    }
}

fn parse(path: &Path, text: &str) -> Result<String, Error> {
    let text = text.trim();
    let bad = |reason| Error::BadSecret {
        path: path.to_path_buf(),
        reason,
    };
    if text.len() < SECRET_BYTES * 2 {
        return Err(bad("shorter than 64 hex digits"));
    }
    if !text.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad("not hex"));
    }
    Ok(text.to_string())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A stable id for an identity-provider token: the SHA-256 of its text, in hex. Used to tie
/// service tokens to the identity token they were minted from without storing the token itself.
pub fn token_id(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_created_private_once_and_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key.secret");
        let first = load_or_create_secret(&path).unwrap();
        let second = load_or_create_secret(&path).unwrap();
        assert_eq!(first, second);
        assert_eq!(first.len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_truncated_secret_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, "abcd").unwrap();
        assert!(matches!(
            load_or_create_secret(&path),
            Err(Error::BadSecret { .. })
        ));
    }
}
