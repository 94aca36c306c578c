//! Money moved since the process started, per service, in exact decimals: what `/metrics`
//! exports (converted to `f64` only there). Totals only: no user, no request.
//!
//! Every hold ends as a settlement or a release, so once no request is in flight
//! `held == charged + released` for each service (the part of a hold that a settlement does not
//! charge counts as released).

use std::collections::BTreeMap;
use std::sync::Mutex;

use rust_decimal::Decimal;

/// One service's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowTotals {
    /// Placed on hold before work started.
    pub held: Decimal,
    /// Taken from balances when holds settled.
    pub charged: Decimal,
    /// Given back: whole holds released, and what settlements did not charge.
    pub released: Decimal,
    /// Added to balances by the admin API.
    pub credited: Decimal,
    /// Taken from balances by the admin API (`debit`).
    pub debited: Decimal,
}

/// The totals of every service, shared by the [`crate::Meter`]s of one process.
#[derive(Debug, Default)]
pub struct Flows {
    by_service: Mutex<BTreeMap<&'static str, FlowTotals>>,
}

impl Flows {
    /// The totals of `service` (all zero when it moved nothing).
    pub fn totals(&self, service: &str) -> FlowTotals {
        self.lock().get(service).copied().unwrap_or_default()
    }

    pub(crate) fn add(&self, service: &'static str, change: impl FnOnce(&mut FlowTotals)) {
        change(self.lock().entry(service).or_default());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, FlowTotals>> {
        // The map holds plain numbers, consistent after any panic: keep counting.
        self.by_service
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
