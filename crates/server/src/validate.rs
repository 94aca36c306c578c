//! The field rules the services share, written once: the service token, the ledger ids
//! (`developerId`, `applicationId`), the margin override, prompts and bounded integers, and the
//! one error a bad field gets ([`FieldError`]). Each service's `validate.rs` composes these with
//! its own fields (messages, sizes, steps), so the same field has the same rule and message
//! everywhere.
//!
//! Messages read `<field>: <what is wrong>`, and `details.field` names the field; a bad
//! `serviceToken` is `InvalidCredentials` (401), every other bad field `InvalidRequest` (400).

use hearth_billing::Margin;
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorKind};

/// The longest `developerId` / `applicationId`, in characters (they are recorded in the ledger).
pub const MAX_ID_CHARS: usize = 256;
/// The longest prompt text, in characters, where a service takes one string.
pub const MAX_PROMPT_CHARS: usize = 4000;

/// A bad field of a request: its name, a message naming it, and what the client needs to fix
/// it (`details`: the field and any bounds).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
    pub details: Value,
}

impl FieldError {
    /// `field: what`.
    pub fn new(field: impl Into<String>, what: impl std::fmt::Display) -> Self {
        let field = field.into();
        FieldError {
            message: format!("{field}: {what}"),
            details: json!({ "field": field }),
            field,
        }
    }

    /// Adds `key: value` to `details`.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if let Some(map) = self.details.as_object_mut() {
            map.insert(key.to_string(), value);
        }
        self
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::new(ErrorKind::InvalidRequest, e.message).with_details(e.details)
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The `serviceToken` field of a request body: a non-empty string, else `InvalidCredentials`.
pub fn service_token_field(value: &Option<Value>) -> Result<&str, ApiError> {
    match value {
        None | Some(Value::Null) => Err(ApiError::invalid_credentials("serviceToken: is required")),
        Some(Value::String(s)) => service_token(s),
        Some(_) => Err(ApiError::invalid_credentials(
            "serviceToken: must be a string",
        )),
    }
}

/// A service token, wherever it came from: not empty or blank, else `InvalidCredentials`.
pub fn service_token(token: &str) -> Result<&str, ApiError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(ApiError::invalid_credentials(
            "serviceToken: must not be empty",
        ));
    }
    Ok(token)
}

/// An optional ledger id (`developerId`, `applicationId`): a string of at most
/// [`MAX_ID_CHARS`] characters.
pub fn optional_id(field: &str, value: &Option<Value>) -> Result<Option<String>, FieldError> {
    optional_text(field, value, MAX_ID_CHARS)
}

/// The same rule for an id that arrived already typed as a string (the OpenAI routes).
pub fn id(field: &str, value: Option<&str>) -> Result<Option<String>, FieldError> {
    match value {
        None => Ok(None),
        Some(s) => within(field, s, MAX_ID_CHARS).map(|s| Some(s.to_string())),
    }
}

/// An optional string of at most `max` characters.
pub fn optional_text(
    field: &str,
    value: &Option<Value>,
    max: usize,
) -> Result<Option<String>, FieldError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => within(field, s, max).map(|s| Some(s.to_string())),
        Some(_) => Err(FieldError::new(field, "must be a string")),
    }
}

/// A required prompt: a string, not blank, of at most `max` characters.
pub fn prompt(field: &str, value: &Option<Value>, max: usize) -> Result<String, FieldError> {
    match optional_text(field, value, max)? {
        None => Err(FieldError::new(field, "is required")),
        Some(s) if s.trim().is_empty() => Err(FieldError::new(field, "must not be empty")),
        Some(s) => Ok(s),
    }
}

fn within<'s>(field: &str, s: &'s str, max: usize) -> Result<&'s str, FieldError> {
    if s.chars().count() > max {
        return Err(
            FieldError::new(field, format!("must be at most {max} characters"))
                .with("maxLength", json!(max)),
        );
    }
    Ok(s)
}

/// A JSON number.
pub fn number(field: &str, value: &Value) -> Result<f64, FieldError> {
    value
        .as_f64()
        .ok_or_else(|| FieldError::new(field, "must be a number"))
}

/// An optional integer from `min` to `max` (a float with no fraction counts: `12.0`).
pub fn integer(
    field: &str,
    value: &Option<Value>,
    min: u64,
    max: u64,
) -> Result<Option<u64>, FieldError> {
    let n = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n,
        Some(_) => return Err(FieldError::new(field, "must be a number")),
    };
    let int = n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    });
    match int {
        Some(i) if (min..=max).contains(&i) => Ok(Some(i)),
        _ => Err(FieldError::new(
            field,
            format!("must be an integer from {min} to {max}, got {n}"),
        )
        .with("min", json!(min))
        .with("max", json!(max))),
    }
}

/// `overrideGrossMarginPercent`: absent, or a number from 0 to 99.
pub fn margin(value: &Option<Value>) -> Result<Option<Margin>, FieldError> {
    const FIELD: &str = "overrideGrossMarginPercent";
    let Some(value) = value.as_ref().filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let percent = number(FIELD, value)?;
    Margin::from_f64(percent).map(Some).map_err(|e| {
        FieldError::new(FIELD, e)
            .with("min", json!(0))
            .with("max", json!(99))
    })
}

/// The service token of an OpenAI-style request, from `Authorization: Bearer <token>` (that
/// API's convention; the spec's routes carry it in the body).
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderMap, HeaderValue};

    #[test]
    fn a_bad_service_token_is_refused_as_credentials_with_one_message_per_fault() {
        let msg = |v: Option<Value>| {
            let e = service_token_field(&v).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidCredentials);
            e.message
        };
        assert_eq!(msg(None), "serviceToken: is required");
        assert_eq!(msg(Some(Value::Null)), "serviceToken: is required");
        assert_eq!(msg(Some(json!(5))), "serviceToken: must be a string");
        assert_eq!(msg(Some(json!(""))), "serviceToken: must not be empty");
        assert_eq!(msg(Some(json!("  "))), "serviceToken: must not be empty");
        assert_eq!(service_token_field(&Some(json!(" t "))).unwrap(), "t");
    }

    #[test]
    fn ledger_ids_are_strings_of_at_most_256_characters() {
        let long = "é".repeat(MAX_ID_CHARS);
        assert_eq!(
            optional_id("developerId", &Some(json!(long))).unwrap(),
            Some(long.clone())
        );
        let too_long = format!("{long}x");
        let e = optional_id("developerId", &Some(json!(too_long))).unwrap_err();
        assert_eq!(e.message, "developerId: must be at most 256 characters");
        assert_eq!(e.details["field"], "developerId");
        assert_eq!(id("developerId", Some(&too_long)).unwrap_err(), e);
        assert_eq!(optional_id("applicationId", &None).unwrap(), None);
        assert_eq!(
            optional_id("applicationId", &Some(json!(1)))
                .unwrap_err()
                .message,
            "applicationId: must be a string"
        );
    }

    #[test]
    fn the_margin_is_a_number_from_0_to_99() {
        assert_eq!(margin(&None).unwrap(), None);
        assert!(margin(&Some(json!(99))).unwrap().is_some());
        for bad in [json!(100), json!(-1), json!("5")] {
            let e = margin(&Some(bad)).unwrap_err();
            assert_eq!(e.field, "overrideGrossMarginPercent");
        }
        assert_eq!(margin(&Some(json!(120))).unwrap_err().details["max"], 99);
    }

    #[test]
    fn integers_take_whole_floats_and_refuse_the_rest_naming_the_bounds() {
        assert_eq!(integer("steps", &Some(json!(3.0)), 1, 8).unwrap(), Some(3));
        assert_eq!(integer("steps", &None, 1, 8).unwrap(), None);
        for bad in [json!(0), json!(9), json!(2.5), json!(-1)] {
            let e = integer("steps", &Some(bad), 1, 8).unwrap_err();
            assert_eq!(
                (e.details["min"].clone(), e.details["max"].clone()),
                (json!(1), json!(8))
            );
        }
        assert_eq!(
            integer("steps", &Some(json!("3")), 1, 8)
                .unwrap_err()
                .message,
            "steps: must be a number"
        );
    }

    #[test]
    fn a_prompt_is_required_not_blank_and_bounded() {
        let f = |v: Option<Value>| prompt("prompt", &v, 10).map_err(|e| e.message);
        assert_eq!(f(None).unwrap_err(), "prompt: is required");
        assert_eq!(
            f(Some(json!(" "))).unwrap_err(),
            "prompt: must not be empty"
        );
        assert_eq!(f(Some(json!(3))).unwrap_err(), "prompt: must be a string");
        assert_eq!(
            f(Some(json!("x".repeat(11)))).unwrap_err(),
            "prompt: must be at most 10 characters"
        );
        assert_eq!(f(Some(json!("a cat"))).unwrap(), "a cat");
    }

    #[test]
    fn the_key_is_read_from_a_bearer_header_only() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  abc "),
        );
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer_token(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_token(&h), None);
    }
}
