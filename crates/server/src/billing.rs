//! Prices and charging, shared by the completion and image services.
//!
//! `cost = units × price / divisor / (1 − margin/100)`, computed exactly in `rust_decimal` and
//! rounded **once**, at the end, to [`MONEY_SCALE`] (6) decimal places, half away from zero.
//! Every amount on the wire is a decimal string with exactly 6 decimal places ([`money`]).
//!
//! Charging goes through the store's holds: reserve an upper bound before the work starts
//! ([`Billing::hold`]), then settle with the real cost ([`Billing::settle`]) or release it
//! ([`Billing::release`]); a one-shot [`Billing::charge`] debits directly.

use hearth_store::{Hold, LedgerMeta, Store};
use rust_decimal::{Decimal, RoundingStrategy};
use serde_json::json;

use crate::error::ApiError;

/// Decimal places of every amount Hearth computes, stores from a price, and reports.
pub const MONEY_SCALE: u32 = 6;

/// Renders an amount the way the wire carries it: a string with exactly 6 decimal places.
pub fn money(amount: Decimal) -> String {
    let mut d = amount.round_dp_with_strategy(MONEY_SCALE, RoundingStrategy::MidpointAwayFromZero);
    d.rescale(MONEY_SCALE);
    d.to_string()
}

/// Why a price could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    #[error("margin must lie within 0 to 99 percent, got {0}")]
    Margin(Decimal),
    #[error("divisor must be positive, got {0}")]
    Divisor(Decimal),
    #[error("units and price must not be negative")]
    Negative,
    #[error("the price overflows")]
    Overflow,
}

/// `units × price / divisor / (1 − margin_percent/100)`, rounded once to 6 dp half away from
/// zero. E.g. 1,234 tokens at 2.40 per 1,000,000 with a 20 % margin cost 0.003702.
pub fn price(
    units: Decimal,
    unit_price: Decimal,
    divisor: Decimal,
    margin_percent: Decimal,
) -> Result<Decimal, PriceError> {
    if margin_percent < Decimal::ZERO || margin_percent > Decimal::from(99) {
        return Err(PriceError::Margin(margin_percent));
    }
    if divisor <= Decimal::ZERO {
        return Err(PriceError::Divisor(divisor));
    }
    if units < Decimal::ZERO || unit_price < Decimal::ZERO {
        return Err(PriceError::Negative);
    }
    let keep = Decimal::ONE - margin_percent / Decimal::ONE_HUNDRED;
    let raw = units
        .checked_mul(unit_price)
        .and_then(|v| v.checked_div(divisor))
        .and_then(|v| v.checked_div(keep))
        .ok_or(PriceError::Overflow)?;
    Ok(raw.round_dp_with_strategy(MONEY_SCALE, RoundingStrategy::MidpointAwayFromZero))
}

/// What a charge did to the balance, in wire form via [`money`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub cost: Decimal,
    pub balance_before: Decimal,
    pub balance_after: Decimal,
}

/// Funds reserved for one request: an owned hold that is settled with the real cost
/// ([`HeldFunds::settle`]) or, on every other path (an error, a cancelled future, a client gone,
/// a panic), released when dropped. So no path strands money: what `hold` placed always ends.
#[must_use = "dropping the funds releases the hold"]
pub struct HeldFunds {
    store: Store,
    /// `Some` until settled or released.
    hold: Option<Hold>,
}

impl HeldFunds {
    /// The amount held.
    pub fn amount(&self) -> Decimal {
        self.hold.as_ref().map_or(Decimal::ZERO, |h| h.amount)
    }

    /// Whose funds these are.
    pub fn user_id(&self) -> &str {
        self.hold.as_ref().map_or("", |h| h.user_id.as_str())
    }

    /// Settles with the real cost (at most the held amount); `balanceBefore` is the balance
    /// before the hold was placed. If the store refuses, the hold is released (the user is not
    /// charged) and the error returned.
    pub async fn settle(mut self, cost: Decimal) -> Result<Charge, ApiError> {
        let Some(hold) = self.hold.take() else {
            return Err(ApiError::internal("a hold was settled twice"));
        };
        let store = self.store.clone();
        let id = hold.id;
        let settled = blocking(move || store.settle_hold(id, cost)).await;
        match settled {
            Ok(change) => Ok(Charge {
                cost,
                balance_before: change.before,
                balance_after: change.after,
            }),
            Err(e) => {
                // Put it back so that dropping `self` releases it.
                self.hold = Some(hold);
                Err(e)
            }
        }
    }

    /// Gives the hold back untouched and waits until the store has done so.
    pub async fn release(mut self) -> Result<(), ApiError> {
        let Some(hold) = self.hold.take() else {
            return Ok(());
        };
        let store = self.store.clone();
        blocking(move || store.release_hold(hold.id))
            .await
            .map(|_| ())
    }
}

impl Drop for HeldFunds {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else { return };
        let store = self.store.clone();
        let release = move || match store.release_hold(hold.id) {
            Ok(_) => {
                tracing::info!(hold = %hold.id, user = %hold.user_id, amount = %hold.amount, "hold released: the request ended without settling")
            }
            // Still in the store: `release_stale_holds` gives it back at the next start.
            Err(e) => {
                tracing::warn!(hold = %hold.id, error = %e, "releasing a dropped hold failed")
            }
        };
        // The store flushes to disk: off the async workers when there are any.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(release);
            }
            Err(_) => release(),
        }
    }
}

impl std::fmt::Debug for HeldFunds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldFunds")
            .field("hold", &self.hold.as_ref().map(|h| h.id))
            .finish()
    }
}

/// Charging on top of the store, with errors already in API shape.
#[derive(Clone)]
pub struct Billing {
    store: Store,
    default_margin_percent: Decimal,
}

impl Billing {
    pub fn new(store: Store, default_margin_percent: Decimal) -> Self {
        Self {
            store,
            default_margin_percent,
        }
    }

    /// The margin to apply: the request's `overrideGrossMarginPercent` (checked to be 0 to 99) or
    /// the configured default.
    pub fn margin(&self, override_percent: Option<f64>) -> Result<Decimal, ApiError> {
        const FIELD: &str = "overrideGrossMarginPercent";
        match override_percent {
            None => Ok(self.default_margin_percent),
            Some(p) if !(0.0..=99.0).contains(&p) => Err(ApiError::invalid_request(
                FIELD,
                format!("must lie within 0 to 99, got {p}"),
            )),
            Some(p) => Decimal::from_f64_retain(p)
                .map(|d| d.round_dp(MONEY_SCALE))
                .ok_or_else(|| ApiError::invalid_request(FIELD, "not a finite number")),
        }
    }

    /// [`price`] with errors as `InternalError` (inputs come from validated requests and the
    /// model table, so a failure here is Hearth's fault).
    pub fn cost(
        &self,
        units: Decimal,
        unit_price: Decimal,
        divisor: Decimal,
        margin_percent: Decimal,
    ) -> Result<Decimal, ApiError> {
        price(units, unit_price, divisor, margin_percent).map_err(ApiError::internal)
    }

    /// The user's spendable balance.
    pub fn balance(&self, user_id: &str) -> Result<Decimal, ApiError> {
        self.store.balance(user_id).map_err(store_error)
    }

    /// Reserves `amount` for a request; `InsufficientFunds` (402) when the balance is short.
    ///
    /// The hold comes back as [`HeldFunds`], which releases it when dropped. It is wrapped on the
    /// blocking thread that placed it, so a caller that goes away while the hold is being placed
    /// (its future dropped mid-await) releases it too: the value is dropped with the task's
    /// unread output.
    pub async fn hold(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: LedgerMeta,
    ) -> Result<HeldFunds, ApiError> {
        let (store, user) = (self.store.clone(), user_id.to_string());
        blocking(move || {
            let hold = store.place_hold(&user, amount, &meta)?;
            Ok(HeldFunds {
                store,
                hold: Some(hold),
            })
        })
        .await
    }

    /// Debits `cost` at once (one ledger row), refusing with `InsufficientFunds`.
    pub async fn charge(
        &self,
        user_id: &str,
        cost: Decimal,
        meta: LedgerMeta,
    ) -> Result<Charge, ApiError> {
        let (store, user) = (self.store.clone(), user_id.to_string());
        if cost.is_zero() {
            let balance = blocking(move || store.balance(&user)).await?;
            return Ok(Charge {
                cost,
                balance_before: balance,
                balance_after: balance,
            });
        }
        let change = blocking(move || store.debit(&user, cost, &meta)).await?;
        Ok(Charge {
            cost,
            balance_before: change.before,
            balance_after: change.after,
        })
    }
}

/// Store calls flush to disk: keep them off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, hearth_store::Error> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
        .map_err(store_error)
}

fn store_error(e: hearth_store::Error) -> ApiError {
    match e {
        hearth_store::Error::UnknownUser(u) => {
            ApiError::invalid_credentials(format!("user {u:?} has no account; sign in again"))
                .with_details(json!({ "userId": u }))
        }
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    #[test]
    fn price_applies_margin_and_rounds_once_half_away_from_zero() {
        assert_eq!(
            price(d("1234"), d("2.40"), d("1000000"), d("20")).unwrap(),
            d("0.003702")
        );
        // 1 token at 0.60/M = 0.0000006 -> rounds half away from zero to 0.000001.
        assert_eq!(
            price(d("1"), d("0.60"), d("1000000"), d("0")).unwrap(),
            d("0.000001")
        );
        // 1 token at 0.45/M = 0.00000045 -> 0.000000; rounding per token would overcharge.
        assert_eq!(
            price(d("1"), d("0.45"), d("1000000"), d("0")).unwrap(),
            d("0")
        );
        assert_eq!(
            price(d("1000000"), d("3"), d("1000000"), d("99")).unwrap(),
            d("300")
        );
    }

    #[test]
    fn price_refuses_out_of_range_inputs() {
        assert_eq!(
            price(d("1"), d("1"), d("1"), d("99.5")),
            Err(PriceError::Margin(d("99.5")))
        );
        assert_eq!(
            price(d("1"), d("1"), d("0"), d("0")),
            Err(PriceError::Divisor(d("0")))
        );
        assert_eq!(
            price(d("-1"), d("1"), d("1"), d("0")),
            Err(PriceError::Negative)
        );
    }

    #[test]
    fn money_always_has_six_decimal_places() {
        assert_eq!(money(d("10")), "10.000000");
        assert_eq!(money(d("0.0000005")), "0.000001");
        assert_eq!(money(d("-1.5")), "-1.500000");
    }

    fn store_with(user: &str, balance: &str) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        store.ensure_user(user, false).unwrap();
        store
            .credit(user, d(balance), &LedgerMeta::reason("test funds"))
            .unwrap();
        (dir, store)
    }

    /// Waits (up to 5 s) until `user` has no open hold.
    async fn holds_end(store: &Store, user: &str) -> bool {
        for _ in 0..500 {
            if store.holds(user).unwrap().is_empty() {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_hold_whose_caller_goes_away_while_it_is_being_placed_is_released() {
        let (_dir, store) = store_with("ann", "10");
        let billing = Billing::new(store.clone(), d("0"));
        // Poll the placement once (it is then on its blocking thread) and drop it: the caller
        // went away mid-await, as a handler does when its client disconnects.
        let mut placing = Box::pin(billing.hold("ann", d("3"), LedgerMeta::reason("test")));
        let first = futures::poll!(placing.as_mut());
        assert!(
            first.is_pending(),
            "the placement finished before it could be cut"
        );
        drop(placing);
        assert!(holds_end(&store, "ann").await, "the hold was stranded");
        assert_eq!(store.balance("ann").unwrap(), d("10"));
    }

    #[tokio::test]
    async fn held_funds_settle_once_and_are_released_when_dropped() {
        let (_dir, store) = store_with("bob", "10");
        let billing = Billing::new(store.clone(), d("0"));
        let meta = || LedgerMeta::reason("test");
        let held = billing.hold("bob", d("4"), meta()).await.unwrap();
        assert_eq!(held.amount(), d("4"));
        assert_eq!(store.balance("bob").unwrap(), d("6"));
        let charge = held.settle(d("1.5")).await.unwrap();
        assert_eq!(
            (charge.balance_before, charge.balance_after),
            (d("10"), d("8.5"))
        );
        assert!(store.holds("bob").unwrap().is_empty());

        let dropped = billing.hold("bob", d("8"), meta()).await.unwrap();
        assert_eq!(store.balance("bob").unwrap(), d("0.5"));
        drop(dropped);
        assert!(holds_end(&store, "bob").await, "a dropped hold stayed");
        assert_eq!(store.balance("bob").unwrap(), d("8.5"));
        // The refusal of a hold beyond the balance places nothing.
        let refused = billing.hold("bob", d("9"), meta()).await.unwrap_err();
        assert_eq!(refused.kind, crate::error::ErrorKind::InsufficientFunds);
        assert!(store.holds("bob").unwrap().is_empty());
    }

    #[test]
    fn margin_override_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let b = Billing::new(store, d("5"));
        assert_eq!(b.margin(None).unwrap(), d("5"));
        assert_eq!(b.margin(Some(12.5)).unwrap(), d("12.5"));
        assert_eq!(
            b.margin(Some(100.0)).unwrap_err().details["field"],
            "overrideGrossMarginPercent"
        );
        assert!(b.margin(Some(-0.1)).is_err());
    }
}
