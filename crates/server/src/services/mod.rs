//! One axum router per service, and the one place that builds each: [`router`]. The facts
//! about each service (name, address, error shape, health, labels) are `crate::service`'s
//! table; adding a service is written there.

use axum::Router;

use crate::service::{Service, ServiceInitError};
use crate::state::AppState;

pub mod admin;
pub mod auth;
pub mod completion;
pub mod imagine;
pub mod markdown;

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
