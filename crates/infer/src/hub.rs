//! Hugging Face hub access, cache-first: a file already in the local hub cache is used without
//! any network; otherwise it is downloaded through `hf_hub::api::sync`.

use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo, RepoType};

use crate::Error;

fn repo(id: &str, revision: Option<&str>) -> Repo {
    Repo::with_revision(
        id.to_string(),
        RepoType::Model,
        revision.unwrap_or("main").to_string(),
    )
}

/// One file of a repository: from the cache if present, else from the hub.
fn get(cache: &Cache, id: &str, revision: Option<&str>, name: &str) -> Result<PathBuf, Error> {
    if let Some(path) = cache.repo(repo(id, revision)).get(name) {
        return Ok(path);
    }
    let api = hf_hub::api::sync::ApiBuilder::from_cache(cache.clone())
        .with_progress(false)
        .build()
        .map_err(|e| Error::Hub(e.to_string()))?;
    api.repo(repo(id, revision)).get(name).map_err(|e| {
        Error::Hub(format!(
            "{id}/{name} is not in the local cache and downloading it failed: {e}"
        ))
    })
}

/// Resolves a hub source to a local path: the `.gguf` file when `file` is given, otherwise the
/// snapshot folder of a safetensors checkpoint (config.json, tokenizer files, weights).
pub(crate) fn fetch(
    id: &str,
    file: Option<&str>,
    revision: Option<&str>,
) -> Result<PathBuf, Error> {
    let cache = Cache::from_env();
    if let Some(name) = file {
        return get(&cache, id, revision, name);
    }
    let config = get(&cache, id, revision, "config.json")?;
    for optional in ["tokenizer.json", "tokenizer_config.json"] {
        if let Err(e) = get(&cache, id, revision, optional) {
            tracing::debug!(error = %e, file = optional, "optional tokenizer file unavailable");
        }
    }
    match get(&cache, id, revision, "model.safetensors.index.json") {
        Ok(index) => {
            let text = std::fs::read_to_string(&index).map_err(|source| Error::Io {
                path: index.clone(),
                source,
            })?;
            let index: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::Hub(e.to_string()))?;
            let mut shards: Vec<String> = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| {
                    m.values()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            shards.sort();
            shards.dedup();
            for shard in shards {
                get(&cache, id, revision, &shard)?;
            }
        }
        Err(_) => {
            get(&cache, id, revision, "model.safetensors")?;
        }
    }
    Ok(config.parent().map(Path::to_path_buf).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_file_is_found_without_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().to_path_buf());
        let r = repo("someone/tiny", None);
        let snapshot = dir
            .path()
            .join(r.folder_name())
            .join("snapshots")
            .join("abc123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(snapshot.join("model.gguf"), b"GGUF").unwrap();
        cache.repo(r).create_ref("abc123").unwrap();
        let got = get(&cache, "someone/tiny", None, "model.gguf").unwrap();
        assert_eq!(got, snapshot.join("model.gguf"));
    }
}
