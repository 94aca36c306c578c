use super::*;
use axum::http::header;

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Req {
    user_id: String,
    lifetime_seconds: Option<u64>,
}

#[test]
fn a_missing_field_is_named() {
    let err = parse_json::<Req>(br#"{"lifetimeSeconds": 5}"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    assert_eq!(err.details["field"], "userId");
}

#[test]
fn a_wrong_type_names_its_field() {
    let err = parse_json::<Req>(br#"{"userId": "a", "lifetimeSeconds": "x"}"#).unwrap_err();
    assert_eq!(err.details["field"], "lifetimeSeconds");
    assert!(
        err.message.starts_with("lifetimeSeconds:"),
        "{}",
        err.message
    );
}

#[test]
fn malformed_json_is_an_invalid_request_about_the_body() {
    let err = parse_json::<Req>(br#"{"userId": "#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    assert!(err.message.contains("malformed JSON"), "{}", err.message);
    let err = parse_json::<Req>(br#"{"userId": "a"} trailing"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
}

#[test]
fn every_kind_has_its_status_and_413_keeps_a_spec_type() {
    assert_eq!(ErrorKind::SessionExpired.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        ErrorKind::InsufficientFunds.status(),
        StatusCode::PAYMENT_REQUIRED
    );
    assert_eq!(ErrorKind::PayloadTooLarge.type_name(), "InvalidRequest");
    let resp = ApiError::overloaded("busy").into_response();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    let resp = ApiError::rate_limited(crate::user_slots::SlotsFull { limit: 2 }).into_response();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
}
