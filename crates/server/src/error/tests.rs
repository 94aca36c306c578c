use super::*;
use axum::http::header;
use std::time::Duration;

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
    let resp = ApiError::overloaded("busy", Duration::from_millis(1500)).into_response();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "2", "rounded up");
    let full = crate::user_slots::SlotsFull {
        limit: 2,
        retry_after: Duration::from_secs(3),
    };
    let resp = ApiError::rate_limited(full).into_response();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
    let resp = ApiError::invalid_request("prompt", "no").into_response();
    assert!(!resp.headers().contains_key(header::RETRY_AFTER));
}

#[test]
fn every_scheduler_refusal_for_load_carries_the_schedulers_own_figure() {
    use hearth_scheduler::Error as E;
    let after = Duration::from_secs(7);
    let refusals = [
        E::Overloaded {
            waiting: 3,
            limit: 3,
            retry_after: after,
        },
        E::QueueTimeout {
            waited: Duration::from_secs(30),
            retry_after: after,
        },
        E::ShuttingDown { retry_after: after },
    ];
    for e in refusals {
        let err = ApiError::from(e);
        assert_eq!(err.kind, ErrorKind::Overloaded, "{err}");
        assert_eq!(err.details["retryAfterSeconds"], 7, "{err}");
        let resp = err.into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "7");
    }
    let err = ApiError::from(E::EmptyPrompt);
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    assert!(!err
        .into_response()
        .headers()
        .contains_key(header::RETRY_AFTER));
}
