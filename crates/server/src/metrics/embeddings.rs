//! The embedding engines' counters ([`hearth_embed::StatsSnapshot`]), read at scrape time, for
//! the models loaded so far.

use std::fmt;
use std::sync::Arc;

use hearth_embed::StatsSnapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::Export;

/// Each loaded embedding model's counters, by model id.
pub type ReadEmbeddings = Arc<dyn Fn() -> Vec<(String, StatsSnapshot)> + Send + Sync>;

/// The completion listener's embedding engines, as `/metrics` reads them.
pub struct EmbeddingEngines {
    read: ReadEmbeddings,
}

impl EmbeddingEngines {
    pub fn new(read: ReadEmbeddings) -> Self {
        Self { read }
    }
}

impl fmt::Debug for EmbeddingEngines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddingEngines").finish_non_exhaustive()
    }
}

impl Export for EmbeddingEngines {
    fn export(self, registry: &mut Registry) {
        registry.register_collector(Box::new(self));
    }
}

impl Collector for EmbeddingEngines {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let engines = (self.read)();
        if engines.is_empty() {
            return Ok(());
        }
        type Read = fn(&StatsSnapshot) -> u64;
        let counters: [(&str, &str, Read); 5] = [
            (
                "hearth_embedding_requests",
                "Requests taken into the embedding engine's queue",
                |s| s.requests,
            ),
            (
                "hearth_embedding_refused",
                "Requests refused because the queue was full",
                |s| s.refused,
            ),
            ("hearth_embedding_inputs", "Inputs embedded", |s| s.inputs),
            (
                "hearth_embedding_batches",
                "Forward passes run (each over several inputs)",
                |s| s.batches,
            ),
            (
                "hearth_embedding_abandoned",
                "Requests skipped because their client had gone",
                |s| s.abandoned,
            ),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (model, s) in &engines {
                ConstCounter::new(read(s))
                    .encode(family.encode_family(&[("model", model.as_str())])?)?;
            }
        }
        let mut queued = encoder.encode_descriptor(
            "hearth_embedding_queue_depth",
            "Inputs waiting for the embedding engine",
            None,
            MetricType::Gauge,
        )?;
        for (model, s) in &engines {
            ConstGauge::new(s.queued as i64)
                .encode(queued.encode_family(&[("model", model.as_str())])?)?;
        }
        Ok(())
    }
}
