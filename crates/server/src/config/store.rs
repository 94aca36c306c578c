//! The store's configuration (`[store]`): where users, balances and revocations live.
//! No `url`: sled in `<data_dir>/db`, one process. A `postgres://` url: PostgreSQL, shared by
//! every node configured with it.

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStoreConfig {
    /// `postgres://user:password@host:port/database`; absent = sled in the data dir.
    pub url: Option<String>,
    /// This node's name on the holds it places (default: made once and kept in
    /// `<data_dir>/node-id`).
    pub node_id: Option<String>,
    /// PostgreSQL connections this node keeps open at most.
    pub max_connections: Option<u32>,
    /// How long a call waits for a PostgreSQL connection while no call gets one (the database
    /// is down or restarting) before it fails as unreachable (default 750 ms); a pool that is
    /// only busy is waited for. Past three such failures the store's circuit refuses at once.
    pub acquire_timeout_ms: Option<u64>,
}

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// sled in `<data_dir>/db`.
    Embedded,
    /// PostgreSQL at this url.
    Postgres(String),
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub choice: StoreChoice,
    pub node_id: Option<String>,
    pub max_connections: u32,
    pub acquire_timeout: std::time::Duration,
}

impl RawStoreConfig {
    pub(super) fn resolve(&self) -> Result<StoreConfig, ConfigError> {
        let choice = match self.url.as_deref().map(str::trim) {
            None | Some("") => StoreChoice::Embedded,
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                StoreChoice::Postgres(url.to_string())
            }
            Some(_) => {
                return Err(invalid(
                    "store.url",
                    "must be a postgres:// url (leave it out for the embedded store)",
                ))
            }
        };
        let node_id = match self.node_id.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(id) if id.len() <= 64 && id.chars().all(|c| c.is_ascii_graphic()) => {
                Some(id.to_string())
            }
            Some(_) => {
                return Err(invalid(
                    "store.node_id",
                    "at most 64 printable ASCII characters, no spaces",
                ))
            }
        };
        let max_connections = self.max_connections.unwrap_or(16);
        if max_connections == 0 {
            return Err(invalid("store.max_connections", "must be at least 1"));
        }
        let acquire_timeout = match self.acquire_timeout_ms {
            None => hearth_store::StoreOptions::default().acquire_timeout,
            Some(ms @ 1..=60_000) => std::time::Duration::from_millis(ms),
            Some(_) => {
                return Err(invalid(
                    "store.acquire_timeout_ms",
                    "must be between 1 and 60000",
                ))
            }
        };
        Ok(StoreConfig {
            choice,
            node_id,
            max_connections,
            acquire_timeout,
        })
    }
}
