//! The `hearth` executable started the way a user starts it (`hearth serve`), for tests that
//! need the real process: its memory, its child processes, whether it is still alive.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use tempfile::TempDir;

/// A running `hearth serve`, killed when dropped.
pub struct ServerProcess {
    child: Child,
    urls: HashMap<String, String>,
    launch: Launch,
    _dir: TempDir,
}

/// How a `ServerProcess` was started, to start it again.
struct Launch {
    services: Vec<String>,
    models: PathBuf,
    env: Vec<(String, String)>,
}

impl Launch {
    /// Runs `hearth serve` on `data_dir`; returns the child once every service listens, with
    /// each service's base URL.
    fn spawn(&self, data_dir: &Path) -> (Child, HashMap<String, String>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--models")
            .arg(&self.models)
            .arg("--services")
            .arg(self.services.join(","));
        for s in &self.services {
            cmd.arg(format!("--{s}-addr")).arg("127.0.0.1:0");
        }
        cmd.env("RUST_LOG", "hearth=info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("hearth serve starts");
        let stderr = child.stderr.take().expect("piped stderr");
        // Read the log on a thread of its own for the whole run, so the server never blocks on
        // a full pipe; hand over `listening` lines, and keep the start of the log to show when
        // the server never listens.
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut kept) = kept.lock() {
                    if kept.len() < 200 {
                        kept.push(line.clone());
                    }
                }
                if line.contains("listening") {
                    let _ = tx.send(line);
                }
            }
        });
        let mut urls = HashMap::new();
        while urls.len() < self.services.len() {
            let line = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|e| {
                let status = child.try_wait().ok().flatten();
                let log = log.lock().map(|l| l.join("\n")).unwrap_or_default();
                panic!("hearth serve listens within 120 s ({e}; exit status {status:?}); its log:\n{log}")
            });
            let field = |key: &str| {
                let rest = &line[line.find(&format!("{key}="))? + key.len() + 1..];
                Some(rest.split_whitespace().next()?.to_string())
            };
            if let (Some(service), Some(addr)) = (field("service"), field("addr")) {
                urls.insert(service, format!("http://{addr}"));
            }
        }
        (child, urls)
    }
}

impl ServerProcess {
    /// Starts `hearth serve` for `services` on ephemeral ports with a fresh data dir and the
    /// model table `models`, `env` added to its environment; returns once every service listens.
    pub fn start(services: &[&str], models: &Path, env: &[(&str, &str)]) -> ServerProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let launch = Launch {
            services: services.iter().map(|s| s.to_string()).collect(),
            models: models.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let (child, urls) = launch.spawn(dir.path());
        ServerProcess {
            child,
            urls,
            launch,
            _dir: dir,
        }
    }

    /// Kills the process with SIGKILL (no clean-up of any kind runs), then starts it again with
    /// the same data dir, models and environment, on new ephemeral ports.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// Kills the process with SIGKILL and waits for it to end; no clean-up of any kind runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the (ended) process again with the same data dir, models and environment, on
    /// new ephemeral ports.
    pub fn restart(&mut self) {
        let (child, urls) = self.launch.spawn(self._dir.path());
        self.child = child;
        self.urls = urls;
    }

    /// The admin API's answer at `/admin/{path}` (the key from the data dir added to `body`).
    pub async fn admin(&self, path: &str, mut body: serde_json::Value) -> (u16, serde_json::Value) {
        let key = std::fs::read_to_string(self.data_dir().join("admin.key")).unwrap();
        body["adminKey"] = serde_json::json!(key.trim());
        let r = reqwest::Client::new()
            .post(format!("{}/admin/{path}", self.url("auth")))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// Model `id`'s row of `hearth models list` (`Null` when there is none).
    pub async fn model_row(&self, id: &str) -> serde_json::Value {
        let (_, all) = self.admin("models", serde_json::json!({})).await;
        all["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_default()
    }

    /// A service token for `user`, signed in at `POST /token` with the built-in provider.
    pub async fn token(&self, user: &str) -> String {
        let secret =
            hearth_auth::load_or_create_secret(&self.data_dir().join("idp.secret")).unwrap();
        let idp = hearth_auth::SharedSecretIdp::new(secret.as_bytes());
        let id_token = idp
            .mint(user, chrono::Duration::minutes(10), false)
            .unwrap();
        let r: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/token", self.url("auth")))
            .json(&serde_json::json!({ "userId": user, "idpToken": id_token, "lifetimeSeconds": 600 }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["serviceToken"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    }

    /// The base URL of `service` (`auth`, `completion`, `markdown`, `imagine`).
    pub fn url(&self, service: &str) -> &str {
        &self.urls[service]
    }

    /// The server's data dir (its database, secrets and admin key).
    pub fn data_dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends the signal named `name` (`TERM`, `INT`, ...) to the process.
    pub fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{name} failed");
    }

    /// The process's exit status if it ends within `limit`.
    pub fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process's peak resident memory so far (`VmHWM`), in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        proc_status_kib(self.pid(), "VmHWM:") * 1024
    }

    /// The pids of the process's direct children (its conversion workers).
    pub fn children(&self) -> Vec<u32> {
        let tasks = format!("/proc/{}/task", self.pid());
        let mut pids = Vec::new();
        for task in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        pids
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `kB` field of `/proc/PID/status`, 0 when unreadable.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
