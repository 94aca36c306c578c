//! The records the store keeps, and how their keys are laid out.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::Error;

/// A user known to Hearth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub user_id: String,
    pub is_marketing: bool,
    pub created_at: DateTime<Utc>,
}

/// Who and what a ledger row is for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerMeta {
    pub reason: String,
    pub developer_id: Option<String>,
    pub application_id: Option<String>,
}

impl LedgerMeta {
    pub fn reason(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            ..Self::default()
        }
    }
}

/// One append-only row: a credit (amount > 0) or a debit (amount < 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Increases with every row written (not necessarily by one).
    pub seq: u64,
    pub user_id: String,
    pub amount: Decimal,
    pub balance_after: Decimal,
    pub reason: String,
    pub developer_id: Option<String>,
    pub application_id: Option<String>,
    pub at: DateTime<Utc>,
}

/// The balance around one money-changing operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalanceChange {
    pub before: Decimal,
    pub after: Decimal,
    /// The ledger row written, if any (a release writes none).
    pub ledger_seq: Option<u64>,
}

/// Identifies an open hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HoldId(pub u64);

impl std::fmt::Display for HoldId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Funds reserved for a request in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub id: HoldId,
    pub user_id: String,
    pub amount: Decimal,
    /// The spendable balance just before the hold was placed.
    pub balance_before: Decimal,
    pub meta: LedgerMeta,
    pub placed_at: DateTime<Utc>,
}

pub(crate) fn check_user_id(user_id: &str) -> Result<(), Error> {
    if user_id.is_empty() {
        return Err(Error::InvalidUserId("must not be empty"));
    }
    if user_id.len() > 256 {
        return Err(Error::InvalidUserId("must be at most 256 bytes"));
    }
    if user_id.chars().any(char::is_control) {
        return Err(Error::InvalidUserId("must not contain control characters"));
    }
    Ok(())
}

// Keys: `user \0 seq(be)` for the ledger, `idp-token-id \0 jti` for idp sessions. User ids and
// token ids never contain NUL (control characters are refused), so prefixes cannot collide.
pub(crate) fn ledger_prefix(user: &str) -> Vec<u8> {
    let mut k = user.as_bytes().to_vec();
    k.push(0);
    k
}

pub(crate) fn ledger_key(user: &str, seq: u64) -> Vec<u8> {
    let mut k = ledger_prefix(user);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(crate) fn session_prefix(idp_token_id: &str) -> Vec<u8> {
    let mut k = idp_token_id.as_bytes().to_vec();
    k.push(0);
    k
}

pub(crate) fn session_key(idp_token_id: &str, jti: &str) -> Vec<u8> {
    let mut k = session_prefix(idp_token_id);
    k.extend_from_slice(jti.as_bytes());
    k
}

pub(crate) fn session_jti(key: &[u8]) -> &str {
    let pos = key.iter().position(|b| *b == 0).map_or(0, |p| p + 1);
    std::str::from_utf8(&key[pos..]).unwrap_or_default()
}
