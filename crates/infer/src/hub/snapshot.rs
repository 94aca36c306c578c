//! The snapshot (safetensors) walk: which files make a snapshot (`config.json`, the tokenizer
//! files when the repository has them, `model.safetensors` or its index with every shard the
//! index names) and which of them it can do without.

use std::path::{Path, PathBuf};

use super::PullFailure;
use crate::Error;

/// Pulls a snapshot's files one after the other through `get` and returns the snapshot folder
/// (the folder of `config.json`); `fail` names the file a failure belongs to.
pub(super) fn walk(
    get: &dyn Fn(&str) -> Result<PathBuf, Error>,
    fail: &dyn Fn(&str, PullFailure) -> Error,
) -> Result<PathBuf, Error> {
    let config = get("config.json")?;
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        optional(get(name), name)?;
    }
    match optional(
        get("model.safetensors.index.json"),
        "model.safetensors.index.json",
    )? {
        Some(index) => {
            let name = "model.safetensors.index.json";
            for shard in shards(&index).map_err(|f| fail(name, f))? {
                get(&shard)?;
            }
        }
        None => {
            get("model.safetensors")?;
        }
    }
    Ok(config.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// A file the snapshot can do without: `None` when the hub has no such file or cannot be
/// reached (an offline start with a cached snapshot), the error when the file is there but
/// wrong.
fn optional(got: Result<PathBuf, Error>, name: &str) -> Result<Option<PathBuf>, Error> {
    match got {
        Ok(path) => Ok(Some(path)),
        Err(Error::Pull {
            failure: failure @ (PullFailure::NotFound | PullFailure::Transport { .. }),
            ..
        }) => {
            tracing::debug!(error = %failure, file = name, "optional hub file unavailable");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The shard names a `model.safetensors.index.json` lists, sorted and each once.
fn shards(index: &Path) -> Result<Vec<String>, PullFailure> {
    let text = std::fs::read_to_string(index).map_err(|source| PullFailure::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let index: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| PullFailure::BadIndex {
            reason: e.to_string(),
        })?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| PullFailure::BadIndex {
            reason: "no weight_map object".to_string(),
        })?;
    let mut shards = Vec::new();
    for value in map.values() {
        let name = value.as_str().ok_or_else(|| PullFailure::BadIndex {
            reason: format!("a weight_map value is not a file name: {value}"),
        })?;
        shards.push(name.to_string());
    }
    shards.sort();
    shards.dedup();
    Ok(shards)
}
