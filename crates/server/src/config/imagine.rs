//! The image service's configuration (`[imagine]`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{addr, invalid, public_url, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImagineConfig {
    pub addr: Option<String>,
    pub public_url: Option<String>,
    /// Image requests one user may have queued or running at once (default 2; 0 = no cap).
    pub max_concurrent_per_user: Option<usize>,
    /// The largest picture (an edit's image or mask) a request may carry, in bytes (default
    /// 10 MiB).
    pub max_upload_bytes: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct ImagineConfig {
    pub addr: SocketAddr,
    pub public_url: Option<String>,
    pub max_concurrent_per_user: usize,
    pub max_upload_bytes: usize,
}

impl RawImagineConfig {
    pub(super) fn resolve(&self) -> Result<ImagineConfig, ConfigError> {
        Ok(ImagineConfig {
            addr: addr("imagine.addr", &self.addr, "127.0.0.1:8084")?,
            public_url: public_url("imagine.public_url", &self.public_url)?,
            max_concurrent_per_user: self.max_concurrent_per_user.unwrap_or(2),
            max_upload_bytes: match self.max_upload_bytes.unwrap_or(10 << 20) {
                0 => return Err(invalid("imagine.max_upload_bytes", "must be above 0")),
                n => n,
            },
        })
    }
}
