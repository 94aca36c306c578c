//! The shared backend: PostgreSQL through sqlx, for several Hearth nodes on one database.
//!
//! Every money movement is one transaction that first locks the user's `balances` row
//! (`SELECT ... FOR UPDATE`, at READ COMMITTED), decides with the same functions as the sled
//! backend (`model::checked_after`, `model::check_settle`) and writes balance, hold and ledger
//! before committing: nothing is checked outside the transaction that acts on it. Settling
//! deletes the hold row first (`DELETE ... RETURNING`), so of two settles of one hold, on one
//! node or two, the second finds nothing. Lock order is hold, then balance, everywhere, so the
//! transactions cannot deadlock. `CHECK (balance >= 0)` backs all of it up.
//!
//! The schema is `migrations/*.sql`, embedded in the binary and applied at connect (sqlx takes
//! an advisory lock, so nodes starting together apply it once).

use chrono::{DateTime, SubsecRound, Utc};
use rust_decimal::Decimal;
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, Row, Transaction};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::model::{self, BalanceChange, Hold, HoldId, LedgerEntry, LedgerMeta, User};
use crate::{Error, Result};

mod setup;
pub use setup::create_database;
use setup::{options, Embedded};

/// A pool of connections to the shared database.
pub(crate) struct PgStore {
    pool: PgPool,
    /// Makes each health check's marker key unique within this process.
    health_seq: AtomicU64,
    /// How long a call waits for a connection while no call has got one (see [`PgStore::conn`]).
    unreachable_after: Duration,
    /// When a call last got a connection, in milliseconds since `epoch`.
    last_acquired_ms: AtomicU64,
    epoch: Instant,
}

/// The longest a call waits for a connection while the database answers others: under load
/// the pool is busy, not broken, and a request should wait its turn.
const BUSY_WAIT: Duration = Duration::from_secs(30);

type Tx = Transaction<'static, Postgres>;

/// Timestamps as PostgreSQL keeps them (microseconds), so what a call returns equals what a
/// later read returns.
fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

fn seq(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

fn id(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

const HOLD_COLUMNS: &str = "id, user_id, amount, balance_before, reason, developer_id, \
                            application_id, node_id, placed_at";

fn hold_row(row: &PgRow) -> Result<Hold> {
    Ok(Hold {
        id: HoldId(seq(row.try_get("id")?)),
        user_id: row.try_get("user_id")?,
        amount: row.try_get("amount")?,
        balance_before: row.try_get("balance_before")?,
        meta: LedgerMeta {
            reason: row.try_get("reason")?,
            developer_id: row.try_get("developer_id")?,
            application_id: row.try_get("application_id")?,
        },
        node_id: row.try_get("node_id")?,
        placed_at: row.try_get("placed_at")?,
    })
}

/// The user's balance, locked until the transaction ends.
async fn lock_balance(tx: &mut Tx, user_id: &str) -> Result<Decimal> {
    sqlx::query("SELECT balance FROM balances WHERE user_id = $1 FOR UPDATE")
        .bind(user_id)
        .fetch_optional(&mut **tx)
        .await?
        .map(|row| row.try_get("balance"))
        .transpose()?
        .ok_or_else(|| Error::UnknownUser(user_id.to_string()))
}

async fn set_balance(tx: &mut Tx, user_id: &str, balance: Decimal) -> Result<()> {
    sqlx::query("UPDATE balances SET balance = $2 WHERE user_id = $1")
        .bind(user_id)
        .bind(balance)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn push_ledger(
    tx: &mut Tx,
    user_id: &str,
    amount: Decimal,
    balance_after: Decimal,
    meta: &LedgerMeta,
) -> Result<u64> {
    let row = sqlx::query(
        "INSERT INTO ledger (user_id, amount, balance_after, reason, developer_id, \
         application_id, at) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING seq",
    )
    .bind(user_id)
    .bind(amount)
    .bind(balance_after)
    .bind(&meta.reason)
    .bind(&meta.developer_id)
    .bind(&meta.application_id)
    .bind(now())
    .fetch_one(&mut **tx)
    .await?;
    Ok(seq(row.try_get("seq")?))
}

/// Whether `e` means the database could not be reached, rather than that it refused the call:
/// the connection failed or broke, the pool had none to give in time, or the server said it is
/// shutting down, starting or out of connections (SQLSTATE classes 08 and 53, 57P01-57P03).
pub(crate) fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || code.starts_with("53") || code.starts_with("57P0")
        }),
        _ => false,
    }
}

impl PgStore {
    /// Connects and brings the schema up to date. `unreachable_after`: see [`PgStore::conn`].
    pub(crate) async fn connect(
        url: &str,
        max_connections: u32,
        unreachable_after: Duration,
    ) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(BUSY_WAIT)
            .connect_with(options(url)?)
            .await?;
        Migrator::new(Embedded).await?.run(&pool).await?;
        Ok(Self {
            pool,
            health_seq: AtomicU64::new(0),
            unreachable_after,
            last_acquired_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A connection of the pool. While other calls keep getting connections the database
    /// answers and the pool is only busy, so this waits its turn (up to [`BUSY_WAIT`]); once no
    /// call has got one for `unreachable_after` (the database is down or restarting: the pool
    /// keeps failing to connect), it gives up with `PoolTimedOut`, which counts as unreachable.
    /// Only the wait is cut short, never a statement, so no write is left half-known.
    async fn conn(&self) -> Result<PoolConnection<Postgres>> {
        let acquire = self.pool.acquire();
        tokio::pin!(acquire);
        let window = u64::try_from(self.unreachable_after.as_millis()).unwrap_or(u64::MAX);
        loop {
            match tokio::time::timeout(self.unreachable_after, &mut acquire).await {
                Ok(conn) => {
                    let conn = conn?;
                    self.last_acquired_ms
                        .store(self.now_ms(), Ordering::Relaxed);
                    return Ok(conn);
                }
                Err(_) => {
                    let last = self.last_acquired_ms.load(Ordering::Relaxed);
                    if self.now_ms().saturating_sub(last) > window {
                        return Err(sqlx::Error::PoolTimedOut.into());
                    }
                }
            }
        }
    }

    /// A transaction on a connection from [`PgStore::conn`].
    async fn begin(&self) -> Result<Tx> {
        Ok(Transaction::begin(self.conn().await?, None).await?)
    }

    /// A write, a read-back and a rollback of a marker row in `meta`.
    pub(crate) async fn health_check(&self) -> Result<()> {
        let n = self.health_seq.fetch_add(1, Ordering::Relaxed);
        let key = format!("health/{}/{n}", std::process::id());
        let stamp = Utc::now().to_rfc3339();
        let mut tx = self.begin().await?;
        sqlx::query("INSERT INTO meta (key, value) VALUES ($1, $2)")
            .bind(&key)
            .bind(&stamp)
            .execute(&mut *tx)
            .await?;
        let read: Option<String> = sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
            .bind(&key)
            .fetch_optional(&mut *tx)
            .await?;
        tx.rollback().await?;
        match read {
            Some(v) if v == stamp => Ok(()),
            _ => Err(Error::HealthMismatch),
        }
    }

    // ---- users --------------------------------------------------------------------------

    pub(crate) async fn ensure_user(
        &self,
        user_id: &str,
        is_marketing: bool,
        initial: Decimal,
    ) -> Result<(User, bool)> {
        let mut tx = self.begin().await?;
        let created_at = now();
        // A second node creating the same user at the same moment waits here for the first's
        // commit, then sees the row and inserts nothing.
        let inserted = sqlx::query(
            "INSERT INTO users (user_id, is_marketing, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (user_id) DO NOTHING",
        )
        .bind(user_id)
        .bind(is_marketing)
        .bind(created_at)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if inserted {
            sqlx::query("INSERT INTO balances (user_id, balance) VALUES ($1, $2)")
                .bind(user_id)
                .bind(initial)
                .execute(&mut *tx)
                .await?;
            if !initial.is_zero() {
                let meta = LedgerMeta::reason(model::INITIAL_BALANCE);
                push_ledger(&mut tx, user_id, initial, initial, &meta).await?;
            }
            tx.commit().await?;
            let user = User {
                user_id: user_id.to_string(),
                is_marketing,
                created_at,
            };
            return Ok((user, true));
        }
        let row = sqlx::query(
            "UPDATE users SET is_marketing = $2 WHERE user_id = $1 RETURNING created_at",
        )
        .bind(user_id)
        .bind(is_marketing)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let user = User {
            user_id: user_id.to_string(),
            is_marketing,
            created_at: row.try_get("created_at")?,
        };
        Ok((user, false))
    }

    pub(crate) async fn user(&self, user_id: &str) -> Result<Option<User>> {
        let row = sqlx::query("SELECT is_marketing, created_at FROM users WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(&mut *self.conn().await?)
            .await?;
        row.map(|r| {
            Ok(User {
                user_id: user_id.to_string(),
                is_marketing: r.try_get("is_marketing")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .transpose()
    }

    pub(crate) async fn users(&self) -> Result<Vec<(User, Decimal)>> {
        // Byte order (COLLATE "C"), as sled keeps its keys.
        let rows = sqlx::query(
            "SELECT u.user_id, u.is_marketing, u.created_at, COALESCE(b.balance, 0) AS balance \
             FROM users u LEFT JOIN balances b USING (user_id) ORDER BY u.user_id COLLATE \"C\"",
        )
        .fetch_all(&mut *self.conn().await?)
        .await?;
        rows.iter()
            .map(|r| {
                let user = User {
                    user_id: r.try_get("user_id")?,
                    is_marketing: r.try_get("is_marketing")?,
                    created_at: r.try_get("created_at")?,
                };
                Ok((user, r.try_get("balance")?))
            })
            .collect()
    }

    pub(crate) async fn balance(&self, user_id: &str) -> Result<Decimal> {
        sqlx::query_scalar("SELECT balance FROM balances WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(&mut *self.conn().await?)
            .await?
            .ok_or_else(|| Error::UnknownUser(user_id.to_string()))
    }

    pub(crate) async fn ledger(&self, user_id: &str) -> Result<Vec<LedgerEntry>> {
        let rows = sqlx::query(
            "SELECT seq, amount, balance_after, reason, developer_id, application_id, at \
             FROM ledger WHERE user_id = $1 ORDER BY seq",
        )
        .bind(user_id)
        .fetch_all(&mut *self.conn().await?)
        .await?;
        rows.iter()
            .map(|r| {
                let meta = LedgerMeta {
                    reason: r.try_get("reason")?,
                    developer_id: r.try_get("developer_id")?,
                    application_id: r.try_get("application_id")?,
                };
                Ok(LedgerEntry::new(
                    seq(r.try_get("seq")?),
                    user_id,
                    r.try_get("amount")?,
                    r.try_get("balance_after")?,
                    &meta,
                    r.try_get("at")?,
                ))
            })
            .collect()
    }

    // ---- money --------------------------------------------------------------------------

    pub(crate) async fn apply(
        &self,
        user_id: &str,
        delta: Decimal,
        meta: &LedgerMeta,
    ) -> Result<BalanceChange> {
        let mut tx = self.begin().await?;
        let before = lock_balance(&mut tx, user_id).await?;
        let after = model::checked_after(before, delta)?;
        set_balance(&mut tx, user_id, after).await?;
        let seq = push_ledger(&mut tx, user_id, delta, after, meta).await?;
        tx.commit().await?;
        Ok(BalanceChange {
            before,
            after,
            ledger_seq: Some(seq),
        })
    }

    pub(crate) async fn place_hold(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: &LedgerMeta,
        node_id: &str,
    ) -> Result<Hold> {
        let mut tx = self.begin().await?;
        let before = lock_balance(&mut tx, user_id).await?;
        let after = model::checked_after(before, -amount)?;
        set_balance(&mut tx, user_id, after).await?;
        let placed_at = now();
        let row = sqlx::query(
            "INSERT INTO holds (user_id, amount, balance_before, reason, developer_id, \
             application_id, node_id, placed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             RETURNING id",
        )
        .bind(user_id)
        .bind(amount)
        .bind(before)
        .bind(&meta.reason)
        .bind(&meta.developer_id)
        .bind(&meta.application_id)
        .bind(node_id)
        .bind(placed_at)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Hold {
            id: HoldId(seq(row.try_get("id")?)),
            user_id: user_id.to_string(),
            amount,
            balance_before: before,
            meta: meta.clone(),
            node_id: node_id.to_string(),
            placed_at,
        })
    }

    pub(crate) async fn settle_hold(
        &self,
        hold_id: HoldId,
        actual: Decimal,
    ) -> Result<BalanceChange> {
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "DELETE FROM holds WHERE id = $1 RETURNING {HOLD_COLUMNS}"
        ))
        .bind(id(hold_id.0))
        .fetch_optional(&mut *tx)
        .await?;
        let hold = match row {
            Some(row) => hold_row(&row)?,
            None => return Err(Error::UnknownHold(hold_id)),
        };
        // Refused: the transaction rolls back when dropped and the hold stays open.
        model::check_settle(&hold, actual)?;
        let current = lock_balance(&mut tx, &hold.user_id).await?;
        let after = current + (hold.amount - actual);
        set_balance(&mut tx, &hold.user_id, after).await?;
        let seq = if actual.is_zero() {
            None
        } else {
            Some(push_ledger(&mut tx, &hold.user_id, -actual, after, &hold.meta).await?)
        };
        tx.commit().await?;
        Ok(BalanceChange {
            before: hold.balance_before,
            after,
            ledger_seq: seq,
        })
    }

    /// Open holds, of one user or one node when asked, oldest first.
    pub(crate) async fn holds(
        &self,
        user_id: Option<&str>,
        node_id: Option<&str>,
    ) -> Result<Vec<Hold>> {
        let rows = sqlx::query(&format!(
            "SELECT {HOLD_COLUMNS} FROM holds WHERE ($1::text IS NULL OR user_id = $1) \
             AND ($2::text IS NULL OR node_id = $2) ORDER BY id"
        ))
        .bind(user_id)
        .bind(node_id)
        .fetch_all(&mut *self.conn().await?)
        .await?;
        rows.iter().map(hold_row).collect()
    }

    // ---- token revocation ---------------------------------------------------------------

    pub(crate) async fn revoke_token(&self, jti: &str, expires_at: DateTime<Utc>) -> Result<()> {
        sqlx::query(
            "INSERT INTO revoked_tokens (jti, expires_at) VALUES ($1, $2) ON CONFLICT (jti) \
             DO UPDATE SET expires_at = GREATEST(revoked_tokens.expires_at, EXCLUDED.expires_at)",
        )
        .bind(jti)
        .bind(expires_at)
        .execute(&mut *self.conn().await?)
        .await?;
        Ok(())
    }

    pub(crate) async fn is_token_revoked(&self, jti: &str) -> Result<bool> {
        Ok(
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM revoked_tokens WHERE jti = $1)")
                .bind(jti)
                .fetch_one(&mut *self.conn().await?)
                .await?,
        )
    }

    pub(crate) async fn record_idp_session(
        &self,
        idp_token_id: &str,
        jti: &str,
        jti_expires_at: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO idp_sessions (idp_token_id, jti, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (idp_token_id, jti) DO UPDATE SET expires_at = EXCLUDED.expires_at",
        )
        .bind(idp_token_id)
        .bind(jti)
        .bind(jti_expires_at)
        .execute(&mut *self.conn().await?)
        .await?;
        Ok(())
    }

    pub(crate) async fn revoke_idp_sessions(
        &self,
        idp_token_id: &str,
        idp_expires_at: DateTime<Utc>,
    ) -> Result<usize> {
        let mut tx = self.begin().await?;
        let count: i64 = sqlx::query_scalar(
            "WITH gone AS (DELETE FROM idp_sessions WHERE idp_token_id = $1 \
             RETURNING jti, expires_at), \
             kept AS (INSERT INTO revoked_tokens (jti, expires_at) SELECT jti, expires_at \
             FROM gone ON CONFLICT (jti) DO UPDATE SET expires_at = \
             GREATEST(revoked_tokens.expires_at, EXCLUDED.expires_at)) \
             SELECT count(*) FROM gone",
        )
        .bind(idp_token_id)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO idp_revoked (idp_token_id, expires_at) VALUES ($1, $2) \
             ON CONFLICT (idp_token_id) DO UPDATE SET expires_at = EXCLUDED.expires_at",
        )
        .bind(idp_token_id)
        .bind(idp_expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(usize::try_from(count).unwrap_or_default())
    }

    pub(crate) async fn is_idp_token_revoked(&self, idp_token_id: &str) -> Result<bool> {
        Ok(
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM idp_revoked WHERE idp_token_id = $1)")
                .bind(idp_token_id)
                .fetch_one(&mut *self.conn().await?)
                .await?,
        )
    }

    pub(crate) async fn purge_expired(&self, now: DateTime<Utc>) -> Result<usize> {
        let mut removed = 0;
        for table in ["revoked_tokens", "idp_sessions", "idp_revoked"] {
            removed += sqlx::query(&format!("DELETE FROM {table} WHERE expires_at <= $1"))
                .bind(now)
                .execute(&mut *self.conn().await?)
                .await?
                .rows_affected();
        }
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }

    /// Runs a statement as it is (tests reach past the API with it).
    #[cfg(test)]
    pub(crate) async fn raw(&self, sql: &str) -> Result<u64> {
        Ok(sqlx::query(sql)
            .execute(&mut *self.conn().await?)
            .await?
            .rows_affected())
    }

    // ---- shared values ------------------------------------------------------------------

    pub(crate) async fn get_or_put(&self, key: &str, value: &str) -> Result<String> {
        sqlx::query("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
            .bind(key)
            .bind(value)
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
            .bind(key)
            .fetch_one(&mut *self.conn().await?)
            .await?)
    }
}

impl PgStore {
    pub(crate) async fn put_value(&self, key: &str, value: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO meta (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        )
        .bind(key)
        .bind(value)
        .execute(&mut *self.conn().await?)
        .await?;
        Ok(())
    }

    pub(crate) async fn remove_value(&self, key: &str) -> Result<()> {
        sqlx::query("DELETE FROM meta WHERE key = $1")
            .bind(key)
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(())
    }

    pub(crate) async fn values(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT key, value FROM meta WHERE starts_with(key, $1) ORDER BY key COLLATE \"C\"",
        )
        .bind(prefix)
        .fetch_all(&mut *self.conn().await?)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("key")?, r.try_get("value")?)))
            .collect()
    }
}
