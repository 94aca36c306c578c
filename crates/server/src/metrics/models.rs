//! Each served model's state, memory, download progress and load waits (`crate::models`), read at scrape time: the
//! completion listener shows its text, embedding and rerank models, the image listener its
//! image model. One collector per listener, whatever kinds it serves: each family appears once.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::Export;
use crate::models::{CountersSnapshot, Hub, Phase};

/// The models of one listener's kinds on the hub, as `/metrics` reads them.
pub struct ModelStates {
    hub: Hub,
    kinds: Vec<&'static str>,
}

impl ModelStates {
    /// The `kind` models (`text`, `image`, ...).
    pub fn new(hub: Hub, kind: &'static str) -> Self {
        Self {
            hub,
            kinds: vec![kind],
        }
    }

    /// The `kind` models too, in the same families (their load counters summed).
    pub fn and(mut self, kind: &'static str) -> Self {
        self.kinds.push(kind);
        self
    }
}

impl fmt::Debug for ModelStates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelStates")
            .field("kinds", &self.kinds)
            .finish_non_exhaustive()
    }
}

impl Export for ModelStates {
    fn export(self, registry: &mut Registry) {
        registry.register_collector(Box::new(self));
    }
}

impl Collector for ModelStates {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let rows: Vec<_> = self
            .hub
            .rows()
            .into_iter()
            .filter(|r| self.kinds.contains(&r.kind.as_str()))
            .collect();
        if !rows.is_empty() {
            let mut state = encoder.encode_descriptor(
                "hearth_model_state",
                "1 for the state each model id is in (unloaded, loading, ready, unloading, failed), 0 for the others",
                None,
                MetricType::Gauge,
            )?;
            for r in &rows {
                for phase in Phase::ALL {
                    ConstGauge::new(i64::from(r.state == phase)).encode(
                        state
                            .encode_family(&[("model", r.id.as_str()), ("state", phase.word())])?,
                    )?;
                }
            }
            let mut memory = encoder.encode_descriptor(
                "hearth_model_memory",
                "What each model holds in memory now (weights and KV budget; 0 when unloaded)",
                Some(&Unit::Bytes),
                MetricType::Gauge,
            )?;
            for r in &rows {
                let held = if r.state.holds_memory() {
                    r.memory_bytes
                } else {
                    0
                };
                ConstGauge::new(held as i64).encode(
                    memory.encode_family(&[
                        ("model", r.id.as_str()),
                        ("device", r.device.as_str()),
                    ])?,
                )?;
            }
        }
        let pulling: Vec<_> = rows
            .iter()
            .filter_map(|r| Some((r.id.as_str(), r.pull.as_ref()?)))
            .collect();
        if !pulling.is_empty() {
            for (name, help, read) in [
                (
                    "hearth_model_pull_done",
                    "Bytes of the file a model is downloading, so far",
                    (|p: &crate::models::PullState| p.done_bytes) as fn(&_) -> u64,
                ),
                (
                    "hearth_model_pull_size",
                    "Size of the file a model is downloading",
                    |p: &crate::models::PullState| p.total_bytes,
                ),
            ] {
                let mut family =
                    encoder.encode_descriptor(name, help, Some(&Unit::Bytes), MetricType::Gauge)?;
                for (id, p) in &pulling {
                    ConstGauge::new(read(p) as i64)
                        .encode(family.encode_family(&[("model", *id)])?)?;
                }
            }
        }
        let c = self
            .kinds
            .iter()
            .map(|k| self.hub.counters(k).snapshot())
            .fold(CountersSnapshot::default(), |a, b| CountersSnapshot {
                load_waits: a.load_waits + b.load_waits,
                load_wait_seconds: a.load_wait_seconds + b.load_wait_seconds,
                loads: a.loads + b.loads,
                unloads: a.unloads + b.unloads,
            });
        for (name, help, value) in [
            ("hearth_model_loads", "Model loads finished", c.loads),
            (
                "hearth_model_unloads",
                "Model unloads begun (keep-alive, by hand, evicted, dropped by a reload)",
                c.unloads,
            ),
            (
                "hearth_model_load_waits",
                "Requests that waited for their model to load",
                c.load_waits,
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(family)?;
        }
        let waited = encoder.encode_descriptor(
            "hearth_model_load_wait",
            "Time requests spent waiting for their model to load",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?;
        ConstCounter::new(c.load_wait_seconds).encode(waited)?;
        Ok(())
    }
}
