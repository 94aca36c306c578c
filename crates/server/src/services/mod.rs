//! The four services and the one place that builds each one's router.
//!
//! Adding a service: write `services/<name>.rs` with `pub async fn router(state: AppState) ->
//! Result<Router, ServiceInitError>`, add its arm to [`router`] and its name to [`AVAILABLE`].

use axum::Router;
use std::fmt;
use std::str::FromStr;

use crate::app::AppState;

pub mod admin;
pub mod auth;
pub mod completion;
pub mod imagine;
pub mod markdown;
mod model_table;

/// A service Hearth can run; each gets its own listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    Auth,
    Completion,
    Markdown,
    Imagine,
}

/// Services this build can run (and runs by default), in start order.
pub const AVAILABLE: &[Service] = &[
    Service::Auth,
    Service::Completion,
    Service::Imagine,
    Service::Markdown,
];

impl Service {
    pub const ALL: [Service; 4] = [
        Service::Auth,
        Service::Completion,
        Service::Markdown,
        Service::Imagine,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Service::Auth => "auth",
            Service::Completion => "completion",
            Service::Markdown => "markdown",
            Service::Imagine => "imagine",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown service {0:?}: expected auth, completion, markdown or imagine")]
pub struct UnknownService(pub String);

impl FromStr for Service {
    type Err = UnknownService;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Service::ALL
            .into_iter()
            .find(|svc| svc.name() == s.trim())
            .ok_or_else(|| UnknownService(s.to_string()))
    }
}

/// A service failed to get ready (a model would not load, say).
#[derive(Debug, thiserror::Error)]
#[error("{service} service failed to start: {source}")]
pub struct ServiceInitError {
    pub service: Service,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl ServiceInitError {
    pub fn new(
        service: Service,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            service,
            source: source.into(),
        }
    }
}

/// Builds the router of one service. Shared layers (tracing, body limit, fallbacks) are added
/// by the caller, `app::start`.
pub async fn router(service: Service, state: AppState) -> Result<Router, ServiceInitError> {
    match service {
        Service::Auth => Ok(auth::router(state.clone()).merge(admin::router(state))),
        Service::Completion => completion::router(state).await,
        Service::Imagine => imagine::router(state).await,
        Service::Markdown => Ok(markdown::router(state).await),
    }
}

/// The service token of an OpenAI-style request, from `Authorization: Bearer <token>` (that
/// API's convention; the spec's routes carry it in the body).
pub(crate) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderMap, HeaderValue};

    #[test]
    fn the_key_is_read_from_a_bearer_header_only() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  abc "),
        );
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer_token(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_token(&h), None);
    }
}
