//! The money each service moved ([`hearth_billing::Flows`], exact decimals), as counters of
//! credits: converted to `f64` here, for the export only. Beside them, where that money is
//! kept: whether the store answers, and how many settlements wait in the node's journal.

use std::fmt;
use std::sync::Arc;

use hearth_billing::{FlowTotals, Flows, Journal, Meter};
use hearth_store::{Reachability, Store};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use crate::service::{MoneyMoved, Service};

type Read = fn(&FlowTotals) -> Decimal;

const HELD: (&str, &str, Read) = (
    "hearth_billing_held_credits",
    "Credits placed on hold before work started",
    |t| t.held,
);
const CHARGED: (&str, &str, Read) = (
    "hearth_billing_charged_credits",
    "Credits charged when holds settled",
    |t| t.charged,
);
const RELEASED: (&str, &str, Read) = (
    "hearth_billing_released_credits",
    "Credits given back: holds released, and what settlements did not charge",
    |t| t.released,
);
const ADMIN_ADDED: (&str, &str, Read) = (
    "hearth_billing_admin_added_credits",
    "Credits added to balances by the admin API",
    |t| t.credited,
);
const ADMIN_REMOVED: (&str, &str, Read) = (
    "hearth_billing_admin_removed_credits",
    "Credits taken from balances by the admin API (debits)",
    |t| t.debited,
);

/// The series of the money `service` moves (its row of the service table), and the state of
/// the store and journal it moves it through.
pub(super) fn register(registry: &mut Registry, meter: &Meter, store: &Store, service: Service) {
    let series: &'static [(&str, &str, Read)] = match service.facts().money {
        MoneyMoved::Holds => &[HELD, CHARGED, RELEASED],
        MoneyMoved::AdminCredits => &[ADMIN_ADDED, ADMIN_REMOVED],
        MoneyMoved::Nothing => return,
    };
    registry.register_collector(Box::new(Money {
        flows: Arc::clone(meter.flows()),
        service: service.name(),
        series,
    }));
    registry.register_collector(Box::new(Keeping {
        store: store.clone(),
        journal: meter.journal().cloned(),
    }));
}

/// The store's reachability and the journal's depth, read at scrape time.
#[derive(Debug)]
struct Keeping {
    store: Store,
    journal: Option<Arc<Journal>>,
}

impl Collector for Keeping {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let reachability = self.store.reachability();
        let gauges = [
            (
                "hearth_store_reachable",
                "1 while the store's last calls reached it, 0 while they fail to",
                i64::from(reachability == Reachability::Reachable),
            ),
            (
                "hearth_store_circuit_open",
                "1 while calls to the store are refused at once because it cannot be reached",
                i64::from(reachability == Reachability::Open),
            ),
            (
                "hearth_billing_journal_depth",
                "Settlements and releases waiting in this node's journal for the store",
                self.journal
                    .as_ref()
                    .map_or(0, |j| i64::try_from(j.depth()).unwrap_or(i64::MAX)),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

struct Money {
    flows: Arc<Flows>,
    service: &'static str,
    series: &'static [(&'static str, &'static str, Read)],
}

impl fmt::Debug for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Money")
            .field("service", &self.service)
            .finish()
    }
}

impl Collector for Money {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let totals = self.flows.totals(self.service);
        for (name, help, read) in self.series {
            let value = read(&totals).to_f64().unwrap_or(f64::NAN);
            let metric = ConstCounter::new(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        Ok(())
    }
}
