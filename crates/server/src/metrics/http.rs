//! Requests by route template, method and status, and their latency: a middleware every
//! listener runs (`app::with_common_layers`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The `route` of a request no route matched (the fallback's 404s, hostile paths): one series
/// for all of them, whatever the path.
pub const UNMATCHED: &str = "unmatched";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: Arc<str>,
    method: &'static str,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: Arc<str>,
    method: &'static str,
}

/// One listener's request series.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(super::seconds_histogram),
        }
    }
}

impl HttpMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "hearth_http_requests",
            "HTTP requests answered, by route template, method and status",
            self.requests.clone(),
        );
        registry.register_with_unit(
            "hearth_http_request_duration",
            "Time from a request's arrival to its response head (a stream's first byte), by route template and method",
            Unit::Seconds,
            self.duration.clone(),
        );
    }

    fn observe(&self, route: Arc<str>, method: &'static str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                route: Arc::clone(&route),
                method,
                status,
            })
            .inc();
        self.duration
            .get_or_create(&RouteLabels { route, method })
            .observe(took.as_secs_f64());
    }
}

/// The middleware: runs after routing (it is added with `Router::layer`), so a matched route's
/// template is in the request's extensions; anything else is [`UNMATCHED`].
pub async fn record(State(metrics): State<HttpMetrics>, request: Request, next: Next) -> Response {
    let route: Arc<str> = match request.extensions().get::<MatchedPath>() {
        Some(path) => path.as_str().into(),
        None => UNMATCHED.into(),
    };
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    metrics.observe(route, method, response.status().as_u16(), started.elapsed());
    response
}

/// The standard methods by name; any other (a client may send any token) is `other`.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(&str, Method); 9] = [
        ("GET", Method::GET),
        ("POST", Method::POST),
        ("PUT", Method::PUT),
        ("DELETE", Method::DELETE),
        ("HEAD", Method::HEAD),
        ("OPTIONS", Method::OPTIONS),
        ("PATCH", Method::PATCH),
        ("CONNECT", Method::CONNECT),
        ("TRACE", Method::TRACE),
    ];
    KNOWN
        .iter()
        .find(|(_, known)| known == method)
        .map_or("other", |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_standard_methods_are_named() {
        assert_eq!(method_label(&Method::POST), "POST");
        let odd = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(method_label(&odd), "other");
    }
}
