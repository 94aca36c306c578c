//! Faults without loss: the database taken away under running `hearth serve` processes and
//! brought back. Every test runs on a PostgreSQL cluster of its own (`common::postgres`), which
//! it stops (`pg_ctl stop -m fast`: every connection is cut) and starts again on the same port.
//! The outage runs under plain decoding on one node and two, and under a draft model's
//! speculation on one.
//!
//! What must hold, whatever the database does:
//! - money: the balance at the end is the start less exactly the costs of the answers that said
//!   they cost something; no hold is left open. A settlement the store cannot take waits in the
//!   node's journal (`hearth_billing::Journal`) and reaches the store once it is back, also when
//!   the node is killed with SIGKILL meanwhile and started again;
//! - nobody hangs: health answers at once (completion 500, auth 503) and new paid requests are
//!   refused with 503 and `Retry-After` while the database is down, and every request gets an
//!   answer within its limit.
//!
//! Skipped (with a message) without `HEARTH_TEST_POSTGRES_URL`, as the other PostgreSQL tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::common::eventually;
use crate::common::postgres::Cluster;
use crate::common::process::ServerProcess;
use crate::completion::{cost_of, dec, models_toml, request};
use crate::multinode::{hearth, n_completion_nodes, sign_in};

/// The longest a test lets one request take: far above any answer here (a few tokens), so only
/// a request hanging on the database reaches it.
const REQUEST_LIMIT: Duration = Duration::from_secs(20);

/// The longest a health answer may take in these tests. The server bounds its check at
/// `hearth_store::HEALTH_BUDGET` (0.8 s); the rest is room for a loaded CI machine.
const HEALTH_LIMIT: Duration = Duration::from_secs(2);

/// How long a refusal of a new paid request may take while the database is down: the pool's
/// acquire timeout (0.75 s) before the circuit opens, at once after; the rest is room again.
const REFUSAL_LIMIT: Duration = Duration::from_secs(2);

/// How the nodes' `alpha-3.3` decodes.
#[derive(Clone, Copy, PartialEq)]
enum Decoding {
    Plain,
    /// Drafted for by a Q4_0 copy of its weights (`speculative = { method = "draft" }`): the
    /// draft model's caches and its back-off beside the money.
    Drafted,
}

/// `n` auth + completion nodes on the database at `url`, each in its own data dir (10 credits
/// for a new user, no per-user cap, room in the queue for every client).
async fn nodes(url: &str, n: usize, dir: &std::path::Path) -> Vec<ServerProcess> {
    nodes_decoding(url, n, dir, Decoding::Plain).await
}

/// [`nodes`], with `alpha-3.3` decoding as `decoding` says.
async fn nodes_decoding(
    url: &str,
    n: usize,
    dir: &std::path::Path,
    decoding: Decoding,
) -> Vec<ServerProcess> {
    let models = models_toml(dir);
    let mut row = "shutdown_grace_ms = 500\nmax_queued = 256".to_string();
    let mut extra = String::new();
    if decoding == Decoding::Drafted {
        row.push_str("\nspeculative = { method = \"draft\", model = \"smol-draft\" }");
        extra = crate::speculative::draft_row(&crate::speculative::smollm2_q4_0(dir));
    }
    let mut table =
        std::fs::read_to_string(&models)
            .unwrap()
            .replacen("shutdown_grace_ms = 500", &row, 1);
    table.push('\n');
    table.push_str(&extra);
    std::fs::write(&models, table).unwrap();
    n_completion_nodes(url, models, n).await
}

/// A store handle of the test's own, for reading balances and holds.
async fn store(url: &str) -> hearth_store::Store {
    hearth_store::Store::connect(url, Default::default())
        .await
        .unwrap()
}

/// `GET {url}/`: its status and how long the answer took.
async fn health(http: &reqwest::Client, url: &str) -> (u16, Duration) {
    let started = Instant::now();
    let status = http
        .get(format!("{url}/"))
        .timeout(REQUEST_LIMIT)
        .send()
        .await
        .map_or(0, |r| r.status().as_u16());
    (status, started.elapsed())
}

/// The node's completion gauge `name`.
async fn gauge(http: &reqwest::Client, node: &ServerProcess, name: &str) -> Option<f64> {
    crate::common::metric(http, node.url("completion"), name, None).await
}

/// Waits up to 30 s for `check` to hold.
async fn within_30s<F: std::future::Future<Output = bool>>(check: impl FnMut() -> F) -> bool {
    eventually(Duration::from_secs(30), Duration::from_millis(100), check).await
}

/// One answer a client got: its status and what it said it cost (zero unless 200).
struct Answer {
    status: u16,
    cost: Decimal,
    took: Duration,
}

/// Paid completions from `clients` tasks, spread over `nodes`, until `stop` is set.
fn traffic(
    nodes: &[ServerProcess],
    token: &str,
    clients: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Answer>>> {
    let http = reqwest::Client::new();
    (0..clients)
        .map(|c| {
            let urls: Vec<String> = nodes.iter().map(|n| n.url("completion").into()).collect();
            let (http, token, stop) = (http.clone(), token.to_string(), Arc::clone(stop));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut i = c;
                while !stop.load(Ordering::Relaxed) {
                    let url = format!("{}/", urls[i % urls.len()]);
                    let body = request(&token, &format!("Say {i}."), 6);
                    let started = Instant::now();
                    let sent = http
                        .post(url)
                        .json(&body)
                        .timeout(REQUEST_LIMIT)
                        .send()
                        .await;
                    let response =
                        sent.unwrap_or_else(|e| panic!("request {i} got no answer: {e}"));
                    let status = response.status().as_u16();
                    let retry_after = response.headers().get("retry-after").cloned();
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    let cost = match status {
                        200 => cost_of(&body),
                        503 => {
                            assert!(retry_after.is_some(), "a 503 without Retry-After: {body}");
                            assert_eq!(body["error"]["type"], "Overloaded", "{body}");
                            Decimal::ZERO
                        }
                        _ => panic!("request {i}: {status} {body}"),
                    };
                    answers.push(Answer {
                        status,
                        cost,
                        took: started.elapsed(),
                    });
                    i += clients;
                }
                answers
            })
        })
        .collect()
}

/// A completion on the OpenAI route that runs to its token limit (`ignore_eos`, 300 tokens):
/// long enough to be running when the database goes. Its answer must be a 200.
fn long_completion(
    http: &reqwest::Client,
    node: &ServerProcess,
    token: &str,
    i: usize,
) -> tokio::task::JoinHandle<Value> {
    let url = format!("{}/v1/chat/completions", node.url("completion"));
    let body = json!({
        "model": "alpha-3.3",
        "messages": [{"role": "user", "content": format!("Count from {i} to 1000.")}],
        "max_tokens": 300,
        "temperature": 0.0,
        "ignore_eos": true,
    });
    let (http, token) = (http.clone(), token.to_string());
    tokio::spawn(async move {
        let r = http
            .post(url)
            .bearer_auth(token)
            .json(&body)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 200, "{body}");
        body
    })
}

/// What an OpenAI-route answer says it cost (Hearth's `hearth` object).
fn openai_cost(body: &Value) -> Decimal {
    let cost = &body["hearth"];
    dec(cost["input_cost"].as_str().unwrap()) + dec(cost["output_cost"].as_str().unwrap())
}

/// Traffic on `n` nodes; the database stops for a few seconds and starts again. Health and new
/// requests answer at once meanwhile, and afterwards the money is exact and no hold is open.
async fn an_outage_mid_traffic(n: usize, test: &str, decoding: Decoding) {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = cluster.database(test).await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = nodes_decoding(&url, n, dir.path(), decoding).await;
    let idp = hearth(&["idp", "mint", "eve"], nodes[0].data_dir(), &url);
    let token = sign_in(&nodes[0], "eve", idp.trim()).await;
    let store = store(&url).await;
    let initial = store.balance("eve").await.unwrap();
    let http = reqwest::Client::new();

    // Beside the traffic, one long completion of another user on the last node, running when
    // the database goes (300 tokens beside the traffic take seconds on a 2-core machine):
    // whenever it ends, before, during or after the outage, it answers 200 and is charged once.
    let idp = hearth(&["idp", "mint", "gil"], nodes[0].data_dir(), &url);
    let long_token = sign_in(&nodes[0], "gil", idp.trim()).await;
    let long_initial = store.balance("gil").await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let clients = traffic(&nodes, &token, 6, &stop);
    let long = long_completion(&http, &nodes[n - 1], &long_token, 0);
    assert!(
        within_30s(|| async { store.holds("gil").await.unwrap().len() == 1 }).await,
        "the long completion never held its funds"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    tokio::task::block_in_place(|| cluster.down());
    let down_at = Instant::now();
    // Health answers within its bound in the failing states while the database is away.
    for node in &nodes {
        let (status, took) = health(&http, node.url("completion")).await;
        assert_eq!(status, 500, "completion health while the database is down");
        assert!(took < HEALTH_LIMIT, "completion health took {took:?}");
        let (status, took) = health(&http, node.url("auth")).await;
        assert_eq!(status, 503, "auth health while the database is down");
        assert!(took < HEALTH_LIMIT, "auth health took {took:?}");
    }
    // A new paid request is refused at once with the store's figure, not left waiting.
    for node in &nodes {
        let started = Instant::now();
        let refused = http
            .post(format!("{}/", node.url("completion")))
            .json(&request(&token, "Say hello.", 6))
            .timeout(REQUEST_LIMIT)
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(refused.status(), 503);
        assert_eq!(
            refused.headers()["retry-after"],
            hearth_store::RETRY_AFTER.as_secs().to_string().as_str()
        );
        assert!(took < REFUSAL_LIMIT, "the refusal took {took:?}");
    }
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(down_at.elapsed())).await;
    tokio::task::block_in_place(|| cluster.up());

    // Healthy again as soon as the database is back, and serving.
    for node in &nodes {
        let url = node.url("completion").to_string();
        assert!(
            within_30s(|| {
                let (http, url) = (http.clone(), url.clone());
                async move { health(&http, &url).await.0 == 200 }
            })
            .await,
            "the node never turned healthy again"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.await.unwrap());
    }
    let served = answers.iter().filter(|a| a.status == 200).count();
    let refused = answers.iter().filter(|a| a.status == 503).count();
    assert!(
        served > 0 && refused > 0,
        "{served} served, {refused} refused"
    );
    let slowest = answers.iter().map(|a| a.took).max().unwrap();
    assert!(slowest < REQUEST_LIMIT, "an answer took {slowest:?}");

    // Every journaled settlement reached the store; the money is exact.
    for node in &nodes {
        assert!(
            within_30s(|| async {
                gauge(&http, node, "hearth_billing_journal_depth").await == Some(0.0)
            })
            .await,
            "a node's journal never emptied"
        );
    }
    assert_eq!(
        store.holds("eve").await.unwrap(),
        vec![],
        "a hold was left open"
    );
    let long_cost = openai_cost(&long.await.unwrap());
    assert_eq!(store.holds("gil").await.unwrap(), vec![]);
    assert_eq!(
        store.balance("gil").await.unwrap(),
        long_initial - long_cost
    );
    let spent: Decimal = answers.iter().map(|a| a.cost).sum();
    assert_eq!(
        store.balance("eve").await.unwrap(),
        initial - spent,
        "{served} answers said they cost {spent} in all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_stopped_mid_traffic_under_one_node_costs_no_money_and_nothing_hangs() {
    an_outage_mid_traffic(1, "chaos_one_node", Decoding::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_stopped_mid_traffic_under_two_nodes_costs_no_money_and_nothing_hangs() {
    an_outage_mid_traffic(2, "chaos_two_nodes", Decoding::Plain).await;
}

/// The same outage under one node whose model a draft model drafts for: the drafted streams,
/// the long one among them, settle exactly and leave no hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_stopped_under_drafted_traffic_costs_no_money_and_nothing_hangs() {
    an_outage_mid_traffic(1, "chaos_drafted", Decoding::Drafted).await;
}

/// Completions finish while the database is down: each is answered with its cost and waits in
/// the node's journal. The node is killed with SIGKILL, the database comes back, the node starts
/// again in its data dir: it replays the journal before releasing its earlier life's holds, so
/// the balance is the start less exactly what the answers said, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_while_its_journal_holds_settlements_charges_them_once_after_restart() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = cluster.database("chaos_journal").await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = nodes(&url, 1, dir.path()).await;
    let idp = hearth(&["idp", "mint", "fay"], nodes[0].data_dir(), &url);
    let token = sign_in(&nodes[0], "fay", idp.trim()).await;
    let store = store(&url).await;
    let initial = store.balance("fay").await.unwrap();
    let http = reqwest::Client::new();

    // Three completions that run until their token limit (`ignore_eos`), long enough to be
    // running when the database goes.
    const RUNNING: usize = 3;
    let running: Vec<_> = (0..RUNNING)
        .map(|i| long_completion(&http, &nodes[0], &token, i))
        .collect();
    assert!(
        within_30s(|| async { store.holds("fay").await.unwrap().len() == RUNNING }).await,
        "the completions never held their funds"
    );
    tokio::task::block_in_place(|| cluster.down());

    let mut spent = Decimal::ZERO;
    for r in running {
        spent += openai_cost(&r.await.unwrap());
    }
    assert!(spent > Decimal::ZERO);
    let journal = nodes[0].data_dir().join("journal");
    let waiting = std::fs::read_dir(&journal).unwrap().count();
    assert_eq!(
        waiting, RUNNING,
        "each answered settlement waits in {journal:?}"
    );

    // Killed while they wait; the database comes back; the node starts again.
    let node = &mut nodes[0];
    tokio::task::block_in_place(|| {
        node.kill();
        cluster.up();
        node.restart();
    });
    assert_eq!(std::fs::read_dir(&journal).unwrap().count(), 0);
    assert_eq!(
        store.holds("fay").await.unwrap(),
        vec![],
        "a hold was left open"
    );
    assert_eq!(store.balance("fay").await.unwrap(), initial - spent);
    // One debit per answer: replaying did not charge twice.
    let debits = store
        .ledger("fay")
        .await
        .unwrap()
        .iter()
        .filter(|e| e.amount < Decimal::ZERO)
        .count();
    assert_eq!(debits, RUNNING);
}

/// Embeddings (and reranking, which pays the same way) through an outage: a client embedding
/// steadily while the database stops and starts again gets a 200 with its usage or a 503 with
/// `Retry-After`, each within its limit; a request held before the outage and settled during it
/// is charged once the journal reaches the store; and the balance is the start less exactly
/// the tokens the answers said they read, with no hold left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_stopped_under_embedding_traffic_costs_exactly_the_tokens_answered() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = cluster.database("embed_outage").await;
    let dir = tempfile::tempdir().unwrap();
    let models = models_toml(dir.path());
    let minilm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/all-MiniLM-L6-v2");
    let mut table = std::fs::read_to_string(&models).unwrap();
    table.push_str(&format!(
        "\n[embedding.\"minilm\"]\nweights = \"{}\"\ninput_price_per_million = \"10\"\n",
        minilm.display()
    ));
    std::fs::write(&models, table).unwrap();
    let nodes = n_completion_nodes(&url, models, 1).await;
    let idp = hearth(&["idp", "mint", "ivy"], nodes[0].data_dir(), &url);
    let token = sign_in(&nodes[0], "ivy", idp.trim()).await;
    let store = store(&url).await;
    let initial = store.balance("ivy").await.unwrap();
    let endpoint = format!("{}/v1/embeddings", nodes[0].url("completion"));

    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (endpoint, token, stop) = (endpoint.clone(), token.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let (mut tokens, mut served, mut refused) = (0u64, 0, 0);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                // Some requests long enough to be held when the database goes.
                let text = format!("Ferry {i} arrives at noon. ").repeat(1 + (i % 3) * 20);
                let body = json!({"model": "minilm", "input": [text, "and one more"],
                    "truncate_prompt_tokens": -1});
                let started = Instant::now();
                let response = http
                    .post(&endpoint)
                    .bearer_auth(&token)
                    .json(&body)
                    .timeout(REQUEST_LIMIT)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("request {i} got no answer: {e}"));
                let status = response.status().as_u16();
                let retry_after = response.headers().get("retry-after").cloned();
                let answer: Value = response.json().await.unwrap_or(Value::Null);
                match status {
                    200 => {
                        tokens += answer["usage"]["prompt_tokens"].as_u64().unwrap();
                        served += 1;
                    }
                    503 => {
                        assert!(retry_after.is_some(), "a 503 without Retry-After: {answer}");
                        refused += 1;
                        // Refusals come at once: a short pause, not thousands of them.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    _ => panic!("request {i}: {status} {answer}"),
                }
                assert!(started.elapsed() < REQUEST_LIMIT);
                i += 1;
            }
            (tokens, served, refused)
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| cluster.down());
    tokio::time::sleep(Duration::from_secs(4)).await;
    tokio::task::block_in_place(|| cluster.up());
    let http = reqwest::Client::new();
    assert!(
        within_30s(|| {
            let (http, url) = (http.clone(), nodes[0].url("completion").to_string());
            async move { health(&http, &url).await.0 == 200 }
        })
        .await,
        "the node never turned healthy again"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let (tokens, served, refused) = client.await.unwrap();
    assert!(
        served > 0 && refused > 0,
        "{served} served, {refused} refused"
    );
    assert!(
        within_30s(|| async {
            gauge(&http, &nodes[0], "hearth_billing_journal_depth").await == Some(0.0)
        })
        .await,
        "the journal never emptied"
    );
    assert_eq!(
        store.holds("ivy").await.unwrap(),
        vec![],
        "a hold was left open"
    );
    assert_eq!(
        store.balance("ivy").await.unwrap(),
        initial - Decimal::from(tokens) * dec("0.00001"),
        "{served} answers read {tokens} tokens"
    );
}
