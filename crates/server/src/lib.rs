//! The `hearth` binary's library and the only crate that knows HTTP and JSON wire shapes: the
//! CLI ([`cli`]), layered configuration ([`config`]), the services and their table of facts
//! ([`service`]), the state handlers share ([`state`]), startup ([`app`]), the field rules the
//! services share ([`validate`]), the
//! accept loop that holds every connection to its limits ([`serve`]), the
//! error shape every JSON service answers with ([`error`]), one axum router per service ([`services`]), the web pages ([`pages`]), the Prometheus
//! export every listener serves at `/metrics` ([`metrics`]) and its OpenAPI 3.1 document at
//! `/openapi.json` ([`openapi`]).
//!
//! It deliberately holds no business logic of its own beyond request validation: tokens are
//! `hearth-auth`'s, prices and holds `hearth-billing`'s, money and revocations `hearth-store`'s,
//! models the inference crates'.

pub mod app;
pub mod cli;
pub mod config;
pub mod error;
pub mod metrics;
pub mod model_table;
pub mod models;
pub mod openapi;
pub mod pages;
pub mod serve;
pub mod service;
pub mod services;
pub mod state;
pub mod user_slots;
pub mod validate;

pub use app::{start, Running};
pub use config::{Config, RawConfig};
pub use error::{ApiError, AppJson, ErrorKind};
pub use service::Service;
pub use state::{AppState, Session};
