//! The store's tests. `suite.rs` and `concurrency.rs` hold test functions written once and run
//! against both backends (`both_backends!` makes one `#[tokio::test]` per backend); the
//! PostgreSQL ones need `HEARTH_TEST_POSTGRES_URL` (`scripts/postgres.sh` starts a throwaway
//! server and prints it) and are skipped with a message without it. Each PostgreSQL test gets a
//! database of its own, so they run in parallel.

mod concurrency;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sled")]
mod sled;
mod suite;

use super::*;
use std::str::FromStr;

pub(crate) fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// A place for one test's data: a temp dir for sled, a fresh database for PostgreSQL.
pub(crate) struct TestDb {
    location: Location,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    #[cfg(feature = "sled")]
    pub(crate) fn sled() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            location: Location::Dir(dir.path().join("db")),
            _dir: Some(dir),
        }
    }

    /// A fresh database on the test server, or `None` (with a message) when there is none.
    #[cfg(feature = "postgres")]
    pub(crate) async fn postgres() -> Option<Self> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let Ok(server) = std::env::var("HEARTH_TEST_POSTGRES_URL") else {
            eprintln!(
                "skipped: HEARTH_TEST_POSTGRES_URL is not set (scripts/postgres.sh start sets it up)"
            );
            return None;
        };
        let nanos = Utc::now().timestamp_subsec_nanos();
        let name = format!(
            "store_{}_{}_{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let url = create_database(&server, &name)
            .await
            .expect("create a test database");
        Some(Self {
            location: Location::Url(url),
            _dir: None,
        })
    }

    pub(crate) fn is_sled(&self) -> bool {
        matches!(self.location, Location::Dir(_))
    }

    /// Opens the store with `initial` as the initial balance.
    pub(crate) async fn open(&self, initial: &str) -> Store {
        self.open_as(initial, "node-a").await
    }

    /// Opens the store as node `node_id`. A sled folder whose last handle this test just
    /// dropped can stay locked for a moment (sled's background writes still hold its files), so
    /// a reopen waits up to two seconds for the lock.
    pub(crate) async fn open_as(&self, initial: &str, node_id: &str) -> Store {
        let options = StoreOptions {
            initial_balance: d(initial),
            node_id: node_id.into(),
            ..StoreOptions::default()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match Store::open_at(&self.location, options.clone()).await {
                Err(Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await
                }
                opened => return opened.unwrap(),
            }
        }
    }

    /// `n` handles on the data: one shared handle for sled (one process), `n` connections as
    /// nodes `node-0`.. for PostgreSQL, as `n` Hearth processes would have.
    pub(crate) async fn nodes(&self, initial: &str, n: usize) -> Vec<Store> {
        if self.is_sled() {
            let store = self.open(initial).await;
            return vec![store; n];
        }
        let mut out = Vec::new();
        for i in 0..n {
            out.push(self.open_as(initial, &format!("node-{i}")).await);
        }
        out
    }
}

/// One `#[tokio::test]` per backend for each named test function (`async fn(&TestDb)`) of the
/// module it is used in.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        #[cfg(feature = "sled")]
        mod on_sled {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(&crate::tests::TestDb::sled()).await
                }
            )*
        }
        #[cfg(feature = "postgres")]
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some(db) = crate::tests::TestDb::postgres().await {
                        super::$name(&db).await
                    }
                }
            )*
        }
    };
}
pub(crate) use both_backends;
