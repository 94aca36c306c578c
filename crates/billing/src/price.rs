//! Margins, prices and costs in exact decimals.

use rust_decimal::{Decimal, RoundingStrategy};

use crate::{Error, Result};

/// Decimal places of every amount Hearth computes, stores from a price, and reports.
pub const MONEY_SCALE: u32 = 6;

/// Renders an amount the way the wire carries it: a string with exactly 6 decimal places.
pub fn money(amount: Decimal) -> String {
    let mut d = round(amount);
    d.rescale(MONEY_SCALE);
    d.to_string()
}

fn round(amount: Decimal) -> Decimal {
    amount.round_dp_with_strategy(MONEY_SCALE, RoundingStrategy::MidpointAwayFromZero)
}

/// A gross margin in percent, 0 to 99: the share of a price that is margin. Only the
/// constructors check the range, so a `Margin` in hand is always valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Margin(Decimal);

impl Margin {
    pub const ZERO: Margin = Margin(Decimal::ZERO);

    /// A margin of `percent`, which must lie within 0 to 99.
    pub fn percent(percent: Decimal) -> Result<Self> {
        if percent < Decimal::ZERO || percent > Decimal::from(99) {
            return Err(Error::Margin(percent.to_string()));
        }
        Ok(Margin(percent))
    }

    /// A margin from a JSON number, rounded to 6 decimal places; 0 to 99, finite.
    pub fn from_f64(percent: f64) -> Result<Self> {
        if !(0.0..=99.0).contains(&percent) {
            return Err(Error::Margin(percent.to_string()));
        }
        let exact = Decimal::from_f64_retain(percent).ok_or(Error::Margin(percent.to_string()))?;
        Margin::percent(exact.round_dp(MONEY_SCALE))
    }

    pub fn as_percent(self) -> Decimal {
        self.0
    }

    /// The share of a price that is not margin: `1 − percent/100` (at least 0.01).
    fn keep(self) -> Decimal {
        Decimal::ONE - self.0 / Decimal::ONE_HUNDRED
    }
}

/// A price: `amount` credits for every `per` units (tokens per million, pixel-steps per
/// reference image).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price {
    amount: Decimal,
    per: Decimal,
}

impl Price {
    /// `amount` for every `per` units; the amount must not be negative, `per` must be positive.
    pub fn new(amount: Decimal, per: Decimal) -> Result<Self> {
        if amount < Decimal::ZERO {
            return Err(Error::Price("the amount is negative"));
        }
        if per <= Decimal::ZERO {
            return Err(Error::Price("the unit count is not positive"));
        }
        Ok(Price { amount, per })
    }

    /// The credits charged for every [`Price::per`] units.
    pub fn amount(&self) -> Decimal {
        self.amount
    }

    /// How many units [`Price::amount`] is for.
    pub fn per(&self) -> Decimal {
        self.per
    }

    /// `amount` for every million units (tokens).
    pub fn per_million(amount: Decimal) -> Result<Self> {
        Price::new(amount, Decimal::from(1_000_000))
    }

    /// The cost of `units` with `margin`: `units × amount / per / (1 − margin/100)`, rounded
    /// once to 6 decimal places, half away from zero. E.g. 1,234 tokens at 2.40 per million
    /// with a 20 % margin cost 0.003702.
    pub fn cost(&self, units: u64, margin: Margin) -> Result<Decimal> {
        let raw = Decimal::from(units)
            .checked_mul(self.amount)
            .and_then(|v| v.checked_div(self.per))
            .and_then(|v| v.checked_div(margin.keep()))
            .ok_or(Error::Overflow)?;
        Ok(round(raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    fn margin(p: &str) -> Margin {
        Margin::percent(d(p)).unwrap()
    }

    #[test]
    fn cost_applies_the_margin_and_rounds_once_half_away_from_zero() {
        let per_m = |a: &str| Price::per_million(d(a)).unwrap();
        assert_eq!(
            per_m("2.40").cost(1234, margin("20")).unwrap(),
            d("0.003702")
        );
        // 1 token at 0.60/M = 0.0000006 -> rounds half away from zero to 0.000001.
        assert_eq!(per_m("0.60").cost(1, Margin::ZERO).unwrap(), d("0.000001"));
        // 1 token at 0.45/M = 0.00000045 -> 0.000000; rounding per token would overcharge.
        assert_eq!(per_m("0.45").cost(1, Margin::ZERO).unwrap(), d("0"));
        assert_eq!(per_m("3").cost(1_000_000, margin("99")).unwrap(), d("300"));
        // An image price: 0.040 per 1024² pixels × 4 steps; 512² at 4 steps is a quarter.
        let image = Price::new(d("0.040"), Decimal::from(1024 * 1024 * 4)).unwrap();
        assert_eq!(image.cost(512 * 512 * 4, Margin::ZERO).unwrap(), d("0.01"));
    }

    #[test]
    fn margins_outside_0_to_99_and_bad_prices_are_refused() {
        assert!(matches!(Margin::percent(d("99.5")), Err(Error::Margin(_))));
        assert!(matches!(Margin::percent(d("-0.1")), Err(Error::Margin(_))));
        assert!(matches!(Margin::from_f64(f64::NAN), Err(Error::Margin(_))));
        assert!(matches!(Margin::from_f64(100.0), Err(Error::Margin(_))));
        assert_eq!(Margin::from_f64(12.5).unwrap().as_percent(), d("12.5"));
        assert!(matches!(Price::new(d("-1"), d("1")), Err(Error::Price(_))));
        assert!(matches!(Price::new(d("1"), d("0")), Err(Error::Price(_))));
    }

    #[test]
    fn a_cost_too_large_is_an_error_not_a_panic() {
        let huge = Price::new(Decimal::MAX, d("1")).unwrap();
        assert!(matches!(
            huge.cost(u64::MAX, Margin::ZERO),
            Err(Error::Overflow)
        ));
    }

    #[test]
    fn money_always_has_six_decimal_places() {
        assert_eq!(money(d("10")), "10.000000");
        assert_eq!(money(d("0.0000005")), "0.000001");
        assert_eq!(money(d("-1.5")), "-1.500000");
    }
}
