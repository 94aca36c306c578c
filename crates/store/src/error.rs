use rust_decimal::Decimal;
use std::path::PathBuf;

use crate::HoldId;

/// Everything the store can refuse or fail with, whichever backend runs.
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
    #[error("stored value {0:?} is not UTF-8")]
    CorruptValue(String),
    #[error("health marker read back differs from what was written")]
    HealthMismatch,
    /// The configuration asks for a backend this build left out (a cargo feature).
    #[error("this build has no {0} store (built without the cargo feature of that name)")]
    NotBuilt(&'static str),
    #[error("store url {0:?} is not a postgres:// or postgresql:// url")]
    BadUrl(String),
    /// The task running a store call ended without an answer (the runtime is shutting down).
    #[error("the store call was interrupted: the runtime is shutting down")]
    Interrupted,
    /// The database could not be reached lately, so this call was refused without trying it
    /// (the circuit is open), or it did not answer within the time given.
    #[error("no answer from the database (down or restarting); try again in {}s", retry_after.as_secs().max(1))]
    Unavailable { retry_after: std::time::Duration },
    #[cfg(feature = "sled")]
    #[error("storage: {0}")]
    Storage(#[from] sled::Error),
    #[cfg(feature = "postgres")]
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[cfg(feature = "postgres")]
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl Error {
    /// Whether the call failed because the database could not be reached (down, restarting,
    /// the pool out of connections, the disk failing), rather than because it refused the call.
    /// Such a call may have been applied or not; what it meant to write is worth retrying.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::Interrupted | Error::Io { .. } => true,
            #[cfg(feature = "sled")]
            Error::Storage(e) => matches!(e, sled::Error::Io(_)),
            #[cfg(feature = "postgres")]
            Error::Database(e) => crate::postgres::is_unreachable(e),
            _ => false,
        }
    }

    /// When a client refused for this error should come back: set for unavailability only.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Unavailable { retry_after } => Some(*retry_after),
            e if e.is_unavailable() => Some(crate::RETRY_AFTER),
            _ => None,
        }
    }
}
