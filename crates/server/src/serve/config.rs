//! The `[server]` section: how every listener treats its connections. Referenced from
//! `config.rs` (raw and resolved), kept here so that the connection settings live beside the
//! code that applies them.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::config::ConfigError;

/// `[server]` as written; see docs/decisions.md "Connections" for each key.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServerConfig {
    /// Seconds a connection may take to send a request's headers, counted from the moment it
    /// waits for one: a new connection, or a kept-alive one after its last response. So it is
    /// also the idle keep-alive timeout (default 10).
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds the next piece of a request body may take to arrive (default 30).
    pub body_read_timeout_secs: Option<u64>,
    /// Past the first `body_read_timeout_secs`, the slowest average a body may arrive at
    /// (default 4096; 0 turns the rate check off).
    pub body_min_bytes_per_sec: Option<u64>,
    /// Open connections per listener; past it, accepting waits (default 1024).
    pub max_connections: Option<usize>,
    /// Seconds a shutdown waits for requests in flight before dropping them (default 15).
    pub shutdown_timeout_secs: Option<u64>,
}

/// The connection settings every listener runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub body_min_bytes_per_sec: u64,
    pub max_connections: usize,
    pub shutdown_timeout: Duration,
}

impl RawServerConfig {
    pub fn resolve(&self) -> Result<ServerConfig, ConfigError> {
        let at_least_one = |key: &str, value: u64| {
            if value == 0 {
                Err(ConfigError::Invalid {
                    key: format!("server.{key}"),
                    message: "must be at least 1".into(),
                })
            } else {
                Ok(value)
            }
        };
        let header = self.header_read_timeout_secs.unwrap_or(10);
        let body = self.body_read_timeout_secs.unwrap_or(30);
        let max_connections = self.max_connections.unwrap_or(1024);
        Ok(ServerConfig {
            header_read_timeout: Duration::from_secs(at_least_one(
                "header_read_timeout_secs",
                header,
            )?),
            body_read_timeout: Duration::from_secs(at_least_one("body_read_timeout_secs", body)?),
            body_min_bytes_per_sec: self.body_min_bytes_per_sec.unwrap_or(4096),
            max_connections: at_least_one("max_connections", max_connections as u64)? as usize,
            shutdown_timeout: Duration::from_secs(self.shutdown_timeout_secs.unwrap_or(15)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = RawServerConfig::default().resolve().unwrap();
        assert_eq!(c.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.body_read_timeout, Duration::from_secs(30));
        assert_eq!(c.body_min_bytes_per_sec, 4096);
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.shutdown_timeout, Duration::from_secs(15));
    }

    #[test]
    fn zero_timeouts_and_caps_are_refused_naming_the_key() {
        let raw = RawServerConfig {
            max_connections: Some(0),
            ..Default::default()
        };
        let err = raw.resolve().unwrap_err().to_string();
        assert!(err.starts_with("server.max_connections"), "{err}");
        let raw = RawServerConfig {
            header_read_timeout_secs: Some(0),
            ..Default::default()
        };
        let err = raw.resolve().unwrap_err().to_string();
        assert!(err.starts_with("server.header_read_timeout_secs"), "{err}");
    }
}
