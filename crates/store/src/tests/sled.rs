//! What only the embedded backend does: one process at a time, files on disk.

use super::{d, TestDb};
use crate::*;

#[test]
fn a_second_open_of_the_same_folder_reports_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
}

#[tokio::test]
async fn health_check_fails_once_the_data_folder_is_gone() {
    let db = TestDb::sled();
    let store = db.open("0").await;
    store.health_check().await.unwrap();
    std::fs::remove_dir_all(store.path().unwrap()).unwrap();
    assert!(store.health_check().await.is_err());
}

#[test]
fn the_store_works_without_an_async_runtime() {
    // The billing crate's `Drop` of a hold may run where there is no runtime.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    futures::executor::block_on(async {
        store.ensure_user("ivy", false).await.unwrap();
        store
            .credit("ivy", d("3"), &LedgerMeta::default())
            .await
            .unwrap();
        let hold = store
            .place_hold("ivy", d("1"), &LedgerMeta::default())
            .await
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        store.release_in_background(hold.id, move |r| {
            let _ = tx.send(r.map(|c| c.after));
        });
        // Without a runtime the release ran right there.
        assert_eq!(rx.try_recv().unwrap().unwrap(), d("3"));
    });
}

#[tokio::test]
#[allow(irrefutable_let_patterns)] // irrefutable when sled is the only backend built
async fn holds_written_before_nodes_had_ids_read_back_and_are_released() {
    let db = TestDb::sled();
    let store = db.open("4").await;
    store.ensure_user("old", false).await.unwrap();
    let hold = store
        .place_hold("old", d("4"), &LedgerMeta::default())
        .await
        .unwrap();
    // Rewrite the hold as an older Hearth stored it: no node_id field.
    let crate::Backend::Sled(s) = &store.backend else {
        unreachable!()
    };
    let mut json = serde_json::to_value(&hold).unwrap();
    json.as_object_mut().unwrap().remove("node_id");
    s.put_raw_hold(hold.id, &serde_json::to_vec(&json).unwrap());
    assert_eq!(store.holds("old").await.unwrap()[0].node_id, "");
    assert_eq!(store.release_stale_holds().await.unwrap(), 1);
    assert_eq!(store.balance("old").await.unwrap(), d("4"));
}
