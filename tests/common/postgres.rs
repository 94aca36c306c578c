//! A PostgreSQL cluster of one test's own, which the test may take down and bring back under a
//! running Hearth (`scripts/postgres.sh down` / `up`, same port). Removed when dropped.

use std::path::PathBuf;
use std::process::Command;

pub struct Cluster {
    dir: PathBuf,
    /// `postgres://...` of the server's default database.
    server: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres.sh")
}

fn run(args: &[&str]) -> String {
    let out = Command::new(script())
        .args(args)
        .output()
        .expect("scripts/postgres.sh runs");
    assert!(
        out.status.success(),
        "scripts/postgres.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Cluster {
    /// A new cluster, or `None` (with a message) where the PostgreSQL tests do not run: without
    /// `HEARTH_TEST_POSTGRES_URL`, as the other PostgreSQL tests (`scripts/test.sh` sets it and
    /// installs the server these clusters are made with).
    pub fn start() -> Option<Cluster> {
        if std::env::var_os("HEARTH_TEST_POSTGRES_URL").is_none() {
            eprintln!("skipped: HEARTH_TEST_POSTGRES_URL is not set (scripts/postgres.sh start)");
            return None;
        }
        let exports = run(&["start"]);
        let value = |key: &str| {
            exports
                .lines()
                .find_map(|l| l.strip_prefix(&format!("export {key}=")))
                .unwrap_or_else(|| panic!("postgres.sh printed no {key}: {exports}"))
                .to_string()
        };
        Some(Cluster {
            dir: PathBuf::from(value("HEARTH_PG_DIR")),
            server: value("HEARTH_TEST_POSTGRES_URL"),
        })
    }

    /// A fresh database on this cluster; its url.
    pub async fn database(&self, name: &str) -> String {
        hearth_store::create_database(&self.server, name)
            .await
            .expect("create a database")
    }

    /// Stops the server (a fast shutdown: every connection is cut, nothing is lost).
    pub fn down(&self) {
        run(&["down", self.dir.to_str().unwrap()]);
    }

    /// Starts it again on the same port.
    pub fn up(&self) {
        run(&["up", self.dir.to_str().unwrap()]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", self.dir.to_str().unwrap()])
            .output();
    }
}
