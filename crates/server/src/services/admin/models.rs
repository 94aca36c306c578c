//! The models' admin routes (`hearth models ...`): list every served model with its state, load
//! one, unload one (at once when idle, else when its running requests end), and reload the
//! model table (what `SIGHUP` does). They reach the models through the server's one
//! [`crate::models::Hub`].

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{check_key, KeyOnly};
use crate::error::{ApiError, AppJson};
use crate::models::{Changes, ModelError, ModelRow};
use crate::openapi::ErrorBody;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/models", post(list))
        .route("/admin/models/load", post(load))
        .route("/admin/models/unload", post(unload))
        .route("/admin/models/pull", post(pull))
        .route("/admin/models/reload", post(reload))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ModelRequest {
    /// The admin key (`<data_dir>/admin.key`).
    admin_key: String,
    /// A model id of `models.toml`.
    id: String,
}

/// Every served model.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModelsResponse {
    pub models: Vec<ModelRow>,
}

/// One model after a load or unload.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModelResponse {
    pub model: ModelRow,
}

/// What a reload changed, and every model after it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReloadResponse {
    pub changes: Changes,
    pub models: Vec<ModelRow>,
}

fn rows(state: &AppState) -> Vec<ModelRow> {
    state.hub.rows()
}

fn row(state: &AppState, id: &str) -> Result<ModelRow, ApiError> {
    rows(state)
        .into_iter()
        .find(|r| r.id == id)
        .ok_or_else(|| unknown(id))
}

fn unknown(id: &str) -> ApiError {
    ApiError::not_found(format!("no model {id:?} in the model table"))
}

/// The admin answer of a registry's refusal.
fn refused(e: ModelError) -> ApiError {
    match e {
        ModelError::Unknown(id) => unknown(&id),
        e => e.into(),
    }
}

/// Every model of the table with its state, memory, device and last use (`hearth models list`).
#[utoipa::path(
    post,
    path = "/admin/models",
    tag = "admin",
    operation_id = "adminModels",
    request_body = KeyOnly,
    responses(
        (status = 200, description = "Every model.", body = ModelsResponse),
        (status = 400, description = "`InvalidRequest`: the body is not `{adminKey}`.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    AppJson(req): AppJson<KeyOnly>,
) -> Result<Json<ModelsResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    Ok(Json(ModelsResponse {
        models: rows(&state),
    }))
}

/// Loads a model and answers once it is ready (`hearth models load ID`), making room within the
/// memory budget by unloading idle models, least recently used first.
#[utoipa::path(
    post,
    path = "/admin/models/load",
    tag = "admin",
    operation_id = "adminModelsLoad",
    request_body = ModelRequest,
    responses(
        (status = 200, description = "Loaded.", body = ModelResponse),
        (status = 400, description = "`InvalidRequest`: a missing field.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
        (status = 404, description = "`NotFound`: no such model id.", body = ErrorBody),
        (status = 502, description = "`GatewayError`: the model failed to load (the message says why).", body = ErrorBody),
        (status = 503, description = "`Overloaded`: no room in the memory budget (the message names what holds it), or still loading after `[loading] load_wait_secs` (`Retry-After`).", body = ErrorBody),
    )
)]
pub(crate) async fn load(
    State(state): State<AppState>,
    AppJson(req): AppJson<ModelRequest>,
) -> Result<Json<ModelResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    state.hub.load(&req.id).await.map_err(refused)?;
    tracing::info!(model = %req.id, "admin: model loaded");
    Ok(Json(ModelResponse {
        model: row(&state, &req.id)?,
    }))
}

/// Downloads a model's weights from its hub (`hearth models pull ID`) without loading them,
/// resuming a download cut short and checking every file's checksum; answers when done. Its
/// progress shows in `/admin/models` (`pull`) meanwhile.
#[utoipa::path(
    post,
    path = "/admin/models/pull",
    tag = "admin",
    operation_id = "adminModelsPull",
    request_body = ModelRequest,
    responses(
        (status = 200, description = "Downloaded (or already in the cache).", body = ModelResponse),
        (status = 400, description = "`InvalidRequest`: a missing field, or a model with local weights (`details.field` is `id`).", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
        (status = 404, description = "`NotFound`: no such model id.", body = ErrorBody),
        (status = 502, description = "`GatewayError`: the download failed (unreachable hub, a cut connection, a checksum that does not match: the message says which; a bad file is removed).", body = ErrorBody),
    )
)]
pub(crate) async fn pull(
    State(state): State<AppState>,
    AppJson(req): AppJson<ModelRequest>,
) -> Result<Json<ModelResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    state.hub.pull(&req.id).await.map_err(refused)?;
    tracing::info!(model = %req.id, "admin: model pulled");
    Ok(Json(ModelResponse {
        model: row(&state, &req.id)?,
    }))
}

/// Unloads a model (`hearth models unload ID`): at once when nothing runs on it, otherwise when
/// its running requests end (`unloadWhenIdle` in the answer); a request arriving before then
/// keeps it. Pinned models are refused.
#[utoipa::path(
    post,
    path = "/admin/models/unload",
    tag = "admin",
    operation_id = "adminModelsUnload",
    request_body = ModelRequest,
    responses(
        (status = 200, description = "Unloading, unloaded, or marked to unload when idle.", body = ModelResponse),
        (status = 400, description = "`InvalidRequest`: a missing field, or a pinned model (`details.field` is `id`).", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
        (status = 404, description = "`NotFound`: no such model id.", body = ErrorBody),
    )
)]
pub(crate) async fn unload(
    State(state): State<AppState>,
    AppJson(req): AppJson<ModelRequest>,
) -> Result<Json<ModelResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    state.hub.unload(&req.id).map_err(refused)?;
    tracing::info!(model = %req.id, "admin: model unload asked");
    Ok(Json(ModelResponse {
        model: row(&state, &req.id)?,
    }))
}

/// Reads `models.toml` again (`hearth models reload`, also `SIGHUP`): added models become
/// available, removed ones unload once idle, changed ones load beside the running version and
/// take over when ready. A table with any error changes nothing and answers it.
#[utoipa::path(
    post,
    path = "/admin/models/reload",
    tag = "admin",
    operation_id = "adminModelsReload",
    request_body = KeyOnly,
    responses(
        (status = 200, description = "Applied.", body = ReloadResponse),
        (status = 400, description = "`InvalidRequest`: the table has an error (`details.field` is `models.toml`); every running model stays as it was.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
    )
)]
pub(crate) async fn reload(
    State(state): State<AppState>,
    AppJson(req): AppJson<KeyOnly>,
) -> Result<Json<ReloadResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    let changes = state
        .hub
        .reload()
        .await
        .map_err(|e| ApiError::invalid_request("models.toml", e))?;
    Ok(Json(ReloadResponse {
        changes,
        models: rows(&state),
    }))
}
