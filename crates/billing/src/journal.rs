//! The settlement journal: settlements and releases the store could not take when they were
//! made, kept on this node's disk until it does.
//!
//! A client told what its request cost must find that cost in the ledger, even when the database
//! was down at the moment of settling. So a settlement that fails because the store cannot be
//! reached is written here (one file per hold, fsynced, and the folder too) before the client is
//! answered, and the hold stays open in the store meanwhile. [`Journal::run`] retries with
//! backoff until the store takes each entry; at start, [`Journal::replay`] runs before the node
//! releases the holds of its earlier life, so a node killed during an outage still charges what
//! it told its clients.
//!
//! Exactly once: the hold id is the entry's key. A settlement that reached the store before its
//! caller saw the failure closed the hold, so replaying it finds no open hold
//! ([`hearth_store::Error::UnknownHold`]) and the entry is dropped without a second charge.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hearth_store::{Hold, HoldId, Store};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// One settlement the store has not taken yet: `cost` 0 is a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub hold: Hold,
    pub cost: Decimal,
}

/// Why the journal could not be opened or written.
#[derive(Debug, thiserror::Error)]
#[error("settlement journal {path}: {source}")]
pub struct JournalError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// What one pass over the journal did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// Entries the store took now.
    pub applied: usize,
    /// Entries whose hold was already closed (the settlement had reached the store before the
    /// failure, or an operator released the hold): dropped, not applied twice.
    pub already_closed: usize,
    /// Entries left for a later pass because the store is still unreachable.
    pub left: usize,
}

/// The first wait between passes while the store is unreachable; it doubles up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The longest the last pass at shutdown may take.
const LAST_PASS: Duration = Duration::from_secs(1);

/// The journal folder of one node.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    depth: AtomicUsize,
    /// Woken when an entry is written, so the retry loop starts its backoff from the beginning.
    written: tokio::sync::Notify,
}

impl Journal {
    /// Opens (creating) the journal in `dir`; half-written files of an earlier life are removed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Arc<Self>, JournalError> {
        let dir = dir.into();
        let err = |source| JournalError {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(err)?;
        let mut depth = 0;
        for item in std::fs::read_dir(&dir).map_err(err)? {
            let path = item.map_err(err)?.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("json") => depth += 1,
                // Never renamed into place, so never acknowledged to a client.
                Some("tmp") => std::fs::remove_file(&path).map_err(err)?,
                _ => {}
            }
        }
        Ok(Arc::new(Self {
            dir,
            depth: AtomicUsize::new(depth),
            written: tokio::sync::Notify::new(),
        }))
    }

    /// Entries waiting for the store.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    fn file(&self, id: HoldId) -> PathBuf {
        self.dir.join(format!("hold-{}.json", id.0))
    }

    /// Writes `entry` durably: a temporary file, fsynced, renamed into place, and the folder
    /// fsynced, so a crash leaves either no entry or the whole one. Blocks on the disk.
    pub fn record(&self, entry: &Entry) -> Result<(), JournalError> {
        let path = self.file(entry.hold.id);
        let err = |source| JournalError {
            path: path.clone(),
            source,
        };
        let tmp = path.with_extension("tmp");
        let bytes = serde_json::to_vec(entry).map_err(|e| err(e.into()))?;
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(e));
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        self.written.notify_one();
        Ok(())
    }

    /// Takes over a settlement (or, at cost 0, a release) that the store failed with `error`:
    /// when `error` says the store could not be reached, the entry is recorded and this is
    /// `Ok`; otherwise, or when it cannot be recorded either, `error` comes back. Blocks on the
    /// disk.
    pub fn take_over(
        &self,
        error: hearth_store::Error,
        entry: Entry,
    ) -> Result<(), hearth_store::Error> {
        if !error.is_unavailable() {
            return Err(error);
        }
        match self.record(&entry) {
            Ok(()) => {
                tracing::warn!(hold = %entry.hold.id, user = %entry.hold.user_id, cost = %entry.cost, %error, "the store is unreachable: journaled");
                Ok(())
            }
            Err(j) => {
                tracing::error!(hold = %entry.hold.id, error = %j, "journaling failed");
                Err(error)
            }
        }
    }

    /// [`Journal::take_over`] on a blocking thread.
    pub async fn take_over_async(
        self: &Arc<Self>,
        error: hearth_store::Error,
        entry: Entry,
    ) -> Result<(), hearth_store::Error> {
        let journal = Arc::clone(self);
        tokio::task::spawn_blocking(move || journal.take_over(error, entry))
            .await
            .unwrap_or(Err(hearth_store::Error::Interrupted))
    }

    fn entries(&self) -> Result<Vec<(PathBuf, Entry)>, JournalError> {
        let err = |path: &Path, source| JournalError {
            path: path.to_path_buf(),
            source,
        };
        let mut out = Vec::new();
        for item in std::fs::read_dir(&self.dir).map_err(|e| err(&self.dir, e))? {
            let path = item.map_err(|e| err(&self.dir, e))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| err(&path, e))?;
            let entry = serde_json::from_slice(&bytes).map_err(|e| err(&path, e.into()))?;
            out.push((path, entry));
        }
        // Oldest holds first, as they were placed.
        out.sort_by_key(|(_, e): &(PathBuf, Entry)| e.hold.id.0);
        Ok(out)
    }

    /// Hands every entry to the store, oldest first, stopping at the first the store cannot take
    /// because it is unreachable. An entry leaves the journal only once the store has it.
    pub async fn replay(&self, store: &Store) -> Result<Replayed, JournalError> {
        let mut done = Replayed::default();
        let entries = self.entries()?;
        let total = entries.len();
        for (i, (path, entry)) in entries.into_iter().enumerate() {
            match store.settle_hold(entry.hold.id, entry.cost).await {
                Ok(_) => done.applied += 1,
                Err(hearth_store::Error::UnknownHold(_)) => done.already_closed += 1,
                Err(e) if e.is_unavailable() => {
                    done.left = total - i;
                    return Ok(done);
                }
                // A settlement the store refuses outright (it cannot be, as the cost was
                // checked against the hold) would never go through: release instead.
                Err(e) => {
                    tracing::error!(hold = %entry.hold.id, error = %e, "the store refused a journaled settlement; releasing the hold");
                    match store.release_hold(entry.hold.id).await {
                        Ok(_) | Err(hearth_store::Error::UnknownHold(_)) => {}
                        Err(e) => {
                            done.left = total - i;
                            tracing::warn!(error = %e, "releasing it failed; trying later");
                            return Ok(done);
                        }
                    }
                }
            }
            std::fs::remove_file(&path).map_err(|source| JournalError {
                path: path.clone(),
                source,
            })?;
            self.depth.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(done)
    }

    /// Replays until `stop` resolves: at once when an entry is written, then with backoff while
    /// the store stays unreachable. At `stop` (after the listeners have ended, so nothing settles
    /// any more) it makes one last pass of at most [`LAST_PASS`]; what is still left waits in the
    /// folder for the next start.
    pub async fn run(self: Arc<Self>, store: Store, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut backoff = FIRST_BACKOFF;
        loop {
            let idle = self.depth() == 0;
            if idle {
                backoff = FIRST_BACKOFF;
            }
            tokio::select! {
                _ = &mut stop => break,
                _ = self.written.notified() => {}
                _ = tokio::time::sleep(backoff), if !idle => {}
            }
            if !self.pass(&store).await {
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
        if !matches!(
            tokio::time::timeout(LAST_PASS, self.pass(&store)).await,
            Ok(true)
        ) {
            tracing::warn!(
                left = self.depth(),
                "journaled settlements wait for the next start"
            );
        }
    }

    /// One [`Journal::replay`], logged; whether it emptied the journal.
    async fn pass(&self, store: &Store) -> bool {
        match self.replay(store).await {
            Ok(done) if done.left == 0 => {
                if done.applied + done.already_closed > 0 {
                    tracing::info!(
                        applied = done.applied,
                        already_closed = done.already_closed,
                        "journaled settlements reached the store"
                    );
                }
                true
            }
            Ok(done) => {
                tracing::debug!(
                    left = done.left,
                    "the store is still unreachable; journaled settlements wait"
                );
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "reading the settlement journal failed");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{d, store_with};
    use hearth_store::LedgerMeta;

    async fn hold(store: &Store, user: &str, amount: &str) -> Hold {
        store
            .place_hold(user, d(amount), &LedgerMeta::reason("completion"))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_journaled_settlement_is_charged_once_even_if_it_had_reached_the_store() {
        let (dir, store) = store_with("ann", "10").await;
        let journal = Journal::open(dir.path().join("journal")).unwrap();
        // One settlement the store never saw, one release, and one that reached the store before
        // its caller saw the failure (so it was journaled too).
        let unseen = hold(&store, "ann", "3").await;
        let released = hold(&store, "ann", "2").await;
        let reached = hold(&store, "ann", "1").await;
        store.settle_hold(reached.id, d("0.5")).await.unwrap();
        for (hold, cost) in [(&unseen, "1.25"), (&released, "0"), (&reached, "0.5")] {
            let entry = Entry {
                hold: hold.clone(),
                cost: d(cost),
            };
            journal.record(&entry).unwrap();
        }
        assert_eq!(journal.depth(), 3);

        let done = journal.replay(&store).await.unwrap();
        assert_eq!(
            done,
            Replayed {
                applied: 2,
                already_closed: 1,
                left: 0
            }
        );
        assert_eq!(journal.depth(), 0);
        assert!(store.holds("ann").await.unwrap().is_empty());
        assert_eq!(store.balance("ann").await.unwrap(), d("8.25"));
        let debits: Vec<_> = store
            .ledger("ann")
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.amount < Decimal::ZERO)
            .map(|e| e.amount)
            .collect();
        assert_eq!(debits, vec![d("-0.5"), d("-1.25")]);
        // A second pass finds nothing to do.
        assert_eq!(journal.replay(&store).await.unwrap(), Replayed::default());
    }

    #[tokio::test]
    async fn entries_outlive_the_process_and_half_written_ones_are_dropped() {
        let (dir, store) = store_with("bob", "10").await;
        let path = dir.path().join("journal");
        let journal = Journal::open(&path).unwrap();
        let placed = hold(&store, "bob", "4").await;
        journal
            .record(&Entry {
                hold: placed.clone(),
                cost: d("4"),
            })
            .unwrap();
        // A write cut before its rename: never acknowledged, so never applied.
        std::fs::write(path.join("hold-999.tmp"), b"{\"hold\":").unwrap();
        drop(journal);

        let reopened = Journal::open(&path).unwrap();
        assert_eq!(reopened.depth(), 1);
        assert!(!path.join("hold-999.tmp").exists());
        assert_eq!(reopened.replay(&store).await.unwrap().applied, 1);
        assert_eq!(store.balance("bob").await.unwrap(), d("6"));
    }

    #[tokio::test]
    async fn the_retry_loop_hands_a_new_entry_to_the_store_at_once_and_stops_when_told() {
        let (dir, store) = store_with("cy", "10").await;
        let journal = Journal::open(dir.path().join("journal")).unwrap();
        let stop = stop_signal();
        let running = tokio::spawn(Arc::clone(&journal).run(store.clone(), stop.1));
        let placed = hold(&store, "cy", "2").await;
        journal
            .record(&Entry {
                hold: placed,
                cost: d("1"),
            })
            .unwrap();
        for _ in 0..500 {
            if journal.depth() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(journal.depth(), 0, "the loop never took the entry");
        assert_eq!(store.balance("cy").await.unwrap(), d("9"));
        let _ = stop.0.send(());
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("the loop stops when told")
            .unwrap();
    }

    /// A stop signal: send on the first to resolve the second.
    fn stop_signal() -> (
        tokio::sync::oneshot::Sender<()>,
        impl std::future::Future<Output = ()>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (tx, async move {
            let _ = rx.await;
        })
    }
}
