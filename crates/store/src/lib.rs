//! Hearth's durable state: users, their balances (exact `rust_decimal`, never floats), an
//! append-only ledger of every credit and debit, holds (funds reserved for a running request and
//! later settled exactly once or released), revoked service tokens, identity-provider sessions,
//! and values every node shares (secrets).
//!
//! One API, [`Store`], over two backends chosen by cargo feature and configuration:
//! - `sled` (default): embedded in the data dir, one process at a time (`sled.rs`).
//! - `postgres`: PostgreSQL through sqlx, so several Hearth nodes share users, money and
//!   revocations (`postgres.rs`, schema in `migrations/`).
//!
//! The API is async. Arguments are checked here, once, before either backend sees them, and
//! both decide money with the same functions (`model.rs`). A write, once started, runs to the
//! end even if its caller goes away (sled's on a blocking thread, since it flushes to disk;
//! PostgreSQL's in a task of its own), so a cancelled request cannot leave a half-known hold.
//!
//! This is the only crate that imports sled or sqlx. It knows nothing of HTTP, JWTs or prices:
//! callers hand it amounts and token ids.

#[cfg(not(any(feature = "sled", feature = "postgres")))]
compile_error!("hearth-store needs the `sled` or the `postgres` feature (or both)");

mod circuit;
mod error;
mod model;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sled")]
mod sled;

pub use circuit::Reachability;
pub use error::Error;
pub use model::{BalanceChange, Hold, HoldId, LedgerEntry, LedgerMeta, User};
#[cfg(feature = "postgres")]
pub use postgres::create_database;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use circuit::Circuit;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// When a client refused because the store is unreachable should try again: the circuit's
/// cool-off, after which the next call tries the database.
pub const RETRY_AFTER: Duration = circuit::COOL_OFF;

/// The longest [`Store::health_check`] takes: past it the store counts as unreachable, so a
/// health answer never waits on a database that does not answer.
pub const HEALTH_BUDGET: Duration = Duration::from_millis(800);

/// Options fixed when the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Balance a user gets when first seen (recorded as a ledger credit when non-zero).
    pub initial_balance: Decimal,
    /// This node's name, written on every hold it places: at start-up a node releases the
    /// holds of its own earlier life, never another live node's.
    pub node_id: String,
    /// Connections in the PostgreSQL pool (unused by sled).
    pub max_connections: u32,
    /// How long a PostgreSQL call waits for a connection while no call gets one (the database
    /// is down or restarting) before it fails as unreachable; a pool that is only busy is waited
    /// for (unused by sled).
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            initial_balance: Decimal::ZERO,
            node_id: "local".into(),
            max_connections: 16,
            acquire_timeout: Duration::from_millis(750),
        }
    }
}

/// Where the data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A sled database in this folder.
    Dir(PathBuf),
    /// A PostgreSQL database (`postgres://...`).
    Url(String),
}

/// Handle to the database; cheap to clone, safe to share across tasks.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    options: Arc<StoreOptions>,
    /// Refuses calls at once while the database cannot be reached.
    circuit: Arc<Circuit>,
}

#[derive(Clone)]
enum Backend {
    #[cfg(feature = "sled")]
    Sled(Arc<crate::sled::SledStore>),
    #[cfg(feature = "postgres")]
    Postgres(Arc<postgres::PgStore>),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Store");
        match &self.backend {
            #[cfg(feature = "sled")]
            Backend::Sled(s) => d.field("sled", &s.path()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => d.field("postgres", &self.options.node_id),
        };
        d.finish()
    }
}

/// A read: inline on sled (no disk sync), awaited on PostgreSQL. The backends' methods have the
/// same names and arguments, so one expression serves both. Refused at once while the circuit is
/// open; its outcome is counted by the circuit.
macro_rules! read {
    ($self:ident, |$s:ident| $call:expr) => {{
        $self.circuit.admit()?;
        let result = match &$self.backend {
            #[cfg(feature = "sled")]
            Backend::Sled($s) => $call,
            #[cfg(feature = "postgres")]
            Backend::Postgres($s) => $call.await,
        };
        $self.circuit.record(&result);
        result
    }};
}

/// A write that finishes even if the caller goes away: on a blocking thread for sled (it
/// flushes), in a task of its own for PostgreSQL. `$call` may use only owned values. Gated and
/// counted by the circuit as [`read!`] is.
macro_rules! write {
    ($self:ident, |$s:ident| $call:expr) => {{
        $self.circuit.admit()?;
        let result = unguarded_write!($self, |$s| $call);
        $self.circuit.record(&result);
        result
    }};
}

/// [`write!`] without the circuit's gate: for the health probe, which must try the database
/// to learn that it is back.
macro_rules! unguarded_write {
    ($self:ident, |$s:ident| $call:expr) => {
        match &$self.backend {
            #[cfg(feature = "sled")]
            Backend::Sled(s) => {
                let $s = Arc::clone(s);
                blocking(move || $call).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => {
                let $s = Arc::clone(p);
                spawned(async move { $call.await }).await
            }
        }
    };
}

/// Runs `f` on tokio's blocking threads, or right here when there is no runtime.
#[cfg(feature = "sled")]
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => joined(rt.spawn_blocking(f).await),
        Err(_) => f(),
    }
}

#[cfg(feature = "postgres")]
async fn spawned<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    joined(tokio::spawn(f).await)
}

/// A task's answer; its panic goes on in the caller.
fn joined<T>(r: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    match r {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(Error::Interrupted),
    }
}

impl Store {
    /// Opens (creating if needed) the sled database in `dir`.
    ///
    /// Fails with [`Error::Locked`] when another process holds it (sled locks its files).
    #[cfg(feature = "sled")]
    pub fn open(dir: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        let sled = crate::sled::SledStore::open(dir.as_ref())?;
        Ok(Self {
            backend: Backend::Sled(Arc::new(sled)),
            options: Arc::new(options),
            circuit: Arc::default(),
        })
    }

    /// Connects to the PostgreSQL database at `url`, creating or upgrading its tables.
    #[cfg(feature = "postgres")]
    pub async fn connect(url: &str, options: StoreOptions) -> Result<Self> {
        let pg = postgres::PgStore::connect(url, options.max_connections, options.acquire_timeout)
            .await?;
        Ok(Self {
            backend: Backend::Postgres(Arc::new(pg)),
            options: Arc::new(options),
            circuit: Arc::default(),
        })
    }

    /// Opens the store at `location`, or [`Error::NotBuilt`] when this build lacks its backend.
    pub async fn open_at(location: &Location, options: StoreOptions) -> Result<Self> {
        match location {
            #[cfg(feature = "sled")]
            Location::Dir(dir) => Self::open(dir, options),
            #[cfg(feature = "postgres")]
            Location::Url(url) => Self::connect(url, options).await,
            #[allow(unreachable_patterns)]
            Location::Dir(_) => Err(Error::NotBuilt("sled")),
            #[allow(unreachable_patterns)]
            Location::Url(_) => Err(Error::NotBuilt("postgres")),
        }
    }

    /// The sled database folder; `None` on PostgreSQL.
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            #[cfg(feature = "sled")]
            Backend::Sled(s) => Some(s.path()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
        }
    }

    /// Whether other processes may use this store at the same time (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        self.path().is_none()
    }

    /// The node id written on the holds this handle places.
    pub fn node_id(&self) -> &str {
        &self.options.node_id
    }

    /// Checks the store can still be used: a write and a read-back of a marker record succeed
    /// (and, on sled, the database folder is still on disk and the write reaches it). Concurrent
    /// checks use separate markers.
    ///
    /// Answers within [`HEALTH_BUDGET`] whatever the database does (past it:
    /// [`Error::Unavailable`]). It tries the database even while the circuit is open, and its
    /// success closes the circuit, so health turns good as soon as the database is back.
    pub async fn health_check(&self) -> Result<()> {
        let probe = async { unguarded_write!(self, |s| s.health_check()) };
        let result = match tokio::time::timeout(HEALTH_BUDGET, probe).await {
            Ok(result) => result,
            Err(_) => Err(Error::Unavailable {
                retry_after: RETRY_AFTER,
            }),
        };
        self.circuit.record(&result);
        result
    }

    /// Whether the last calls reached the database, without trying it: for `/metrics`.
    pub fn reachability(&self) -> Reachability {
        self.circuit.reachability()
    }

    // ---- users --------------------------------------------------------------------------

    /// Returns the user, creating them with the initial balance when first seen. `is_marketing`
    /// is refreshed from the caller (the identity provider is the source of truth for it).
    pub async fn ensure_user(&self, user_id: &str, is_marketing: bool) -> Result<User> {
        model::check_user_id(user_id)?;
        let (user, initial) = (user_id.to_string(), self.options.initial_balance);
        let (user, created) = write!(self, |s| s.ensure_user(&user, is_marketing, initial))?;
        if created {
            tracing::info!(user = user_id, "user created");
        }
        Ok(user)
    }

    /// One user, if known.
    pub async fn user(&self, user_id: &str) -> Result<Option<User>> {
        read!(self, |s| s.user(user_id))
    }

    /// All users with their balances, ordered by user id (bytewise).
    pub async fn users(&self) -> Result<Vec<(User, Decimal)>> {
        read!(self, |s| s.users())
    }

    /// The spendable balance of a user (funds under a hold are not included).
    pub async fn balance(&self, user_id: &str) -> Result<Decimal> {
        read!(self, |s| s.balance(user_id))
    }

    /// The user's ledger, oldest first.
    pub async fn ledger(&self, user_id: &str) -> Result<Vec<LedgerEntry>> {
        read!(self, |s| s.ledger(user_id))
    }

    // ---- money --------------------------------------------------------------------------

    /// Adds `amount` (> 0) to the balance of an existing user, with a ledger row.
    pub async fn credit(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: &LedgerMeta,
    ) -> Result<BalanceChange> {
        if amount <= Decimal::ZERO {
            return Err(Error::NonPositiveAmount(amount));
        }
        self.apply(user_id, amount, meta).await
    }

    /// Takes `amount` (> 0) from the balance, refusing with [`Error::InsufficientFunds`] rather
    /// than going below zero; one ledger row.
    pub async fn debit(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: &LedgerMeta,
    ) -> Result<BalanceChange> {
        if amount <= Decimal::ZERO {
            return Err(Error::NonPositiveAmount(amount));
        }
        self.apply(user_id, -amount, meta).await
    }

    async fn apply(
        &self,
        user_id: &str,
        delta: Decimal,
        meta: &LedgerMeta,
    ) -> Result<BalanceChange> {
        let (user, meta) = (user_id.to_string(), meta.clone());
        write!(self, |s| s.apply(&user, delta, &meta))
    }

    /// Reserves `amount` (>= 0) of the user's balance in one transaction, or refuses with
    /// [`Error::InsufficientFunds`]. The reserved funds leave the spendable balance until the hold
    /// is settled or released; no ledger row is written until it is settled. The hold carries
    /// this node's id.
    pub async fn place_hold(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: &LedgerMeta,
    ) -> Result<Hold> {
        if amount < Decimal::ZERO {
            return Err(Error::NonPositiveAmount(amount));
        }
        let (user, meta) = (user_id.to_string(), meta.clone());
        let node = self.options.node_id.clone();
        write!(self, |s| s.place_hold(&user, amount, &meta, &node))
    }

    /// Settles a hold with the amount actually spent (0 <= `actual` <= held amount): the rest
    /// goes back to the balance and one ledger row records the debit. A hold settles exactly once:
    /// a second settle (or a settle after a release) fails with [`Error::UnknownHold`]; a settle
    /// above the hold fails with [`Error::SettleExceedsHold`] and leaves it open.
    pub async fn settle_hold(&self, id: HoldId, actual: Decimal) -> Result<BalanceChange> {
        if actual < Decimal::ZERO {
            return Err(Error::NonPositiveAmount(actual));
        }
        write!(self, |s| s.settle_hold(id, actual))
    }

    /// Gives a hold's funds back untouched; nothing is written to the ledger.
    pub async fn release_hold(&self, id: HoldId) -> Result<BalanceChange> {
        self.settle_hold(id, Decimal::ZERO).await
    }

    /// Releases a hold without waiting, for `Drop` implementations: on the current runtime, or
    /// right here on sled when there is none. `done` gets the outcome. Without a runtime a
    /// PostgreSQL hold stays open (`Error::Interrupted`) until its node restarts or an operator
    /// releases it.
    pub fn release_in_background(
        &self,
        id: HoldId,
        done: impl FnOnce(Result<BalanceChange>) + Send + 'static,
    ) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let store = self.clone();
                rt.spawn(async move { done(store.release_hold(id).await) });
            }
            Err(_) => match &self.backend {
                #[cfg(feature = "sled")]
                Backend::Sled(s) => done(s.settle_hold(id, Decimal::ZERO)),
                #[cfg(feature = "postgres")]
                Backend::Postgres(_) => done(Err(Error::Interrupted)),
            },
        }
    }

    /// Open holds of one user.
    pub async fn holds(&self, user_id: &str) -> Result<Vec<Hold>> {
        read!(self, |s| s.holds(Some(user_id), None))
    }

    /// Open holds placed by node `node_id`.
    pub async fn holds_of_node(&self, node_id: &str) -> Result<Vec<Hold>> {
        read!(self, |s| s.holds(None, Some(node_id)))
    }

    /// Releases the holds a previous life of this node left open; called once at start-up.
    /// On sled that is every hold (this process holds the database lock, so whatever is there
    /// belongs to a request that died with a previous process); on PostgreSQL only the holds
    /// carrying this node's id, never those of other live nodes.
    pub async fn release_stale_holds(&self) -> Result<usize> {
        let holds = match &self.backend {
            #[cfg(feature = "sled")]
            Backend::Sled(s) => s.holds(None, None)?,
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => self.holds_of_node(&self.options.node_id).await?,
        };
        let released = self.release_all(holds).await?;
        if released > 0 {
            tracing::warn!(released, "released holds left open by a previous process");
        }
        Ok(released)
    }

    /// Releases every open hold of node `node_id` (`hearth holds release --node ID`, for a node
    /// that will not come back). Returns how many it released.
    pub async fn release_holds_of_node(&self, node_id: &str) -> Result<usize> {
        let holds = self.holds_of_node(node_id).await?;
        self.release_all(holds).await
    }

    async fn release_all(&self, holds: Vec<Hold>) -> Result<usize> {
        let mut released = 0;
        for hold in holds {
            match self.release_hold(hold.id).await {
                Ok(_) => released += 1,
                // Settled or released meanwhile by its own request: nothing to give back.
                Err(Error::UnknownHold(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(released)
    }

    // ---- token revocation ---------------------------------------------------------------

    /// Marks a service token (by its `jti`) revoked until `expires_at`, when it dies anyway.
    pub async fn revoke_token(&self, jti: &str, expires_at: DateTime<Utc>) -> Result<()> {
        let jti = jti.to_string();
        write!(self, |s| s.revoke_token(&jti, expires_at))
    }

    pub async fn is_token_revoked(&self, jti: &str) -> Result<bool> {
        read!(self, |s| s.is_token_revoked(jti))
    }

    /// Records that service token `jti` (valid until `jti_expires_at`) was minted from the
    /// identity-provider token `idp_token_id`.
    pub async fn record_idp_session(
        &self,
        idp_token_id: &str,
        jti: &str,
        jti_expires_at: DateTime<Utc>,
    ) -> Result<()> {
        let (idp, jti) = (idp_token_id.to_string(), jti.to_string());
        write!(self, |s| s.record_idp_session(&idp, &jti, jti_expires_at))
    }

    /// Revokes every service token minted from `idp_token_id` and refuses that identity token
    /// until `idp_expires_at`. Returns how many service tokens were revoked.
    pub async fn revoke_idp_sessions(
        &self,
        idp_token_id: &str,
        idp_expires_at: DateTime<Utc>,
    ) -> Result<usize> {
        let idp = idp_token_id.to_string();
        write!(self, |s| s.revoke_idp_sessions(&idp, idp_expires_at))
    }

    pub async fn is_idp_token_revoked(&self, idp_token_id: &str) -> Result<bool> {
        read!(self, |s| s.is_idp_token_revoked(idp_token_id))
    }

    /// Drops revocations and idp sessions whose tokens have expired by `now` (an expired token
    /// is refused for its expiry alone). Returns how many records were removed.
    pub async fn purge_expired(&self, now: DateTime<Utc>) -> Result<usize> {
        write!(self, |s| s.purge_expired(now))
    }

    // ---- shared values ------------------------------------------------------------------

    /// The value stored under `key`; the first caller stores `make()`'s, and every later one,
    /// on any node, gets that. For secrets every node must share.
    pub async fn shared_value(&self, key: &str, make: impl FnOnce() -> String) -> Result<String> {
        let (key, value) = (key.to_string(), make());
        write!(self, |s| s.get_or_put(&key, &value))
    }

    /// Sets `key` to `value`, replacing what was there (what one node tells the others, such as
    /// where it listens).
    pub async fn put_value(&self, key: &str, value: &str) -> Result<()> {
        let (key, value) = (key.to_string(), value.to_string());
        write!(self, |s| s.put_value(&key, &value))
    }

    pub async fn remove_value(&self, key: &str) -> Result<()> {
        let key = key.to_string();
        write!(self, |s| s.remove_value(&key))
    }

    /// Every value whose key starts with `prefix`, in key order (bytewise).
    pub async fn values(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        read!(self, |s| s.values(prefix))
    }
}

#[cfg(test)]
mod tests;
