//! What the billing tests share: a sled store in a temp dir with one funded user.

use hearth_store::{LedgerMeta, Store};
use rust_decimal::Decimal;
use std::str::FromStr;

pub(crate) fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// A store in a new temp dir (`db` in it, the rest free for a journal) where `user` has
/// `balance`.
pub(crate) async fn store_with(user: &str, balance: &str) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), Default::default()).unwrap();
    store.ensure_user(user, false).await.unwrap();
    store
        .credit(user, d(balance), &LedgerMeta::reason("test funds"))
        .await
        .unwrap();
    (dir, store)
}
