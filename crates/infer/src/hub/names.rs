//! What a name may be before it becomes part of a URL or a cache path: the repository id, the
//! revision and file names a request carries, and the etag and commit the server answers, which
//! hf-hub 0.4.3 joins into cache paths unchecked.

use super::{bad, PullFailure};

/// A single path segment the server names (an etag, a commit) and hf-hub joins into the cache.
pub(super) fn check_name(value: &str, what: &'static str) -> Result<(), PullFailure> {
    let fine = !value.is_empty()
        && value.len() <= 128
        && value != "."
        && value != ".."
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fine {
        Ok(())
    } else {
        Err(bad(format!("{what} {value:?} is not a plain name")))
    }
}

/// `owner/name` or `name`, each part a plain name.
pub(super) fn check_repo_id(id: &str) -> Result<(), PullFailure> {
    let parts: Vec<&str> = id.split('/').collect();
    let fine = parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && *p != "."
                && *p != ".."
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        });
    if fine {
        Ok(())
    } else {
        Err(PullFailure::InvalidRequest {
            what: "repository",
            reason: format!("{id:?} is not owner/name"),
        })
    }
}

/// A relative path inside the repository (a file name, or a revision, which may hold `/`):
/// no empty, `.` or `..` part, nothing a URL or a path would read differently.
pub(super) fn check_relative(path: &str, what: &'static str) -> Result<(), PullFailure> {
    let fine = !path.is_empty()
        && path.len() <= 1024
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
        && !path
            .chars()
            .any(|c| c.is_control() || matches!(c, '\\' | '?' | '#' | '%' | ':'));
    if fine {
        Ok(())
    } else {
        Err(PullFailure::InvalidRequest {
            what,
            reason: format!("{path:?} is not a relative path inside the repository"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_the_cache_are_refused() {
        for name in [
            "../x",
            "a/../b",
            "/etc/passwd",
            "a//b",
            "",
            "a\\b",
            "a?b",
            ".",
        ] {
            assert!(check_relative(name, "file").is_err(), "{name:?}");
        }
        for name in ["model.gguf", "sub/dir/model-00001-of-00002.safetensors"] {
            assert!(check_relative(name, "file").is_ok(), "{name:?}");
        }
        for etag in ["../../x", "a/b", "", "..", "a b"] {
            assert!(check_name(etag, "ETag").is_err(), "{etag:?}");
        }
        assert!(check_name(&"f".repeat(64), "ETag").is_ok());
        for id in ["a/b/c", "../x", "a/", "/a", "a b/c"] {
            assert!(check_repo_id(id).is_err(), "{id:?}");
        }
        assert!(check_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct").is_ok());
        assert!(check_repo_id("gpt2").is_ok());
    }
}
