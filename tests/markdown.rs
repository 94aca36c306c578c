//! The markdown conversion service over HTTP (spec 2.2, 2.5, 4.3, 7): real uploads, the error
//! shapes and statuses, health, CORS and the upload limit.

use hearth_server::Service;
use reqwest::multipart::{Form, Part};
use reqwest::StatusCode;
use serde_json::Value;

use crate::common::TestApp;

async fn app_with(f: impl FnOnce(&mut hearth_server::RawConfig)) -> TestApp {
    TestApp::builder()
        .services(&[Service::Markdown])
        .configure(f)
        .spawn()
        .await
}

async fn upload(app: &TestApp, name: &str, bytes: Vec<u8>) -> (StatusCode, Value) {
    upload_to(app, "/", name, bytes).await
}

pub(crate) async fn upload_to(
    app: &TestApp,
    path: &str,
    name: &str,
    bytes: Vec<u8>,
) -> (StatusCode, Value) {
    let form = Form::new().part("file", Part::bytes(bytes).file_name(name.to_string()));
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", app.url(Service::Markdown)))
        .multipart(form)
        .send()
        .await
        .expect("request");
    let status = resp.status();
    (status, resp.json().await.expect("JSON body"))
}

#[tokio::test]
async fn converts_an_uploaded_csv_and_names_the_file() {
    let app = app_with(|_| {}).await;
    let (status, body) = upload(&app, "fruit.csv", b"name,qty\napple,3\npear,5\n".to_vec()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["original_filename"], "fruit.csv");
    let md = body["markdown"].as_str().expect("markdown string");
    assert!(
        md.contains("| name | qty |\n| --- | --- |\n| apple | 3 |"),
        "{md}"
    );
}

/// A message with a CSV attachment: listed by default, converted with `?attachments=convert`
/// or when the operator configures `markdown.attachments = "convert"`.
#[tokio::test]
async fn email_attachments_are_listed_or_converted_as_asked() {
    let eml = b"From: ann@example.org\r\nSubject: Figures\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XX\r\n\r\n--XX\r\nContent-Type: text/plain\r\n\r\nSee attached.\r\n--XX\r\nContent-Type: text/csv\r\nContent-Disposition: attachment; filename=\"q3.csv\"\r\n\r\nregion,sales\r\nnorth,10\r\n--XX--\r\n";
    let app = app_with(|_| {}).await;
    let markdown = |body: &Value| body["markdown"].as_str().expect("markdown").to_string();

    let (status, body) = upload(&app, "figures.eml", eml.to_vec()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed = markdown(&body);
    assert!(listed.contains("See attached."), "{listed}");
    assert!(
        listed.contains("## Attachments\n\n- q3.csv (csv, "),
        "{listed}"
    );
    assert!(!listed.contains("north"), "{listed}");

    let (status, body) =
        upload_to(&app, "/?attachments=convert", "figures.eml", eml.to_vec()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(markdown(&body).contains("| north | 10 |"), "{body}");

    let (status, body) = upload_to(&app, "/?attachments=all", "figures.eml", eml.to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("attachments must be"),
        "{body}"
    );

    let app = app_with(|c| c.markdown.attachments = Some("convert".into())).await;
    let (status, body) = upload(&app, "figures.eml", eml.to_vec()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(markdown(&body).contains("| north | 10 |"), "{body}");
    let (_, body) = upload_to(&app, "/?attachments=list", "figures.eml", eml.to_vec()).await;
    assert!(!markdown(&body).contains("north"), "{body}");
}

/// A small white PNG, made here.
fn tiny_png() -> Vec<u8> {
    let white = image::RgbImage::from_pixel(4, 3, image::Rgb([255, 255, 255]));
    let mut png = std::io::Cursor::new(Vec::new());
    white
        .write_to(&mut png, image::ImageFormat::Png)
        .expect("encode a PNG");
    png.into_inner()
}

/// `?ocr=` and `?lang=` values the parsers refuse answer 400 in the spec's shape, as a bad
/// `?attachments=` does; `?ocr=off` leaves an image at its metadata table.
#[tokio::test]
async fn ocr_query_parameters_are_checked_and_ocr_off_gives_the_metadata_only() {
    let app = app_with(|_| {}).await;
    for (query, says) in [
        ("/?ocr=bogus", "ocr must be"),
        ("/?lang=../x", "lang must be"),
        ("/?lang=eng%2B", "lang must be"),
    ] {
        let (status, body) = upload_to(&app, query, "tiny.png", tiny_png()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        let error = body["error"].as_str().expect("an error string");
        assert!(error.contains(says), "{query}: {body}");
        assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
    }

    let (status, body) = upload_to(&app, "/?ocr=off", "tiny.png", tiny_png()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let md = body["markdown"].as_str().expect("markdown");
    assert!(
        md.starts_with("# Image\n\n| Property | Value |")
            && md.contains("| Format | PNG |")
            && md.contains("| Width | 4 px |")
            && md.contains("| Height | 3 px |"),
        "{md}"
    );
    assert!(!md.contains("## Text"), "{md}");
    // `+` may come raw (form decoding makes it a space) or encoded.
    for query in ["/?ocr=off&lang=eng+fra", "/?ocr=off&lang=eng%2Bfra"] {
        let (status, body) = upload_to(&app, query, "tiny.png", tiny_png()).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
    }
}

/// A well-formed language this machine has no model for is the request's mistake (400, naming
/// the models there are); with no OCR engine at all, `?ocr=force` is the service's (503).
/// Which half runs depends on whether tesseract is installed here.
#[tokio::test]
async fn ocr_languages_the_machine_lacks_are_400_and_forced_ocr_without_an_engine_is_503() {
    let app = app_with(|_| {}).await;
    let health: Value = reqwest::get(format!("{}/", app.url(Service::Markdown)))
        .await
        .expect("health")
        .json()
        .await
        .expect("health JSON");
    assert_eq!(health["status"], "healthy", "{health}");
    let ocr = &health["components"]["ocr"];
    match hearth_markdown::OcrEngine::installed() {
        Some(engine) => {
            assert_eq!(ocr["status"], "up", "{health}");
            assert_eq!(ocr["engine"], engine.version.as_str(), "{health}");
            // Forced: under `auto` a blank image is not read, so no model is looked for.
            let (status, body) =
                upload_to(&app, "/?ocr=force&lang=xyz", "tiny.png", tiny_png()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            let error = body["error"].as_str().expect("an error string");
            assert!(
                error.starts_with("no OCR model for xyz; this machine has: "),
                "{error}"
            );
            if let Some(first) = engine.languages.first() {
                assert!(error.contains(first.as_str()), "{error}");
            }
        }
        None => {
            println!("tesseract is not installed: checking ?ocr=force is 503 instead of ?lang=xyz");
            assert_eq!(ocr["status"], "unavailable", "{health}");
            let (status, body) = upload_to(&app, "/?ocr=force", "tiny.png", tiny_png()).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            let error = body["error"].as_str().expect("an error string");
            assert!(error.contains("OCR failed"), "{error}");
        }
    }
}

#[tokio::test]
async fn converts_html_with_headings_and_without_scripts() {
    let app = app_with(|_| {}).await;
    let html =
        b"<html><body><h1>Report</h1><p>Total <b>42</b></p><script>evil()</script></body></html>"
            .to_vec();
    let (status, body) = upload(&app, "report.html", html).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let md = body["markdown"].as_str().unwrap();
    assert!(
        md.contains("# Report") && md.contains("**42**") && !md.contains("evil"),
        "{md}"
    );
}

#[tokio::test]
async fn missing_file_part_is_400_no_file_provided() {
    let app = app_with(|_| {}).await;
    let form = Form::new().text("other", "x");
    let resp = reqwest::Client::new()
        .post(format!("{}/", app.url(Service::Markdown)))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body, serde_json::json!({ "error": "No file provided" }));
}

#[tokio::test]
async fn empty_selection_is_400_no_file_selected() {
    let app = app_with(|_| {}).await;
    let (status, body) = upload(&app, "", Vec::new()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body, serde_json::json!({ "error": "No file selected" }));
}

#[tokio::test]
async fn broken_document_is_500_with_a_message() {
    let app = app_with(|_| {}).await;
    let mut bytes = b"PK\x03\x04".to_vec();
    bytes.extend_from_slice(&[0u8; 200]);
    let (status, body) = upload(&app, "broken.docx", bytes).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("Conversion failed"),
        "{body}"
    );
}

#[tokio::test]
async fn unsupported_type_is_415_with_a_clear_message() {
    let app = app_with(|_| {}).await;
    let (status, body) = upload(&app, "tool.exe", b"MZ\x90\x00\x03\x00\x00\x00".to_vec()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("Unsupported file type"),
        "{body}"
    );
}

#[tokio::test]
async fn upload_over_the_limit_is_413_json() {
    let app = app_with(|c| c.markdown.max_upload_bytes = Some(1024)).await;
    let (status, body) = upload(&app, "big.txt", vec![b'a'; 20 * 1024]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("too large"),
        "{body}"
    );
}

#[tokio::test]
async fn health_reports_every_field_with_a_working_converter() {
    let app = app_with(|c| {
        c.allowed_origins = Some(vec![
            "https://app.example".into(),
            "https://b.example".into(),
        ]);
        c.region = Some("eu-test".into());
    })
    .await;
    let resp = reqwest::get(format!("{}/", app.url(Service::Markdown)))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let h: Value = resp.json().await.unwrap();
    assert_eq!(h["status"], "healthy");
    assert_eq!(h["components"]["converter"], "up");
    assert!(
        h["version"]["rust"].as_str().unwrap().starts_with("rustc "),
        "{h}"
    );
    assert!(
        h["version"]["axum"]
            .as_str()
            .unwrap()
            .starts_with("axum 0.8"),
        "{h}"
    );
    assert_eq!(h["region"], "eu-test");
    assert_eq!(
        h["allowed_origins"],
        "https://app.example,https://b.example"
    );
    for t in ["server_time", "deployment_time"] {
        chrono::DateTime::parse_from_rfc3339(h[t].as_str().unwrap()).expect("ISO 8601 timestamp");
    }
    let usage = &h["usage"];
    assert!(usage["web_interface"].as_str().unwrap().ends_with("/ui"));
    assert!(usage["example_curl"]
        .as_str()
        .unwrap()
        .starts_with("curl -F 'file=@"));
    assert!(
        usage["supported_methods"]["GET"].is_string()
            && usage["supported_methods"]["POST"].is_string()
    );
    assert!(usage["description"].is_string() && h["service"].is_string());
}

#[tokio::test]
async fn cors_headers_only_for_allowed_origins_and_preflight_works() {
    let app = app_with(|c| c.allowed_origins = Some(vec!["https://app.example".into()])).await;
    let client = reqwest::Client::new();
    let url = format!("{}/", app.url(Service::Markdown));
    let allowed = client
        .get(&url)
        .header("Origin", "https://app.example")
        .send()
        .await
        .unwrap();
    assert_eq!(
        allowed
            .headers()
            .get("access-control-allow-origin")
            .unwrap(),
        "https://app.example"
    );
    let other = client
        .get(&url)
        .header("Origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
    let preflight = client
        .request(reqwest::Method::OPTIONS, &url)
        .header("Origin", "https://app.example")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "{}", preflight.status());
    let methods = preflight
        .headers()
        .get("access-control-allow-methods")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(methods.contains("POST"), "{methods}");
}

#[tokio::test]
async fn ui_page_has_an_upload_form() {
    let app = app_with(|_| {}).await;
    let page = reqwest::get(format!("{}/ui", app.url(Service::Markdown)))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("type=\"file\"")
            && page.contains("id=\"copy\"")
            && page.contains("id=\"download\"")
    );
}

/// A scanned page uploaded as an image comes back as its text, read by OCR in a conversion
/// worker (the engine as the worker's child, under the worker's limits), under the default
/// `?ocr=auto`; a scanned page in a PDF likewise.
#[tokio::test]
async fn a_scanned_page_comes_back_as_its_text() {
    if hearth_markdown::OcrEngine::installed().is_none() {
        panic!("tesseract is not installed (scripts/test.sh installs it)");
    }
    let app = app_with(|_| {}).await;
    let docs = std::env::var_os("HEARTH_TEST_DOCS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/test-docs")
        });
    for (file, name, says) in [
        (
            "ocr-pages/clean-150dpi.png",
            "scan.png",
            "The harbour office opens at seven in the morning",
        ),
        (
            "ocrmypdf/c03-29.pdf",
            "scan.pdf",
            "I got a fish-line, but no hooks",
        ),
    ] {
        let bytes = std::fs::read(docs.join(file))
            .unwrap_or_else(|e| panic!("{file}: {e} (scripts/test.sh fetches and draws it)"));
        let (status, body) = upload_to(&app, "/", name, bytes).await;
        assert_eq!(status, StatusCode::OK, "{file}: {body}");
        let md = body["markdown"].as_str().expect("markdown");
        assert!(md.contains(says), "{file}: {says:?} in:\n{md}");
    }
}
