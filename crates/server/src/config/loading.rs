//! When models load and leave (`[loading]`): the default keep-alive, how long a request waits for
//! a load, and the memory budgets (`crate::models::Hub` applies them).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};
use crate::models::{Budget, KeepAlive};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLoadingConfig {
    /// How long an idle model stays loaded when its row does not say (default -1: forever).
    pub keep_alive: Option<KeepAlive>,
    /// How long a request waits for its model to load before a 503 (default 120).
    pub load_wait_secs: Option<u64>,
    /// Host memory the loaded models may hold, in MiB (default: 90% of the machine's).
    pub ram_budget_mb: Option<u64>,
    /// Each GPU's memory the loaded models may hold, in MiB (default: 90% of the GPU's).
    pub gpu_budget_mb: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct LoadingConfig {
    pub keep_alive: KeepAlive,
    pub load_wait: Duration,
    pub budget: Budget,
    /// Where `hf = ...` models are pulled from and to.
    pub hub: HubVars,
}

/// `HF_ENDPOINT` and `HF_HOME` as the process's entry read them (`hearth serve`); none: the
/// hub's defaults (huggingface.co, `~/.cache/huggingface`).
#[derive(Debug, Clone, Default)]
pub struct HubVars {
    pub endpoint: Option<String>,
    pub home: Option<String>,
}

impl HubVars {
    /// The two variables as `var` gives them.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        HubVars {
            endpoint: var("HF_ENDPOINT"),
            home: var("HF_HOME"),
        }
    }

    /// A hub client for them (reads the token beside the cache).
    pub fn client(&self) -> hearth_infer::hub::HubClient {
        hearth_infer::hub::HubClient::from_vars(|k| match k {
            "HF_ENDPOINT" => self.endpoint.clone(),
            "HF_HOME" => self.home.clone(),
            _ => None,
        })
    }
}

impl RawLoadingConfig {
    pub(super) fn resolve(&self) -> Result<LoadingConfig, ConfigError> {
        let positive = |key: &str, v: Option<u64>| match v {
            Some(0) => Err(invalid(key, "must be above 0")),
            v => Ok(v),
        };
        Ok(LoadingConfig {
            keep_alive: self.keep_alive.unwrap_or_default(),
            load_wait: Duration::from_secs(
                positive("loading.load_wait_secs", self.load_wait_secs)?.unwrap_or(120),
            ),
            budget: Budget::from_config(
                positive("loading.ram_budget_mb", self.ram_budget_mb)?,
                positive("loading.gpu_budget_mb", self.gpu_budget_mb)?,
            ),
            hub: HubVars::default(),
        })
    }
}
