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
    pub async fn hold(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: LedgerMeta,
    ) -> Result<Hold, ApiError> {
        let (store, user) = (self.store.clone(), user_id.to_string());
        blocking(move || store.place_hold(&user, amount, &meta)).await
    }

    /// Settles a hold with the real cost (at most the held amount); `balanceBefore` is the
    /// balance before the hold was placed.
    pub async fn settle(&self, hold: &Hold, cost: Decimal) -> Result<Charge, ApiError> {
        let (store, id) = (self.store.clone(), hold.id);
        let change = blocking(move || store.settle_hold(id, cost)).await?;
        Ok(Charge {
            cost,
            balance_before: change.before,
            balance_after: change.after,
        })
    }

    /// Gives a hold back untouched (the request failed before costing anything).
    pub async fn release(&self, hold: &Hold) -> Result<(), ApiError> {
        let (store, id) = (self.store.clone(), hold.id);
        blocking(move || store.release_hold(id)).await.map(|_| ())
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
