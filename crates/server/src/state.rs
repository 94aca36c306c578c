//! The state every handler can reach ([`AppState`]) and what it hands out: a verified token
//! ([`Session`]), the services' public URLs ([`ServiceUrls`]), the admin key. A leaf: it imports
//! no service and not the start-up (`app.rs`), which builds it.

use axum::extract::FromRef;
use chrono::{DateTime, Utc};
use hearth_auth::{IdentityProvider, ServiceTokens};
use hearth_billing::Meter;
use hearth_store::Store;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::model_table::RawModelTable;
use crate::service::Service;

/// Everything a handler may need. Cheap to clone; handlers take parts with `State<T>` via
/// `FromRef`. There is no global state: two `start`ed servers coexist in one process.
#[derive(Clone, FromRef)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Store,
    pub tokens: Arc<ServiceTokens>,
    pub idp: Arc<IdentityProvider>,
    pub admin_key: AdminKey,
    pub urls: Arc<ServiceUrls>,
    /// Each listener gets a copy that counts the money it moves under its service's name.
    pub billing: Meter,
    /// Request series of every listener (the rest of `/metrics` is read at scrape time).
    pub metrics: Metrics,
    /// `models.toml`, read once at start when a service that serves models runs (each resolves
    /// its own rows from it); empty otherwise.
    pub model_table: Arc<RawModelTable>,
    /// Every served model's registry, the memory budget and the admin surface of models.
    pub hub: crate::models::Hub,
    /// Cancelled when the server shuts down; long-lived tasks watch it.
    pub shutdown: CancellationToken,
}

/// The admin API key (hex), compared in constant time.
#[derive(Clone)]
pub struct AdminKey(pub Arc<str>);

impl AdminKey {
    pub fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// Public base URL of each service (configured, or `http://` + the bound address), used for
/// health `ui` fields and links between pages.
#[derive(Debug, Clone)]
pub struct ServiceUrls(pub(crate) HashMap<Service, String>);

impl ServiceUrls {
    pub fn get(&self, service: Service) -> &str {
        self.0.get(&service).map(String::as_str).unwrap_or_default()
    }
    /// The URL of a service's `/ui` page.
    pub fn ui(&self, service: Service) -> String {
        format!("{}/ui", self.get(service))
    }
}

/// A verified service token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user_id: String,
    pub is_marketing: bool,
    pub jti: String,
    pub expires_at: DateTime<Utc>,
}

impl AppState {
    /// Checks a `serviceToken` from a request body: signature, issuer, audience, expiry
    /// (`SessionExpired`) and revocation (`InvalidCredentials`), in-process against the same key
    /// and store the auth service uses.
    pub async fn authenticate(&self, token: &str) -> Result<Session, ApiError> {
        let token = crate::validate::service_token(token)?;
        let claims = self.tokens.verify(token)?;
        if self
            .store
            .is_token_revoked(&claims.jti)
            .await
            .map_err(ApiError::from)?
        {
            return Err(ApiError::invalid_credentials(
                "the service token has been revoked",
            ));
        }
        Ok(Session {
            expires_at: claims.expires_at(),
            user_id: claims.sub,
            is_marketing: claims.mkt,
            jti: claims.jti,
        })
    }
}
