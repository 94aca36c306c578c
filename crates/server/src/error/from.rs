//! The typed errors of the crates below the server, mapped to [`ApiError`] once.

use serde_json::json;

use super::ApiError;
use hearth_billing::money;

impl From<hearth_store::Error> for ApiError {
    fn from(e: hearth_store::Error) -> Self {
        use hearth_store::Error as E;
        match e {
            E::InsufficientFunds { needed, available } => {
                ApiError::insufficient_funds(money(needed), money(available))
            }
            E::UnknownUser(u) => ApiError::not_found(format!("unknown user {u:?}")),
            E::InvalidUserId(why) => ApiError::invalid_request("userId", why),
            E::NonPositiveAmount(a) => {
                ApiError::invalid_request("amount", format!("must be positive, got {a}"))
            }
            // Down, restarting or out of connections: refused at once, with the store's figure.
            e if e.is_unavailable() => {
                let after = e.retry_after().unwrap_or(hearth_store::RETRY_AFTER);
                ApiError::overloaded(format!("the store is unreachable: {e}"), after)
            }
            other => ApiError::internal(other),
        }
    }
}

/// A token failure: expiry is `SessionExpired`, everything else about the token is
/// `InvalidCredentials` (the reason goes in the message), key-set trouble is internal.
impl From<hearth_auth::Error> for ApiError {
    fn from(e: hearth_auth::Error) -> Self {
        use hearth_auth::Error as E;
        match e {
            E::Expired => ApiError::session_expired(),
            E::Invalid(why) => ApiError::invalid_credentials(format!("invalid token: {why}")),
            e @ (E::AlgorithmNotAllowed(_) | E::UnknownKey { .. }) => {
                ApiError::invalid_credentials(e.to_string())
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<hearth_billing::Error> for ApiError {
    fn from(e: hearth_billing::Error) -> Self {
        use hearth_billing::Error as E;
        match e {
            E::InsufficientFunds { needed, available } => {
                ApiError::insufficient_funds(money(needed), money(available))
            }
            // A signed-in user always has an account; without one the token outlived the data.
            E::UnknownUser(u) => {
                ApiError::invalid_credentials(format!("user {u:?} has no account; sign in again"))
                    .with_details(json!({ "userId": u }))
            }
            E::Store(e) => e.into(),
            // Margins are parsed at validation and prices at load: these are Hearth's faults.
            E::Margin(_) | E::Price(_) | E::Overflow | E::Task(_) => ApiError::internal(e),
        }
    }
}

impl From<crate::models::ModelError> for ApiError {
    fn from(e: crate::models::ModelError) -> Self {
        use crate::models::ModelError as E;
        match e {
            // Requests name validated ids: the registry lacks one only when a reload dropped it
            // between the validation and the engine.
            E::Unknown(id) => ApiError::invalid_request(
                "model",
                format!("no model {id:?}: the model table was just reloaded without it"),
            ),
            // Both pass: a load finishes, a busy model goes idle and makes room.
            E::StillLoading { .. } | E::NoRoom { .. } => {
                ApiError::overloaded(e.to_string(), crate::models::RETRY_LOAD_AFTER)
            }
            E::Unavailable { .. } => ApiError::gateway(e.to_string()),
            // Only the admin API unloads, and it answers this itself.
            E::Pinned(_) | E::Local(_) => ApiError::invalid_request("id", e),
        }
    }
}

impl From<hearth_scheduler::Error> for ApiError {
    fn from(e: hearth_scheduler::Error) -> Self {
        use hearth_scheduler::Error as E;
        // Every refusal for load says when to come back: the engine's figure, sent as it is.
        if let Some(after) = e.retry_after() {
            return ApiError::overloaded(e.to_string(), after);
        }
        match e {
            E::EngineUnavailable(why) => {
                ApiError::gateway(format!("the model's engine is unavailable: {why}"))
            }
            E::PromptTooLong { .. } | E::EmptyPrompt | E::InvalidToken { .. } => {
                ApiError::invalid_request("messages", e)
            }
            E::ExceedsKvBudget { .. } | E::ZeroMaxTokens => {
                ApiError::invalid_request("maxOutputTokens", e)
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<hearth_imagine::Error> for ApiError {
    fn from(e: hearth_imagine::Error) -> Self {
        use hearth_imagine::Error as E;
        match e {
            E::Overloaded {
                waiting,
                retry_after,
            } => ApiError::overloaded(
                format!("the image queue is full ({waiting} waiting); retry shortly"),
                retry_after,
            ),
            E::InvalidParams { field, message } => ApiError::invalid_request(field, message),
            other => ApiError::internal(other),
        }
    }
}
