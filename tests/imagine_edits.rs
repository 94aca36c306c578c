//! Image edits over HTTP on the tiny SDXL-shaped model: image-to-image and inpainting through the
//! spec route's extension fields (`image`, `mask`, `strength`), through `/stream`, and through
//! `/v1/images/edits` as multipart; the size rule; the price of the steps that run; and every
//! hostile picture (corrupt, truncated, a pixel bomb, a mask of another size, too many bytes)
//! refused with a 400 naming its field before any hold, the host still up.

use base64::Engine as _;
use hearth_server::Service;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::assert_error;
use crate::imagine::ImagineApp;

fn png(width: u32, height: u32, pixel: impl Fn(u32, u32) -> [u8; 4]) -> Vec<u8> {
    let img = image::RgbaImage::from_fn(width, height, |x, y| image::Rgba(pixel(x, y)));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn picture(width: u32, height: u32) -> Vec<u8> {
    png(width, height, |x, y| [x as u8, y as u8, (x ^ y) as u8, 255])
}

/// White (repaint) on the left half, black (keep) on the right.
fn left_half_mask(width: u32, height: u32) -> Vec<u8> {
    png(width, height, |x, _| {
        let v = if x < width / 2 { 255 } else { 0 };
        [v, v, v, 255]
    })
}

fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn png_of(resp: &Value) -> Vec<u8> {
    let url = resp["imageUrl"].as_str().expect("imageUrl");
    base64::engine::general_purpose::STANDARD
        .decode(url.strip_prefix("data:image/png;base64,").unwrap())
        .unwrap()
}

fn size_of(png: &[u8]) -> (u32, u32) {
    let img = image::load_from_memory(png).expect("a PNG");
    (img.width(), img.height())
}

async fn no_holds(img: &ImagineApp, user: &str) -> bool {
    let store = &img.app.running().state.store;
    store.holds(user).await.unwrap().is_empty()
}

#[tokio::test]
async fn image_to_image_is_deterministic_differs_from_text_and_pays_the_steps_run() {
    let img = ImagineApp::start("1", "").await;
    let token = img.app.token("ivy").await;
    let base = json!({"serviceToken": token, "prompt": "a boat", "width": 256, "height": 256,
        "steps": 4, "seed": 5});
    let mut edit = base.clone();
    edit["image"] = json!(data_url(&picture(256, 256)));
    edit["strength"] = json!(0.5);
    let (status, a) = img.imagine(edit.clone()).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(size_of(&png_of(&a)), (256, 256));
    // The spec's metadata keeps the steps asked for; the price counts the 2 that ran:
    // 0.040 x 65536/1048576 x 2/4.
    assert_eq!(a["metadata"]["steps"], 4);
    assert_eq!(a["usage"]["cost"], "0.001250");
    assert_eq!(a["balanceAfter"], "0.998750");
    let (_, again) = img.imagine(edit.clone()).await;
    assert_eq!(
        png_of(&a),
        png_of(&again),
        "same seed, same edit, same bytes"
    );
    let (_, text) = img.imagine(base).await;
    assert_ne!(png_of(&a), png_of(&text), "the picture changes the result");
    // Plain base64 is taken as well as a data URL.
    edit["image"] = json!(base64::engine::general_purpose::STANDARD.encode(picture(256, 256)));
    let (_, plain) = img.imagine(edit).await;
    assert_eq!(png_of(&a), png_of(&plain));
    assert!(no_holds(&img, "ivy").await);
}

#[tokio::test]
async fn inpainting_runs_the_full_schedule_by_default_and_the_mask_matters() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("jo").await;
    let body = |mask: &[u8]| {
        json!({"serviceToken": token, "prompt": "a boat", "steps": 2, "seed": 9,
            "image": data_url(&picture(256, 256)), "mask": data_url(mask)})
    };
    let (status, left) = img.imagine(body(&left_half_mask(256, 256))).await;
    assert_eq!(status, StatusCode::OK, "{left}");
    // No size named: the picture's own. Strength 1 by default with a mask: both steps run.
    assert_eq!(size_of(&png_of(&left)), (256, 256));
    assert_eq!(left["usage"]["cost"], "0.001250");
    let keep_all = png(256, 256, |_, _| [0, 0, 0, 255]);
    let (_, kept) = img.imagine(body(&keep_all)).await;
    assert_ne!(png_of(&left), png_of(&kept), "the mask changes the result");
}

#[tokio::test]
async fn the_output_size_follows_the_picture_unless_the_request_names_one() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("kai").await;
    let edit = |extra: Value| {
        let mut b = json!({"serviceToken": token, "prompt": "x", "steps": 2, "seed": 1,
            "image": data_url(&picture(300, 200)), "strength": 0.5});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    // 300x200 rounds to the 64 grid (320x192) and the short side rises to the 256 minimum.
    let (status, own) = img.imagine(edit(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{own}");
    assert_eq!(size_of(&png_of(&own)), (320, 256));
    assert_eq!(own["metadata"]["width"], 320);
    let (_, named) = img
        .imagine(edit(json!({"width": 256, "height": 384})))
        .await;
    assert_eq!(size_of(&png_of(&named)), (256, 384));
}

#[tokio::test]
async fn an_edit_streams_as_a_job_with_one_step_event_per_step_run() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("lee").await;
    let response = img
        .app
        .client
        .post(format!("{}/stream", img.app.url(Service::Imagine)))
        .json(
            &json!({"serviceToken": token, "prompt": "x", "width": 256, "height": 256,
            "steps": 4, "seed": 2, "strength": 0.75, "image": data_url(&picture(256, 256))}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect();
    let steps: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e.get("step").is_some())
        .map(|e| {
            let s = &e["step"];
            (s["step"].as_u64().unwrap(), s["steps"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(steps, vec![(1, 3), (2, 3), (3, 3)], "{text}");
    let done = events.last().unwrap();
    assert_eq!(
        done["response"]["usage"]["cost"], "0.001875",
        "3 of 4 steps: {done}"
    );
}

#[tokio::test]
async fn the_openai_edits_route_takes_multipart_with_a_transparent_mask() {
    let img = ImagineApp::start("10", "").await;
    let token = img.app.token("max").await;
    let url = format!("{}/v1/images/edits", img.app.url(Service::Imagine));
    let part = |bytes: Vec<u8>| {
        reqwest::multipart::Part::bytes(bytes)
            .file_name("x.png")
            .mime_str("image/png")
            .unwrap()
    };
    let form = |mask: Vec<u8>| {
        reqwest::multipart::Form::new()
            .part("image", part(picture(256, 256)))
            .part("mask", part(mask))
            .text("prompt", "a boat")
            .text("size", "256x256")
            .text("seed", "3")
            .text("steps", "2")
            .text("quality", "high")
    };
    let send = |form: reqwest::multipart::Form| {
        img.app
            .client
            .post(&url)
            .bearer_auth(&token)
            .multipart(form)
            .send()
    };
    // Transparent on the left: repaint there.
    let transparent_left = png(256, 256, |x, _| [9, 9, 9, if x < 128 { 0 } else { 255 }]);
    let r = send(form(transparent_left)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(body["data"][0]["b64_json"].as_str().unwrap())
        .unwrap();
    assert_eq!(size_of(&bytes), (256, 256));
    assert_eq!(body["hearth"]["cost"], "0.001250", "{body}");
    // Fully opaque: nothing to repaint under OpenAI's rule, so a different image.
    let opaque = png(256, 256, |_, _| [255, 255, 255, 255]);
    let r: Value = send(form(opaque)).await.unwrap().json().await.unwrap();
    assert_ne!(r["data"][0]["b64_json"], body["data"][0]["b64_json"]);
    // No image: refused naming it, in OpenAI's shape.
    let r = send(reqwest::multipart::Form::new().text("prompt", "x"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], "image");
    assert!(no_holds(&img, "max").await);
}

#[tokio::test]
async fn hostile_pictures_are_refused_naming_their_field_before_any_hold() {
    let img =
        ImagineApp::start_with("10", "", |raw| raw.imagine.max_upload_bytes = Some(200_000)).await;
    let token = img.app.token("nell").await;
    let good = data_url(&picture(256, 256));
    let full = picture(256, 256);
    // A PNG declaring 100,000 x 100,000 pixels in a few dozen bytes (a pixel bomb).
    let bomb = {
        let mut ihdr = 100_000u32.to_be_bytes().to_vec();
        ihdr.extend(100_000u32.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [
            (&b"IHDR"[..], &ihdr[..]),
            (b"IDAT", &[0x78, 0x01]),
            (b"IEND", &[]),
        ] {
            let body = [kind, data].concat();
            b.extend((data.len() as u32).to_be_bytes());
            b.extend(&body);
            b.extend(crc32(&body).to_be_bytes());
        }
        b
    };
    let noise: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "truncated",
            json!({"image": data_url(&full[..full.len() / 2])}),
            "image",
        ),
        (
            "not an image",
            json!({"image": data_url(b"hello, world")}),
            "image",
        ),
        (
            "gif",
            json!({"image": data_url(b"GIF89a\x01\x00\x01\x00\x00\x00\x00")}),
            "image",
        ),
        ("bomb", json!({"image": data_url(&bomb)}), "image"),
        (
            "bad base64",
            json!({"image": "data:image/png;base64,!!!"}),
            "image",
        ),
        ("not a string", json!({"image": 7}), "image"),
        (
            "too many bytes",
            json!({"image": data_url(&noise)}),
            "image",
        ),
        ("mask alone", json!({"mask": good}), "mask"),
        ("strength alone", json!({"strength": 0.5}), "strength"),
        (
            "wrong mask size",
            json!({"image": good, "mask": data_url(&left_half_mask(128, 256))}),
            "mask",
        ),
        (
            "corrupt mask",
            json!({"image": good, "mask": data_url(b"\x89PNG\r\n\x1a\n")}),
            "mask",
        ),
        (
            "strength 0",
            json!({"image": good, "strength": 0}),
            "strength",
        ),
        (
            "strength 2",
            json!({"image": good, "strength": 2}),
            "strength",
        ),
        (
            "strength text",
            json!({"image": good, "strength": "half"}),
            "strength",
        ),
        (
            "no step left",
            json!({"image": good, "strength": 0.1, "steps": 4}),
            "strength",
        ),
    ];
    for (what, extra, field) in cases {
        let mut body = json!({"serviceToken": token, "prompt": "x", "seed": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let started = std::time::Instant::now();
        let (status, r) = img.imagine(body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {r}");
        assert_error(&r, "InvalidRequest");
        assert_eq!(r["error"]["details"]["field"], field, "{what}: {r}");
        if what == "bomb" {
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains("declares 100000x100000"), "{message}");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{what} took {:?}",
            started.elapsed()
        );
    }
    assert!(no_holds(&img, "nell").await);
    let store = &img.app.running().state.store;
    assert_eq!(
        store.balance("nell").await.unwrap(),
        rust_decimal::Decimal::from(10)
    );
    // A body far past the limit is refused whole.
    let huge = "A".repeat(2_000_000);
    let (status, r) = img
        .imagine(json!({"serviceToken": token, "prompt": "x", "image": huge}))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{r}");
    // And the host still serves.
    let (status, r) = img.app.get(Service::Imagine, "/").await;
    assert_eq!(status, StatusCode::OK, "{r}");
}

/// CRC-32 (IEEE) for a hand-made PNG chunk.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    crc.sum()
}
