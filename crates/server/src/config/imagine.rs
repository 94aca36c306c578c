//! The image service's configuration (`[imagine]`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{addr, public_url, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImagineConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
    /// Image requests one user may have queued or running at once (default 2; 0 = no cap).
    pub max_concurrent_per_user: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct ImagineConfig {
    pub addr: SocketAddr,
    pub public_url: Option<String>,
    pub max_concurrent_per_user: usize,
}

impl RawImagineConfig {
    pub(super) fn resolve(&self) -> Result<ImagineConfig, ConfigError> {
        Ok(ImagineConfig {
            addr: addr("imagine.addr", &self.addr, "127.0.0.1:8084")?,
            public_url: public_url("imagine.public_url", &self.public_url)?,
            max_concurrent_per_user: self.max_concurrent_per_user.unwrap_or(2),
        })
    }
}
