//! `hearth_infer::hub::pull` against a local stand-in for the hub (tests/support/hub_server.rs),
//! the pulls that work: whole pulls with progress, a download cut midway and resumed (by the next
//! pull or by a retry within one), the cache used without network, a safetensors snapshot, and a
//! missing file. What a hostile or broken server gets, hub_hostile.rs.
//!
//! Each test starts its own server and cache; nothing here touches the process environment
//! (the endpoint is given with `HubClient::new`).

#[path = "support/hub_cache.rs"]
mod hub_cache;
#[path = "support/hub_server.rs"]
mod hub_server;

use hearth_infer::hub::{HubClient, HubPull, PullFailure, PullProgress};
use hub_cache::{complete_blobs, failure, gguf_like, part_len, pointer, repo_dir, Reports, REPO};
use hub_server::{sha256_hex, FakeHub, HubFile, Quirks, COMMIT};

#[test]
fn a_gguf_file_is_pulled_whole_with_progress() {
    let hub = FakeHub::start();
    let content = gguf_like(1_500_000);
    hub.add(REPO, "model.gguf", HubFile::lfs(content.clone()));
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let reports = Reports::default();

    let path = client
        .pull(&HubPull::file(REPO, "model.gguf"), &reports.sink())
        .unwrap();

    assert_eq!(path, pointer(cache.path(), REPO, "model.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), content);
    // The blob is named by its SHA-256, and nothing partial is left.
    assert_eq!(
        complete_blobs(cache.path(), REPO),
        vec![repo_dir(cache.path(), REPO)
            .join("blobs")
            .join(sha256_hex(&content))]
    );
    assert_eq!(part_len(cache.path(), REPO, &sha256_hex(&content)), None);
    let reports = reports.take();
    assert!(reports.len() >= 3, "{reports:?}");
    assert!(reports
        .iter()
        .all(|r| r.file == "model.gguf" && r.total == content.len() as u64));
    assert!(
        reports.windows(2).all(|w| w[0].done < w[1].done),
        "{reports:?}"
    );
    assert_eq!(reports.last().unwrap().done, content.len() as u64);
    // The body crossed the wire once.
    let downloads: Vec<_> = hub
        .log()
        .into_iter()
        .filter(|l| l.range.as_deref() != Some("bytes=0-0") && l.sent > 0)
        .collect();
    assert_eq!(downloads.len(), 1, "{downloads:?}");
    assert_eq!(downloads[0].sent, content.len() as u64);
}

#[test]
fn a_download_cut_midway_is_resumed_by_the_next_pull() {
    let hub = FakeHub::start();
    let content = gguf_like(1_000_000);
    let etag = sha256_hex(&content);
    let cut = 300_000u64;
    hub.add(
        REPO,
        "model.gguf",
        HubFile::lfs(content.clone()).with_quirks(Quirks {
            cut_after: Some((cut, 1)),
            ..Quirks::default()
        }),
    );
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let req = HubPull::file(REPO, "model.gguf");

    let first = failure(client.pull(&req, &|_| {}), "model.gguf");
    assert!(
        matches!(first, PullFailure::Transport { partial, .. } if partial == cut),
        "{first:?}"
    );
    // The partial file is kept as such; nothing claims to be the complete file.
    assert_eq!(part_len(cache.path(), REPO, &etag), Some(cut));
    assert!(complete_blobs(cache.path(), REPO).is_empty());
    assert!(!pointer(cache.path(), REPO, "model.gguf").exists());

    hub.clear_log();
    let reports = Reports::default();
    let path = client.pull(&req, &reports.sink()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), content);
    // The second attempt asked for the rest only, and the server sent fewer bytes than the file.
    let log = hub.log();
    let ranges: Vec<_> = log.iter().filter_map(|l| l.range.clone()).collect();
    assert!(ranges.contains(&format!("bytes={cut}-")), "{ranges:?}");
    let sent = hub.bytes_sent();
    assert!(sent < content.len() as u64, "{sent} bytes sent");
    // Besides the one-byte metadata answers, exactly the rest of the body.
    let body: u64 = log
        .iter()
        .filter(|l| l.range.as_deref() != Some("bytes=0-0"))
        .map(|l| l.sent)
        .sum();
    assert_eq!(body, content.len() as u64 - cut);
    // Progress starts where the download resumed.
    let reports = reports.take();
    assert_eq!(reports.first().unwrap().done, cut);
    assert_eq!(reports.last().unwrap().done, content.len() as u64);
}

#[test]
fn retries_resume_within_one_pull() {
    let hub = FakeHub::start();
    let content = gguf_like(600_000);
    hub.add(
        REPO,
        "model.gguf",
        HubFile::lfs(content.clone()).with_quirks(Quirks {
            cut_after: Some((200_000, 1)),
            ..Quirks::default()
        }),
    );
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path()).with_retries(2);

    let path = client
        .pull(&HubPull::file(REPO, "model.gguf"), &|_| {})
        .unwrap();

    assert_eq!(std::fs::read(&path).unwrap(), content);
    let bodies: Vec<_> = hub
        .log()
        .into_iter()
        .filter(|l| l.path.starts_with("/cdn/") && l.range.as_deref() != Some("bytes=0-0"))
        .map(|l| (l.range.unwrap_or_default(), l.sent))
        .collect();
    assert_eq!(
        bodies,
        vec![
            ("bytes=0-".to_string(), 200_000),
            ("bytes=200000-".to_string(), 400_000)
        ]
    );
}

#[test]
fn a_cached_file_is_pulled_again_without_any_request() {
    let hub = FakeHub::start();
    let content = gguf_like(50_000);
    hub.add(REPO, "model.gguf", HubFile::lfs(content.clone()));
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let req = HubPull::file(REPO, "model.gguf");
    let first = client.pull(&req, &|_| {}).unwrap();

    hub.clear_log();
    let reports = Reports::default();
    let again = client.pull(&req, &reports.sink()).unwrap();
    assert_eq!(again, first);
    assert!(hub.log().is_empty(), "{:?}", hub.log());
    assert_eq!(
        reports.take(),
        vec![PullProgress {
            file: "model.gguf".into(),
            done: content.len() as u64,
            total: content.len() as u64
        }]
    );
    // With the server gone as well.
    drop(hub);
    assert_eq!(client.pull(&req, &|_| {}).unwrap(), first);
}

#[test]
fn a_safetensors_snapshot_brings_config_tokenizer_index_and_shards() {
    let repo = "someone/tiny-st";
    let hub = FakeHub::start();
    let index = serde_json::json!({
        "metadata": {"total_size": 300_000},
        "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "b.weight": "model-00002-of-00002.safetensors",
            "c.weight": "model-00001-of-00002.safetensors",
        }
    });
    hub.add(
        repo,
        "config.json",
        HubFile::git(b"{\"model_type\": \"llama\"}".to_vec()),
    );
    hub.add(
        repo,
        "tokenizer.json",
        HubFile::git(b"{\"model\": {}}".to_vec()),
    );
    hub.add(
        repo,
        "model.safetensors.index.json",
        HubFile::git(index.to_string().into_bytes()),
    );
    hub.add(
        repo,
        "model-00001-of-00002.safetensors",
        HubFile::lfs(gguf_like(200_000)),
    );
    hub.add(
        repo,
        "model-00002-of-00002.safetensors",
        HubFile::lfs(gguf_like(100_000)),
    );
    // No tokenizer_config.json: the hub answers 404 and the snapshot does without.
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let reports = Reports::default();

    let dir = client
        .pull(&HubPull::snapshot(repo), &reports.sink())
        .unwrap();

    assert_eq!(
        dir,
        repo_dir(cache.path(), repo).join("snapshots").join(COMMIT)
    );
    for file in [
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    assert!(!dir.join("tokenizer_config.json").exists());
    assert!(!dir.join("model.safetensors").exists());
    let files: Vec<String> = reports.take().into_iter().map(|r| r.file).collect();
    assert_eq!(files.first().map(String::as_str), Some("config.json"));
    assert!(files
        .iter()
        .any(|f| f == "model-00002-of-00002.safetensors"));

    // Again: only the file the hub does not have is asked about.
    hub.clear_log();
    assert_eq!(client.pull(&HubPull::snapshot(repo), &|_| {}).unwrap(), dir);
    let asked: Vec<_> = hub.log().into_iter().map(|l| l.path).collect();
    assert!(
        asked.iter().all(|p| p.ends_with("/tokenizer_config.json")),
        "{asked:?}"
    );
}

#[test]
fn a_missing_file_is_not_found_and_leaves_nothing() {
    let hub = FakeHub::start();
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let got = failure(
        client.pull(&HubPull::file(REPO, "nope.gguf"), &|_| {}),
        "nope.gguf",
    );
    assert!(matches!(got, PullFailure::NotFound), "{got:?}");
    assert!(!repo_dir(cache.path(), REPO).exists());
}
