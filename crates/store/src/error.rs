use rust_decimal::Decimal;
use std::path::PathBuf;

use crate::HoldId;

/// Everything the store can refuse or fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("insufficient funds: {needed} needed, {available} available")]
    InsufficientFunds { needed: Decimal, available: Decimal },
    #[error("unknown user {0:?}")]
    UnknownUser(String),
    #[error("invalid user id: {0}")]
    InvalidUserId(&'static str),
    #[error("amount must be positive, got {0}")]
    NonPositiveAmount(Decimal),
    #[error("hold {0} is not open (already settled or released, or never placed)")]
    UnknownHold(HoldId),
    #[error("cannot settle {actual} against a hold of {held}")]
    SettleExceedsHold { held: Decimal, actual: Decimal },
    #[error("the database at {path} is in use by another process")]
    Locked { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("stored {what} is unreadable: {source}")]
    Corrupt {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("health marker read back differs from what was written")]
    HealthMismatch,
    #[error("storage: {0}")]
    Storage(#[from] sled::Error),
}
