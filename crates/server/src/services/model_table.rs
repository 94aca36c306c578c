//! The model table (`models.toml`) as a file: read and parsed once per service into that
//! service's view of it (`[text.*]` for completion, `[image.*]` for images), with one error type
//! that names the file, the section, the model and the key.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// What is wrong with the model table.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: [{section}.\"{id}\"] {message}")]
    Invalid {
        path: PathBuf,
        section: &'static str,
        id: String,
        message: String,
    },
    #[error("{path}: no [{section}.\"...\"] entry")]
    Empty {
        path: PathBuf,
        section: &'static str,
    },
}

/// Reads the table at `path`.
pub fn read(path: &Path) -> Result<String, TableError> {
    std::fs::read_to_string(path).map_err(|source| TableError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses table text (read from `path`) into a service's view of it.
pub fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, TableError> {
    toml::from_str(text).map_err(|e| TableError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// `p` as written in the table at `path`: relative paths are relative to the table's folder.
pub fn relative_to(path: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        path.parent().unwrap_or(Path::new(".")).join(p)
    }
}
