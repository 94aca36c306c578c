//! What only the shared backend does: several nodes on one database.

use super::{d, TestDb};
use crate::*;

#[tokio::test]
async fn a_node_releases_only_its_own_stale_holds_and_an_operator_releases_a_dead_nodes() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let a = db.open_as("10", "node-a").await;
    let b = db.open_as("10", "node-b").await;
    a.ensure_user("kim", false).await.unwrap();
    let on_a = a
        .place_hold("kim", d("3"), &LedgerMeta::default())
        .await
        .unwrap();
    let on_b = b
        .place_hold("kim", d("4"), &LedgerMeta::default())
        .await
        .unwrap();
    assert_eq!(
        (on_a.node_id.as_str(), on_b.node_id.as_str()),
        ("node-a", "node-b")
    );
    // Node b restarts: it gives back its own hold, never a's (a is alive and still streaming).
    drop(b);
    let b = db.open_as("10", "node-b").await;
    assert_eq!(b.release_stale_holds().await.unwrap(), 1);
    assert_eq!(b.holds("kim").await.unwrap(), vec![on_a.clone()]);
    assert_eq!(a.balance("kim").await.unwrap(), d("7"));
    // a's request still settles its hold.
    a.settle_hold(on_a.id, d("1")).await.unwrap();
    // a dies with a hold open and never comes back: the operator releases it by node id.
    let stranded = a
        .place_hold("kim", d("2"), &LedgerMeta::default())
        .await
        .unwrap();
    drop(a);
    assert_eq!(b.holds_of_node("node-a").await.unwrap(), vec![stranded]);
    assert_eq!(b.release_holds_of_node("node-a").await.unwrap(), 1);
    assert_eq!(b.release_holds_of_node("node-a").await.unwrap(), 0);
    assert_eq!(b.balance("kim").await.unwrap(), d("9"));
}

#[tokio::test]
#[allow(irrefutable_let_patterns)] // irrefutable when PostgreSQL is the only backend built
async fn the_database_itself_refuses_a_negative_balance() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let store = db.open("1").await;
    store.ensure_user("neg", false).await.unwrap();
    let Backend::Postgres(pg) = &store.backend else {
        unreachable!()
    };
    let err = pg
        .raw("UPDATE balances SET balance = balance - 2 WHERE user_id = 'neg'")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("check constraint"), "{err}");
    assert_eq!(store.balance("neg").await.unwrap(), d("1"));
}

#[tokio::test]
async fn a_url_that_is_not_postgres_is_refused_before_connecting() {
    let err = Store::connect("mysql://localhost/x", StoreOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadUrl(_)), "{err:?}");
}

/// `scripts/postgres.sh ARGS`; its stdout.
fn cluster_script(args: &[&str]) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/postgres.sh");
    let out = std::process::Command::new(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The database stopped under an open store: calls fail as unreachable within the acquire
/// timeout, three in a row open the circuit and later calls are refused at once; the health
/// probe still tries the database, answers within its budget, and closes the circuit once the
/// database is back. A cluster of the test's own, as it is stopped and started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_while_the_database_is_down_and_the_first_answer_closes_the_circuit() {
    if std::env::var_os("HEARTH_TEST_POSTGRES_URL").is_none() {
        eprintln!("skipped: HEARTH_TEST_POSTGRES_URL is not set (scripts/postgres.sh start)");
        return;
    }
    let exports = cluster_script(&["start"]);
    let value = |key: &str| {
        exports
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {key}=")))
            .unwrap()
            .to_string()
    };
    let (dir, server) = (value("HEARTH_PG_DIR"), value("HEARTH_TEST_POSTGRES_URL"));
    struct Removed(String);
    impl Drop for Removed {
        fn drop(&mut self) {
            cluster_script(&["stop", &self.0]);
        }
    }
    let _removed = Removed(dir.clone());
    let url = create_database(&server, "store_circuit").await.unwrap();
    let store = Store::connect(&url, StoreOptions::default()).await.unwrap();
    store.ensure_user("lee", false).await.unwrap();
    assert_eq!(store.reachability(), Reachability::Reachable);

    cluster_script(&["down", &dir]);
    let limit = StoreOptions::default().acquire_timeout + std::time::Duration::from_millis(750);
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let e = store.balance("lee").await.unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        assert!(started.elapsed() < limit, "took {:?}", started.elapsed());
    }
    assert_eq!(store.reachability(), Reachability::Open);
    let started = std::time::Instant::now();
    let refused = store
        .place_hold("lee", d("0"), &LedgerMeta::default())
        .await;
    assert!(
        matches!(refused, Err(Error::Unavailable { retry_after }) if retry_after == RETRY_AFTER),
        "{refused:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(100));
    let started = std::time::Instant::now();
    assert!(store.health_check().await.unwrap_err().is_unavailable());
    assert!(started.elapsed() < HEALTH_BUDGET + std::time::Duration::from_millis(500));

    cluster_script(&["up", &dir]);
    store.health_check().await.unwrap();
    assert_eq!(store.reachability(), Reachability::Reachable);
    assert_eq!(store.balance("lee").await.unwrap(), d("0"));
}
