//! Billing's configuration (`[billing]`): the starting balance and the default margin.

use hearth_billing::Margin;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::{decimal, invalid, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBillingConfig {
    /// Decimal string credited to a user when first seen.
    pub initial_balance: Option<String>,
    /// Gross margin (percent, 0 to 99) applied when a request does not override it.
    pub default_margin_percent: Option<String>,
}

#[derive(Debug, Clone)]
pub struct BillingConfig {
    pub initial_balance: Decimal,
    pub default_margin: Margin,
}

impl RawBillingConfig {
    pub(super) fn resolve(&self) -> Result<BillingConfig, ConfigError> {
        let initial_balance = decimal("billing.initial_balance", &self.initial_balance, "10")?;
        if initial_balance < Decimal::ZERO {
            return Err(invalid("billing.initial_balance", "must not be negative"));
        }
        const MARGIN: &str = "billing.default_margin_percent";
        let percent = decimal(MARGIN, &self.default_margin_percent, "0")?;
        let default_margin = Margin::percent(percent).map_err(|e| invalid(MARGIN, e))?;
        Ok(BillingConfig {
            initial_balance,
            default_margin,
        })
    }
}
