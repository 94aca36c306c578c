//! The admin API on the auth listener, used by `hearth users list` and `hearth balance ...`
//! while the server runs (sled lets one process open the database). Every request carries the
//! admin key from `<data_dir>/admin.key` in its `adminKey` body field.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use hearth_store::{LedgerMeta, Store};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

use crate::app::AppState;
use crate::error::{ApiError, AppJson};
use hearth_billing::{money, MONEY_SCALE};

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/admin/users", post(users))
        .route("/admin/balance", post(balance))
        .route("/admin/credit", post(credit))
        .with_state(state)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserRow {
    pub user_id: String,
    pub is_marketing: bool,
    pub balance: String,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsersResponse {
    pub users: Vec<UserRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BalanceResponse {
    pub user_id: String,
    pub balance: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreditResponse {
    pub user_id: String,
    pub balance_before: String,
    pub balance_after: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyOnly {
    admin_key: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BalanceRequest {
    admin_key: String,
    user_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreditRequest {
    admin_key: String,
    user_id: String,
    amount: String,
    note: Option<String>,
    #[serde(default)]
    debit: bool,
}

fn check_key(state: &AppState, key: &str) -> Result<(), ApiError> {
    if state.admin_key.matches(key.trim()) {
        Ok(())
    } else {
        Err(ApiError::invalid_credentials("wrong admin key"))
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
}

async fn users(
    State(state): State<AppState>,
    AppJson(req): AppJson<KeyOnly>,
) -> Result<Json<UsersResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    let store = state.store.clone();
    Ok(Json(blocking(move || list_users(&store)).await?))
}

async fn balance(
    State(state): State<AppState>,
    AppJson(req): AppJson<BalanceRequest>,
) -> Result<Json<BalanceResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    let store = state.store.clone();
    Ok(Json(
        blocking(move || show_balance(&store, &req.user_id)).await?,
    ))
}

async fn credit(
    State(state): State<AppState>,
    AppJson(req): AppJson<CreditRequest>,
) -> Result<Json<CreditResponse>, ApiError> {
    check_key(&state, &req.admin_key)?;
    let store = state.store.clone();
    let resp = blocking(move || {
        apply_credit(
            &store,
            &req.user_id,
            &req.amount,
            req.note.as_deref(),
            req.debit,
        )
    })
    .await?;
    tracing::info!(user = %resp.user_id, before = %resp.balance_before, after = %resp.balance_after, "admin balance change");
    Ok(Json(resp))
}

/// Every user with their balance.
pub fn list_users(store: &Store) -> Result<UsersResponse, ApiError> {
    let users = store
        .users()?
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
pub fn show_balance(store: &Store, user_id: &str) -> Result<BalanceResponse, ApiError> {
    let balance = store.balance(user_id)?;
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
pub fn apply_credit(
    store: &Store,
    user_id: &str,
    amount: &str,
    note: Option<&str>,
    debit: bool,
) -> Result<CreditResponse, ApiError> {
    let amount = parse_amount(amount)?;
    if amount < Decimal::ZERO && !debit {
        return Err(ApiError::invalid_request(
            "amount",
            "a negative amount is a debit: say --debit (\"debit\": true)",
        ));
    }
    if store.user(user_id)?.is_none() {
        store.ensure_user(user_id, false)?;
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
        store.debit(user_id, amount.abs(), &meta)?
    } else {
        store.credit(user_id, amount, &meta)?
    };
    Ok(CreditResponse {
        user_id: user_id.to_string(),
        balance_before: money(change.before),
        balance_after: money(change.after),
    })
}
