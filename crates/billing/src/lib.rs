//! Metering, shared by the completion and image services: what a request costs and the funds
//! held for it.
//!
//! - [`Margin`]: a gross margin, 0 to 99 percent, checked once where it enters (a request field
//!   or the configuration) and trusted everywhere after.
//! - [`Price`]: credits per a number of units (per million tokens, per reference image); its
//!   [`Price::cost`] is `units × amount / per / (1 − margin/100)`, computed exactly and rounded
//!   **once**, at the end, to [`MONEY_SCALE`] (6) decimal places, half away from zero.
//! - [`Meter`] places holds on the store; a hold comes back as [`HeldFunds`], an owned value
//!   that settles with the real cost or is released when dropped, on every path.
//! - [`Journal`]: settlements and releases the store could not take when they were made, kept
//!   on the node's disk and handed to the store once it answers, exactly once.
//! - [`Flows`]: the money each service held, charged, released and had credited, counted where
//!   it moves, for the metrics export.
//!
//! Errors are [`Error`]; the HTTP edge maps them once.

mod flows;
mod hold;
mod journal;
mod price;
#[cfg(test)]
mod test_support;

pub use flows::{FlowTotals, Flows};
pub use hold::{Charge, HeldFunds, Meter, UNATTRIBUTED};
pub use journal::{Entry, Journal, JournalError, Replayed};
pub use price::{money, Margin, Price, MONEY_SCALE};

use rust_decimal::Decimal;

/// Why metering failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The balance cannot cover the amount asked for; nothing was held.
    #[error("insufficient funds: {needed} needed, {available} available")]
    InsufficientFunds { needed: Decimal, available: Decimal },
    /// The user has no account in the store.
    #[error("user {0:?} has no account")]
    UnknownUser(String),
    /// A margin outside 0 to 99 percent (or not a finite number).
    #[error("must be between 0 and 99, got {0}")]
    Margin(String),
    /// A price with a negative amount or a non-positive unit count.
    #[error("invalid price: {0}")]
    Price(&'static str),
    /// A cost too large for the decimal type.
    #[error("the cost overflows")]
    Overflow,
    #[error(transparent)]
    Store(hearth_store::Error),
    /// The task that placed a hold failed (it panicked or the runtime is gone).
    #[error("placing the hold did not complete: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl From<hearth_store::Error> for Error {
    fn from(e: hearth_store::Error) -> Self {
        match e {
            hearth_store::Error::InsufficientFunds { needed, available } => {
                Error::InsufficientFunds { needed, available }
            }
            hearth_store::Error::UnknownUser(user) => Error::UnknownUser(user),
            other => Error::Store(other),
        }
    }
}

impl Error {
    /// Whether the store could not be reached (see [`hearth_store::Error::is_unavailable`]).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_unavailable())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
