//! Hearth's durable state in sled: users, their balances (exact `rust_decimal`, never floats), an
//! append-only ledger of every credit and debit, holds (funds reserved for a running request and
//! later settled exactly once or released), revoked service tokens and identity-provider sessions.
//!
//! This is the only crate that imports sled. It knows nothing of HTTP, JWTs or prices: callers
//! hand it amounts and token ids. Every write that moves money is one sled transaction across the
//! balance, hold and ledger trees, followed by a flush, so a `kill -9` loses nothing acknowledged.
//! (Placing a hold moves no money and is not flushed: see [`Store::place_hold`].)

mod error;
mod model;

pub use error::Error;
pub use model::{BalanceChange, Hold, HoldId, LedgerEntry, LedgerMeta, User};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sled::transaction::{abort, ConflictableTransactionError, TransactionError, TransactionalTree};
use sled::Transactional;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Options fixed when the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Balance a user gets when first seen (recorded as a ledger credit when non-zero).
    pub initial_balance: Decimal,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            initial_balance: Decimal::ZERO,
        }
    }
}

/// Handle to the database; cheap to clone, safe to share across tasks.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    db: sled::Db,
    users: sled::Tree,
    balances: sled::Tree,
    ledger: sled::Tree,
    holds: sled::Tree,
    revoked: sled::Tree,
    idp_sessions: sled::Tree,
    idp_revoked: sled::Tree,
    meta: sled::Tree,
    options: StoreOptions,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish()
    }
}

type TxError = ConflictableTransactionError<Error>;

fn tx_result<T>(r: std::result::Result<T, TransactionError<Error>>) -> Result<T> {
    match r {
        Ok(v) => Ok(v),
        Err(TransactionError::Abort(e)) => Err(e),
        Err(TransactionError::Storage(e)) => Err(Error::Storage(e)),
    }
}

fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Serializing our own plain structs to JSON cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn dec<T: serde::de::DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| Error::Corrupt { what, source })
}

fn dec_tx<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> std::result::Result<T, TxError> {
    dec(what, bytes).map_err(ConflictableTransactionError::Abort)
}

fn read_balance(balances: &TransactionalTree, user: &str) -> std::result::Result<Decimal, TxError> {
    match balances.get(user.as_bytes())? {
        Some(b) => dec_tx("balance", &b),
        None => abort(Error::UnknownUser(user.to_string())),
    }
}

fn push_ledger(
    ledger: &TransactionalTree,
    user: &str,
    amount: Decimal,
    balance_after: Decimal,
    meta: &LedgerMeta,
    at: DateTime<Utc>,
) -> std::result::Result<LedgerEntry, TxError> {
    let seq = ledger.generate_id()?;
    let entry = LedgerEntry {
        seq,
        user_id: user.to_string(),
        amount,
        balance_after,
        reason: meta.reason.clone(),
        developer_id: meta.developer_id.clone(),
        application_id: meta.application_id.clone(),
        at,
    };
    ledger.insert(model::ledger_key(user, seq), enc(&entry))?;
    Ok(entry)
}

impl Store {
    /// Opens (creating if needed) the database in `dir`.
    ///
    /// Fails with [`Error::Locked`] when another process holds it (sled locks its files).
    pub fn open(dir: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        let path = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let db = sled::Config::new()
            .path(&path)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io) if io.to_string().contains("could not acquire lock") => {
                    Error::Locked { path: path.clone() }
                }
                other => Error::Storage(other),
            })?;
        let tree = |name: &str| db.open_tree(name).map_err(Error::Storage);
        let inner = Inner {
            users: tree("users")?,
            balances: tree("balances")?,
            ledger: tree("ledger")?,
            holds: tree("holds")?,
            revoked: tree("revoked_tokens")?,
            idp_sessions: tree("idp_sessions")?,
            idp_revoked: tree("idp_revoked")?,
            meta: tree("meta")?,
            db,
            path,
            options,
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The folder the database lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn flush(&self) -> Result<()> {
        self.inner.db.flush().map_err(Error::Storage)?;
        Ok(())
    }

    /// Checks the store can still be used: the database folder is still on disk, and a write,
    /// a flush and a read-back of a marker record succeed. Each call writes its own marker, so
    /// checks running at the same time cannot see each other's.
    pub fn health_check(&self) -> Result<()> {
        let conf = self.inner.path.join("conf");
        std::fs::metadata(&conf).map_err(|source| Error::Io { path: conf, source })?;
        let n = self.inner.db.generate_id().map_err(Error::Storage)?;
        let key = [b"health/".as_slice(), &n.to_be_bytes()].concat();
        let stamp = Utc::now()
            .timestamp_nanos_opt()
            .unwrap_or_default()
            .to_be_bytes();
        let meta = &self.inner.meta;
        meta.insert(&key, &stamp).map_err(Error::Storage)?;
        self.flush()?;
        let read = meta.get(&key).map_err(Error::Storage)?;
        meta.remove(&key).map_err(Error::Storage)?;
        match read {
            Some(v) if v.as_ref() == stamp => Ok(()),
            _ => Err(Error::HealthMismatch),
        }
    }

    // ---- users --------------------------------------------------------------------------

    /// Returns the user, creating them with the initial balance when first seen. `is_marketing`
    /// is refreshed from the caller (the identity provider is the source of truth for it).
    pub fn ensure_user(&self, user_id: &str, is_marketing: bool) -> Result<User> {
        model::check_user_id(user_id)?;
        let i = &self.inner;
        let initial = i.options.initial_balance;
        let now = Utc::now();
        let (user, created) = tx_result((&i.users, &i.balances, &i.ledger).transaction(
            |(users, balances, ledger)| match users.get(user_id.as_bytes())? {
                Some(bytes) => {
                    let mut user: User = dec_tx("user", &bytes)?;
                    if user.is_marketing != is_marketing {
                        user.is_marketing = is_marketing;
                        users.insert(user_id.as_bytes(), enc(&user))?;
                    }
                    Ok((user, false))
                }
                None => {
                    let user = User {
                        user_id: user_id.to_string(),
                        is_marketing,
                        created_at: now,
                    };
                    users.insert(user_id.as_bytes(), enc(&user))?;
                    balances.insert(user_id.as_bytes(), enc(&initial))?;
                    if !initial.is_zero() {
                        let meta = LedgerMeta::reason("initial balance");
                        push_ledger(ledger, user_id, initial, initial, &meta, now)?;
                    }
                    Ok((user, true))
                }
            },
        ))?;
        if created {
            self.flush()?;
            tracing::info!(user = user_id, "user created");
        }
        Ok(user)
    }

    /// One user, if known.
    pub fn user(&self, user_id: &str) -> Result<Option<User>> {
        match self
            .inner
            .users
            .get(user_id.as_bytes())
            .map_err(Error::Storage)?
        {
            Some(b) => Ok(Some(dec("user", &b)?)),
            None => Ok(None),
        }
    }

    /// All users with their balances, ordered by user id.
    pub fn users(&self) -> Result<Vec<(User, Decimal)>> {
        let mut out = Vec::new();
        for item in self.inner.users.iter() {
            let (k, v) = item.map_err(Error::Storage)?;
            let user: User = dec("user", &v)?;
            let balance = match self.inner.balances.get(&k).map_err(Error::Storage)? {
                Some(b) => dec("balance", &b)?,
                None => Decimal::ZERO,
            };
            out.push((user, balance));
        }
        Ok(out)
    }

    /// The spendable balance of a user (funds under a hold are not included).
    pub fn balance(&self, user_id: &str) -> Result<Decimal> {
        match self
            .inner
            .balances
            .get(user_id.as_bytes())
            .map_err(Error::Storage)?
        {
            Some(b) => dec("balance", &b),
            None => Err(Error::UnknownUser(user_id.to_string())),
        }
    }

    /// The user's ledger, oldest first.
    pub fn ledger(&self, user_id: &str) -> Result<Vec<LedgerEntry>> {
        let mut out = Vec::new();
        for item in self.inner.ledger.scan_prefix(model::ledger_prefix(user_id)) {
            let (_, v) = item.map_err(Error::Storage)?;
            out.push(dec("ledger entry", &v)?);
        }
        out.sort_by_key(|e: &LedgerEntry| e.seq);
        Ok(out)
    }

    // ---- money --------------------------------------------------------------------------

    /// Adds `amount` (> 0) to the balance of an existing user, with a ledger row.
    pub fn credit(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: &LedgerMeta,
    ) -> Result<BalanceChange> {
        if amount <= Decimal::ZERO {
            return Err(Error::NonPositiveAmount(amount));
        }
        self.apply(user_id, amount, meta)
    }

    /// Takes `amount` (> 0) from the balance, refusing with [`Error::InsufficientFunds`] rather
    /// than going below zero; one ledger row.
    pub fn debit(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: &LedgerMeta,
    ) -> Result<BalanceChange> {
        if amount <= Decimal::ZERO {
            return Err(Error::NonPositiveAmount(amount));
        }
        self.apply(user_id, -amount, meta)
    }

    fn apply(&self, user_id: &str, delta: Decimal, meta: &LedgerMeta) -> Result<BalanceChange> {
        let i = &self.inner;
        let now = Utc::now();
        let change = tx_result((&i.balances, &i.ledger).transaction(|(balances, ledger)| {
            let before = read_balance(balances, user_id)?;
            let after = before + delta;
            if after < Decimal::ZERO {
                return abort(Error::InsufficientFunds {
                    needed: -delta,
                    available: before,
                });
            }
            balances.insert(user_id.as_bytes(), enc(&after))?;
            let entry = push_ledger(ledger, user_id, delta, after, meta, now)?;
            Ok(BalanceChange {
                before,
                after,
                ledger_seq: Some(entry.seq),
            })
        }))?;
        self.flush()?;
        Ok(change)
    }

    /// Reserves `amount` (>= 0) of the user's balance in one transaction, or refuses with
    /// [`Error::InsufficientFunds`]. The reserved funds leave the spendable balance until the hold
    /// is settled or released; no ledger row is written until it is settled.
    pub fn place_hold(&self, user_id: &str, amount: Decimal, meta: &LedgerMeta) -> Result<Hold> {
        if amount < Decimal::ZERO {
            return Err(Error::NonPositiveAmount(amount));
        }
        let i = &self.inner;
        let now = Utc::now();
        let hold = tx_result((&i.balances, &i.holds).transaction(|(balances, holds)| {
            let before = read_balance(balances, user_id)?;
            if before < amount {
                return abort(Error::InsufficientFunds {
                    needed: amount,
                    available: before,
                });
            }
            let id = HoldId(holds.generate_id()?);
            let hold = Hold {
                id,
                user_id: user_id.to_string(),
                amount,
                balance_before: before,
                meta: meta.clone(),
                placed_at: now,
            };
            balances.insert(user_id.as_bytes(), enc(&(before - amount)))?;
            holds.insert(&id.0.to_be_bytes(), enc(&hold))?;
            Ok(hold)
        }))?;
        // No flush here: a hold moves no money. After a crash, sled recovers whole transactions
        // only, and every hold that survived is released at start-up, so a hold that was lost
        // and one that was kept leave the same balance. The settle that charges is flushed.
        // (A durable write here added one disk sync to every request's time to first token.)
        Ok(hold)
    }

    /// Settles a hold with the amount actually spent (0 <= `actual` <= held amount): the rest
    /// goes back to the balance and one ledger row records the debit. A hold settles exactly once:
    /// a second settle (or a settle after a release) fails with [`Error::UnknownHold`].
    pub fn settle_hold(&self, id: HoldId, actual: Decimal) -> Result<BalanceChange> {
        if actual < Decimal::ZERO {
            return Err(Error::NonPositiveAmount(actual));
        }
        let i = &self.inner;
        let now = Utc::now();
        let change = tx_result((&i.balances, &i.holds, &i.ledger).transaction(
            |(balances, holds, ledger)| {
                let hold: Hold = match holds.remove(&id.0.to_be_bytes())? {
                    Some(b) => dec_tx("hold", &b)?,
                    None => return abort(Error::UnknownHold(id)),
                };
                if actual > hold.amount {
                    return abort(Error::SettleExceedsHold {
                        held: hold.amount,
                        actual,
                    });
                }
                let current = read_balance(balances, &hold.user_id)?;
                let after = current + (hold.amount - actual);
                balances.insert(hold.user_id.as_bytes(), enc(&after))?;
                let seq = if actual.is_zero() {
                    None
                } else {
                    Some(push_ledger(ledger, &hold.user_id, -actual, after, &hold.meta, now)?.seq)
                };
                Ok(BalanceChange {
                    before: hold.balance_before,
                    after,
                    ledger_seq: seq,
                })
            },
        ))?;
        self.flush()?;
        Ok(change)
    }

    /// Gives a hold's funds back untouched; nothing is written to the ledger.
    pub fn release_hold(&self, id: HoldId) -> Result<BalanceChange> {
        self.settle_hold(id, Decimal::ZERO)
    }

    /// Releases every hold still open. Called once at startup: this process holds the database
    /// lock, so any hold found then belongs to a request that died with a previous process.
    pub fn release_stale_holds(&self) -> Result<usize> {
        let mut ids = Vec::new();
        for item in self.inner.holds.iter() {
            let (_, v) = item.map_err(Error::Storage)?;
            let hold: Hold = dec("hold", &v)?;
            ids.push(hold.id);
        }
        let mut released = 0;
        for id in ids {
            match self.release_hold(id) {
                Ok(_) => released += 1,
                Err(Error::UnknownHold(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if released > 0 {
            tracing::warn!(released, "released holds left open by a previous process");
        }
        Ok(released)
    }

    /// Open holds of one user.
    pub fn holds(&self, user_id: &str) -> Result<Vec<Hold>> {
        let mut out = Vec::new();
        for item in self.inner.holds.iter() {
            let (_, v) = item.map_err(Error::Storage)?;
            let hold: Hold = dec("hold", &v)?;
            if hold.user_id == user_id {
                out.push(hold);
            }
        }
        Ok(out)
    }

    // ---- token revocation ---------------------------------------------------------------

    /// Marks a service token (by its `jti`) revoked until `expires_at`, when it dies anyway.
    pub fn revoke_token(&self, jti: &str, expires_at: DateTime<Utc>) -> Result<()> {
        self.inner
            .revoked
            .insert(jti.as_bytes(), enc(&expires_at))
            .map_err(Error::Storage)?;
        self.flush()
    }

    pub fn is_token_revoked(&self, jti: &str) -> Result<bool> {
        self.inner
            .revoked
            .contains_key(jti.as_bytes())
            .map_err(Error::Storage)
    }

    /// Records that service token `jti` (valid until `jti_expires_at`) was minted from the
    /// identity-provider token `idp_token_id`.
    pub fn record_idp_session(
        &self,
        idp_token_id: &str,
        jti: &str,
        jti_expires_at: DateTime<Utc>,
    ) -> Result<()> {
        let key = model::session_key(idp_token_id, jti);
        self.inner
            .idp_sessions
            .insert(key, enc(&jti_expires_at))
            .map_err(Error::Storage)?;
        self.flush()
    }

    /// Revokes every service token minted from `idp_token_id` and refuses that identity token
    /// until `idp_expires_at`. Returns how many service tokens were revoked.
    pub fn revoke_idp_sessions(
        &self,
        idp_token_id: &str,
        idp_expires_at: DateTime<Utc>,
    ) -> Result<usize> {
        let i = &self.inner;
        let mut sessions = Vec::new();
        for item in i
            .idp_sessions
            .scan_prefix(model::session_prefix(idp_token_id))
        {
            let (k, v) = item.map_err(Error::Storage)?;
            let exp: DateTime<Utc> = dec("session expiry", &v)?;
            let jti = model::session_jti(&k).to_string();
            sessions.push((k, jti, exp));
        }
        let count = sessions.len();
        tx_result((&i.revoked, &i.idp_sessions, &i.idp_revoked).transaction(
            |(revoked, idp_sessions, idp_revoked)| {
                for (k, jti, exp) in &sessions {
                    revoked.insert(jti.as_bytes(), enc(exp))?;
                    idp_sessions.remove(k)?;
                }
                idp_revoked.insert(idp_token_id.as_bytes(), enc(&idp_expires_at))?;
                Ok(())
            },
        ))?;
        self.flush()?;
        Ok(count)
    }

    pub fn is_idp_token_revoked(&self, idp_token_id: &str) -> Result<bool> {
        self.inner
            .idp_revoked
            .contains_key(idp_token_id.as_bytes())
            .map_err(Error::Storage)
    }

    /// Drops revocations and idp sessions whose tokens have expired by `now` (an expired token
    /// is refused for its expiry alone). Returns how many records were removed.
    pub fn purge_expired(&self, now: DateTime<Utc>) -> Result<usize> {
        let mut removed = 0;
        for tree in [
            &self.inner.revoked,
            &self.inner.idp_sessions,
            &self.inner.idp_revoked,
        ] {
            for item in tree.iter() {
                let (k, v) = item.map_err(Error::Storage)?;
                let exp: DateTime<Utc> = dec("expiry", &v)?;
                if exp <= now {
                    tree.remove(k).map_err(Error::Storage)?;
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            self.flush()?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
