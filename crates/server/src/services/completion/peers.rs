//! Several nodes on one shared store (`[store] url`): `POST /stream/shutdown` reaches the node
//! that runs the stream, whichever node it was sent to.
//!
//! Each node records where its completion service can be reached (`node/<node id>` in the
//! store's values: `[completion] internal_url`, else its bound address) when the service starts,
//! and removes it when the server shuts down. A node that does not run the stream asked for
//! asks the other recorded nodes, one after another, with [`FORWARDED_HEADER`] set so that a
//! forwarded request is never passed on again, and answers what the owner answered: the same
//! `200 {"streamId", "status": "terminated", "response"}` a client of the owner gets (or its
//! 500). No node has it: 404, as on one node. A recorded node that does not answer (it crashed)
//! counts as not having it. Nothing is written per stream: the cost is on the rare shutdown.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

use crate::service::Service;
use crate::state::AppState;

/// Set on a `/stream/shutdown` one node sends another.
pub const FORWARDED_HEADER: &str = "x-hearth-forwarded";
const KEY_PREFIX: &str = "node/";

fn key(state: &AppState) -> String {
    format!("{KEY_PREFIX}{}", state.store.node_id())
}

/// Records this node's completion URL for the others (shared stores only).
pub async fn announce(state: &AppState) {
    if !state.store.is_shared() {
        return;
    }
    let url = state
        .config
        .completion
        .internal_url
        .clone()
        .unwrap_or_else(|| state.urls.get(Service::Completion).to_string());
    if let Err(e) = state.store.put_value(&key(state), &url).await {
        tracing::warn!(error = %e, "cannot record this node for stream shutdowns from others");
    }
}

/// Removes this node's record (at shutdown).
pub async fn withdraw(state: &AppState) {
    if state.store.is_shared() {
        let _ = state.store.remove_value(&key(state)).await;
    }
}

/// Asks the other nodes to stop `stream_id`: the first answer other than 404, or `None` when
/// none runs it. `wait` is how long the owner may take to stop it.
pub async fn forward_shutdown(
    state: &AppState,
    stream_id: &str,
    wait: Duration,
) -> Option<(StatusCode, Value)> {
    let own = key(state);
    let nodes = match state.store.values(KEY_PREFIX).await {
        Ok(nodes) => nodes,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the other nodes");
            return None;
        }
    };
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(wait + Duration::from_secs(5))
        .build()
        .ok()?;
    for (node, url) in nodes.into_iter().filter(|(k, _)| *k != own) {
        let sent = client
            .post(format!("{url}/stream/shutdown"))
            .header(FORWARDED_HEADER, "1")
            .json(&json!({ "streamId": stream_id }))
            .send()
            .await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => {
                tracing::warn!(%node, %url, error = %e, "a recorded node did not answer");
                continue;
            }
        };
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            continue;
        }
        let body = resp.json().await.unwrap_or(Value::Null);
        tracing::info!(%node, %stream_id, %status, "stream shutdown forwarded");
        return Some((status, body));
    }
    None
}
