//! The image service's queue and the time of each denoising step.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use hearth_imagine::StepObserver;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::Export;

/// Requests waiting for the model's worker, read at scrape time (`None` while it loads).
pub type QueueDepth = Arc<dyn Fn() -> Option<usize> + Send + Sync>;

/// One image model's series.
#[derive(Clone)]
pub struct ImageMetrics {
    model: String,
    steps: Histogram,
    queue: QueueDepth,
}

impl ImageMetrics {
    /// With no queue to read until [`ImageMetrics::with_queue`] gives one.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            // 5 ms (the tiny test model) to about 160 s (SDXL at 1024² on a small CPU).
            steps: Histogram::new(exponential_buckets(0.005, 2.0, 16)),
            queue: Arc::new(|| None),
        }
    }

    pub fn with_queue(self, queue: QueueDepth) -> Self {
        Self { queue, ..self }
    }

    /// Makes what a worker calls after each denoising step (one per load of the model).
    pub fn step_observers(&self) -> impl Fn() -> StepObserver + Send + Sync + 'static {
        let steps = self.steps.clone();
        move || {
            let steps = steps.clone();
            Box::new(move |took| steps.observe(took.as_secs_f64()))
        }
    }
}

impl fmt::Debug for ImageMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageMetrics")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl Export for ImageMetrics {
    fn export(self, registry: &mut Registry) {
        let model = (Cow::Borrowed("model"), Cow::Owned(self.model.clone()));
        let per_model = registry.sub_registry_with_label(model);
        per_model.register_with_unit(
            "hearth_imagine_step_duration",
            "Time of one denoising step",
            Unit::Seconds,
            self.steps.clone(),
        );
        per_model.register_collector(Box::new(self));
    }
}

impl Collector for ImageMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(waiting) = (self.queue)() else {
            return Ok(());
        };
        let gauge = ConstGauge::new(i64::try_from(waiting).unwrap_or(i64::MAX));
        gauge.encode(encoder.encode_descriptor(
            "hearth_imagine_queue_depth",
            "Image requests waiting for the model's worker (the one running not included)",
            None,
            gauge.metric_type(),
        )?)
    }
}
