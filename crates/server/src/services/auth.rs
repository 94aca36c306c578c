//! The authentication service (spec 4.1): `POST /token`, `/validate`, `/logout`, health at
//! `GET /` and the sign-in page at `GET /ui`; beside the spec, `POST /balance` for the pages'
//! header.

pub mod openapi;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, Method};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{Duration, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::instrument;
use utoipa::ToSchema;

use crate::config::origin_of;
use crate::error::{json_fallbacks, ApiError, AppJson};
use crate::openapi::ErrorBody;
use crate::pages;
use crate::service::Service;
use crate::services::admin::{show_balance, BalanceResponse};
use crate::state::AppState;

pub fn router(state: AppState) -> Router {
    json_fallbacks(
        Router::new()
            .route("/", get(health))
            .route("/token", post(token))
            .route("/validate", post(validate))
            .route("/logout", post(logout))
            // A service rather than a method router: json_fallbacks would swap a layered method
            // router's default fallback for an unlayered one, and the preflight would get 405.
            .route_service(
                "/balance",
                post(balance)
                    .layer(own_origins_cors(&state))
                    .with_state::<()>(state.clone()),
            )
            .route("/ui", get(ui))
            .route("/metrics", crate::metrics::route(&state, Service::Auth, ()))
            .route(
                "/openapi.json",
                crate::openapi::route(openapi::document(), state.urls.get(Service::Auth)),
            ),
    )
    .with_state(state)
}

/// CORS for Hearth's own services' origins: their pages' headers ask for the balance here.
fn own_origins_cors(state: &AppState) -> CorsLayer {
    let origins: Vec<HeaderValue> = Service::ALL
        .into_iter()
        .filter_map(|s| origin_of(state.urls.get(s)))
        .filter_map(|o| HeaderValue::from_str(&o).ok())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::POST])
        .allow_headers([header::CONTENT_TYPE])
        .max_age(std::time::Duration::from_secs(3600))
}

/// Health object (spec 2.1), shared by the services that use it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `healthy`, or `unhealthy` (503) when the store or the signing key fails its check.
    pub status: &'static str,
    /// The environment's name (`env` in the configuration).
    pub env: String,
    /// The sign-in page's URL.
    pub ui: String,
}

/// Health (spec 4.1): the store's round trip and the signing key.
#[utoipa::path(
    get,
    path = "/",
    tag = "health",
    responses(
        (status = 200, description = "Healthy.", body = Health),
        (status = 503, description = "Unhealthy: `status` is `unhealthy`.", body = Health),
    )
)]
#[instrument(skip_all)]
async fn health(State(state): State<AppState>) -> Response {
    let problem = match (state.store.health_check().await, state.tokens.self_check()) {
        (Ok(()), Ok(())) => None,
        (Err(e), _) => Some(format!("store: {e}")),
        (_, Err(e)) => Some(format!("signing key: {e}")),
    };
    let ui = state.urls.ui(Service::Auth);
    let env = state.config.env.clone();
    if let Some(why) = &problem {
        tracing::error!(problem = %why, "auth service unhealthy");
    }
    let (status, code) = Service::Auth.health(problem.is_none());
    (code, Json(Health { status, env, ui })).into_response()
}

/// Token request (spec 2.3).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct TokenRequest {
    /// Must be the identity token's subject.
    user_id: String,
    /// A token of the identity provider (`hearth idp mint USER` for the built-in one).
    idp_token: String,
    /// The service token's lifetime in seconds, within `[auth] token_lifetime_min_secs` and
    /// `token_lifetime_max_secs` (default 3600).
    lifetime_seconds: Option<i64>,
}

/// Token response (spec 2.3).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct TokenResponse {
    /// The service token (a JWT) the other services take.
    service_token: String,
}

/// Exchanges an identity-provider token for a service token (spec 4.1, 5.1). A user seen for
/// the first time is created with the initial balance.
#[utoipa::path(
    post,
    path = "/token",
    tag = "auth",
    request_body = TokenRequest,
    responses(
        (status = 200, description = "The service token.", body = TokenResponse),
        (status = 400, description = "`InvalidRequest`: a missing or empty field, `lifetimeSeconds` out of bounds (`details.min`, `details.max`).", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: the identity token is invalid, expired or logged out, or is not `userId`'s.", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
    )
)]
#[instrument(skip_all, fields(user = %req.user_id))]
async fn token(
    State(state): State<AppState>,
    AppJson(req): AppJson<TokenRequest>,
) -> Result<Json<TokenResponse>, ApiError> {
    let auth = &state.config.auth;
    let lifetime = req
        .lifetime_seconds
        .unwrap_or(auth.token_lifetime_default_secs);
    if !(auth.token_lifetime_min_secs..=auth.token_lifetime_max_secs).contains(&lifetime) {
        return Err(ApiError::invalid_request(
            "lifetimeSeconds",
            format!(
                "must lie within {} to {} seconds",
                auth.token_lifetime_min_secs, auth.token_lifetime_max_secs
            ),
        )
        .with_details(
            json!({ "min": auth.token_lifetime_min_secs, "max": auth.token_lifetime_max_secs }),
        ));
    }
    if req.user_id.trim().is_empty() {
        return Err(ApiError::invalid_request("userId", "must not be empty"));
    }
    if req.idp_token.trim().is_empty() {
        return Err(ApiError::invalid_request("idpToken", "must not be empty"));
    }
    let identity = state
        .idp
        .verify(req.idp_token.trim())
        .await
        .map_err(|e| match e {
            // An expired identity token is a failed sign-in, not an expired service session.
            hearth_auth::Error::Expired => {
                ApiError::invalid_credentials("the identity token has expired")
            }
            other => ApiError::from(other),
        })?;
    if identity.subject != req.user_id {
        return Err(ApiError::invalid_credentials(
            "userId does not match the identity token's subject",
        ));
    }
    let (store, user_id, token_id) = (&state.store, &req.user_id, &identity.token_id);
    if store.is_idp_token_revoked(token_id).await? {
        return Err(ApiError::invalid_credentials(
            "the identity token was logged out",
        ));
    }
    store.ensure_user(user_id, identity.is_marketing).await?;
    let issued = state
        .tokens
        .issue(user_id, identity.is_marketing, Duration::seconds(lifetime))
        .map_err(ApiError::internal)?;
    store
        .record_idp_session(token_id, &issued.jti, issued.expires_at)
        .await?;
    tracing::info!(lifetime, "service token issued");
    Ok(Json(TokenResponse {
        service_token: issued.token,
    }))
}

/// Validate request (spec 2.3); also `POST /balance`'s.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ValidateRequest {
    /// The service token: the credential of this route.
    service_token: String,
}

/// Validate response (spec 2.3).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ValidateResponse {
    /// Always `true`: an invalid token is an error.
    valid: bool,
    user_id: String,
    /// Whether the identity provider marked the user as a marketing account.
    is_marketing: bool,
    /// ISO 8601 UTC, whole seconds.
    #[schema(format = DateTime)]
    expires_at: String,
}

/// Whether a service token is valid, whose it is and when it expires (spec 4.1, 5.2).
#[utoipa::path(
    post,
    path = "/validate",
    tag = "auth",
    request_body = ValidateRequest,
    responses(
        (status = 200, description = "The token is valid.", body = ValidateResponse),
        (status = 400, description = "`InvalidRequest`: the body is not a validate request.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials` (bad or revoked token) or `SessionExpired`.", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
    )
)]
async fn validate(
    State(state): State<AppState>,
    AppJson(req): AppJson<ValidateRequest>,
) -> Result<Json<ValidateResponse>, ApiError> {
    let session = state.authenticate(&req.service_token).await?;
    Ok(Json(ValidateResponse {
        valid: true,
        user_id: session.user_id,
        is_marketing: session.is_marketing,
        expires_at: session
            .expires_at
            .to_rfc3339_opts(SecondsFormat::Secs, true),
    }))
}

/// `POST /balance` (not in the spec): the signed-in user's own balance, `{userId, balance}`
/// with 6 decimals, for the header of every page.
#[utoipa::path(
    post,
    path = "/balance",
    tag = "auth",
    request_body = ValidateRequest,
    responses(
        (status = 200, description = "The token's user and balance.", body = BalanceResponse),
        (status = 400, description = "`InvalidRequest`: the body is not `{serviceToken}`.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials` or `SessionExpired`.", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
    )
)]
async fn balance(
    State(state): State<AppState>,
    AppJson(req): AppJson<ValidateRequest>,
) -> Result<Json<BalanceResponse>, ApiError> {
    let session = state.authenticate(&req.service_token).await?;
    Ok(Json(show_balance(&state.store, &session.user_id).await?))
}

/// Logout request (spec 2.3).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct LogoutRequest {
    /// The service token to revoke (an expired one is accepted).
    service_token: String,
    /// The identity token whose sessions end too: every service token issued for it.
    idp_token: Option<String>,
}

/// Logout response (spec 2.3).
#[derive(Debug, Serialize, ToSchema)]
struct LogoutResponse {
    /// Always `success`.
    status: &'static str,
    message: String,
}

/// Revokes a service token and, with `idpToken`, the identity provider's sessions (spec 4.1,
/// 5.3).
#[utoipa::path(
    post,
    path = "/logout",
    tag = "auth",
    request_body = LogoutRequest,
    responses(
        (status = 200, description = "Revoked.", body = LogoutResponse),
        (status = 400, description = "`InvalidRequest`: the body is not a logout request.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: a token is invalid, or `idpToken` is another user's.", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
    )
)]
#[instrument(skip_all)]
async fn logout(
    State(state): State<AppState>,
    AppJson(req): AppJson<LogoutRequest>,
) -> Result<Json<LogoutResponse>, ApiError> {
    // Logging out an already-expired token is allowed (and harmless): the idp sessions may not be.
    let claims = state
        .tokens
        .verify_ignoring_expiry(req.service_token.trim())
        .map_err(ApiError::from)?;
    let identity = match req
        .idp_token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        None => None,
        Some(t) => {
            let id = state.idp.verify_for_logout(t).await.map_err(|e| match e {
                hearth_auth::Error::Invalid(why) => {
                    ApiError::invalid_credentials(format!("idpToken: {why}"))
                }
                other => ApiError::from(other),
            })?;
            if id.subject != claims.sub {
                return Err(ApiError::invalid_credentials(
                    "idpToken belongs to another user",
                ));
            }
            Some(id)
        }
    };
    let exp = claims.expires_at();
    if exp > Utc::now() {
        state.store.revoke_token(&claims.jti, exp).await?;
    }
    let revoked_sessions = match identity {
        Some(id) => Some(
            state
                .store
                .revoke_idp_sessions(&id.token_id, id.expires_at.max(exp))
                .await?,
        ),
        None => None,
    };
    let message = match revoked_sessions {
        None => "service token revoked".to_string(),
        Some(n) => format!(
            "service token revoked; identity-provider session ended ({n} service token(s) revoked)"
        ),
    };
    tracing::info!(user = %claims.sub, %message, "logout");
    Ok(Json(LogoutResponse {
        status: "success",
        message,
    }))
}

#[derive(Debug, Deserialize)]
struct UiQuery {
    callback: Option<String>,
}

/// Whether `/ui?callback=` may redirect to `url`: an http(s) URL whose origin is one of
/// Hearth's own services, `allowed_origins` or `[auth] callback_origins`.
pub fn callback_allowed(state: &AppState, url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("it is not an absolute URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "only http and https callbacks are allowed, not {}:",
            parsed.scheme()
        ));
    }
    let origin = origin_of(url).ok_or("it has no origin")?;
    let cfg = &state.config;
    let own = Service::ALL
        .into_iter()
        .filter_map(|s| origin_of(state.urls.get(s)));
    let listed = cfg
        .allowed_origins
        .iter()
        .chain(&cfg.auth.callback_origins)
        .filter_map(|o| origin_of(o));
    if own.chain(listed).any(|o| o == origin) {
        Ok(())
    } else {
        Err(format!("{origin} is not an allowed origin"))
    }
}

/// The sign-in page (spec 4.1).
#[utoipa::path(
    get,
    path = "/ui",
    tag = "pages",
    params(("callback" = Option<String>, Query, description = "Where to go once signed in, with the token: a URL of one of Hearth's services, `allowed_origins` or `[auth] callback_origins`; others are refused on the page.")),
    responses((status = 200, description = "The HTML page.", content_type = "text/html", body = String))
)]
async fn ui(State(state): State<AppState>, Query(q): Query<UiQuery>) -> Html<String> {
    let callback = q.callback.filter(|c| !c.is_empty());
    let (accepted, refused) = match callback {
        None => (None, None),
        Some(c) => match callback_allowed(&state, &c) {
            Ok(()) => (Some(c), None),
            Err(why) => {
                tracing::warn!(callback = %c, reason = %why, "refused sign-in callback");
                (None, Some((c, why)))
            }
        },
    };
    let auth = &state.config.auth;
    // Where a signed-in user goes next: the pages of the other services this server runs.
    let onward: Vec<_> = Service::ALL
        .into_iter()
        .filter(|s| state.config.services.contains(s))
        .filter_map(|s| Some((s, s.facts().onward_label?)))
        .map(|(s, name)| json!({ "service": s.name(), "name": name, "url": state.urls.ui(s) }))
        .collect();
    let page_config = json!({
        "callback": accepted,
        "onward": onward,
        "lifetimeDefault": auth.token_lifetime_default_secs,
        "lifetimeMin": auth.token_lifetime_min_secs,
        "lifetimeMax": auth.token_lifetime_max_secs,
        "identityProvider": state.idp.name(),
    });
    let body = pages::auth_body(
        accepted.as_deref(),
        refused.as_ref().map(|(c, w)| (c.as_str(), w.as_str())),
    );
    Html(pages::render(
        &state,
        pages::Page {
            title: "Account",
            service: Service::Auth,
            body: &body,
            config: page_config,
        },
    ))
}
