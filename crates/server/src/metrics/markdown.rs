//! Document conversions by detected format and outcome, with their duration.

use std::time::Duration;

use hearth_isolate::{ConvertErrorKind, Error as IsolateError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::Export;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConversionLabels {
    format: &'static str,
    outcome: &'static str,
}

/// The markdown service's conversions (uploads that reached a conversion worker).
#[derive(Debug, Clone)]
pub struct Conversions {
    total: Family<ConversionLabels, Counter>,
    duration: Family<ConversionLabels, Histogram, fn() -> Histogram>,
}

impl Default for Conversions {
    fn default() -> Self {
        Self {
            total: Family::default(),
            duration: Family::new_with_constructor(super::seconds_histogram),
        }
    }
}

impl Conversions {
    /// Counts one conversion: `format` is the detected format's name (`unknown` when it
    /// failed: the worker reports no format then), `outcome` is `ok` or a
    /// [`conversion_outcome`].
    pub fn record(&self, format: &'static str, outcome: &'static str, took: Duration) {
        let labels = ConversionLabels { format, outcome };
        self.total.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
}

impl Export for Conversions {
    fn export(self, registry: &mut Registry) {
        registry.register(
            "hearth_markdown_conversions",
            "Conversions by detected format (unknown when it failed) and outcome (ok or the error kind)",
            self.total,
        );
        registry.register_with_unit(
            "hearth_markdown_conversion_duration",
            "Time a conversion took, waiting for a worker included",
            Unit::Seconds,
            self.duration,
        );
    }
}

/// The `outcome` label of a failed conversion: the converter's error kind, or what happened to
/// the worker.
pub fn conversion_outcome(e: &IsolateError) -> &'static str {
    match e {
        IsolateError::Convert { kind, .. } => match kind {
            ConvertErrorKind::Empty => "empty",
            ConvertErrorKind::Unsupported { .. } => "unsupported",
            ConvertErrorKind::TooLarge => "too_large",
            ConvertErrorKind::Malformed => "malformed",
            ConvertErrorKind::Encrypted => "encrypted",
            ConvertErrorKind::ExpandsTooMuch => "expands_too_much",
            ConvertErrorKind::TooManyMembers => "too_many_members",
            ConvertErrorKind::TooDeep => "too_deep",
            ConvertErrorKind::TimedOut => "timed_out",
            ConvertErrorKind::ImageTooLarge => "image_too_large",
            ConvertErrorKind::TooManyPages => "too_many_pages",
            ConvertErrorKind::UnknownLanguage => "unknown_language",
            ConvertErrorKind::Ocr => "ocr_unavailable",
            ConvertErrorKind::Crashed => "converter_panicked",
        },
        IsolateError::Crashed { .. } => "worker_died",
        IsolateError::Busy { .. } => "busy",
        IsolateError::Unavailable { .. } => "unavailable",
    }
}
