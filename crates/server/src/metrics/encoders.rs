//! The encoder engines' counters ([`hearth_embed::StatsSnapshot`]: the embedding and rerank
//! models), read at scrape time, for the models loaded so far.

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

/// Each loaded embedding or rerank model's counters, by model id.
pub type ReadEncoders = Arc<dyn Fn() -> Vec<(String, StatsSnapshot)> + Send + Sync>;

/// The completion listener's encoder engines, as `/metrics` reads them.
pub struct EncoderEngines {
    read: ReadEncoders,
}

impl EncoderEngines {
    pub fn new(read: ReadEncoders) -> Self {
        Self { read }
    }
}

impl fmt::Debug for EncoderEngines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncoderEngines").finish_non_exhaustive()
    }
}

impl Export for EncoderEngines {
    fn export(self, registry: &mut Registry) {
        registry.register_collector(Box::new(self));
    }
}

impl Collector for EncoderEngines {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let engines = (self.read)();
        if engines.is_empty() {
            return Ok(());
        }
        type Read = fn(&StatsSnapshot) -> u64;
        let counters: [(&str, &str, Read); 5] = [
            (
                "hearth_encoder_requests",
                "Requests taken into an encoder engine's queue (embedding or rerank)",
                |s| s.requests,
            ),
            (
                "hearth_encoder_refused",
                "Requests refused because the queue was full",
                |s| s.refused,
            ),
            (
                "hearth_encoder_inputs",
                "Inputs encoded (texts embedded, query-document pairs scored)",
                |s| s.inputs,
            ),
            (
                "hearth_encoder_batches",
                "Forward passes run (each over several inputs)",
                |s| s.batches,
            ),
            (
                "hearth_encoder_abandoned",
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
            "hearth_encoder_queue_depth",
            "Inputs waiting for the encoder engine",
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
