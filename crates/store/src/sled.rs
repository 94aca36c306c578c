//! The embedded backend: sled in `<data_dir>/db`, one process at a time (sled locks its files).
//!
//! Synchronous: the [`crate::Store`] facade runs the writes (which flush to disk) on tokio's
//! blocking threads and the reads inline. Arguments arrive checked by the facade.
//!
//! Every write that moves money is one sled transaction across the balance, hold and ledger
//! trees, followed by a flush, so a `kill -9` loses nothing acknowledged. (Placing a hold moves
//! no money and is not flushed: see [`SledStore::place_hold`].)

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sled::transaction::{abort, ConflictableTransactionError, TransactionError, TransactionalTree};
use sled::Transactional;
use std::path::{Path, PathBuf};

use crate::model::{self, BalanceChange, Hold, HoldId, LedgerEntry, LedgerMeta, User};
use crate::{Error, Result};

/// The open sled database and its trees.
pub(crate) struct SledStore {
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
    let entry = LedgerEntry::new(seq, user, amount, balance_after, meta, at);
    ledger.insert(ledger_key(user, seq), enc(&entry))?;
    Ok(entry)
}

impl SledStore {
    /// Opens (creating if needed) the database in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let path = dir.to_path_buf();
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
        Ok(Self {
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
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn flush(&self) -> Result<()> {
        self.db.flush().map_err(Error::Storage)?;
        Ok(())
    }

    /// The database folder is still on disk, and a write, a flush and a read-back of a marker
    /// record succeed. Each call writes its own marker, so concurrent checks cannot see each
    /// other's.
    pub(crate) fn health_check(&self) -> Result<()> {
        let conf = self.path.join("conf");
        std::fs::metadata(&conf).map_err(|source| Error::Io { path: conf, source })?;
        let n = self.db.generate_id().map_err(Error::Storage)?;
        let key = [b"health/".as_slice(), &n.to_be_bytes()].concat();
        let stamp = Utc::now()
            .timestamp_nanos_opt()
            .unwrap_or_default()
            .to_be_bytes();
        self.meta.insert(&key, &stamp).map_err(Error::Storage)?;
        self.flush()?;
        let read = self.meta.get(&key).map_err(Error::Storage)?;
        self.meta.remove(&key).map_err(Error::Storage)?;
        match read {
            Some(v) if v.as_ref() == stamp => Ok(()),
            _ => Err(Error::HealthMismatch),
        }
    }

    // ---- users --------------------------------------------------------------------------

    pub(crate) fn ensure_user(
        &self,
        user_id: &str,
        is_marketing: bool,
        initial: Decimal,
    ) -> Result<(User, bool)> {
        let now = Utc::now();
        let (user, created) = tx_result((&self.users, &self.balances, &self.ledger).transaction(
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
                        let meta = LedgerMeta::reason(model::INITIAL_BALANCE);
                        push_ledger(ledger, user_id, initial, initial, &meta, now)?;
                    }
                    Ok((user, true))
                }
            },
        ))?;
        if created {
            self.flush()?;
        }
        Ok((user, created))
    }

    pub(crate) fn user(&self, user_id: &str) -> Result<Option<User>> {
        match self.users.get(user_id.as_bytes()).map_err(Error::Storage)? {
            Some(b) => Ok(Some(dec("user", &b)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn users(&self) -> Result<Vec<(User, Decimal)>> {
        let mut out = Vec::new();
        for item in self.users.iter() {
            let (k, v) = item.map_err(Error::Storage)?;
            let user: User = dec("user", &v)?;
            let balance = match self.balances.get(&k).map_err(Error::Storage)? {
                Some(b) => dec("balance", &b)?,
                None => Decimal::ZERO,
            };
            out.push((user, balance));
        }
        Ok(out)
    }

    pub(crate) fn balance(&self, user_id: &str) -> Result<Decimal> {
        match self
            .balances
            .get(user_id.as_bytes())
            .map_err(Error::Storage)?
        {
            Some(b) => dec("balance", &b),
            None => Err(Error::UnknownUser(user_id.to_string())),
        }
    }

    pub(crate) fn ledger(&self, user_id: &str) -> Result<Vec<LedgerEntry>> {
        let mut out = Vec::new();
        for item in self.ledger.scan_prefix(ledger_prefix(user_id)) {
            let (_, v) = item.map_err(Error::Storage)?;
            out.push(dec("ledger entry", &v)?);
        }
        out.sort_by_key(|e: &LedgerEntry| e.seq);
        Ok(out)
    }

    // ---- money --------------------------------------------------------------------------

    /// Adds `delta` (either sign) to the balance with one ledger row, never below zero.
    pub(crate) fn apply(
        &self,
        user_id: &str,
        delta: Decimal,
        meta: &LedgerMeta,
    ) -> Result<BalanceChange> {
        let now = Utc::now();
        let change = tx_result((&self.balances, &self.ledger).transaction(
            |(balances, ledger)| {
                let before = read_balance(balances, user_id)?;
                let after = model::checked_after(before, delta).map_err(TxError::Abort)?;
                balances.insert(user_id.as_bytes(), enc(&after))?;
                let entry = push_ledger(ledger, user_id, delta, after, meta, now)?;
                Ok(BalanceChange {
                    before,
                    after,
                    ledger_seq: Some(entry.seq),
                })
            },
        ))?;
        self.flush()?;
        Ok(change)
    }

    pub(crate) fn place_hold(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: &LedgerMeta,
        node_id: &str,
    ) -> Result<Hold> {
        let now = Utc::now();
        let hold = tx_result(
            (&self.balances, &self.holds).transaction(|(balances, holds)| {
                let before = read_balance(balances, user_id)?;
                let after = model::checked_after(before, -amount).map_err(TxError::Abort)?;
                let hold = Hold {
                    id: HoldId(holds.generate_id()?),
                    user_id: user_id.to_string(),
                    amount,
                    balance_before: before,
                    meta: meta.clone(),
                    node_id: node_id.to_string(),
                    placed_at: now,
                };
                balances.insert(user_id.as_bytes(), enc(&after))?;
                holds.insert(&hold.id.0.to_be_bytes(), enc(&hold))?;
                Ok(hold)
            }),
        )?;
        // No flush here: a hold moves no money. After a crash, sled recovers whole transactions
        // only, and every hold that survived is released at start-up, so a hold that was lost
        // and one that was kept leave the same balance. The settle that charges is flushed.
        // (A durable write here added one disk sync to every request's time to first token.)
        Ok(hold)
    }

    pub(crate) fn settle_hold(&self, id: HoldId, actual: Decimal) -> Result<BalanceChange> {
        let now = Utc::now();
        let change = tx_result((&self.balances, &self.holds, &self.ledger).transaction(
            |(balances, holds, ledger)| {
                let hold: Hold = match holds.remove(&id.0.to_be_bytes())? {
                    Some(b) => dec_tx("hold", &b)?,
                    None => return abort(Error::UnknownHold(id)),
                };
                model::check_settle(&hold, actual).map_err(TxError::Abort)?;
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

    /// Open holds, of one user or one node when asked, oldest first.
    pub(crate) fn holds(&self, user_id: Option<&str>, node_id: Option<&str>) -> Result<Vec<Hold>> {
        let mut out = Vec::new();
        for item in self.holds.iter() {
            let (_, v) = item.map_err(Error::Storage)?;
            let hold: Hold = dec("hold", &v)?;
            if user_id.is_none_or(|u| u == hold.user_id)
                && node_id.is_none_or(|n| n == hold.node_id)
            {
                out.push(hold);
            }
        }
        Ok(out)
    }

    /// Stores hold bytes as they are, to test reading what older versions wrote.
    #[cfg(test)]
    pub(crate) fn put_raw_hold(&self, id: HoldId, bytes: &[u8]) {
        self.holds.insert(id.0.to_be_bytes(), bytes).unwrap();
    }

    // ---- token revocation ---------------------------------------------------------------

    pub(crate) fn revoke_token(&self, jti: &str, expires_at: DateTime<Utc>) -> Result<()> {
        self.revoked
            .insert(jti.as_bytes(), enc(&expires_at))
            .map_err(Error::Storage)?;
        self.flush()
    }

    pub(crate) fn is_token_revoked(&self, jti: &str) -> Result<bool> {
        self.revoked
            .contains_key(jti.as_bytes())
            .map_err(Error::Storage)
    }

    pub(crate) fn record_idp_session(
        &self,
        idp_token_id: &str,
        jti: &str,
        jti_expires_at: DateTime<Utc>,
    ) -> Result<()> {
        self.idp_sessions
            .insert(session_key(idp_token_id, jti), enc(&jti_expires_at))
            .map_err(Error::Storage)?;
        self.flush()
    }

    pub(crate) fn revoke_idp_sessions(
        &self,
        idp_token_id: &str,
        idp_expires_at: DateTime<Utc>,
    ) -> Result<usize> {
        let mut sessions = Vec::new();
        for item in self.idp_sessions.scan_prefix(session_prefix(idp_token_id)) {
            let (k, v) = item.map_err(Error::Storage)?;
            let exp: DateTime<Utc> = dec("session expiry", &v)?;
            let jti = session_jti(&k).to_string();
            sessions.push((k, jti, exp));
        }
        let count = sessions.len();
        tx_result(
            (&self.revoked, &self.idp_sessions, &self.idp_revoked).transaction(
                |(revoked, idp_sessions, idp_revoked)| {
                    for (k, jti, exp) in &sessions {
                        revoked.insert(jti.as_bytes(), enc(exp))?;
                        idp_sessions.remove(k)?;
                    }
                    idp_revoked.insert(idp_token_id.as_bytes(), enc(&idp_expires_at))?;
                    Ok(())
                },
            ),
        )?;
        self.flush()?;
        Ok(count)
    }

    pub(crate) fn is_idp_token_revoked(&self, idp_token_id: &str) -> Result<bool> {
        self.idp_revoked
            .contains_key(idp_token_id.as_bytes())
            .map_err(Error::Storage)
    }

    pub(crate) fn purge_expired(&self, now: DateTime<Utc>) -> Result<usize> {
        let mut removed = 0;
        for tree in [&self.revoked, &self.idp_sessions, &self.idp_revoked] {
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

    // ---- shared values ------------------------------------------------------------------

    /// The value stored under `key`, storing `value` first when there is none.
    pub(crate) fn get_or_put(&self, key: &str, value: &str) -> Result<String> {
        let k = value_key(key);
        let stored = self
            .meta
            .compare_and_swap(&k, None::<&[u8]>, Some(value.as_bytes()))
            .map_err(Error::Storage)?;
        let current = match stored {
            Ok(()) => {
                self.flush()?;
                value.as_bytes().to_vec()
            }
            Err(cas) => cas.current.map(|v| v.to_vec()).unwrap_or_default(),
        };
        String::from_utf8(current).map_err(|_| Error::CorruptValue(key.to_string()))
    }

    pub(crate) fn put_value(&self, key: &str, value: &str) -> Result<()> {
        self.meta
            .insert(value_key(key), value.as_bytes())
            .map_err(Error::Storage)?;
        self.flush()
    }

    pub(crate) fn remove_value(&self, key: &str) -> Result<()> {
        self.meta.remove(value_key(key)).map_err(Error::Storage)?;
        self.flush()
    }

    pub(crate) fn values(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for item in self.meta.scan_prefix(value_key(prefix)) {
            let (k, v) = item.map_err(Error::Storage)?;
            let key = String::from_utf8_lossy(&k["value/".len()..]).into_owned();
            let value =
                String::from_utf8(v.to_vec()).map_err(|_| Error::CorruptValue(key.clone()))?;
            out.push((key, value));
        }
        Ok(out)
    }
}

fn value_key(key: &str) -> Vec<u8> {
    [b"value/".as_slice(), key.as_bytes()].concat()
}

// Keys: `user \0 seq(be)` for the ledger, `idp-token-id \0 jti` for idp sessions. User ids and
// token ids never contain NUL (control characters are refused), so prefixes cannot collide.
fn ledger_prefix(user: &str) -> Vec<u8> {
    let mut k = user.as_bytes().to_vec();
    k.push(0);
    k
}

fn ledger_key(user: &str, seq: u64) -> Vec<u8> {
    let mut k = ledger_prefix(user);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn session_prefix(idp_token_id: &str) -> Vec<u8> {
    let mut k = idp_token_id.as_bytes().to_vec();
    k.push(0);
    k
}

fn session_key(idp_token_id: &str, jti: &str) -> Vec<u8> {
    let mut k = session_prefix(idp_token_id);
    k.extend_from_slice(jti.as_bytes());
    k
}

fn session_jti(key: &[u8]) -> &str {
    let pos = key.iter().position(|b| *b == 0).map_or(0, |p| p + 1);
    std::str::from_utf8(&key[pos..]).unwrap_or_default()
}
