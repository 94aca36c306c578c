//! The image page in real headless Chromium: sign in through the auth page's callback, generate
//! an image on the tiny model as a job (its progress bar filled), see it with its metadata, cost,
//! balance and a download link; cancel a job from the page and pay nothing. Its edit mode: a
//! picture chosen through the file input, edited as it is (no mask sent) and then with a mask
//! painted with the mouse (sent as a black-and-white PNG of the picture's size), each paying the
//! steps its strength runs, the result taken back in as the next picture to edit; on a phone
//! the canvas fits the screen while the mask keeps the picture's pixels, and a finger paints;
//! a file that is not a picture, and the service's refusal of an edit, shown with the page
//! still usable.

use crate::common::browser::{Browser, DESKTOP, PHONE};
use crate::imagine::ImagineApp;
use base64::Engine as _;
use fantoccini::actions::{
    InputSource, MouseActions, PointerAction, TouchActions, MOUSE_BUTTON_LEFT,
};
use hearth_server::Service;
use serde_json::Value;
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
    assert_eq!(decoded_size(&browser).await, (256, 320));

    assert_eq!(meta(&browser, "seed").await, "1234");
    assert_eq!(meta(&browser, "size").await, "256 × 320");
    // 0.040 x 81920/1048576 x 1/4 = 0.00078125 -> 0.000781
    assert_eq!(meta(&browser, "cost").await, "0.000781");
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

/// The result's size as the browser decoded it (`#image`'s natural size), once it has.
async fn decoded_size(browser: &Browser) -> (u64, u64) {
    // naturalWidth/naturalHeight are numbers, which WebDriver's property call won't return as
    // strings: read them with a script instead.
    let size = wait_for(
        browser,
        "the result decoded",
        "const i = document.querySelector('#image');
         return i && i.naturalWidth ? [i.naturalWidth, i.naturalHeight] : null;",
    )
    .await;
    (size[0].as_u64().unwrap(), size[1].as_u64().unwrap())
}

/// Runs `script` until it returns something other than `null`/`false` (up to 60 s), and returns it.
async fn wait_for(browser: &Browser, what: &str, script: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = browser.client.execute(script, vec![]).await.unwrap();
        if !matches!(got, Value::Null | Value::Bool(false)) {
            return got;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Keeps every body the page posts to `/stream` in `window.sent`, for the test to read.
const RECORD_REQUESTS: &str = "window.sent = [];
const original = window.fetch;
window.fetch = (url, options) => {
  if (String(url).endsWith('/stream')) window.sent.push(JSON.parse(options.body));
  return original(url, options);
};";

/// The bodies posted to `/stream` so far.
async fn sent(browser: &Browser) -> Vec<Value> {
    let got = browser
        .client
        .execute("return window.sent;", vec![])
        .await
        .unwrap();
    serde_json::from_value(got).unwrap()
}

/// Clicks Generate and waits until it is the `n`th job posted and the page is done with it:
/// answers the status (`done`, `stopped`) or `refused` when the page shows an error.
async fn run_job(browser: &Browser, n: usize) -> String {
    browser.click("#go").await;
    let end = wait_for(
        browser,
        "the job posted and finished",
        &format!(
            "if (window.sent.length !== {n} || document.querySelector('#go').textContent !== 'Generate') return null;
             return document.querySelector('#error') ? 'refused' : document.querySelector('#status').textContent;"
        ),
    )
    .await;
    end.as_str().unwrap().to_string()
}

/// A PNG file of `width` x `height` pixels (a colour ramp) in `dir`.
fn picture_file(dir: &std::path::Path, width: u32, height: u32) -> String {
    let path = dir.join(format!("picture-{width}x{height}.png"));
    image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x % 256) as u8, (y % 256) as u8, 128])
    })
    .save(&path)
    .unwrap();
    path.display().to_string()
}

/// Decodes a `data:image/png;base64,...` URL.
fn decode_data_url(url: &Value) -> image::DynamicImage {
    let data = url
        .as_str()
        .and_then(|u| u.strip_prefix("data:image/png;base64,"))
        .expect("a PNG data URL");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    image::load_from_memory(&bytes).unwrap()
}

/// Opens the page signed in as `user`, in edit mode, recording what it posts.
async fn open_edit_mode(browser: &Browser, img: &ImagineApp, user: &str) {
    let app = &img.app;
    let token = app.token(user).await;
    let page = format!("{}/ui#serviceToken={token}", app.url(Service::Imagine));
    browser.client.goto(&page).await.unwrap();
    browser.visible_text("#who").await;
    browser
        .client
        .execute(RECORD_REQUESTS, vec![])
        .await
        .unwrap();
    browser.click("#tabEdit").await;
}

/// Chooses `path` in the file input and waits until the page shows the picture's size.
async fn choose_picture(browser: &Browser, path: &str, size: &str) {
    browser
        .find("#editImage")
        .await
        .send_keys(path)
        .await
        .unwrap();
    let shown = wait_for(
        browser,
        "the picture loaded",
        "const t = document.querySelector('#picInfo').textContent;
         return t.includes('×') ? t : null;",
    )
    .await;
    assert!(shown.as_str().unwrap().contains(size), "{shown}");
}

/// Scrolls the mask canvas to the middle of the screen and draws a horizontal stroke through
/// its centre, `reach` CSS pixels to each side, with `pointer` (a mouse or a finger).
async fn paint_stroke<P>(browser: &Browser, pointer: P, reach: f64)
where
    P: InputSource<Action = PointerAction> + Into<fantoccini::actions::ActionSequence>,
{
    browser
        .client
        .execute(
            "document.querySelector('#maskCanvas').scrollIntoView({block: 'center'});",
            vec![],
        )
        .await
        .unwrap();
    let canvas = browser.find("#maskCanvas").await;
    let to = |x: f64, ms: Option<u64>| PointerAction::MoveToElement {
        element: canvas.clone(),
        duration: ms.map(Duration::from_millis),
        x,
        y: 0.0,
    };
    let stroke = pointer
        .then(to(-reach, None))
        .then(PointerAction::Down {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(to(0.0, Some(100)))
        .then(to(reach, Some(100)))
        .then(PointerAction::Up {
            button: MOUSE_BUTTON_LEFT,
        });
    browser.client.perform_actions(stroke).await.unwrap();
}

/// `#strength`'s value as the page holds it.
async fn strength(browser: &Browser) -> String {
    browser
        .find("#strength")
        .await
        .prop("value")
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn an_edit_sends_the_picture_and_a_painted_mask_and_pays_the_steps_its_strength_runs() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.set_viewport(DESKTOP).await;
    let img = ImagineApp::start("5", "").await;
    let files = tempfile::tempdir().unwrap();
    open_edit_mode(&browser, &img, "edda").await;
    choose_picture(&browser, &picture_file(files.path(), 256, 256), "256 × 256").await;
    // No size chosen: the lists show the picture's, and the request will name none.
    assert!(browser
        .visible_text("#sizeHint")
        .await
        .contains("256 × 256"));
    assert_eq!(strength(&browser).await, "0.75");
    assert!(browser
        .visible_text("#strengthHint")
        .await
        .starts_with("3 of 4 steps run"));
    browser.fill("#prompt", "the same lake at night").await;
    browser.fill("#seed", "77").await;

    // Nothing painted: image to image, no mask sent, 3 of 4 steps paid.
    assert_eq!(run_job(&browser, 1).await, "done");
    assert_eq!(decoded_size(&browser).await, (256, 256));
    assert_eq!(meta(&browser, "steps").await, "3 of 4");
    assert_eq!(
        meta(&browser, "edit").await,
        "image to image, strength 0.75"
    );
    // 0.040 x 65536/1048576 x 3/4 = 0.001875
    assert_eq!(meta(&browser, "cost").await, "0.001875");
    let first = image_src(&browser).await;

    // A stroke across the middle: the strength follows the mask to 1, until set by hand.
    paint_stroke(&browser, MouseActions::new("mouse".into()), 60.0).await;
    assert_eq!(strength(&browser).await, "1");
    assert!(browser
        .visible_text("#maskHint")
        .await
        .contains("Only the painted part"));
    browser.fill("#strength", "0.5").await;
    assert!(browser
        .visible_text("#strengthHint")
        .await
        .starts_with("2 of 4 steps run"));
    assert_eq!(run_job(&browser, 2).await, "done");
    assert_eq!(meta(&browser, "edit").await, "inpainting, strength 0.5");
    assert_eq!(decoded_size(&browser).await, (256, 256));
    assert_eq!(meta(&browser, "steps").await, "2 of 4");
    // 0.040 x 65536/1048576 x 2/4 = 0.00125
    assert_eq!(meta(&browser, "cost").await, "0.001250");
    let second = image_src(&browser).await;
    assert_ne!(first, second, "the masked edit made another image");
    assert_eq!(browser.visible_text("#balance").await, "4.996875");
    assert_eq!(img.app.balance("edda").await, "4.996875");

    // What the page sent: the same picture both times, at its own size and no size named;
    // a mask only the second time, the picture's size, white along the stroke, black elsewhere.
    let bodies = sent(&browser).await;
    for body in &bodies {
        assert_eq!(body["image"], bodies[0]["image"]);
        let size = (body.get("width"), body.get("height"));
        assert_eq!(size, (None, None), "no size named");
        assert_eq!(body["steps"], 4);
    }
    let picture = decode_data_url(&bodies[0]["image"]).to_rgb8();
    assert_eq!(picture.dimensions(), (256, 256));
    assert_eq!(picture.get_pixel(200, 10).0, [200, 10, 128]);
    assert!(bodies[0].get("mask").is_none(), "nothing painted, no mask");
    assert_eq!(bodies[0]["strength"], 0.75);
    assert_eq!(bodies[1]["strength"], 0.5);
    let mask = decode_data_url(&bodies[1]["mask"]).to_luma8();
    assert_eq!(mask.dimensions(), (256, 256));
    assert_eq!(
        mask.get_pixel(128, 128).0,
        [255],
        "the stroke's middle repaints"
    );
    for (x, y) in [
        (5, 5),
        (250, 250),
        (128, 20),
        (128, 236),
        (5, 128),
        (250, 128),
    ] {
        assert_eq!(mask.get_pixel(x, y).0, [0], "({x}, {y}) is kept");
    }

    // The result becomes the next picture to edit, with its mask cleared.
    browser.click("#editResult").await;
    wait_for(
        &browser,
        "the result taken in",
        "return document.querySelector('#picInfo').textContent === 'the result: 256 × 256';",
    )
    .await;
    assert!(!browser.find("#clearMask").await.is_enabled().await.unwrap());
    let problems = browser.layout_problems().await;
    browser.save_screenshot("imagine-edit-desktop").await;
    assert!(problems.is_empty(), "{problems:#?}");
    browser.close().await;
}

#[tokio::test]
async fn on_a_phone_the_picture_fits_the_screen_and_a_finger_paints_its_mask() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.set_viewport(PHONE).await;
    let img = ImagineApp::start("5", "").await;
    let files = tempfile::tempdir().unwrap();
    open_edit_mode(&browser, &img, "fin").await;
    choose_picture(&browser, &picture_file(files.path(), 512, 384), "512 × 384").await;
    // The canvas is drawn smaller than its pixels, inside the screen.
    let fit = browser
        .client
        .execute(
            "const c = document.querySelector('#maskCanvas'), r = c.getBoundingClientRect();
             return [c.width, c.height, r.left, r.right, r.width, document.documentElement.clientWidth];",
            vec![],
        )
        .await
        .unwrap();
    let n = |i: usize| fit[i].as_f64().unwrap();
    assert_eq!(
        (n(0), n(1)),
        (512.0, 384.0),
        "the mask has the picture's pixels"
    );
    assert!(
        n(2) >= 0.0 && n(3) <= n(5),
        "the canvas is on screen: {fit}"
    );
    assert!(n(4) < 512.0 && n(4) > 200.0, "scaled by CSS: {fit}");
    let problems = browser.layout_problems().await;
    browser.save_screenshot("imagine-edit-phone").await;
    assert!(problems.is_empty(), "{problems:#?}");

    paint_stroke(&browser, TouchActions::new("finger".into()), 40.0).await;
    assert_eq!(strength(&browser).await, "1");
    // Cleared, the strength goes back with the mask; undone, both come back. The eraser
    // takes the stroke off the same way, and is undone too.
    browser.click("#clearMask").await;
    assert_eq!(strength(&browser).await, "0.75");
    browser.click("#undoMask").await;
    assert_eq!(strength(&browser).await, "1");
    browser.click("#eraser").await;
    paint_stroke(&browser, TouchActions::new("finger".into()), 40.0).await;
    assert_eq!(strength(&browser).await, "0.75");
    browser.click("#eraser").await;
    browser.click("#undoMask").await;
    assert_eq!(strength(&browser).await, "1");
    browser.fill("#prompt", "a red door").await;
    browser.fill("#steps", "1").await;
    assert_eq!(run_job(&browser, 1).await, "done");
    assert_eq!(decoded_size(&browser).await, (512, 384));
    assert_eq!(meta(&browser, "steps").await, "1 of 1");
    // 0.040 x 196608/1048576 x 1/4 = 0.001875
    assert_eq!(meta(&browser, "cost").await, "0.001875");
    let bodies = sent(&browser).await;
    let mask = decode_data_url(&bodies[0]["mask"]).to_luma8();
    assert_eq!(mask.dimensions(), (512, 384));
    assert_eq!(mask.get_pixel(256, 192).0, [255]);
    assert_eq!(mask.get_pixel(10, 10).0, [0]);
    browser.close().await;
}

#[tokio::test]
async fn a_file_that_is_not_a_picture_and_a_refused_edit_are_shown_and_the_page_stays_usable() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.set_viewport(DESKTOP).await;
    let img = ImagineApp::start("0", "").await;
    let files = tempfile::tempdir().unwrap();
    open_edit_mode(&browser, &img, "nell").await;
    let notes = files.path().join("notes.txt");
    std::fs::write(&notes, "not a picture at all\n").unwrap();
    browser
        .find("#editImage")
        .await
        .send_keys(&notes.display().to_string())
        .await
        .unwrap();
    assert!(browser
        .visible_text("#error")
        .await
        .contains("notes.txt is not a picture"));
    // Still usable: a picture is taken, and the error goes.
    choose_picture(&browser, &picture_file(files.path(), 256, 256), "256 × 256").await;
    assert!(browser
        .client
        .find_all(fantoccini::Locator::Css("#error"))
        .await
        .unwrap()
        .is_empty());
    // A strength that leaves no step is stopped before it is sent.
    browser.fill("#prompt", "anything").await;
    browser.fill("#strength", "0.1").await;
    assert!(browser
        .visible_text("#strengthHint")
        .await
        .starts_with("no step of 4 would run"));
    assert!(!browser.find("#go").await.is_enabled().await.unwrap());
    browser.fill("#strength", "0.5").await;
    // The service's refusal, in its words; the button back for another try.
    assert_eq!(run_job(&browser, 1).await, "refused");
    assert!(browser
        .visible_text("#error")
        .await
        .contains("InsufficientFunds"));
    assert!(browser.find("#go").await.is_enabled().await.unwrap());
    browser.close().await;
}

/// The text of the result's metadata row `key`.
async fn meta(browser: &Browser, key: &str) -> String {
    browser
        .visible_text(&format!("#meta dd[data-key='{key}']"))
        .await
}

/// The result image's `src`.
async fn image_src(browser: &Browser) -> String {
    browser
        .find("#image")
        .await
        .attr("src")
        .await
        .unwrap()
        .unwrap()
}
