//! How a command reaches the store: the database itself when it can (always on PostgreSQL; on
//! the embedded store while no server holds it), else the running server's admin API, found
//! through the address it recorded in the data dir (`server.json`).

use serde::de::DeserializeOwned;
use serde_json::json;
use std::path::Path;

use super::CliError;
use crate::app::{self, paths};
use crate::config::Config;
use crate::error::ApiError;

/// Whether process `pid` exists (on Linux; elsewhere assumed).
fn process_alive(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new(&format!("/proc/{pid}")).exists()
}

/// Opens the store itself: always possible on PostgreSQL; on the embedded store only while no
/// server holds it.
pub(super) async fn open_store_directly(config: &Config) -> Result<hearth_store::Store, CliError> {
    match app::open_store(config).await {
        Ok(store) => Ok(store),
        Err(hearth_store::Error::Locked { path }) => Err(CliError::Usage(format!(
            "a running server holds the embedded store at {}: stop it first (or use [store] url)",
            path.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Runs an admin operation on the store directly when no server holds it (always, on
/// PostgreSQL, which every node shares), or through the running server's admin API (auth
/// listener, key from the data dir) when one holds the embedded store.
pub(super) async fn admin_call<T, F, Fut>(
    config: &Config,
    endpoint: &str,
    body: serde_json::Value,
    direct: F,
) -> Result<T, CliError>
where
    T: DeserializeOwned,
    F: FnOnce(hearth_store::Store) -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    match app::open_store(config).await {
        Ok(store) => return direct(store).await.map_err(CliError::Api),
        Err(hearth_store::Error::Locked { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    server_call(config, endpoint, body).await
}

/// Calls the running server's admin API (auth listener, key from the data dir): what only a
/// running server has (its models), or the store a server holds.
pub(super) async fn server_call<T: DeserializeOwned>(
    config: &Config,
    endpoint: &str,
    mut body: serde_json::Value,
) -> Result<T, CliError> {
    let key_path = paths::admin_key(&config.data_dir);
    let key = std::fs::read_to_string(&key_path).map_err(|e| {
        CliError::Usage(format!(
            "cannot read the admin key {} (is this the server's data dir?): {e}",
            key_path.display()
        ))
    })?;
    body["adminKey"] = json!(key.trim());
    // The address the server recorded in the data dir, else the configured one.
    let base = app::read_server_file(&paths::server(&config.data_dir))
        .filter(|s| process_alive(s.pid))
        .map(|s| s.auth_url)
        .or_else(|| config.auth.public_url.clone())
        .unwrap_or_else(|| format!("http://{}", config.auth.addr));
    let url = format!("{base}/admin/{endpoint}");
    let resp = reqwest::Client::new()
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|source| CliError::AdminUnreachable {
            url: url.clone(),
            source,
        })?;
    let status = resp.status();
    let value: serde_json::Value =
        resp.json()
            .await
            .map_err(|source| CliError::AdminUnreachable {
                url: url.clone(),
                source,
            })?;
    if !status.is_success() {
        let message = value["error"]["message"]
            .as_str()
            .unwrap_or("request failed")
            .to_string();
        return Err(CliError::Usage(format!(
            "server refused: {message} (HTTP {status})"
        )));
    }
    serde_json::from_value(value)
        .map_err(|e| CliError::Usage(format!("unexpected answer from {url}: {e}")))
}
