//! `hearth_infer::hub::pull` against a hostile or broken stand-in for the hub
//! (tests/support/hub_server.rs): downloads that do not match their checksum or size refused and
//! removed, a resume answered with the whole file, garbled headers turned into typed errors
//! (never a panic, nothing claiming completeness), and names that would leave the repository
//! refused. The pulls that work, hub_pull.rs.
//!
//! Each test starts its own server and cache; nothing here touches the process environment
//! (the endpoint is given with `HubClient::new`).

#[path = "support/hub_cache.rs"]
mod hub_cache;
#[path = "support/hub_server.rs"]
mod hub_server;

use hearth_infer::hub::{HubClient, HubPull, PullFailure};
use hub_cache::{complete_blobs, failure, gguf_like, part_len, pointer, snapshot_entries, REPO};
use hub_server::{sha256_hex, FakeHub, HubFile, Quirks};

#[test]
fn a_file_that_does_not_match_its_sha256_etag_is_refused_and_removed() {
    let hub = FakeHub::start();
    let content = gguf_like(100_000);
    let claimed = sha256_hex(b"some other file");
    hub.add(
        REPO,
        "model.gguf",
        HubFile::lfs(content.clone()).with_etag(claimed.clone()),
    );
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let req = HubPull::file(REPO, "model.gguf");

    let err = client.pull(&req, &|_| {}).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("model.gguf") && message.contains(&claimed),
        "{message}"
    );
    match failure(Err(err), "model.gguf") {
        PullFailure::Checksum {
            algorithm,
            expected,
            actual,
        } => {
            assert_eq!(algorithm, "sha256");
            assert_eq!(expected, claimed);
            assert_eq!(actual, sha256_hex(&content));
        }
        other => panic!("{other:?}"),
    }
    assert!(complete_blobs(cache.path(), REPO).is_empty());
    assert!(!pointer(cache.path(), REPO, "model.gguf").exists());
    assert_eq!(part_len(cache.path(), REPO, &claimed), None);
    // Nothing bad was cached: the next pull downloads again, and is refused again.
    hub.clear_log();
    let again = failure(client.pull(&req, &|_| {}), "model.gguf");
    assert!(matches!(again, PullFailure::Checksum { .. }), "{again:?}");
    assert!(hub.bytes_sent() >= content.len() as u64);
}

#[test]
fn a_git_file_that_does_not_match_its_blob_id_is_refused() {
    let hub = FakeHub::start();
    hub.add(
        REPO,
        "config.json",
        HubFile::git(b"{\"a\": 1}".to_vec()).with_etag(hub_server::git_blob_id(b"{}")),
    );
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let got = failure(
        client.pull(&HubPull::file(REPO, "config.json"), &|_| {}),
        "config.json",
    );
    assert!(
        matches!(
            got,
            PullFailure::Checksum {
                algorithm: "git blob sha1",
                ..
            }
        ),
        "{got:?}"
    );
    assert!(complete_blobs(cache.path(), REPO).is_empty());
}

#[test]
fn a_body_longer_than_announced_is_refused_and_removed() {
    let hub = FakeHub::start();
    let content = gguf_like(40_000);
    hub.add(
        REPO,
        "model.gguf",
        HubFile::lfs(content.clone()).with_quirks(Quirks {
            extra: vec![0; 1000],
            ..Quirks::default()
        }),
    );
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let got = failure(
        client.pull(&HubPull::file(REPO, "model.gguf"), &|_| {}),
        "model.gguf",
    );
    assert!(
        matches!(
            got,
            PullFailure::WrongSize {
                expected: 40_000,
                got: 41_000
            }
        ),
        "{got:?}"
    );
    assert!(complete_blobs(cache.path(), REPO).is_empty());
    assert!(!pointer(cache.path(), REPO, "model.gguf").exists());
}

#[test]
fn a_resume_answered_with_the_whole_file_is_refused_and_the_next_pull_starts_over() {
    let hub = FakeHub::start();
    let content = gguf_like(80_000);
    let etag = sha256_hex(&content);
    hub.add(
        REPO,
        "model.gguf",
        HubFile::lfs(content.clone()).with_quirks(Quirks {
            cut_after: Some((10_000, 1)),
            ignore_range: true,
            ..Quirks::default()
        }),
    );
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let req = HubPull::file(REPO, "model.gguf");

    let cut = failure(client.pull(&req, &|_| {}), "model.gguf");
    assert!(
        matches!(
            cut,
            PullFailure::Transport {
                partial: 10_000,
                ..
            }
        ),
        "{cut:?}"
    );
    // The server ignores `Range: bytes=10000-` and sends the whole file after the partial one.
    let appended = failure(client.pull(&req, &|_| {}), "model.gguf");
    assert!(
        matches!(
            appended,
            PullFailure::WrongSize {
                expected: 80_000,
                got: 90_000
            }
        ),
        "{appended:?}"
    );
    assert!(complete_blobs(cache.path(), REPO).is_empty());
    assert_eq!(part_len(cache.path(), REPO, &etag), None);
    // Nothing partial is left to resume from, so a download from 0 (which the server does
    // honour) completes.
    let path = client.pull(&req, &|_| {}).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), content);
}

/// What a case expects of the failure.
type Expect = fn(&PullFailure) -> bool;

/// One garbled answer per case: a typed failure, never a panic, nothing claiming completeness.
#[test]
fn garbage_answers_are_typed_errors() {
    let hub = FakeHub::start();
    let content = gguf_like(5_000);
    let file = "model.gguf";
    // A file whose answer redirects to itself; a case below redirects to it.
    let loop_repo = "hostile/loop";
    let to_loop = Quirks {
        headers: vec![(
            "Location",
            Some(format!("/{loop_repo}/resolve/main/{file}")),
        )],
        ..Quirks::default()
    };
    hub.add(
        loop_repo,
        file,
        HubFile::lfs(content.clone()).with_quirks(to_loop.clone()),
    );
    let cases: Vec<(&str, HubFile, Expect)> = vec![
        (
            "an etag that climbs out of the cache",
            HubFile::lfs(content.clone()).with_etag("../../../escape"),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "no commit header",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                headers: vec![("x-repo-commit", None)],
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a commit with a slash",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                headers: vec![("x-repo-commit", Some("../x".into()))],
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "no etag at all",
            HubFile::git(content.clone()).with_quirks(Quirks {
                headers: vec![("etag", None)],
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a size that is not a number",
            HubFile::git(content.clone()).with_quirks(Quirks {
                headers: vec![("Content-Range", Some("bytes 0-0/lots".into()))],
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a redirect without a Location (hf-hub 0.4.3 unwraps it)",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                headers: vec![("Location", None)],
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a 300 without a Location",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                status: Some(300),
                headers: vec![("Location", None)],
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "relative redirects without end (hf-hub 0.4.3 follows them forever)",
            HubFile::lfs(content.clone()).with_quirks(to_loop),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a Location that is neither a path nor a URL",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                headers: vec![("Location", Some("cdn/elsewhere".into()))],
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a sane answer to the probe, then no Location for hf-hub (which unwraps it)",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                headers: vec![("Location", None)],
                garble_from: 1,
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a sane answer to the probe, then another etag for hf-hub",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                headers: vec![("x-linked-etag", Some(format!("\"{}\"", "e".repeat(64))))],
                garble_from: 1,
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a sane answer to the probe, then another commit for hf-hub",
            HubFile::git(content.clone()).with_quirks(Quirks {
                headers: vec![("x-repo-commit", Some("f".repeat(40)))],
                garble_from: 1,
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::BadResponse { .. }),
        ),
        (
            "a server error",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                status: Some(500),
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::Status { status: 500 }),
        ),
        (
            "a gated repository",
            HubFile::lfs(content.clone()).with_quirks(Quirks {
                status: Some(401),
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::Denied { status: 401 }),
        ),
        (
            "a body cut on every attempt",
            HubFile::git(content.clone()).with_quirks(Quirks {
                cut_after: Some((1000, usize::MAX)),
                ..Quirks::default()
            }),
            |f| matches!(f, PullFailure::Transport { partial: 1000, .. }),
        ),
    ];
    for (i, (case, hub_file, expected)) in cases.into_iter().enumerate() {
        let repo = format!("hostile/case{i}");
        hub.add(&repo, file, hub_file);
        let root = tempfile::tempdir().unwrap();
        let cache = root.path().join("hub");
        let client = HubClient::new(hub.endpoint(), &cache).with_retries(0);
        let got = failure(client.pull(&HubPull::file(&repo, file), &|_| {}), file);
        assert!(expected(&got), "{case}: {got:?}");
        assert!(complete_blobs(&cache, &repo).is_empty(), "{case}");
        assert!(snapshot_entries(&cache, &repo).is_empty(), "{case}");
        // Nothing was written beside the cache.
        let beside: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "hub")
            .collect();
        assert!(beside.is_empty(), "{case}: {beside:?}");
    }
}

#[test]
fn names_that_leave_the_repository_are_refused_before_any_request() {
    let hub = FakeHub::start();
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    for (req, file) in [
        (
            HubPull::file(REPO, "../../escape.gguf"),
            "../../escape.gguf",
        ),
        (HubPull::file("../x", "model.gguf"), ""),
        (HubPull::file(REPO, "model.gguf").at_revision("../main"), ""),
    ] {
        let got = failure(client.pull(&req, &|_| {}), file);
        assert!(matches!(got, PullFailure::InvalidRequest { .. }), "{got:?}");
    }
    assert!(hub.log().is_empty());
}

#[test]
fn an_index_naming_a_shard_outside_the_repository_is_refused() {
    let repo = "someone/sneaky";
    let hub = FakeHub::start();
    let index = serde_json::json!({"weight_map": {"a": "../../../escape.safetensors"}});
    hub.add(repo, "config.json", HubFile::git(b"{}".to_vec()));
    hub.add(
        repo,
        "model.safetensors.index.json",
        HubFile::git(index.to_string().into_bytes()),
    );
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(hub.endpoint(), cache.path());
    let got = failure(
        client.pull(&HubPull::snapshot(repo), &|_| {}),
        "../../../escape.safetensors",
    );
    assert!(matches!(got, PullFailure::InvalidRequest { .. }), "{got:?}");
}
