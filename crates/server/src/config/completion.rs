//! The completion service's configuration (`[completion]`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{addr, invalid, public_url, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompletionConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
    /// Where the other nodes of a shared store reach this node's completion service, to stop
    /// a stream it runs (default: http:// + the bound address).
    pub internal_url: Option<String>,
    /// Completions one user may run at once (default 4; 0 = no cap).
    pub max_concurrent_per_user: Option<usize>,
    /// Seconds a stream may wait on a client that reads nothing before it is aborted and
    /// settled (default 30).
    pub client_stall_timeout_secs: Option<u64>,
    /// Seconds a client refused for load (queue full, queue timeout, shutting down) is told to
    /// wait, in `Retry-After`: every engine's `SchedulerConfig::retry_after` (default: the
    /// scheduler's, 1).
    pub retry_after_secs: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct CompletionConfig {
    pub addr: SocketAddr,
    pub public_url: Option<String>,
    pub internal_url: Option<String>,
    pub max_concurrent_per_user: usize,
    pub client_stall_timeout: std::time::Duration,
    /// The engines' retry figure (`SchedulerConfig::retry_after`).
    pub retry_after: std::time::Duration,
}

impl RawCompletionConfig {
    pub(super) fn resolve(&self) -> Result<CompletionConfig, ConfigError> {
        Ok(CompletionConfig {
            addr: addr("completion.addr", &self.addr, "127.0.0.1:8082")?,
            public_url: public_url("completion.public_url", &self.public_url)?,
            internal_url: public_url("completion.internal_url", &self.internal_url)?,
            max_concurrent_per_user: self.max_concurrent_per_user.unwrap_or(4),
            client_stall_timeout: match self.client_stall_timeout_secs.unwrap_or(30) {
                0 => {
                    return Err(invalid(
                        "completion.client_stall_timeout_secs",
                        "must be at least 1",
                    ))
                }
                n => std::time::Duration::from_secs(n),
            },
            retry_after: match self.retry_after_secs {
                None => hearth_scheduler::SchedulerConfig::default().retry_after,
                Some(0) => {
                    return Err(invalid("completion.retry_after_secs", "must be at least 1"))
                }
                Some(n) => std::time::Duration::from_secs(n),
            },
        })
    }
}
