use super::*;
use std::str::FromStr;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

fn open(dir: &Path, initial: &str) -> Store {
    Store::open(
        dir,
        StoreOptions {
            initial_balance: d(initial),
        },
    )
    .unwrap()
}

#[test]
fn new_user_gets_the_initial_balance_with_a_ledger_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "5.25");
    store.ensure_user("alice", false).unwrap();
    assert_eq!(store.balance("alice").unwrap(), d("5.25"));
    let ledger = store.ledger("alice").unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].amount, d("5.25"));
    // Seeing the user again neither resets nor re-credits them.
    store
        .debit("alice", d("1"), &LedgerMeta::reason("x"))
        .unwrap();
    store.ensure_user("alice", true).unwrap();
    assert_eq!(store.balance("alice").unwrap(), d("4.25"));
    assert!(store.user("alice").unwrap().unwrap().is_marketing);
}

#[test]
fn debit_beyond_balance_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "1");
    store.ensure_user("bob", false).unwrap();
    let err = store
        .debit("bob", d("1.000001"), &LedgerMeta::reason("x"))
        .unwrap_err();
    assert!(
        matches!(err, Error::InsufficientFunds { needed, available } if needed == d("1.000001") && available == d("1"))
    );
    assert_eq!(store.balance("bob").unwrap(), d("1"));
    assert_eq!(store.ledger("bob").unwrap().len(), 1);
}

#[test]
fn money_for_unknown_users_and_non_positive_amounts_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "0");
    assert!(matches!(
        store.credit("ghost", d("1"), &LedgerMeta::default()),
        Err(Error::UnknownUser(_))
    ));
    store.ensure_user("carol", false).unwrap();
    assert!(matches!(
        store.credit("carol", d("-1"), &LedgerMeta::default()),
        Err(Error::NonPositiveAmount(_))
    ));
    assert!(matches!(
        store.ensure_user("", false),
        Err(Error::InvalidUserId(_))
    ));
}

#[test]
fn concurrent_debits_and_credits_add_up_exactly_with_one_ledger_row_each() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "1000");
    store.ensure_user("dave", false).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let meta = LedgerMeta::reason(format!("t{t} op{i}"));
                    if (t + i) % 3 == 0 {
                        store.credit("dave", d("0.5"), &meta).unwrap();
                    } else {
                        store.debit("dave", d("1.25"), &meta).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let ops: Vec<(i32, i32)> = (0..8).flat_map(|t| (0..25).map(move |i| (t, i))).collect();
    let credits = ops.iter().filter(|(t, i)| (t + i) % 3 == 0).count() as i64;
    let debits = ops.len() as i64 - credits;
    let expected =
        d("1000") + Decimal::from(credits) * d("0.5") - Decimal::from(debits) * d("1.25");
    assert_eq!(store.balance("dave").unwrap(), expected);
    let ledger = store.ledger("dave").unwrap();
    assert_eq!(ledger.len(), 1 + ops.len());
    let sum: Decimal = ledger.iter().map(|e| e.amount).sum();
    assert_eq!(sum, expected);
    // Each row's balance_after is the running total in ledger order.
    let mut running = Decimal::ZERO;
    for e in &ledger {
        running += e.amount;
        assert_eq!(e.balance_after, running);
    }
}

#[test]
fn hold_settles_exactly_once_refunding_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "10");
    store.ensure_user("erin", false).unwrap();
    let hold = store
        .place_hold("erin", d("4"), &LedgerMeta::reason("completion"))
        .unwrap();
    assert_eq!(hold.balance_before, d("10"));
    assert_eq!(store.balance("erin").unwrap(), d("6"));
    let change = store.settle_hold(hold.id, d("1.5")).unwrap();
    assert_eq!((change.before, change.after), (d("10"), d("8.5")));
    assert!(matches!(
        store.settle_hold(hold.id, d("1.5")),
        Err(Error::UnknownHold(_))
    ));
    assert!(matches!(
        store.release_hold(hold.id),
        Err(Error::UnknownHold(_))
    ));
    assert_eq!(store.balance("erin").unwrap(), d("8.5"));
    let ledger = store.ledger("erin").unwrap();
    assert_eq!(ledger.last().unwrap().amount, d("-1.5"));
}

#[test]
fn hold_beyond_balance_is_refused_and_settle_above_hold_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "3");
    store.ensure_user("fay", false).unwrap();
    assert!(matches!(
        store.place_hold("fay", d("3.01"), &LedgerMeta::default()),
        Err(Error::InsufficientFunds { .. })
    ));
    let hold = store
        .place_hold("fay", d("2"), &LedgerMeta::default())
        .unwrap();
    assert!(matches!(
        store.settle_hold(hold.id, d("2.5")),
        Err(Error::SettleExceedsHold { .. })
    ));
    // The refused settle left the hold open: releasing it restores everything.
    store.release_hold(hold.id).unwrap();
    assert_eq!(store.balance("fay").unwrap(), d("3"));
    assert_eq!(store.ledger("fay").unwrap().len(), 1);
}

#[test]
fn data_survives_reopening_and_stale_holds_are_released() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), "0");
        store.ensure_user("gus", true).unwrap();
        store
            .credit("gus", d("7.123456"), &LedgerMeta::reason("top-up"))
            .unwrap();
        store
            .place_hold("gus", d("2"), &LedgerMeta::default())
            .unwrap();
        store
            .revoke_token("jti-1", Utc::now() + chrono::Duration::hours(1))
            .unwrap();
    }
    let store = open(dir.path(), "0");
    assert_eq!(store.balance("gus").unwrap(), d("5.123456"));
    assert_eq!(store.release_stale_holds().unwrap(), 1);
    assert_eq!(store.balance("gus").unwrap(), d("7.123456"));
    assert!(store.holds("gus").unwrap().is_empty());
    assert!(store.is_token_revoked("jti-1").unwrap());
    assert!(store.user("gus").unwrap().unwrap().is_marketing);
}

#[test]
fn a_second_open_of_the_same_folder_reports_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _store = open(dir.path(), "0");
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
}

#[test]
fn idp_logout_revokes_every_token_minted_from_it_and_purge_forgets_expired() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "0");
    let soon = Utc::now() + chrono::Duration::hours(1);
    store.record_idp_session("idp-a", "j1", soon).unwrap();
    store.record_idp_session("idp-a", "j2", soon).unwrap();
    store.record_idp_session("idp-b", "j3", soon).unwrap();
    assert_eq!(store.revoke_idp_sessions("idp-a", soon).unwrap(), 2);
    assert!(store.is_token_revoked("j1").unwrap() && store.is_token_revoked("j2").unwrap());
    assert!(!store.is_token_revoked("j3").unwrap());
    assert!(store.is_idp_token_revoked("idp-a").unwrap());
    let removed = store
        .purge_expired(soon + chrono::Duration::seconds(1))
        .unwrap();
    assert_eq!(removed, 4);
    assert!(!store.is_idp_token_revoked("idp-a").unwrap());
}

#[test]
fn health_check_fails_once_the_data_folder_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = open(&path, "0");
    store.health_check().unwrap();
    std::fs::remove_dir_all(&path).unwrap();
    assert!(store.health_check().is_err());
}

#[test]
fn health_checks_running_at_the_same_time_all_pass() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("db"), "0");
    let failures: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                s.spawn(move || (0..50).filter(|_| store.health_check().is_err()).count())
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert_eq!(failures, 0);
}
