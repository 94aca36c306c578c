//! The image page in real headless Chromium: sign in through the auth page's callback, generate
//! an image on the tiny model as a job (its progress bar filled), see it with its metadata, cost,
//! balance and a download link; cancel a job from the page and pay nothing.

use crate::common::browser::Browser;
use crate::imagine::ImagineApp;
use hearth_server::Service;
use std::time::{Duration, Instant};

#[tokio::test]
async fn sign_in_via_callback_generate_and_see_image_metadata_cost_and_download() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let img = ImagineApp::start("5", "").await;
    let app = &img.app;
    let page = format!("{}/ui", app.url(Service::Imagine));
    browser.client.goto(&page).await.unwrap();

    // Not signed in: the page links to the auth page with itself as the callback.
    browser.click("#signin").await;
    browser.wait_for_url(|u| u.contains("callback=")).await;
    browser.fill("#userId", "pia").await;
    browser.fill("#idpToken", &app.idp_token("pia")).await;
    browser.click("#submit").await;
    browser.wait_for_url(|u| u.starts_with(&page)).await;
    assert!(browser.visible_text("#who").await.contains("pia"));

    browser.fill("#prompt", "a small boat on a lake").await;
    browser.fill("#seed", "1234").await;
    browser.fill("#steps", "1").await;
    browser
        .find("#width")
        .await
        .select_by_value("256")
        .await
        .unwrap();
    browser
        .find("#height")
        .await
        .select_by_value("320")
        .await
        .unwrap();
    browser.click("#go").await;

    let image = browser.find("#image").await;
    let src = image.attr("src").await.unwrap().unwrap();
    assert!(src.starts_with("data:image/png;base64,"));
    // The browser decoded it at the requested size.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (w, h) = loop {
        // naturalWidth/naturalHeight are numbers, which WebDriver's property call won't return
        // as strings: read them with a script instead.
        let size = browser
            .client
            .execute(
                "const i = document.querySelector('#image'); return [i.naturalWidth, i.naturalHeight];",
                vec![],
            )
            .await
            .unwrap();
        let w = size[0].as_u64().unwrap_or_default().to_string();
        let h = size[1].as_u64().unwrap_or_default().to_string();
        if w != "0" {
            break (w, h);
        }
        assert!(Instant::now() < deadline, "image never decoded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((w.as_str(), h.as_str()), ("256", "320"));

    assert_eq!(
        browser.visible_text("#meta dd[data-key='seed']").await,
        "1234"
    );
    assert_eq!(
        browser.visible_text("#meta dd[data-key='size']").await,
        "256 × 320"
    );
    // 0.040 x 81920/1048576 x 1/4 = 0.00078125 -> 0.000781
    assert_eq!(
        browser.visible_text("#meta dd[data-key='cost']").await,
        "0.000781"
    );
    assert_eq!(browser.visible_text("#balance").await, "4.999219");
    assert!(browser
        .visible_text("#test-model")
        .await
        .contains("test model"));
    let href = browser
        .find("#download")
        .await
        .attr("href")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(href, src, "the download link carries the PNG");
    assert_eq!(app.balance("pia").await, "4.999219");
    // The job's progress: its one step done.
    assert_eq!(browser.visible_text("#status").await, "done");
    let bar = browser
        .client
        .execute(
            "const b = document.querySelector('#bar'); return [b.value, b.max];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!((bar[0].as_f64(), bar[1].as_f64()), (Some(1.0), Some(1.0)));
    browser.close().await;
}

#[tokio::test]
async fn a_job_shows_its_steps_and_previews_and_the_cancel_button_stops_it_for_free() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let img = ImagineApp::start("5", "").await;
    let app = &img.app;
    let token = app.token("ravi").await;
    let before = app.balance("ravi").await;
    let page = format!("{}/ui#serviceToken={token}", app.url(Service::Imagine));
    browser.client.goto(&page).await.unwrap();
    browser.fill("#prompt", "a long wait").await;
    browser.fill("#steps", "8").await;
    for side in ["#width", "#height"] {
        browser
            .find(side)
            .await
            .select_by_value("512")
            .await
            .unwrap();
    }
    browser.click("#go").await;
    // The first step reported, with its preview in the stage.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !browser.visible_text("#status").await.starts_with("step") {
        assert!(Instant::now() < deadline, "no step reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let preview = browser
        .find("#preview")
        .await
        .attr("src")
        .await
        .unwrap()
        .unwrap();
    assert!(preview.starts_with("data:image/png;base64,"));
    browser.click("#cancel").await;
    assert!(browser
        .visible_text("#cancelled")
        .await
        .contains("nothing was charged"));
    assert_eq!(browser.visible_text("#status").await, "stopped");
    assert_eq!(app.balance("ravi").await, before);
    browser.close().await;
}

#[tokio::test]
async fn the_page_shows_a_refusal_from_the_service() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let img = ImagineApp::start("0", "").await;
    let app = &img.app;
    let token = app.token("quin").await;
    let page = format!("{}/ui#serviceToken={token}", app.url(Service::Imagine));
    browser.client.goto(&page).await.unwrap();
    browser.fill("#prompt", "anything").await;
    browser
        .find("#width")
        .await
        .select_by_value("256")
        .await
        .unwrap();
    browser
        .find("#height")
        .await
        .select_by_value("256")
        .await
        .unwrap();
    browser.click("#go").await;
    assert!(browser
        .visible_text("#error")
        .await
        .contains("InsufficientFunds"));
    browser.close().await;
}
