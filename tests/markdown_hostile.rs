//! Hostile uploads against the real `hearth serve` process: every class of hostile document the
//! library's own suite builds (self-drawing PDF forms, inflate bombs in every stream kind, huge
//! and sparse sheets, deep and unbalanced HTML and XML, entity expansion, nested and high-ratio
//! archives, truncated files of every format) is answered within the time limit plus a second
//! while the other three services answer health and the host's memory stays bounded; a
//! conversion worker killed mid-document costs that upload alone; an upload declared over the
//! limit is refused before its body is read; image bombs are refused from their headers and OCR
//! past the time limit is stopped with its engine.

// The library's hostile-document builders, shared with `crates/markdown/tests/hostile.rs`.
#[path = "../crates/markdown/tests/hostile/cases.rs"]
mod cases;
#[path = "../crates/markdown/tests/hostile/gen.rs"]
mod gen;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use hearth_server::Service;
use reqwest::multipart::{Form, Part};
use reqwest::StatusCode;
use serde_json::Value;

use crate::common::process::ServerProcess;
use crate::common::TestApp;

/// One hostile document as the library suite builds it. Its `check` is the library-level
/// expectation; over HTTP any answer in the service's shape within the limit will do.
pub struct Case {
    pub name: &'static str,
    pub filename: &'static str,
    pub bytes: Vec<u8>,
    #[allow(dead_code)]
    pub check: Check,
}

pub type Check =
    fn(&Result<hearth_markdown::Conversion, hearth_markdown::Error>) -> Result<(), String>;

/// The conversion time limit of these servers.
const TIME_LIMIT: Duration = Duration::from_secs(5);

/// The host parses nothing: its peak memory is uploads, buffers and the models it serves.
const HOST_PEAK_RSS_BYTES: u64 = 1024 * 1024 * 1024;

/// A model table with SmolLM2 as the text models and the tiny SDXL-shaped image model.
pub(crate) fn models(dir: &Path) -> std::path::PathBuf {
    let table = crate::completion::models_toml(dir);
    hearth_imagine::write_tiny_sdxl(&dir.join("tiny-sdxl"), hearth_imagine::tiny::TINY_SEED)
        .unwrap();
    let mut text = std::fs::read_to_string(&table).unwrap();
    text.push_str(
        "\n[image.\"xl-lightning\"]\nweights = \"no-real-weights-here\"\ntiny_weights = \"tiny-sdxl\"\nprice_per_image = \"0.040\"\n",
    );
    std::fs::write(&table, text).unwrap();
    table
}

fn all_four(dir: &Path) -> ServerProcess {
    ServerProcess::start(
        &["auth", "completion", "markdown", "imagine"],
        &models(dir),
        &[("HEARTH_MARKDOWN_TIME_LIMIT_SECS", "5")],
    )
}

async fn upload(
    http: &reqwest::Client,
    url: &str,
    name: &str,
    bytes: Vec<u8>,
) -> (StatusCode, Value) {
    let form = Form::new().part("file", Part::bytes(bytes).file_name(name.to_string()));
    let resp = http
        .post(format!("{url}/"))
        .multipart(form)
        .send()
        .await
        .expect("an answer");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Every service of `server` answers its health check with 200.
async fn all_healthy(http: &reqwest::Client, server: &ServerProcess, when: &str) {
    for service in ["auth", "completion", "markdown", "imagine"] {
        let resp = http
            .get(format!("{}/", server.url(service)))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{service} health {when}: {e}"));
        assert_eq!(resp.status(), StatusCode::OK, "{service} health {when}");
    }
}

/// Every 4xx/5xx answer of this service is `{"error": "<message>"}`.
fn assert_error_shape(name: &str, status: StatusCode, body: &Value) {
    if !status.is_success() {
        assert!(
            body["error"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}: {status} without an error message: {body}"
        );
    } else {
        assert!(
            body["markdown"].is_string(),
            "{name}: 200 without markdown: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_document_is_answered_in_time_and_the_host_stays_up_and_small() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = all_four(dir.path());
    let http = reqwest::Client::new();
    let url = server.url("markdown").to_string();
    all_healthy(&http, &server, "at the start").await;
    let mut documents: Vec<Case> = cases::all().collect();
    documents.extend(cases::truncated());
    assert!(documents.len() > 30, "the suite lost its cases");
    for case in documents {
        let started = Instant::now();
        let (status, body) = upload(&http, &url, case.filename, case.bytes).await;
        let took = started.elapsed();
        assert!(
            took <= TIME_LIMIT + Duration::from_secs(1),
            "{}: answered {status} after {took:?}",
            case.name
        );
        assert_error_shape(case.name, status, &body);
        assert!(server.is_running(), "{}: the host process died", case.name);
        all_healthy(&http, &server, &format!("after {}", case.name)).await;
    }
    let peak = server.peak_rss_bytes();
    assert!(
        peak < HOST_PEAK_RSS_BYTES,
        "the host's peak RSS reached {} MiB",
        peak >> 20
    );
}

/// The markdown health's report of its worker pool.
async fn pool_state(http: &reqwest::Client, url: &str) -> Value {
    let health: Value = http
        .get(format!("{url}/"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    health["components"]["workers"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_conversion_costs_that_upload_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = all_four(dir.path());
    let http = reqwest::Client::new();
    let url = server.url("markdown").to_string();
    // A document that keeps a worker busy for a while: a big CSV.
    let mut csv = String::from("id,name,amount,note\n");
    for i in 0..400_000 {
        csv.push_str(&format!(
            "{i},name {i},{}.{:02},a note about row {i}\n",
            i * 7,
            i % 100
        ));
    }
    let job = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move { upload(&http, &url, "big.csv", csv.into_bytes()).await }
    });
    // Once a worker is busy, kill every worker process from outside.
    let mut killed = false;
    for _ in 0..500 {
        let workers = pool_state(&http, &url).await;
        if workers["idle"].as_u64() < workers["live"].as_u64() {
            for pid in server.children() {
                let _ = std::process::Command::new("kill")
                    .arg("-9")
                    .arg(pid.to_string())
                    .status();
            }
            killed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(killed, "no worker was ever seen busy");
    let (status, body) = job.await.unwrap();
    if status == StatusCode::OK {
        // The conversion won the race with the kill: nothing was lost, but nothing was shown.
        eprintln!("the conversion finished before its worker was killed");
    } else {
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
        let message = body["error"].as_str().unwrap();
        assert!(message.starts_with("Conversion failed: "), "{message}");
        assert!(
            message.contains("signal 9"),
            "the cause is named: {message}"
        );
    }
    assert!(server.is_running(), "the host process died with its worker");
    // The idle workers were killed too; health notices them and the pool replaces every one.
    let mut back = false;
    for _ in 0..200 {
        let workers = pool_state(&http, &url).await;
        if workers["live"] == workers["workers"] && workers["idle"] == workers["workers"] {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back, "the pool did not get back to full strength");
    // Replacement workers take the next upload.
    let (status, body) = upload(&http, &url, "small.csv", b"a,b\n1,2\n".to_vec()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    all_healthy(&http, &server, "after the kill").await;
}

#[tokio::test]
async fn an_upload_declared_over_the_limit_is_refused_before_its_body_is_read() {
    let app = TestApp::builder()
        .services(&[Service::Markdown])
        .configure(|raw| raw.markdown.max_upload_bytes = Some(1024 * 1024))
        .spawn()
        .await;
    let addr = app
        .url(Service::Markdown)
        .trim_start_matches("http://")
        .to_string();
    // Headers only: a 10 GB body is announced and never sent.
    let answer = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            tcp,
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 10000000000\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        // Read until the JSON body has arrived or the server closes.
        while !text.contains('}') {
            match tcp.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        text
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("File too large"), "{answer}");
}

/// Image bombs are refused from their headers, and OCR that runs past the time limit (four
/// pages of text tiled into one image, against a 1 s limit) is stopped at it, its engine with
/// it; each answer comes within the limit plus a second and the host stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_bombs_and_endless_ocr_are_answered_in_time_and_the_host_stays_up() {
    const LIMIT: Duration = Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(
        &["markdown"],
        &models(dir.path()),
        &[("HEARTH_MARKDOWN_TIME_LIMIT_SECS", "1")],
    );
    let http = reqwest::Client::new();
    let url = server.url("markdown").to_string();
    let cases = [
        (
            "png claiming 10^10 pixels",
            gen::png_claiming(100_000, 100_000),
        ),
        (
            "png claiming a 1,000,000-pixel row",
            gen::png_claiming(1_000_000, 2),
        ),
        ("four pages of text in one image", four_pages_in_one_png()),
    ];
    for (name, bytes) in cases {
        let started = Instant::now();
        let (status, body) = upload(&http, &url, "scan.png", bytes).await;
        let took = started.elapsed();
        assert!(
            took <= LIMIT + Duration::from_secs(1),
            "{name}: answered {status} after {took:?}"
        );
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{name}: {body}");
        assert_error_shape(name, status, &body);
        assert!(server.is_running(), "{name}: the host process died");
        let health = http.get(format!("{url}/")).send().await.expect("health");
        assert_eq!(health.status(), StatusCode::OK, "health after {name}");
    }
    // No engine outlives the conversion it was started for: the workers have no children.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let engines = engines(&server);
    assert!(
        engines.is_empty(),
        "workers' children still running: {engines:?}"
    );
}

/// Whether a process is alive (not gone, not a zombie).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// The server's conversion workers that have running children (OCR engines), with those
/// children's pids.
fn reading(server: &ServerProcess) -> Vec<(String, Vec<String>)> {
    server
        .children()
        .into_iter()
        .map(|worker| {
            let children: Vec<String> = std::fs::read_dir(format!("/proc/{worker}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|pids| {
                    pids.split_whitespace()
                        .map(str::to_string)
                        .collect::<Vec<_>>()
                })
                .filter(|pid| alive(pid))
                .collect();
            (worker.to_string(), children)
        })
        .filter(|(_, children)| !children.is_empty())
        .collect()
}

/// The running children of the server's conversion workers: OCR engines.
fn engines(server: &ServerProcess) -> Vec<String> {
    reading(server).into_iter().flat_map(|(_, c)| c).collect()
}

/// A page of text tiled four times: a few seconds of OCR.
fn four_pages_in_one_png() -> Vec<u8> {
    let docs = std::env::var_os("HEARTH_TEST_DOCS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/test-docs"));
    let page = image::open(docs.join("ocr-pages/clean-300dpi.png"))
        .expect("the OCR test pages (scripts/test.sh writes them)")
        .into_luma8();
    let (w, h) = page.dimensions();
    let tiled = image::GrayImage::from_fn(w * 2, h * 2, |x, y| *page.get_pixel(x % w, y % h));
    let mut png = std::io::Cursor::new(Vec::new());
    tiled.write_to(&mut png, image::ImageFormat::Png).unwrap();
    png.into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_vanishes_mid_ocr_frees_its_worker_and_engines() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(
        &["markdown"],
        &models(dir.path()),
        &[("HEARTH_MARKDOWN_TIME_LIMIT_SECS", "60")],
    );
    let http = reqwest::Client::new();
    let url = server.url("markdown").to_string();
    let job = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move { upload(&http, &url, "scan.png", four_pages_in_one_png()).await }
    });
    // Once an engine is reading the page, the client goes away.
    let mut busy = Vec::new();
    for _ in 0..600 {
        busy = reading(&server);
        if !busy.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!busy.is_empty(), "no OCR engine was ever seen running");
    job.abort();
    assert!(job.await.unwrap_err().is_cancelled());
    // The worker is killed with its engines (a conversion that ran to its end would have left
    // its worker alive and idle), and the pool replaces it; nothing reads on for nobody.
    let mut freed = false;
    for _ in 0..100 {
        let workers = pool_state(&http, &url).await;
        if busy
            .iter()
            .all(|(worker, children)| !alive(worker) && !children.iter().any(|c| alive(c)))
            && workers["live"] == workers["workers"]
            && workers["idle"] == workers["workers"]
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        freed,
        "5 s after the client left: busy {busy:?}, engines {:?}, workers {}",
        engines(&server),
        pool_state(&http, &url).await
    );
    assert!(server.is_running());
    let (status, body) = upload(&http, &url, "small.csv", b"a,b\n1,2\n".to_vec()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
