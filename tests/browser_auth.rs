//! The sign-in page in real headless Chromium: sign in, see the token, log out; follow an
//! allowed callback; see a foreign callback refused.

use crate::common::browser::Browser;
use crate::common::spawn_app;
use hearth_server::Service;
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn sign_in_shows_the_token_and_logout_revokes_it() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    browser
        .client
        .goto(&format!("{}/ui", app.url(Service::Auth)))
        .await
        .unwrap();
    browser.fill("#userId", "gia").await;
    browser.fill("#idpToken", &app.idp_token("gia")).await;
    browser.click("#submit").await;
    assert_eq!(browser.visible_text("#session-user").await, "gia");
    assert!(browser.visible_text("#expires").await.contains('Z'));
    let token = browser
        .find("#token")
        .await
        .prop("value")
        .await
        .unwrap()
        .unwrap();
    let (status, body) = app
        .post(Service::Auth, "/validate", json!({ "serviceToken": token }))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["userId"], "gia");

    browser.click("#logout").await;
    assert!(browser.visible_text("#status").await.contains("Signed out"));
    let (status, _) = app
        .post(Service::Auth, "/validate", json!({ "serviceToken": token }))
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "logout from the page revoked the token"
    );
    browser.close().await;
}

#[tokio::test]
async fn a_wrong_identity_token_is_explained_on_the_page() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    browser
        .client
        .goto(&format!("{}/ui", app.url(Service::Auth)))
        .await
        .unwrap();
    browser.fill("#userId", "hal").await;
    browser
        .fill("#idpToken", &app.idp_token("someone-else"))
        .await;
    browser.click("#submit").await;
    assert!(browser
        .visible_text("#error")
        .await
        .contains("does not match"));
    browser.close().await;
}

#[tokio::test]
async fn sign_in_follows_an_allowed_callback_with_the_token_in_the_fragment() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let auth = app.url(Service::Auth);
    // The service's own origin is always allowed; land on its health endpoint.
    let callback = format!("{auth}/?from=signin");
    browser
        .client
        .goto(&format!("{auth}/ui?callback={}", urlencode(&callback)))
        .await
        .unwrap();
    assert!(browser
        .visible_text("#callback-notice")
        .await
        .contains(&callback));
    browser.fill("#userId", "ivy").await;
    browser.fill("#idpToken", &app.idp_token("ivy")).await;
    browser.click("#submit").await;
    let landed = browser.wait_for_url(|u| u.contains("#serviceToken=")).await;
    assert!(landed.starts_with(&callback), "{landed}");
    let token = landed
        .split("#serviceToken=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    let (status, body) = app
        .post(Service::Auth, "/validate", json!({ "serviceToken": token }))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["userId"], "ivy");
    browser.close().await;
}

#[tokio::test]
async fn a_foreign_callback_is_refused_and_sign_in_stays_on_the_page() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let auth = app.url(Service::Auth);
    browser
        .client
        .goto(&format!(
            "{auth}/ui?callback={}",
            urlencode("https://evil.example/grab")
        ))
        .await
        .unwrap();
    let notice = browser.visible_text("#callback-refused").await;
    assert!(
        notice.contains("https://evil.example is not an allowed origin"),
        "{notice}"
    );
    browser.fill("#userId", "jo").await;
    browser.fill("#idpToken", &app.idp_token("jo")).await;
    browser.click("#submit").await;
    assert_eq!(browser.visible_text("#session-user").await, "jo");
    let url = browser.client.current_url().await.unwrap();
    assert!(url.as_str().starts_with(&auth), "stayed on {url}");
    browser.close().await;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn after_sign_in_the_page_links_on_to_the_running_services_signed_in() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let models = tempfile::tempdir().unwrap();
    let table = crate::completion::models_toml(models.path());
    let app = crate::common::TestApp::builder()
        .services(&[Service::Auth, Service::Completion, Service::Markdown])
        .configure(|raw| raw.models = Some(table))
        .spawn()
        .await;
    browser
        .client
        .goto(&format!("{}/ui", app.url(Service::Auth)))
        .await
        .unwrap();
    browser.fill("#userId", "jo").await;
    browser.fill("#idpToken", &app.idp_token("jo")).await;
    browser.click("#submit").await;
    assert_eq!(browser.visible_text("#session-user").await, "jo");
    // One link per running service page; the image service is not running here.
    let onward = browser.visible_text("#onward").await;
    assert!(
        onward.contains("Chat") && onward.contains("Convert documents"),
        "{onward}"
    );
    assert!(!onward.contains("Make images"), "{onward}");
    browser.click("#onward a[data-service=completion]").await;
    let landed = browser
        .wait_for_url(|u| u.starts_with(&app.url(Service::Completion)))
        .await;
    assert!(
        landed.ends_with("/ui"),
        "the token left the address bar: {landed}"
    );
    assert_eq!(browser.visible_text("#who").await, "signed in as jo");
    browser.close().await;
}
