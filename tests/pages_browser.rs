//! The four pages as one product, in real headless Chromium at a laptop's and a phone's size:
//! the shared header links the running services' pages (carrying the token along) and shows who
//! is signed in and their balance (fetched cross-origin from the auth service); no two controls
//! overlap, no control's text is clipped, nothing is cut off at the side. A PNG of every page at
//! every size is saved under `<target dir>/screenshots/` for review.

use base64::Engine;
use hearth_server::Service;
use serde_json::Value;
use std::time::{Duration, Instant};

use crate::common::browser::{Browser, DESKTOP, PHONE};
use crate::common::spawn_all_four;

/// A layout the check must refuse, after the old document page: an inline drop-zone label whose
/// padded, dashed box runs over the checkbox below it, and a button too narrow for its text.
const BROKEN: &str = "<!doctype html><body style='margin:8px;font:15px sans-serif'>\
<label id='drop' for='file' style='border:2px dashed;padding:28px'><strong>Drop a document here</strong> or click</label>\
<input id='file' type='file' hidden>\
<p><label><input id='attachments' type='checkbox'> Convert e-mail attachments too</label></p>\
<button id='narrow' style='width:40px;overflow:hidden;white-space:nowrap'>Download .md</button></body>";

#[tokio::test]
async fn the_layout_check_catches_overlapping_and_clipped_controls() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.set_viewport(DESKTOP).await;
    let page = base64::engine::general_purpose::STANDARD.encode(BROKEN);
    browser
        .client
        .goto(&format!("data:text/html;base64,{page}"))
        .await
        .unwrap();
    let problems = browser.layout_problems().await;
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("overlap: label#drop") && p.contains("attachments")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("clipped: button#narrow")),
        "{problems:?}"
    );
    browser.close().await;
}

/// Waits until the header shows `balance`.
async fn wait_for_balance(browser: &Browser, balance: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let shown = browser.visible_text("#balance").await;
        if shown == balance {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the header's balance stayed {shown:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the layout check on the page at hand (noting what it finds) and saves its picture.
async fn check(browser: &Browser, name: &str, problems: &mut Vec<String>) {
    let found = browser.layout_problems().await;
    problems.extend(found.into_iter().map(|p| format!("{name}: {p}")));
    browser.save_screenshot(name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_shares_the_header_and_lays_out_at_desktop_and_phone_sizes() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let models = tempfile::tempdir().unwrap();
    let app = spawn_all_four(crate::markdown_hostile::models(models.path())).await;
    let token = app.token("uma").await;
    let pages = [
        (Service::Auth, "signin"),
        (Service::Completion, "chat"),
        (Service::Markdown, "markdown"),
        (Service::Imagine, "imagine"),
    ];
    let mut problems = Vec::new();
    for (size, size_name) in [(DESKTOP, "desktop"), (PHONE, "phone")] {
        browser.set_viewport(size).await;

        // The sign-in page as a stranger sees it.
        browser
            .client
            .goto(&format!("{}/ui", app.url(Service::Auth)))
            .await
            .unwrap();
        browser
            .client
            .execute("sessionStorage.clear();", vec![])
            .await
            .unwrap();
        browser.client.refresh().await.unwrap();
        browser.visible_text("#submit").await;
        check(&browser, &format!("signin-form-{size_name}"), &mut problems).await;

        // Every page signed in, the token handed over in the fragment as sign-in does.
        for (service, name) in pages {
            // From a blank page: a new fragment alone would not load the page again.
            browser.client.goto("about:blank").await.unwrap();
            let url = format!("{}/ui#serviceToken={token}", app.url(service));
            browser.client.goto(&url).await.unwrap();
            assert_eq!(browser.visible_text("#who").await, "signed in as uma");
            wait_for_balance(&browser, "10.000000").await;
            if service == Service::Auth {
                assert_eq!(browser.visible_text("#session-user").await, "uma");
            }
            let links = browser
                .client
                .execute(
                    "return [...document.querySelectorAll('.services a')].map((a) =>
                       [a.dataset.service, a.getAttribute('aria-current'), a.href.includes('#serviceToken=')]);",
                    vec![],
                )
                .await
                .unwrap();
            let expected: Vec<Value> = pages
                .iter()
                .map(|&(s, _)| {
                    let here = s == service;
                    serde_json::json!([s.name(), here.then_some("page"), !here])
                })
                .collect();
            assert_eq!(links, Value::Array(expected), "header links on {name}");
            check(&browser, &format!("{name}-{size_name}"), &mut problems).await;
        }
        // The dice is drawn by the page itself.
        let dice = browser
            .client
            .execute(
                "const r = document.querySelector('#dice svg').getBoundingClientRect(); return r.width * r.height;",
                vec![],
            )
            .await
            .unwrap();
        assert!(dice.as_f64().unwrap() > 100.0, "{dice}");
    }
    assert!(problems.is_empty(), "{problems:#?}");
    browser.close().await;
}
