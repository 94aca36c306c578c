//! The chat page in real headless Chromium: sign in through the auth page's callback, stream a
//! reply, stop a second one mid-way, and see the balance drop after each; the model picker says
//! which models are loaded and loads one on use.

use std::str::FromStr;

use hearth_server::Service;
use hearth_store::LedgerMeta;
use rust_decimal::Decimal;

use crate::common::browser::Browser;
use crate::common::TestApp;

/// The auth and completion services on the completion tests' table (SmolLM2 as alpha-3.3 and
/// beta-4-mini, a missing file as gamma-3.5-sonnet); the table's folder lives as long as it.
async fn spawn() -> (tempfile::TempDir, TestApp) {
    let models = tempfile::tempdir().unwrap();
    let table = crate::completion::models_toml(models.path());
    let app = TestApp::builder()
        .services(&[Service::Auth, Service::Completion])
        .configure(|raw| raw.models = Some(table))
        .spawn()
        .await;
    (models, app)
}

/// Opens the chat page and signs `user` in through the auth page's callback (not signed in, the
/// page links to the auth page with itself as the callback).
async fn sign_in(browser: &Browser, app: &TestApp, user: &str) {
    browser
        .client
        .goto(&format!("{}/ui", app.url(Service::Completion)))
        .await
        .unwrap();
    browser.click("#signin").await;
    browser.wait_for_url(|u| u.contains("callback=")).await;
    browser.fill("#userId", user).await;
    browser.fill("#idpToken", &app.idp_token(user)).await;
    browser.click("#submit").await;
    browser
        .wait_for_url(|u| u.starts_with(&app.url(Service::Completion)) && !u.contains('#'))
        .await;
    assert!(browser.visible_text("#who").await.contains(user));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_page_signs_in_streams_stops_and_shows_the_balance_drop() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (_models, app) = spawn().await;
    let store = &app.running().state.store;
    store.ensure_user("wren", false).await.unwrap();
    store
        .credit("wren", Decimal::from(10), &LedgerMeta::reason("test funds"))
        .await
        .unwrap();
    let start_balance = store.balance("wren").await.unwrap();

    sign_in(&browser, &app, "wren").await;

    // A streamed reply ends with its usage, cost and the balance after it.
    browser.fill("#maxTokens", "16").await;
    browser.fill("#prompt", "Say hello in French.").await;
    browser.click("#send").await;
    let meta = browser.visible_text(".msg.assistant .meta").await;
    assert!(
        meta.contains("output tokens") && meta.contains("balance"),
        "{meta}"
    );
    let after_first = Decimal::from_str(&browser.visible_text("#balance").await).unwrap();
    assert!(
        after_first < start_balance,
        "{after_first} !< {start_balance}"
    );

    // A long reply stopped mid-way: marked as stopped, billed, balance lower again.
    browser.fill("#maxTokens", "2000").await;
    // Greedy, so the reply is the same long count every run: a sampled one sometimes ended on
    // its own before Stop was clicked.
    browser
        .client
        .execute("document.getElementById('temperature').value = '0'", vec![])
        .await
        .unwrap();
    browser
        .fill("#prompt", "Count from one to one thousand in words.")
        .await;
    browser.click("#send").await;
    // The model may end this reply on its own after a few dozen tokens, so the check that it
    // has started and the click on Stop run in one script in the page, not two WebDriver calls.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let clicked = browser
            .client
            .execute(
                "const r = document.querySelectorAll('.msg.assistant');
                 const stop = document.getElementById('stop');
                 if (r.length === 2 && r[1].textContent.trim() && !stop.disabled) {
                   stop.click();
                   return true;
                 }
                 return false;",
                vec![],
            )
            .await
            .unwrap();
        if clicked.as_bool() == Some(true) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the second reply never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let stopped = browser.visible_text(".msg.assistant .meta.aborted").await;
    assert!(stopped.starts_with("stopped"), "{stopped}");
    let after_second = Decimal::from_str(&browser.visible_text("#balance").await).unwrap();
    assert!(
        after_second < after_first,
        "{after_second} !< {after_first}"
    );
    assert_eq!(store.balance("wren").await.unwrap(), after_second);
    browser.close().await;
}

/// The model picker's option texts.
async fn options(browser: &Browser) -> Vec<String> {
    let texts = browser
        .client
        .execute(
            "return [...document.getElementById('model').options].map((o) => o.textContent);",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(texts).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_page_says_which_models_are_loaded_and_loads_one_on_use() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (_models, app) = spawn().await;
    let hub = &app.running().state.hub;
    // alpha-3.3 and beta-4-mini share one engine: loaded, then unloaded by hand.
    hub.load("alpha-3.3").await.unwrap();
    hub.unload("beta-4-mini").unwrap();
    let unloaded = crate::common::eventually(
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(100),
        || async {
            let (_, health) = app.get(Service::Completion, "/").await;
            health["models"]["beta-4-mini"] == "unloaded"
        },
    )
    .await;
    assert!(unloaded);
    sign_in(&browser, &app, "finch").await;
    assert_eq!(
        options(&browser).await,
        [
            "alpha-3.3 · not loaded",
            "beta-4-mini · not loaded",
            "gamma-3.5-sonnet · unavailable"
        ]
    );
    browser
        .client
        .execute(
            "const s = document.getElementById('model'); s.value = 'beta-4-mini';
             s.dispatchEvent(new Event('change'));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        browser.visible_text("#mstate").await,
        "not loaded: loads when you send"
    );

    // Sending loads it, then the reply comes and the picker says so.
    browser.fill("#maxTokens", "8").await;
    browser.fill("#prompt", "Hello!").await;
    browser.click("#send").await;
    let meta = browser.visible_text(".msg.assistant .meta").await;
    assert!(meta.contains("output tokens"), "{meta}");
    let reply = browser.visible_text(".msg.assistant").await;
    assert!(!reply.starts_with("loading"), "{reply}");
    // beta-4-mini says so at its first token; alpha-3.3, which shares its engine, when the page
    // next asks the health check: when the picker is opened.
    browser.click("#model").await;
    let loaded = crate::common::eventually(
        std::time::Duration::from_secs(15),
        std::time::Duration::from_millis(200),
        || async {
            options(&browser).await[..2] == ["alpha-3.3 · loaded", "beta-4-mini · loaded"]
        },
    )
    .await;
    assert!(loaded, "{:?}", options(&browser).await);
    let note = browser
        .client
        .execute(
            "return document.getElementById('mstate').textContent;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(note, "", "a loaded model needs no note");
    browser.close().await;
}
