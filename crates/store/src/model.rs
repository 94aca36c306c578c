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

impl LedgerEntry {
    pub(crate) fn new(
        seq: u64,
        user_id: &str,
        amount: Decimal,
        balance_after: Decimal,
        meta: &LedgerMeta,
        at: DateTime<Utc>,
    ) -> Self {
        Self {
            seq,
            user_id: user_id.to_string(),
            amount,
            balance_after,
            reason: meta.reason.clone(),
            developer_id: meta.developer_id.clone(),
            application_id: meta.application_id.clone(),
            at,
        }
    }
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
    /// The node whose request placed it: only that node releases it when it restarts (holds
    /// written before nodes had ids read back as `""`).
    #[serde(default)]
    pub node_id: String,
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

/// The ledger reason of the credit a new user starts with.
pub(crate) const INITIAL_BALANCE: &str = "initial balance";

/// `before + delta`, or [`Error::InsufficientFunds`] when that is below zero. Every backend
/// decides with this, inside the transaction that holds the balance.
pub(crate) fn checked_after(before: Decimal, delta: Decimal) -> Result<Decimal, Error> {
    let after = before + delta;
    if after < Decimal::ZERO {
        return Err(Error::InsufficientFunds {
            needed: -delta,
            available: before,
        });
    }
    Ok(after)
}

/// A hold settles for at most what it holds.
pub(crate) fn check_settle(hold: &Hold, actual: Decimal) -> Result<(), Error> {
    if actual > hold.amount {
        return Err(Error::SettleExceedsHold {
            held: hold.amount,
            actual,
        });
    }
    Ok(())
}
