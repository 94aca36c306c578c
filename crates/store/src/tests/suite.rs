//! The store's behaviour, checked the same way on both backends.

use super::{both_backends, d, TestDb};
use crate::*;

both_backends!(
    new_user_gets_the_initial_balance_with_a_ledger_row,
    debit_beyond_balance_is_refused_and_changes_nothing,
    money_for_unknown_users_and_non_positive_amounts_is_refused,
    hold_settles_exactly_once_refunding_the_rest,
    hold_beyond_balance_is_refused_and_settle_above_hold_is_refused,
    data_survives_reopening_and_stale_holds_are_released,
    idp_logout_revokes_every_token_minted_from_it_and_purge_forgets_expired,
    health_checks_running_at_the_same_time_all_pass,
    users_are_listed_in_byte_order_with_their_balances,
    a_shared_value_is_the_first_one_stored_whoever_asks,
    a_hold_released_in_the_background_gives_its_funds_back,
    values_are_set_listed_by_prefix_and_removed,
);

pub(crate) async fn new_user_gets_the_initial_balance_with_a_ledger_row(db: &TestDb) {
    let store = db.open("5.25").await;
    store.ensure_user("alice", false).await.unwrap();
    assert_eq!(store.balance("alice").await.unwrap(), d("5.25"));
    let ledger = store.ledger("alice").await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].amount, d("5.25"));
    assert_eq!(ledger[0].reason, "initial balance");
    // Seeing the user again neither resets nor re-credits them.
    store
        .debit("alice", d("1"), &LedgerMeta::reason("x"))
        .await
        .unwrap();
    store.ensure_user("alice", true).await.unwrap();
    assert_eq!(store.balance("alice").await.unwrap(), d("4.25"));
    assert!(store.user("alice").await.unwrap().unwrap().is_marketing);
    assert!(store.user("nobody").await.unwrap().is_none());
}

pub(crate) async fn debit_beyond_balance_is_refused_and_changes_nothing(db: &TestDb) {
    let store = db.open("1").await;
    store.ensure_user("bob", false).await.unwrap();
    let err = store
        .debit("bob", d("1.000001"), &LedgerMeta::reason("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InsufficientFunds { needed, available } if needed == d("1.000001") && available == d("1")),
        "{err:?}"
    );
    assert_eq!(store.balance("bob").await.unwrap(), d("1"));
    assert_eq!(store.ledger("bob").await.unwrap().len(), 1);
    // Exactly the balance may go: to zero, not below.
    store
        .debit("bob", d("1"), &LedgerMeta::reason("x"))
        .await
        .unwrap();
    assert_eq!(store.balance("bob").await.unwrap(), d("0"));
}

pub(crate) async fn money_for_unknown_users_and_non_positive_amounts_is_refused(db: &TestDb) {
    let store = db.open("0").await;
    assert!(matches!(
        store.credit("ghost", d("1"), &LedgerMeta::default()).await,
        Err(Error::UnknownUser(_))
    ));
    assert!(matches!(
        store
            .place_hold("ghost", d("1"), &LedgerMeta::default())
            .await,
        Err(Error::UnknownUser(_))
    ));
    assert!(matches!(
        store.balance("ghost").await,
        Err(Error::UnknownUser(_))
    ));
    store.ensure_user("carol", false).await.unwrap();
    for bad in ["-1", "0"] {
        assert!(matches!(
            store.credit("carol", d(bad), &LedgerMeta::default()).await,
            Err(Error::NonPositiveAmount(_))
        ));
        assert!(matches!(
            store.debit("carol", d(bad), &LedgerMeta::default()).await,
            Err(Error::NonPositiveAmount(_))
        ));
    }
    assert!(matches!(
        store
            .place_hold("carol", d("-0.01"), &LedgerMeta::default())
            .await,
        Err(Error::NonPositiveAmount(_))
    ));
    for bad in ["", "a\u{0}b", "line\nbreak"] {
        assert!(matches!(
            store.ensure_user(bad, false).await,
            Err(Error::InvalidUserId(_))
        ));
    }
    assert!(matches!(
        store.ensure_user(&"x".repeat(257), false).await,
        Err(Error::InvalidUserId(_))
    ));
}

pub(crate) async fn hold_settles_exactly_once_refunding_the_rest(db: &TestDb) {
    let store = db.open("10").await;
    store.ensure_user("erin", false).await.unwrap();
    let hold = store
        .place_hold("erin", d("4"), &LedgerMeta::reason("completion"))
        .await
        .unwrap();
    assert_eq!(hold.balance_before, d("10"));
    assert_eq!(hold.node_id, "node-a");
    assert_eq!(store.balance("erin").await.unwrap(), d("6"));
    assert_eq!(store.holds("erin").await.unwrap(), vec![hold.clone()]);
    let change = store.settle_hold(hold.id, d("1.5")).await.unwrap();
    assert_eq!((change.before, change.after), (d("10"), d("8.5")));
    assert!(matches!(
        store.settle_hold(hold.id, d("1.5")).await,
        Err(Error::UnknownHold(_))
    ));
    assert!(matches!(
        store.release_hold(hold.id).await,
        Err(Error::UnknownHold(_))
    ));
    assert!(matches!(
        store.settle_hold(HoldId(987_654), d("0")).await,
        Err(Error::UnknownHold(_))
    ));
    assert_eq!(store.balance("erin").await.unwrap(), d("8.5"));
    let ledger = store.ledger("erin").await.unwrap();
    assert_eq!(ledger.len(), 2);
    assert_eq!(ledger[1].amount, d("-1.5"));
    assert_eq!(ledger[1].balance_after, d("8.5"));
    assert_eq!(ledger[1].reason, "completion");
    // A hold of nothing (a free request) settles for nothing and writes no ledger row.
    let free = store
        .place_hold("erin", d("0"), &LedgerMeta::default())
        .await
        .unwrap();
    assert_eq!(
        store.settle_hold(free.id, d("0")).await.unwrap().ledger_seq,
        None
    );
    assert_eq!(store.ledger("erin").await.unwrap().len(), 2);
}

pub(crate) async fn hold_beyond_balance_is_refused_and_settle_above_hold_is_refused(db: &TestDb) {
    let store = db.open("3").await;
    store.ensure_user("fay", false).await.unwrap();
    assert!(matches!(
        store.place_hold("fay", d("3.01"), &LedgerMeta::default()).await,
        Err(Error::InsufficientFunds { needed, available }) if needed == d("3.01") && available == d("3")
    ));
    let hold = store
        .place_hold("fay", d("2"), &LedgerMeta::default())
        .await
        .unwrap();
    assert!(matches!(
        store.settle_hold(hold.id, d("2.5")).await,
        Err(Error::SettleExceedsHold { .. })
    ));
    // The refused settle left the hold open: releasing it restores everything.
    assert_eq!(store.holds("fay").await.unwrap().len(), 1);
    store.release_hold(hold.id).await.unwrap();
    assert_eq!(store.balance("fay").await.unwrap(), d("3"));
    assert_eq!(store.ledger("fay").await.unwrap().len(), 1);
}

pub(crate) async fn data_survives_reopening_and_stale_holds_are_released(db: &TestDb) {
    {
        let store = db.open("0").await;
        store.ensure_user("gus", true).await.unwrap();
        store
            .credit("gus", d("7.123456"), &LedgerMeta::reason("top-up"))
            .await
            .unwrap();
        store
            .place_hold("gus", d("2"), &LedgerMeta::default())
            .await
            .unwrap();
        store
            .revoke_token("jti-1", Utc::now() + chrono::Duration::hours(1))
            .await
            .unwrap();
    }
    let store = db.open("0").await;
    assert_eq!(store.balance("gus").await.unwrap(), d("5.123456"));
    assert_eq!(store.release_stale_holds().await.unwrap(), 1);
    assert_eq!(store.release_stale_holds().await.unwrap(), 0);
    assert_eq!(store.balance("gus").await.unwrap(), d("7.123456"));
    assert!(store.holds("gus").await.unwrap().is_empty());
    assert!(store.is_token_revoked("jti-1").await.unwrap());
    assert!(!store.is_token_revoked("jti-2").await.unwrap());
    assert!(store.user("gus").await.unwrap().unwrap().is_marketing);
}

pub(crate) async fn idp_logout_revokes_every_token_minted_from_it_and_purge_forgets_expired(
    db: &TestDb,
) {
    let store = db.open("0").await;
    let soon = Utc::now() + chrono::Duration::hours(1);
    store.record_idp_session("idp-a", "j1", soon).await.unwrap();
    store.record_idp_session("idp-a", "j2", soon).await.unwrap();
    store.record_idp_session("idp-b", "j3", soon).await.unwrap();
    assert_eq!(store.revoke_idp_sessions("idp-a", soon).await.unwrap(), 2);
    assert!(store.is_token_revoked("j1").await.unwrap());
    assert!(store.is_token_revoked("j2").await.unwrap());
    assert!(!store.is_token_revoked("j3").await.unwrap());
    assert!(store.is_idp_token_revoked("idp-a").await.unwrap());
    assert!(!store.is_idp_token_revoked("idp-b").await.unwrap());
    // Logging out again revokes nothing new and is no error.
    assert_eq!(store.revoke_idp_sessions("idp-a", soon).await.unwrap(), 0);
    let removed = store
        .purge_expired(soon + chrono::Duration::seconds(1))
        .await
        .unwrap();
    // j1, j2, the idp-b session (j3) and the idp-a revocation.
    assert_eq!(removed, 4);
    assert!(!store.is_idp_token_revoked("idp-a").await.unwrap());
    assert!(!store.is_token_revoked("j1").await.unwrap());
}

pub(crate) async fn health_checks_running_at_the_same_time_all_pass(db: &TestDb) {
    let store = db.open("0").await;
    let checks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut failed = 0;
                for _ in 0..20 {
                    failed += usize::from(store.health_check().await.is_err());
                }
                failed
            })
        })
        .collect();
    let mut failures = 0;
    for c in checks {
        failures += c.await.unwrap();
    }
    assert_eq!(failures, 0);
}

pub(crate) async fn users_are_listed_in_byte_order_with_their_balances(db: &TestDb) {
    let store = db.open("2").await;
    for u in ["bea", "Zed", "amy", "é-user"] {
        store.ensure_user(u, u == "amy").await.unwrap();
    }
    store
        .credit("bea", d("0.5"), &LedgerMeta::default())
        .await
        .unwrap();
    let users = store.users().await.unwrap();
    let rows: Vec<(&str, bool, Decimal)> = users
        .iter()
        .map(|(u, b)| (u.user_id.as_str(), u.is_marketing, *b))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("Zed", false, d("2")),
            ("amy", true, d("2")),
            ("bea", false, d("2.5")),
            ("é-user", false, d("2")),
        ]
    );
}

pub(crate) async fn a_shared_value_is_the_first_one_stored_whoever_asks(db: &TestDb) {
    let store = db.open("0").await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .shared_value("secret", || format!("value-{i}"))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    assert!(seen.iter().all(|v| v == &seen[0]), "{seen:?}");
    drop(store);
    let store = db.open("0").await;
    let again = store
        .shared_value("secret", || "later".into())
        .await
        .unwrap();
    assert_eq!(again, seen[0]);
    let other = store.shared_value("other", || "x".into()).await.unwrap();
    assert_eq!(other, "x");
}

pub(crate) async fn a_hold_released_in_the_background_gives_its_funds_back(db: &TestDb) {
    let store = db.open("5").await;
    store.ensure_user("hal", false).await.unwrap();
    let hold = store
        .place_hold("hal", d("5"), &LedgerMeta::default())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    store.release_in_background(hold.id, move |r| {
        let _ = tx.send(r.map(|c| c.after));
    });
    assert_eq!(rx.await.unwrap().unwrap(), d("5"));
    assert_eq!(store.balance("hal").await.unwrap(), d("5"));
}

pub(crate) async fn values_are_set_listed_by_prefix_and_removed(db: &TestDb) {
    let store = db.open("0").await;
    store.put_value("node/b", "http://b").await.unwrap();
    store.put_value("node/a", "http://a0").await.unwrap();
    store.put_value("node/a", "http://a").await.unwrap();
    store.put_value("other", "x").await.unwrap();
    assert_eq!(
        store.values("node/").await.unwrap(),
        vec![
            ("node/a".to_string(), "http://a".to_string()),
            ("node/b".to_string(), "http://b".to_string())
        ]
    );
    store.remove_value("node/a").await.unwrap();
    store.remove_value("node/none").await.unwrap();
    assert_eq!(store.values("node/").await.unwrap().len(), 1);
    // A shared value is one of them.
    assert_eq!(
        store.shared_value("other", || "y".into()).await.unwrap(),
        "x"
    );
}
