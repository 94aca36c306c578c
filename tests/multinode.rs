//! Two `hearth serve` processes on one PostgreSQL database (`[store] url`), each with its own
//! data dir and ports, configured with nothing else in common: a token minted on one works on
//! the other, a logout on either ends it on both at once, money is one balance, and the CLI
//! works against the shared store from any node's data dir. Skipped (with a message) without
//! `HEARTH_TEST_POSTGRES_URL`; `scripts/test.sh` starts a PostgreSQL and sets it.

use crate::common::process::ServerProcess;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// A fresh database for this test, or `None` when there is no test server.
async fn database(test: &str) -> Option<String> {
    let Ok(server) = std::env::var("HEARTH_TEST_POSTGRES_URL") else {
        eprintln!("skipped: HEARTH_TEST_POSTGRES_URL is not set (scripts/postgres.sh start)");
        return None;
    };
    let nanos = chrono::Utc::now().timestamp_subsec_nanos();
    let name = format!("{test}_{}_{nanos}", std::process::id());
    Some(hearth_store::create_database(&server, &name).await.unwrap())
}

/// Runs the `hearth` CLI on `data_dir` against the store at `url`; returns its stdout.
pub(crate) fn hearth(args: &[&str], data_dir: &Path, url: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("HEARTH_STORE_URL", url)
        .output()
        .expect("hearth runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "hearth {args:?}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub(crate) async fn post(url: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn sign_in(node: &ServerProcess, user: &str, idp: &str) -> String {
    let (status, body) = post(
        node.url("auth"),
        "/token",
        json!({ "userId": user, "idpToken": idp, "lifetimeSeconds": 3600 }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["serviceToken"].as_str().unwrap().to_string()
}

async fn validate(node: &ServerProcess, token: &str) -> StatusCode {
    post(
        node.url("auth"),
        "/validate",
        json!({ "serviceToken": token }),
    )
    .await
    .0
}

async fn balance(node: &ServerProcess, token: &str) -> String {
    let (status, body) = post(
        node.url("auth"),
        "/balance",
        json!({ "serviceToken": token }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["balance"].as_str().unwrap().to_string()
}

/// Starts two auth nodes on the database at `url`, each in a data dir of its own.
fn two_nodes(url: &str) -> (tempfile::TempDir, ServerProcess, ServerProcess) {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models.toml");
    std::fs::write(&models, "").unwrap();
    let env = [
        ("HEARTH_STORE_URL", url),
        ("HEARTH_BILLING_INITIAL_BALANCE", "3"),
    ];
    let a = ServerProcess::start(&["auth"], &models, &env);
    let b = ServerProcess::start(&["auth"], &models, &env);
    (dir, a, b)
}

/// Starts two auth + completion nodes on the database at `url` with the model table `models`
/// (10 credits for a new user, no per-user cap).
async fn completion_nodes(url: &str, models: std::path::PathBuf) -> (ServerProcess, ServerProcess) {
    let mut nodes = n_completion_nodes(url, models, 2).await;
    let b = nodes.pop().unwrap();
    (nodes.pop().unwrap(), b)
}

/// Starts `n` auth + completion nodes, as [`completion_nodes`] does.
pub(crate) async fn n_completion_nodes(
    url: &str,
    models: std::path::PathBuf,
    n: usize,
) -> Vec<ServerProcess> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let env = [
            ("HEARTH_STORE_URL", url.as_str()),
            ("HEARTH_BILLING_INITIAL_BALANCE", "10"),
            ("HEARTH_COMPLETION_MAX_CONCURRENT_PER_USER", "0"),
        ];
        (0..n)
            .map(|_| ServerProcess::start(&["auth", "completion"], &models, &env))
            .collect()
    })
    .await
    .unwrap()
}

/// The id a node recorded in its data dir (`node-id`).
fn node_id(node: &ServerProcess) -> String {
    std::fs::read_to_string(node.data_dir().join("node-id"))
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_one_node_works_on_the_other_and_a_logout_on_either_ends_it_on_both() {
    let Some(url) = database("multinode_tokens").await else {
        return;
    };
    let (_dir, a, b) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || two_nodes(&url)
    })
    .await
    .unwrap();
    // The identity provider's secret is in the database: minted with A's data dir, it signs in
    // on B.
    let idp = hearth(&["idp", "mint", "alice"], a.data_dir(), &url);
    let token = sign_in(&b, "alice", idp.trim()).await;
    assert_eq!(validate(&a, &token).await, StatusCode::OK);
    assert_eq!(balance(&a, &token).await, "3.000000");

    // One balance: credited through B's data dir, seen by A.
    hearth(&["balance", "credit", "alice", "2"], b.data_dir(), &url);
    assert_eq!(balance(&a, &token).await, "5.000000");
    let ledger = hearth(&["ledger", "alice"], a.data_dir(), &url);
    assert!(
        ledger.contains("initial balance") && ledger.contains("admin credit"),
        "{ledger}"
    );

    // Logged out on A: refused on B at once.
    let (status, body) = post(a.url("auth"), "/logout", json!({ "serviceToken": token })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(validate(&b, &token).await, StatusCode::UNAUTHORIZED);

    // An identity-provider logout on B ends the sessions made on A, and the identity token.
    let on_a = sign_in(&a, "alice", idp.trim()).await;
    let on_b = sign_in(&b, "alice", idp.trim()).await;
    let (status, body) = post(
        b.url("auth"),
        "/logout",
        json!({ "serviceToken": on_b, "idpToken": idp.trim() }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(validate(&a, &on_a).await, StatusCode::UNAUTHORIZED);
    let (status, _) = post(
        a.url("auth"),
        "/token",
        json!({ "userId": "alice", "idpToken": idp.trim(), "lifetimeSeconds": 60 }),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_has_its_own_id_and_the_operator_releases_a_dead_nodes_holds() {
    let Some(url) = database("multinode_holds").await else {
        return;
    };
    let (_dir, a, b) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || two_nodes(&url)
    })
    .await
    .unwrap();
    let (id_a, id_b) = (node_id(&a), node_id(&b));
    assert_ne!(id_a, id_b);
    // A hold left by node A (as a request in flight when A died leaves it).
    let store = hearth_store::Store::connect(
        &url,
        hearth_store::StoreOptions {
            node_id: id_a.clone(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    store.ensure_user("bo", false).await.unwrap();
    let meta = hearth_store::LedgerMeta::reason("completion");
    store
        .credit("bo", rust_decimal::Decimal::from(4), &meta)
        .await
        .unwrap();
    store
        .place_hold("bo", rust_decimal::Decimal::from(3), &meta)
        .await
        .unwrap();
    // B's operator gives back only what node A held.
    let out = hearth(&["holds", "release", "--node", &id_b], b.data_dir(), &url);
    assert!(out.contains("released 0 hold(s)"), "{out}");
    let out = hearth(&["holds", "release", "--node", &id_a], b.data_dir(), &url);
    assert!(out.contains("released 1 hold(s)"), "{out}");
    assert_eq!(
        store.balance("bo").await.unwrap(),
        rust_decimal::Decimal::from(4)
    );
}

/// Completions on two nodes: a stream running on A is stopped through B (B relays A's answer),
/// and many concurrent completions for one user, split across both nodes, leave exactly the
/// initial balance less what each answer says it cost, with one ledger row each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_one_node_stops_through_the_other_and_both_nodes_bill_one_balance_exactly() {
    use crate::completion::{cost_of, dec, models_toml, request};
    use futures::StreamExt;
    let Some(url) = database("multinode_completions").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let models = models_toml(dir.path());
    // Room for every one of the concurrent requests below to wait its turn on one node, however
    // slow a shared CI machine makes the turns.
    let table = std::fs::read_to_string(&models).unwrap().replacen(
        "shutdown_grace_ms = 500",
        "shutdown_grace_ms = 500\nmax_queued = 256\nqueue_timeout_ms = 600000",
        1,
    );
    std::fs::write(&models, table).unwrap();
    let (a, b) = completion_nodes(&url, models).await;
    let idp = hearth(&["idp", "mint", "cat"], a.data_dir(), &url);
    let token = sign_in(&a, "cat", idp.trim()).await;
    let http = reqwest::Client::new();

    // A stream on A, stopped by a request to B.
    let response = http
        .post(format!("{}/stream", a.url("completion")))
        .json(&request(
            &token,
            "Count from one to one thousand in words.",
            2000,
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-stream-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\"token\"") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    let (status, stopped) = post(
        b.url("completion"),
        "/stream/shutdown",
        json!({ "streamId": id }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert_eq!(stopped["status"], "terminated");
    assert_eq!(stopped["streamId"], id.as_str());
    while let Some(chunk) = body.next().await {
        seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        seen.contains("\"aborted\":true"),
        "A's client saw no abort: {seen}"
    );
    let after_stop = stopped["response"]["balanceAfter"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(balance(&b, &token).await, after_stop);
    // Gone everywhere now: 404 from either node.
    for node in [&a, &b] {
        let (status, _) = post(
            node.url("completion"),
            "/stream/shutdown",
            json!({ "streamId": id }),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    // Concurrent completions for the same user on both nodes.
    const N: usize = 200;
    let start = dec(&after_stop);
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let node = if i % 2 == 0 { &a } else { &b };
            let url = format!("{}/", node.url("completion"));
            let (http, body) = (http.clone(), request(&token, &format!("Say {i}."), 3));
            tokio::spawn(async move {
                let r = http.post(url).json(&body).send().await.unwrap();
                let status = r.status();
                let body = r.json::<Value>().await.unwrap();
                assert_eq!(status, 200, "{body}");
                body
            })
        })
        .collect();
    let mut total = rust_decimal::Decimal::ZERO;
    for t in tasks {
        total += cost_of(&t.await.unwrap());
    }
    let end = dec(&balance(&a, &token).await);
    assert_eq!(end, start - total);
    let ledger = hearth(&["ledger", "cat"], b.data_dir(), &url);
    // The initial credit, the stopped stream and one row per completion.
    assert_eq!(ledger.lines().count(), 1 + 1 + 1 + N, "{ledger}");
}

/// Node A is killed with SIGKILL while streams run on it and B serves the same user; the holds
/// A's streams left stay open (B's start-up or traffic never touches them) until A restarts in
/// its data dir and gives them back. Afterwards no hold is open, the balance replays from the
/// ledger, and it is the initial credit less exactly what the answers that finished said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_traffic_gives_its_holds_back_at_restart_and_the_balance_is_exact() {
    use crate::completion::{cost_of, dec, models_toml, request};
    use futures::StreamExt;
    let Some(url) = database("multinode_crash").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let models = models_toml(dir.path());
    let (a, b) = completion_nodes(&url, models).await;
    let id_a = node_id(&a);
    let idp = hearth(&["idp", "mint", "dot"], b.data_dir(), &url);
    let token = sign_in(&b, "dot", idp.trim()).await;
    let initial = dec(&balance(&b, &token).await);
    let http = reqwest::Client::new();

    // Long streams on A; each reports once its first token arrived, then reads to the end (or
    // to the broken connection) and returns the cost of a `completed` event if one came.
    const STREAMS: usize = 6;
    let (started_tx, mut started) = tokio::sync::mpsc::channel(STREAMS);
    let streams: Vec<_> = (0..STREAMS)
        .map(|i| {
            let url = format!("{}/stream", a.url("completion"));
            let body = request(
                &token,
                &format!("Count from {i} to one thousand in words."),
                2000,
            );
            let (http, started_tx) = (http.clone(), started_tx.clone());
            tokio::spawn(async move {
                let response = http.post(url).json(&body).send().await.unwrap();
                assert_eq!(response.status(), 200);
                let mut body = response.bytes_stream();
                let mut seen = String::new();
                let mut told = false;
                while let Some(Ok(chunk)) = body.next().await {
                    seen.push_str(&String::from_utf8_lossy(&chunk));
                    if !told && seen.contains("\"token\"") {
                        told = true;
                        let _ = started_tx.send(()).await;
                    }
                }
                let completed = seen
                    .split("data:")
                    .filter_map(|e| serde_json::from_str::<Value>(e.trim()).ok())
                    .find(|e| e["completed"] == true);
                completed.map(|e| cost_of(&e["response"]))
            })
        })
        .collect();
    for _ in 0..STREAMS {
        started
            .recv()
            .await
            .expect("every stream on A produces a token");
    }
    // Short completions on B run while A dies.
    const SHORT: usize = 20;
    let shorts: Vec<_> = (0..SHORT)
        .map(|i| {
            let url = format!("{}/", b.url("completion"));
            let (http, body) = (http.clone(), request(&token, &format!("Say {i}."), 3));
            tokio::spawn(async move {
                let r = http.post(url).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200);
                cost_of(&r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let store = hearth_store::Store::connect(&url, Default::default())
        .await
        .unwrap();
    let mut a = a;
    let a = tokio::task::spawn_blocking(move || {
        a.signal("KILL");
        a.exit_within(std::time::Duration::from_secs(10))
            .expect("A dies at SIGKILL");
        a
    })
    .await
    .unwrap();
    let mut spent = rust_decimal::Decimal::ZERO;
    let mut finished_on_a = 0;
    for s in streams {
        if let Some(cost) = s.await.unwrap() {
            spent += cost;
            finished_on_a += 1;
        }
    }
    for s in shorts {
        spent += s.await.unwrap();
    }
    // A's unfinished streams still hold money: nobody but A (or an operator) gives it back.
    let left_open = store.holds_of_node(&id_a).await.unwrap();
    assert_eq!(left_open.len(), STREAMS - finished_on_a, "{left_open:?}");
    assert!(store.balance("dot").await.unwrap() < initial - spent);

    let mut a = a;
    let a = tokio::task::spawn_blocking(move || {
        a.kill_and_restart();
        a
    })
    .await
    .unwrap();
    assert!(store.holds("dot").await.unwrap().is_empty());
    let end = dec(&balance(&a, &token).await);
    assert_eq!(dec(&balance(&b, &token).await), end);
    assert_eq!(end, initial - spent);
    let ledger = store.ledger("dot").await.unwrap();
    let replayed: rust_decimal::Decimal = ledger.iter().map(|e| e.amount).sum();
    assert_eq!(replayed, end, "{ledger:?}");
    // The initial credit and one row per finished completion; nothing for the killed streams.
    assert_eq!(ledger.len(), 1 + SHORT + finished_on_a, "{ledger:?}");
}
