//! The operator's side: `hearth` CLI with the server stopped and running (admin API), data
//! surviving restarts and `kill -9`, and money adding up under concurrency.

use crate::common::{assert_error, hearth_cli as hearth, spawn_app, TestApp};
use hearth_server::app::paths;
use hearth_server::Service;
use reqwest::StatusCode;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

fn dir_arg(dir: &Path) -> String {
    dir.display().to_string()
}

#[test]
fn cli_manages_balances_with_the_server_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir_arg(dir.path());
    let (ok, out, err) = hearth(
        &[
            "balance",
            "credit",
            "amy",
            "12.5",
            "--note",
            "welcome gift",
            "--data-dir",
            &d,
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        "amy: 10.000000 -> 22.500000",
        "new user gets the initial 10 first"
    );
    let (ok, out, _) = hearth(&["balance", "show", "amy", "--data-dir", &d], &[]);
    assert!(ok);
    assert_eq!(out.trim(), "amy 22.500000");
    let (ok, _, err) = hearth(&["balance", "credit", "amy", "-5", "--data-dir", &d], &[]);
    assert!(!ok && err.contains("--debit"), "{err}");
    let (ok, out, _) = hearth(
        &[
            "balance",
            "credit",
            "amy",
            "-5",
            "--debit",
            "--data-dir",
            &d,
        ],
        &[],
    );
    assert!(ok);
    assert_eq!(out.trim(), "amy: 22.500000 -> 17.500000");
    let (ok, _, err) = hearth(
        &[
            "balance",
            "credit",
            "amy",
            "100",
            "--debit",
            "--data-dir",
            &d,
        ],
        &[],
    );
    assert!(!ok && err.contains("insufficient funds"), "{err}");
    let (ok, _, err) = hearth(
        &["balance", "credit", "amy", "1.0000001", "--data-dir", &d],
        &[],
    );
    assert!(!ok && err.contains("decimal places"), "{err}");
    let (ok, _, err) = hearth(&["balance", "show", "nobody", "--data-dir", &d], &[]);
    assert!(!ok && err.contains("nobody"), "{err}");
    let (ok, out, _) = hearth(&["users", "list", "--data-dir", &d], &[]);
    assert!(ok);
    let row = out
        .lines()
        .find(|l| l.starts_with("amy "))
        .expect("amy listed");
    assert!(row.contains("17.500000"), "{row}");
}

#[tokio::test]
async fn cli_goes_through_the_admin_api_while_the_server_runs() {
    let app = spawn_app().await;
    let d = dir_arg(&app.data_dir());
    // No address given: the server listens on an ephemeral port, and the CLI finds it through
    // the data dir (`server.json`, written at start).
    let info = hearth_server::app::read_server_file(&app.data_dir().join("server.json"))
        .expect("the server recorded itself in its data dir");
    let addr = app.running().addr(Service::Auth).unwrap();
    assert_eq!(info.auth_url, format!("http://{addr}"));
    let env: [(&str, &str); 0] = [];
    let (d2, e2) = (d.clone(), env.map(|(k, v)| (k.to_string(), v.to_string())));
    let run = move |args: Vec<&'static str>| {
        let (d, e) = (d2.clone(), e2.clone());
        tokio::task::spawn_blocking(move || {
            let mut full: Vec<&str> = args.to_vec();
            full.extend(["--data-dir", d.as_str()]);
            let env: Vec<(&str, &str)> = e.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            hearth(&full, &env)
        })
    };
    let (ok, out, err) = run(vec!["balance", "credit", "ben", "2.25"]).await.unwrap();
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "ben: 10.000000 -> 12.250000");
    assert_eq!(
        app.balance("ben").await,
        "12.250000",
        "the running server sees it"
    );
    let (ok, out, _) = run(vec!["balance", "show", "ben"]).await.unwrap();
    assert!(ok);
    assert_eq!(out.trim(), "ben 12.250000");
    let (ok, out, _) = run(vec!["users", "list"]).await.unwrap();
    assert!(ok && out.contains("ben "), "{out}");
    // The identity token minted by the CLI signs in at the running server.
    let (ok, idp, err) = run(vec!["idp", "mint", "ben", "--ttl", "120", "--marketing"])
        .await
        .unwrap();
    assert!(ok, "{err}");
    let (status, body) = app
        .post(
            Service::Auth,
            "/token",
            json!({ "userId": "ben", "idpToken": idp.trim() }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    drop(d);
}

#[tokio::test]
async fn admin_api_refuses_a_wrong_key_and_its_key_file_is_private() {
    let app = spawn_app().await;
    let (status, body) = app
        .post(
            Service::Auth,
            "/admin/credit",
            json!({ "adminKey": "0".repeat(64), "userId": "cal", "amount": "5" }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for file in [
            paths::admin_key(&app.data_dir()),
            paths::service_token_secret(&app.data_dir()),
        ] {
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", file.display());
        }
    }
}

#[tokio::test]
async fn balances_users_and_revocations_survive_a_restart() {
    let app = spawn_app().await;
    let kept = app.token("dora").await;
    let revoked = app.token("dora").await;
    app.credit("dora", "3.333333").await;
    let (status, _) = app
        .post(Service::Auth, "/logout", json!({ "serviceToken": revoked }))
        .await;
    assert_eq!(status, StatusCode::OK);
    let dir = app.stop().await;

    let app = TestApp::builder().data_dir(dir).spawn().await;
    assert_eq!(app.balance("dora").await, "13.333333");
    let (status, _) = app
        .post(Service::Auth, "/validate", json!({ "serviceToken": kept }))
        .await;
    assert_eq!(status, StatusCode::OK, "same signing key after restart");
    let (status, body) = app
        .post(
            Service::Auth,
            "/validate",
            json!({ "serviceToken": revoked }),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "InvalidCredentials");
}

#[test]
fn a_credit_survives_kill_9_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir_arg(dir.path());
    let mut server = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "serve",
            "--services",
            "auth",
            "--auth-addr",
            "127.0.0.1:0",
            "--data-dir",
            &d,
        ])
        .env_clear()
        .env("RUST_LOG", "hearth=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("server printed its address").unwrap();
        if let Some(rest) = line.split("listening service=auth addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let env = [("HEARTH_AUTH_ADDR", addr.as_str())];
    let (ok, out, err) = hearth(&["balance", "credit", "eve", "7.5", "--data-dir", &d], &env);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "eve: 10.000000 -> 17.500000");
    server.kill().unwrap(); // SIGKILL: no shutdown path runs
    server.wait().unwrap();
    // With the server gone the CLI opens the database itself.
    let (ok, out, err) = hearth(&["balance", "show", "eve", "--data-dir", &d], &[]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "eve 17.500000");
}

#[tokio::test]
async fn parallel_credits_and_debits_through_the_api_add_up_exactly() {
    let app = std::sync::Arc::new(spawn_app().await);
    app.credit("finn", "90").await; // 10 initial + 90
    let mut tasks = Vec::new();
    for i in 0..40 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let amount = if i % 4 == 0 { "1.5" } else { "-2.25" };
            app.credit("finn", amount).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 10 credits of 1.5 and 30 debits of 2.25: 100 + 15 - 67.5.
    assert_eq!(app.balance("finn").await, "47.500000");
}
