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
