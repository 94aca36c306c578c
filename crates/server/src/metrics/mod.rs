//! Prometheus metrics: `GET /metrics` on every listener, in the Prometheus text exposition
//! format 0.0.4 (`text/plain; version=0.0.4`).
//!
//! **Crate.** `prometheus-client`, the Prometheus project's Rust client, rather than `metrics` +
//! `metrics-exporter-prometheus`: its `Registry` is a plain value, so there is no process-wide
//! recorder and two servers in one process (the tests) keep separate series, as the
//! no-global-state invariant asks; and its `Collector` trait lets a scrape read what the
//! scheduler and billing already count, histograms with the scheduler's own buckets included,
//! where the `metrics` exporter can only bucket observations it recorded itself.
//!
//! **One listener, its own series.** Each listener's `/metrics` shows its requests, its
//! service's own metrics and the money its service moved, every series labelled
//! `service="<name>"`. Scraping all four listeners of a process never counts a series twice,
//! and a process that runs some services shows those. The state: one [`Metrics`] per process
//! in `AppState` (the request series of each service), the services' own values (markdown's
//! conversions, imagine's step times), and the scheduler's and billing's counters, read at
//! scrape time.
//!
//! **What the series carry.** Route templates (`MatchedPath`, never the raw path; `unmatched`
//! otherwise), standard methods (else `other`), statuses, model ids, document formats, outcome
//! kinds, service names, money totals per service. Never a user id, a token, a prompt, a file
//! name or anything of one request, so `/metrics` needs no credential (docs/decisions.md,
//! "Metrics"; `tests/metrics.rs` checks it).

mod encoders;
mod engines;
mod http;
mod imagine;
mod markdown;
mod models;
mod money;

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::service::Service;
use crate::state::AppState;

pub use encoders::{EncoderEngines, ReadEncoders};
pub use engines::TextEngines;
pub use http::{record, HttpMetrics, UNMATCHED};
pub use imagine::{ImageMetrics, QueueDepth};
pub use markdown::{conversion_outcome, Conversions};
pub use models::ModelStates;

/// The request series of every service, shared by the middleware that counts and the
/// `/metrics` route that shows them. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    http: Arc<[HttpMetrics; 4]>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            http: Arc::new(std::array::from_fn(|_| HttpMetrics::default())),
        }
    }
}

impl Metrics {
    /// The request series of `service`'s listener.
    pub fn http(&self, service: Service) -> &HttpMetrics {
        let i = Service::ALL
            .iter()
            .position(|s| *s == service)
            .expect("every service is in Service::ALL");
        &self.http[i]
    }
}

/// What a service adds to its listener's `/metrics` beside the request series and the money.
pub trait Export {
    fn export(self, registry: &mut Registry);
}

/// Nothing more.
impl Export for () {
    fn export(self, _: &mut Registry) {}
}

/// Both.
impl<A: Export, B: Export> Export for (A, B) {
    fn export(self, registry: &mut Registry) {
        self.0.export(registry);
        self.1.export(registry);
    }
}

/// `GET /metrics` for `service`'s listener: its request series, the money its service moved,
/// and what `export` adds.
pub fn route<S>(state: &AppState, service: Service, export: impl Export) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    let labels = [(Cow::Borrowed("service"), Cow::Borrowed(service.name()))];
    let mut registry = Registry::with_labels(labels.into_iter());
    state.metrics.http(service).register(&mut registry);
    money::register(&mut registry, &state.billing, &state.store, service);
    export.export(&mut registry);
    get(scrape).with_state(Arc::new(registry))
}

async fn scrape(State(registry): State<Arc<Registry>>) -> Response {
    let mut text = String::new();
    match prometheus_text::encode(&mut text, &registry) {
        Ok(()) => (
            [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding the metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the metrics failed",
            )
                .into_response()
        }
    }
}

/// Buckets for request and conversion times: 1 ms to about 65 s, doubling.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}
