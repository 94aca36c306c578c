//! The completion engines' own counters ([`hearth_scheduler::MetricsSnapshot`]), read at scrape
//! time. Model ids that share weights share one engine (`services/completion/engines.rs`): its
//! series are labelled with the engine's name, the first of its ids, and
//! `hearth_completion_model_info{model, engine}` maps every id to its engine.

use std::fmt;

use hearth_scheduler::metrics::{bucket_bounds, HistogramSnapshot};
use hearth_scheduler::{MetricsSnapshot, SchedulerHandle};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::Export;
use crate::models::{Availability, Models};

/// The completion service's engines, as `/metrics` reads them.
pub struct TextEngines<K> {
    models: Models<SchedulerHandle, K>,
}

impl<K> TextEngines<K> {
    pub fn new(models: Models<SchedulerHandle, K>) -> Self {
        Self { models }
    }
}

impl<K> fmt::Debug for TextEngines<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextEngines").finish_non_exhaustive()
    }
}

impl<K: PartialEq + Send + Sync + 'static> Export for TextEngines<K> {
    fn export(self, registry: &mut Registry) {
        registry.register_collector(Box::new(self));
    }
}

/// One engine at one scrape.
struct Engine {
    name: String,
    snapshot: MetricsSnapshot,
    kv_budget_bytes: u64,
}

impl<K: PartialEq + Send + Sync + 'static> Collector for TextEngines<K> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let status = self.models.status();
        if !status.is_empty() {
            let mut ready = encoder.encode_descriptor(
                "hearth_completion_model_ready",
                "1 when the model id is loaded and its engine runs, 0 while it loads or when it cannot serve",
                None,
                MetricType::Gauge,
            )?;
            for (id, availability) in &status {
                let up = i64::from(*availability == Availability::Ready);
                ConstGauge::new(up).encode(ready.encode_family(&[("model", id.as_str())])?)?;
            }
        }

        let loaded = self.models.all_loaded();
        let mut engines: Vec<Engine> = Vec::new();
        for (_, handle) in &loaded {
            if !engines.iter().any(|e| e.name == handle.name()) {
                engines.push(Engine {
                    name: handle.name().to_string(),
                    snapshot: handle.metrics(),
                    kv_budget_bytes: handle.config().kv_budget_bytes,
                });
            }
        }
        if engines.is_empty() {
            return Ok(());
        }
        let mut info = encoder.encode_descriptor(
            "hearth_completion_model",
            "The engine (named by its first model id) that serves each model id",
            None,
            MetricType::Info,
        )?;
        for (id, handle) in &loaded {
            info.encode_info(&[("model", id.as_str()), ("engine", handle.name())])?;
        }

        type Read = fn(&Engine) -> u64;
        let counters: [(&str, &str, Read); 11] = [
            ("hearth_completion_requests", "Requests submitted to the engine", |e| e.snapshot.requests),
            ("hearth_completion_rejected", "Requests the engine refused at submission (queue full, prompt too long, shutting down)", |e| e.snapshot.rejected),
            ("hearth_completion_finished", "Sequences that finished (a stop, the length limit)", |e| e.snapshot.finished),
            ("hearth_completion_aborted", "Sequences aborted (cancelled, client gone, engine failure, shutdown)", |e| e.snapshot.aborted),
            ("hearth_completion_prompt_tokens", "Prompt tokens of the sequences admitted", |e| e.snapshot.prompt_tokens),
            ("hearth_completion_prefix_reused_tokens", "Prompt tokens taken from a kept KV cache instead of prefilled", |e| e.snapshot.prefix_reused_tokens),
            ("hearth_completion_draft_prefix_reused_tokens", "Prompt tokens the draft model took from a kept or running draft cache instead of prefilling", |e| e.snapshot.draft_reused_tokens),
            ("hearth_completion_generated_tokens", "Tokens generated", |e| e.snapshot.generated_tokens),
            ("hearth_completion_drafted_tokens", "Tokens drafted by speculative decoding and fed for verification", |e| e.snapshot.drafted_tokens),
            ("hearth_completion_accepted_tokens", "Drafted tokens the model confirmed", |e| e.snapshot.accepted_tokens),
            ("hearth_completion_steps", "Engine steps (one forward pass over the batch each)", |e| e.snapshot.steps),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for e in &engines {
                ConstCounter::new(read(e)).encode(family.encode_family(&model(e))?)?;
            }
        }
        let gauges: [(&str, &str, Option<Unit>, Read); 5] = [
            (
                "hearth_completion_queue_depth",
                "Requests waiting for admission",
                None,
                |e| e.snapshot.queue_depth,
            ),
            (
                "hearth_completion_active_sequences",
                "Sequences in the batch",
                None,
                |e| e.snapshot.active,
            ),
            (
                "hearth_completion_paused_sequences",
                "Sequences paused because their client reads nothing",
                None,
                |e| e.snapshot.paused,
            ),
            (
                "hearth_completion_kv_cache_in_use",
                "KV cache held by the sequences in the batch (caches kept for reuse not included)",
                Some(Unit::Bytes),
                |e| e.snapshot.kv_bytes_in_use,
            ),
            (
                "hearth_completion_kv_cache_budget",
                "The engine's KV cache budget",
                Some(Unit::Bytes),
                |e| e.kv_budget_bytes,
            ),
        ];
        for (name, help, unit, read) in gauges {
            let mut family =
                encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
            for e in &engines {
                let value = i64::try_from(read(e)).unwrap_or(i64::MAX);
                ConstGauge::new(value).encode(family.encode_family(&model(e))?)?;
            }
        }

        type ReadHistogram = fn(&MetricsSnapshot) -> &HistogramSnapshot;
        const MICROS: f64 = 1e6;
        let histograms: [(&str, &str, Option<Unit>, f64, ReadHistogram); 6] = [
            (
                "hearth_completion_time_to_first_token",
                "From admission to the first generated token",
                Some(Unit::Seconds),
                MICROS,
                |s| &s.time_to_first_token_us,
            ),
            (
                "hearth_completion_inter_token_latency",
                "Between two tokens of one sequence",
                Some(Unit::Seconds),
                MICROS,
                |s| &s.inter_token_latency_us,
            ),
            (
                "hearth_completion_queue_wait",
                "From submission to admission",
                Some(Unit::Seconds),
                MICROS,
                |s| &s.queue_wait_us,
            ),
            (
                "hearth_completion_step_duration",
                "One engine step",
                Some(Unit::Seconds),
                MICROS,
                |s| &s.step_time_us,
            ),
            (
                "hearth_completion_batch_size",
                "Sequences in one engine step",
                None,
                1.0,
                |s| &s.batch_rows,
            ),
            (
                "hearth_completion_batch_tokens",
                "Tokens in one engine step (prefill chunks and decode rows)",
                None,
                1.0,
                |s| &s.batch_tokens,
            ),
        ];
        for (name, help, unit, scale, read) in histograms {
            let mut family =
                encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Histogram)?;
            for e in &engines {
                let h = read(&e.snapshot);
                let buckets = buckets(h, scale);
                let count = buckets.iter().map(|(_, c)| c).sum();
                family
                    .encode_family(&model(e))?
                    .encode_histogram::<NoLabelSet>(h.sum as f64 / scale, count, &buckets, None)?;
            }
        }
        Ok(())
    }
}

fn model(e: &Engine) -> [(&'static str, &str); 1] {
    [("model", e.name.as_str())]
}

/// The scheduler's buckets, every one on every scrape, bounds divided by `scale` (microseconds
/// to seconds) and rounded to 6 significant digits; the last bucket takes everything above the
/// one before it, so its bound is +Inf.
fn buckets(h: &HistogramSnapshot, scale: f64) -> Vec<(f64, u64)> {
    let last = h.counts.len().saturating_sub(1);
    bucket_bounds()
        .zip(h.counts.iter().copied())
        .enumerate()
        .map(|(i, (bound, count))| {
            let bound = if i == last {
                f64::INFINITY
            } else {
                significant(bound / scale)
            };
            (bound, count)
        })
        .collect()
}

fn significant(x: f64) -> f64 {
    let scale = 10f64.powi(5 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_scheduler::metrics::Histogram;

    #[test]
    fn scheduler_histograms_keep_every_bucket_with_inf_last_in_seconds() {
        let h = Histogram::default();
        h.record(12); // µs: the second bucket (10, 15]
        h.record(u64::MAX / 4); // past every bound: the last
        let s = h.snapshot();
        let b = buckets(&s, 1e6);
        assert_eq!(b.len(), bucket_bounds().count());
        assert_eq!(b[0], (1e-5, 0));
        assert_eq!(b[1], (1.5e-5, 1));
        assert_eq!(*b.last().unwrap(), (f64::INFINITY, 1));
        assert!(b.windows(2).all(|w| w[0].0 < w[1].0), "bounds increase");
    }
}
