//! The fields the services share have one rule and one message (`crates/server/src/validate.rs`):
//! the same faulty field sent to the completion service's `POST /` and the image service's
//! `POST /` gets the same status, type, field and message from both.

use hearth_server::Service;
use serde_json::{json, Value};

use crate::completion::spawn_completion;
use crate::imagine::ImagineApp;

/// A fault in one field: the field, its value (`null`: left out), then what the client must see:
/// status, type, `details.field` and message.
type Case = (
    &'static str,
    Value,
    u16,
    &'static str,
    Option<&'static str>,
    &'static str,
);

/// What a client sees of a refusal: status, type, `details.field` and message.
fn seen(status: u16, body: &Value) -> (u16, Value, Value, Value) {
    let e = &body["error"];
    (
        status,
        e["type"].clone(),
        e["details"]["field"].clone(),
        e["message"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_field_is_refused_alike_by_the_completion_and_image_services() {
    let text = spawn_completion().await;
    let text_token = text.user("fields", "10").await;
    let image = ImagineApp::start("10", "").await;
    let image_token = image.app.token("fields").await;

    let long_id = "x".repeat(257);
    let cases: [Case; 8] = [
        (
            "serviceToken",
            Value::Null,
            401,
            "InvalidCredentials",
            None,
            "serviceToken: is required",
        ),
        (
            "serviceToken",
            json!(""),
            401,
            "InvalidCredentials",
            None,
            "serviceToken: must not be empty",
        ),
        (
            "serviceToken",
            json!(7),
            401,
            "InvalidCredentials",
            None,
            "serviceToken: must be a string",
        ),
        (
            "developerId",
            json!(long_id),
            400,
            "InvalidRequest",
            Some("developerId"),
            "developerId: must be at most 256 characters",
        ),
        (
            "applicationId",
            json!(long_id),
            400,
            "InvalidRequest",
            Some("applicationId"),
            "applicationId: must be at most 256 characters",
        ),
        (
            "applicationId",
            json!(3),
            400,
            "InvalidRequest",
            Some("applicationId"),
            "applicationId: must be a string",
        ),
        (
            "overrideGrossMarginPercent",
            json!(100),
            400,
            "InvalidRequest",
            Some("overrideGrossMarginPercent"),
            "overrideGrossMarginPercent: must be between 0 and 99, got 100",
        ),
        (
            "overrideGrossMarginPercent",
            json!("5"),
            400,
            "InvalidRequest",
            Some("overrideGrossMarginPercent"),
            "overrideGrossMarginPercent: must be a number",
        ),
    ];
    for (key, value, status, kind, field, message) in cases {
        let set = |mut body: Value| {
            match &value {
                Value::Null => drop(body.as_object_mut().unwrap().remove(key)),
                v => body[key] = v.clone(),
            }
            body
        };
        let text_body = set(json!({
            "serviceToken": text_token, "model": "alpha-3.3", "maxOutputTokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        }));
        let (s, r) = text.post("/", text_body).await;
        let from_text = seen(s, &r);
        let image_body = set(json!({
            "serviceToken": image_token, "prompt": "a fox", "width": 256, "height": 256, "steps": 1,
        }));
        let (s, r) = image.app.post(Service::Imagine, "/", image_body).await;
        let from_image = seen(s.as_u16(), &r);
        let expected = (
            status,
            json!(kind),
            field.map_or(Value::Null, |f| json!(f)),
            json!(message),
        );
        assert_eq!(from_text, expected, "completion, {key} = {value}: {r}");
        assert_eq!(from_image, expected, "imagine, {key} = {value}");
    }
    // Nothing was held or charged by any refusal.
    assert_eq!(
        text.store().balance("fields").await.unwrap(),
        crate::completion::dec("10")
    );
}
