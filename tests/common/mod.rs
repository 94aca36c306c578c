//! Shared test harness: start the real server in-process on 127.0.0.1:0 with a temporary data
//! dir, and talk to it with typed helpers. Used by every service's integration tests.
#![allow(dead_code)] // each test module uses a different part

pub mod browser;
/// The Hugging Face hub stand-in of `hearth-infer`'s own pull tests.
#[path = "../../crates/infer/tests/support/hub_server.rs"]
pub mod hub_server;
pub mod postgres;
pub mod process;

use hearth_server::app::paths;
use hearth_server::config::RawConfig;
use hearth_server::{Running, Service};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// Starts the auth service alone with default settings.
pub async fn spawn_app() -> TestApp {
    TestApp::builder().spawn().await
}

/// Starts all four services with the model table `models`.
pub async fn spawn_all_four(models: PathBuf) -> TestApp {
    TestApp::builder()
        .services(&Service::ALL)
        .configure(|raw| raw.models = Some(models))
        .spawn()
        .await
}

/// Chooses services and settings before starting.
pub struct AppBuilder {
    raw: RawConfig,
    services: Vec<Service>,
    data_dir: Option<TempDir>,
}

impl AppBuilder {
    /// The services to run (default: auth only). Every one binds 127.0.0.1:0.
    pub fn services(mut self, services: &[Service]) -> Self {
        self.services = services.to_vec();
        self
    }

    /// Changes the raw configuration (any layer a user could set).
    pub fn configure(mut self, f: impl FnOnce(&mut RawConfig)) -> Self {
        f(&mut self.raw);
        self
    }

    /// Reuses a data dir (from [`TestApp::stop`]) to test what survives a restart.
    pub fn data_dir(mut self, dir: TempDir) -> Self {
        self.data_dir = Some(dir);
        self
    }

    pub async fn spawn(self) -> TestApp {
        self.try_spawn()
            .await
            .unwrap_or_else(|e| panic!("server failed to start: {e}"))
    }

    /// Starts the server, or says why it would not start.
    pub async fn try_spawn(self) -> Result<TestApp, hearth_server::app::StartError> {
        let dir = self
            .data_dir
            .unwrap_or_else(|| tempfile::tempdir().expect("temp dir"));
        let mut raw = self.raw;
        raw.data_dir = Some(dir.path().to_path_buf());
        raw.services = Some(self.services.iter().map(|s| s.name().to_string()).collect());
        raw.auth.addr = Some("127.0.0.1:0".into());
        raw.completion.addr = Some("127.0.0.1:0".into());
        raw.markdown.addr = Some("127.0.0.1:0".into());
        raw.imagine.addr = Some("127.0.0.1:0".into());
        if raw.models.is_none() {
            raw.models = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("models.toml"));
        }
        // The server runs in this test process: its conversion workers are the built binary.
        if raw.markdown.worker_program.is_none() {
            raw.markdown.worker_program = Some(PathBuf::from(env!("CARGO_BIN_EXE_hearth")));
        }
        let config = raw.resolve().expect("test configuration resolves");
        let running = start_retrying(config).await?;
        Ok(TestApp {
            running: Some(running),
            client: reqwest::Client::new(),
            dir: Some(dir),
        })
    }
}

/// sled releases its file lock a moment after the last handle drops: retry briefly on restart.
async fn start_retrying(
    config: hearth_server::Config,
) -> Result<Running, hearth_server::app::StartError> {
    for _ in 0..50 {
        match hearth_server::start(config.clone()).await {
            Err(hearth_server::app::StartError::Store(hearth_store::Error::Locked { .. })) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            started => return started,
        }
    }
    panic!("store stayed locked");
}

/// A running server and a client for it.
pub struct TestApp {
    running: Option<Running>,
    pub client: reqwest::Client,
    dir: Option<TempDir>,
}

impl TestApp {
    pub fn builder() -> AppBuilder {
        AppBuilder {
            raw: RawConfig::default(),
            services: vec![Service::Auth],
            data_dir: None,
        }
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("server running")
    }

    /// Base URL of a running service, e.g. `http://127.0.0.1:43121`.
    pub fn url(&self, service: Service) -> String {
        let addr = self
            .running()
            .addr(service)
            .unwrap_or_else(|| panic!("{service} is not running"));
        format!("http://{addr}")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.as_ref().expect("data dir").path().to_path_buf()
    }

    /// An identity token from the built-in provider (what `hearth idp mint` prints).
    pub fn idp_token(&self, user: &str) -> String {
        self.idp_token_with(user, chrono::Duration::hours(1), false)
    }

    pub fn idp_token_with(&self, user: &str, ttl: chrono::Duration, marketing: bool) -> String {
        let secret =
            hearth_auth::load_or_create_secret(&paths::idp_secret(&self.data_dir())).unwrap();
        hearth_auth::SharedSecretIdp::new(secret.as_bytes())
            .mint(user, ttl, marketing)
            .unwrap()
    }

    /// Signs in for real: mints an identity token and exchanges it at `POST /token`.
    pub async fn token(&self, user: &str) -> String {
        let idp = self.idp_token(user);
        let (status, body) = self
            .post(
                Service::Auth,
                "/token",
                json!({ "userId": user, "idpToken": idp, "lifetimeSeconds": 3600 }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "sign-in failed: {body}");
        body["serviceToken"]
            .as_str()
            .expect("serviceToken")
            .to_string()
    }

    /// POSTs JSON and returns the status and JSON body (Null when the body is not JSON).
    pub async fn post(&self, service: Service, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.url(service)))
            .json(&body)
            .send()
            .await
            .expect("request sent");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, service: Service, path: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .get(format!("{}{path}", self.url(service)))
            .send()
            .await
            .expect("request sent");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub fn admin_key(&self) -> String {
        std::fs::read_to_string(paths::admin_key(&self.data_dir()))
            .unwrap()
            .trim()
            .to_string()
    }

    /// Credits `amount` (decimal string; negative debits) through the admin API; returns the
    /// balance after, as the wire string.
    pub async fn credit(&self, user: &str, amount: &str) -> String {
        let debit = amount.starts_with('-');
        let (status, body) = self
            .post(Service::Auth, "/admin/credit", json!({ "adminKey": self.admin_key(), "userId": user, "amount": amount, "debit": debit }))
            .await;
        assert_eq!(status, StatusCode::OK, "credit failed: {body}");
        body["balanceAfter"].as_str().unwrap().to_string()
    }

    /// The user's balance through the admin API, as the wire string.
    pub async fn balance(&self, user: &str) -> String {
        let (status, body) = self
            .post(
                Service::Auth,
                "/admin/balance",
                json!({ "adminKey": self.admin_key(), "userId": user }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "balance failed: {body}");
        body["balance"].as_str().unwrap().to_string()
    }

    /// Stops the server (requests in flight finish) and hands back the data dir.
    pub async fn stop(mut self) -> TempDir {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
        self.dir.take().expect("data dir")
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(r) = &self.running {
            r.shutdown_token().cancel();
        }
    }
}

/// Asserts the spec's error shape and type; returns the message.
/// Runs the real `hearth` binary with a clean environment (`env` and `RUST_LOG=warn` only);
/// returns (success, stdout, stderr).
pub fn hearth_cli(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("hearth runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn assert_error(body: &Value, error_type: &str) -> String {
    let err = &body["error"];
    assert_eq!(err["type"], error_type, "unexpected error body: {body}");
    assert!(
        err["details"].is_object(),
        "details must be an object: {body}"
    );
    err["message"]
        .as_str()
        .expect("error.message is a string")
        .to_string()
}

/// The Python of the third-party clients' virtual environment (`openai`, `prometheus_client`,
/// `openapi-spec-validator`, `jsonschema`): `$HEARTH_CLIENTS_PYTHON`, else the repository's
/// `.cache/venv-clients`, which `scripts/python-clients.sh` creates.
pub fn clients_python() -> PathBuf {
    let python = std::env::var_os("HEARTH_CLIENTS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/venv-clients/bin/python")
        });
    assert!(
        python.exists(),
        "{} is missing: run scripts/python-clients.sh, or point HEARTH_CLIENTS_PYTHON at a \
         Python that has the clients",
        python.display()
    );
    python
}

/// Runs `tests/clients/<script>` with `input` on its stdin (off the async runtime); its exit
/// status, stdout and stderr.
pub async fn run_client_script(
    script: &str,
    args: Vec<String>,
    input: Vec<u8>,
) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(clients_python())
            .arg(&script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", script.display()));
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

/// Whether `check` holds within `within`, asking every `every`.
pub async fn eventually<F: std::future::Future<Output = bool>>(
    within: std::time::Duration,
    every: std::time::Duration,
    mut check: impl FnMut() -> F,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// The value of the first series `name` at `{base}/metrics` whose labels include `label`
/// (`key="value"`; any series of that name with `None`); `None` when there is none or the
/// listener does not answer.
pub async fn metric(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    label: Option<&str>,
) -> Option<f64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| {
            l.strip_prefix(name).is_some_and(|rest| match label {
                Some(label) => rest.starts_with('{') && rest.contains(label),
                None => rest.starts_with([' ', '{']),
            })
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}
