//! The admin API on the auth listener, used by `hearth users list`, `hearth balance ...` and
//! `hearth models ...` (`admin/models.rs`)
//! while the server runs on the embedded store (sled lets one process open the database; on
//! PostgreSQL the CLI uses the database directly). Every request carries the
//! admin key from `<data_dir>/admin.key` in its `adminKey` body field.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use hearth_store::{LedgerMeta, Store};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use utoipa::ToSchema;

use crate::error::{ApiError, AppJson};
use crate::openapi::ErrorBody;
use crate::state::AppState;
use hearth_billing::{money, MONEY_SCALE};

pub mod models;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/admin/users", post(users))
        .route("/admin/balance", post(balance))
        .route("/admin/credit", post(credit))
        .merge(models::router())
        .with_state(state)
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserRow {
    pub user_id: String,
    pub is_marketing: bool,
    /// Decimal string, 6 places.
    pub balance: String,
    /// ISO 8601 UTC.
    #[schema(format = DateTime)]
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsersResponse {
    pub users: Vec<UserRow>,
}

/// A user's spendable balance.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BalanceResponse {
    pub user_id: String,
    /// Decimal string, 6 places.
    pub balance: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreditResponse {
    pub user_id: String,
    /// Decimal string, 6 places.
    pub balance_before: String,
    /// Decimal string, 6 places.
    pub balance_after: String,
}

/// The admin key alone.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KeyOnly {
    /// The admin key (`<data_dir>/admin.key`): the credential of the admin routes.
    admin_key: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct BalanceRequest {
    /// The admin key (`<data_dir>/admin.key`).
    admin_key: String,
    user_id: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct CreditRequest {
    /// The admin key (`<data_dir>/admin.key`).
    admin_key: String,
    /// Created (with the initial balance) if unknown.
    user_id: String,
    /// Decimal string, non-zero, at most 6 places; negative only with `debit`.
    amount: String,
    /// The ledger row's reason (default `admin credit` / `admin debit`).
    note: Option<String>,
    /// Take the amount away instead (refused past the balance).
    #[serde(default)]
    debit: bool,
}

pub(super) fn check_key(state: &AppState, key: &str) -> Result<(), ApiError> {
    if state.admin_key.matches(key.trim()) {
        Ok(())
    } else {
        Err(ApiError::invalid_credentials("wrong admin key"))
    }
}

/// Every user with their balance (`hearth users list`).
#[utoipa::path(
    post,
    path = "/admin/users",
    tag = "admin",
    operation_id = "adminUsers",
    request_body = KeyOnly,
    responses(
        (status = 200, description = "The users.", body = UsersResponse),
        (status = 400, description = "`InvalidRequest`: the body is not `{adminKey}`.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
    )
)]
async fn users(
    State(state): State<AppState>,
    AppJson(req): AppJson<KeyOnly>,
) -> Result<Json<UsersResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    Ok(Json(list_users(&state.store).await?))
}

/// One user's balance (`hearth balance show`).
#[utoipa::path(
    post,
    path = "/admin/balance",
    tag = "admin",
    operation_id = "adminBalance",
    request_body = BalanceRequest,
    responses(
        (status = 200, description = "The balance.", body = BalanceResponse),
        (status = 400, description = "`InvalidRequest`: a missing field.", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
    )
)]
async fn balance(
    State(state): State<AppState>,
    AppJson(req): AppJson<BalanceRequest>,
) -> Result<Json<BalanceResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    Ok(Json(show_balance(&state.store, &req.user_id).await?))
}

/// Credits or debits a user (`hearth balance credit`).
#[utoipa::path(
    post,
    path = "/admin/credit",
    tag = "admin",
    operation_id = "adminCredit",
    request_body = CreditRequest,
    responses(
        (status = 200, description = "The balance before and after.", body = CreditResponse),
        (status = 400, description = "`InvalidRequest`: a missing field, or a bad `amount` (`details.field`).", body = ErrorBody),
        (status = 401, description = "`InvalidCredentials`: wrong admin key.", body = ErrorBody),
        (status = 402, description = "`InsufficientFunds`: a debit past the balance.", body = ErrorBody),
        (status = 500, description = "`InternalError`.", body = ErrorBody),
    )
)]
async fn credit(
    State(state): State<AppState>,
    AppJson(req): AppJson<CreditRequest>,
) -> Result<Json<CreditResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    let (resp, moved) = change_balance(
        &state.store,
        &req.user_id,
        &req.amount,
        req.note.as_deref(),
        req.debit,
    )
    .await?;
    state.billing.record_admin_change(moved);
    tracing::info!(user = %resp.user_id, before = %resp.balance_before, after = %resp.balance_after, "admin balance change");
    Ok(Json(resp))
}

/// Every user with their balance.
pub async fn list_users(store: &Store) -> Result<UsersResponse, ApiError> {
    let users = store
        .users()
        .await?
        .into_iter()
        .map(|(u, balance)| UserRow {
            user_id: u.user_id,
            is_marketing: u.is_marketing,
            balance: money(balance),
            created_at: u
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        })
        .collect();
    Ok(UsersResponse { users })
}

/// One user's spendable balance.
pub async fn show_balance(store: &Store, user_id: &str) -> Result<BalanceResponse, ApiError> {
    let balance = store.balance(user_id).await?;
    Ok(BalanceResponse {
        user_id: user_id.to_string(),
        balance: money(balance),
    })
}

/// Parses an admin amount: a decimal string, non-zero, at most 6 decimal places.
pub fn parse_amount(text: &str) -> Result<Decimal, ApiError> {
    let amount = Decimal::from_str(text.trim()).map_err(|_| {
        ApiError::invalid_request(
            "amount",
            format!("{text:?} is not a decimal number like 12.50"),
        )
    })?;
    if amount.is_zero() {
        return Err(ApiError::invalid_request("amount", "must not be zero"));
    }
    if amount.normalize().scale() > MONEY_SCALE {
        return Err(ApiError::invalid_request(
            "amount",
            format!("at most {MONEY_SCALE} decimal places"),
        ));
    }
    Ok(amount)
}

/// Credits (or, with `debit`, debits) a user; a user not seen before is created first (and gets
/// the initial balance). A negative amount is refused unless `debit` is set; with `debit` the
/// amount's absolute value is taken away, never below zero.
pub async fn apply_credit(
    store: &Store,
    user_id: &str,
    amount: &str,
    note: Option<&str>,
    debit: bool,
) -> Result<CreditResponse, ApiError> {
    let (response, _) = change_balance(store, user_id, amount, note, debit).await?;
    Ok(response)
}

/// [`apply_credit`], also saying how much the balance moved (negative for a debit).
async fn change_balance(
    store: &Store,
    user_id: &str,
    amount: &str,
    note: Option<&str>,
    debit: bool,
) -> Result<(CreditResponse, Decimal), ApiError> {
    let amount = parse_amount(amount)?;
    if amount < Decimal::ZERO && !debit {
        return Err(ApiError::invalid_request(
            "amount",
            "a negative amount is a debit: say --debit (\"debit\": true)",
        ));
    }
    if store.user(user_id).await?.is_none() {
        store.ensure_user(user_id, false).await?;
    }
    let reason = note.map(str::to_string).unwrap_or_else(|| {
        if debit {
            "admin debit".into()
        } else {
            "admin credit".into()
        }
    });
    let meta = LedgerMeta::reason(reason);
    let change = if debit {
        store.debit(user_id, amount.abs(), &meta).await?
    } else {
        store.credit(user_id, amount, &meta).await?
    };
    let response = CreditResponse {
        user_id: user_id.to_string(),
        balance_before: money(change.before),
        balance_after: money(change.after),
    };
    Ok((response, change.after - change.before))
}
