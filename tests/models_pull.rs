//! Models pulled from a hub on request: `hf = "owner/repo"` rows download through hf-hub from
//! `HF_ENDPOINT` (here a local stand-in serving the hub's file layout), a download cut midway
//! resumes where it stopped on `hearth models pull`, and a file that fails its checksum is
//! refused and removed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::common::hub_server::{sha256_hex, FakeHub, HubFile, Quirks};
use crate::common::process::ServerProcess;
use crate::common::{eventually, hearth_cli};

const SMOLLM2: &str = "weights/SmolLM2-135M-Instruct.Q4_1.gguf";

fn hub_row(id: &str, repo: &str, file: &str) -> String {
    format!(
        "[text.\"{id}\"]\nhf = \"{repo}\"\nfile = \"{file}\"\ninput_price_per_million = \"1\"\noutput_price_per_million = \"2\"\nkv_budget_mb = 32\n\n"
    )
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_model_is_pulled_resumed_after_a_cut_checksummed_and_served() {
    let gguf = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(SMOLLM2))
        .expect("run scripts/fetch-weights.sh");
    let hub = FakeHub::start();
    // The first download of the weights stops after 20 MiB.
    hub.add(
        "team/smol",
        "smol.gguf",
        HubFile::lfs(gguf.clone()).with_quirks(Quirks {
            cut_after: Some((20 << 20, 1)),
            ..Quirks::default()
        }),
    );
    // A file whose bytes are not those its etag (SHA-256) names.
    let mut tampered = gguf[..1 << 20].to_vec();
    tampered[100] ^= 1;
    hub.add(
        "team/tampered",
        "model.gguf",
        HubFile::lfs(tampered).with_etag(sha256_hex(&gguf[..1 << 20])),
    );
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("models.toml");
    std::fs::write(
        &table,
        format!(
            "[defaults]\nthreads = 2\n\n{}{}",
            hub_row("pulled", "team/smol", "smol.gguf"),
            hub_row("tampered", "team/tampered", "model.gguf")
        ),
    )
    .unwrap();
    let hf_home = dir.path().join("hf-home");
    let endpoint = hub.endpoint();
    let server = ServerProcess::start(
        &["auth", "completion"],
        &table,
        &[
            ("HF_ENDPOINT", &endpoint),
            ("HF_HOME", hf_home.to_str().unwrap()),
        ],
    );

    // The load at start pulls, and the cut fails it, saying so; the partial file stays.
    let failed = eventually(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { server.model_row("pulled").await["state"] == "failed" },
    )
    .await;
    assert!(failed, "{}", server.model_row("pulled").await);
    let first = hub.bytes_sent();
    assert!(first >= 20 << 20 && first < gguf.len() as u64, "{first}");
    assert!(
        files(&hf_home)
            .iter()
            .any(|f| f.to_string_lossy().ends_with(".part")),
        "the partial download is kept: {:?}",
        files(&hf_home)
    );

    // `hearth models pull` resumes it: only the rest crosses the wire, and it is checked.
    hub.clear_log();
    let data_dir = server.data_dir().display().to_string();
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        hearth_cli(&["models", "pull", "pulled", "--data-dir", &data_dir], &[])
    })
    .await
    .unwrap();
    assert!(ok, "{out}{err}");
    let resumed = hub.bytes_sent();
    assert!(
        resumed < gguf.len() as u64 && resumed + first >= gguf.len() as u64,
        "resumed with {resumed} of {} bytes after {first}",
        gguf.len()
    );
    assert!(
        hub.log().iter().any(|l| l
            .range
            .as_deref()
            .is_some_and(|r| r != "bytes=0-0" && !r.starts_with("bytes=0-"))),
        "the body was asked from where it stopped: {:?}",
        hub.log()
    );
    let blob = files(&hf_home)
        .into_iter()
        .find(|f| f.to_string_lossy().contains("models--team--smol/blobs/"))
        .expect("the blob is in the cache");
    assert_eq!(
        blob.file_name().unwrap().to_string_lossy(),
        sha256_hex(&gguf)
    );
    assert_eq!(
        std::fs::read(&blob).unwrap(),
        gguf,
        "the whole file, intact"
    );

    // Loaded from the cache, it serves.
    let (status, body) = server.admin("models/load", json!({ "id": "pulled" })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"]["state"], "ready");

    // The tampered file is refused and removed, again on a second try.
    for _ in 0..2 {
        let (status, body) = server
            .admin("models/pull", json!({ "id": "tampered" }))
            .await;
        assert_eq!(status, 502, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("model.gguf") && message.contains(&sha256_hex(&gguf[..1 << 20])),
            "{message}"
        );
        let kept: Vec<_> = files(&hf_home)
            .into_iter()
            .filter(|f| f.to_string_lossy().contains("models--team--tampered/"))
            .filter(|f| !f.to_string_lossy().contains("/refs/"))
            // hf-hub's empty lock file, kept after every download of a blob.
            .filter(|f| f.extension().is_none_or(|e| e != "lock"))
            .collect();
        assert!(kept.is_empty(), "nothing of the bad file stays: {kept:?}");
    }
    let (status, body) = server.admin("models/pull", json!({ "id": "nope" })).await;
    assert_eq!(status, 404, "{body}");
}
