//! The markdown page (`GET /ui`) in real headless Chromium: a document chosen with the file
//! picker is uploaded and shown rendered and as raw Markdown side by side; Copy and Download hand
//! over exactly that Markdown; a dropped file converts too; a refused file shows the service's
//! message.
//!
//! The clipboard and the file download are observed through small page-side spies installed by
//! script (headless Chromium neither exposes the system clipboard nor says where a download
//! went): they record what the page hands to `navigator.clipboard.writeText` and which Blob and
//! file name the download link carries.

use std::time::{Duration, Instant};

use fantoccini::Locator;
use hearth_server::Service;
use serde_json::Value;

use crate::common::browser::Browser;
use crate::common::TestApp;

const REPORT: &str = "<!doctype html><html><head><title>Q3</title>\
<style>p { color: red }</style></head><body>\
<h1>Quarterly report</h1>\
<p>Revenue <b>grew</b> in every region.</p>\
<ul><li>North</li><li>South</li></ul>\
<table><tr><th>Region</th><th>Sales</th></tr><tr><td>North</td><td>120</td></tr></table>\
<script>document.title = 'injected';</script>\
</body></html>";

const SPIES: &str = r#"
window.__copied = null;
Object.defineProperty(navigator, "clipboard", {
  configurable: true,
  value: { writeText: async (t) => { window.__copied = t; } },
});
window.__blobs = {};
window.__downloads = [];
const create = URL.createObjectURL.bind(URL);
URL.createObjectURL = (blob) => { const url = create(blob); window.__blobs[url] = blob; return url; };
HTMLAnchorElement.prototype.click = function () {
  window.__downloads.push({ name: this.download, blob: window.__blobs[this.href] });
};
"#;

/// Starts the markdown service and opens its upload page; the app lives as long as the result.
async fn open_upload_page(browser: &Browser) -> TestApp {
    let app = TestApp::builder()
        .services(&[Service::Markdown])
        .spawn()
        .await;
    browser
        .client
        .goto(&format!("{}/ui", app.url(Service::Markdown)))
        .await
        .unwrap();
    app
}

/// Waits until the status line contains `needle`, returning it.
async fn wait_status(browser: &Browser, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = browser.visible_text("#status").await;
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "status never said {needle:?}; last {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Picks `path` in the file picker again: the picker and the status line cleared first, so that
/// the change event fires for the same file and the next status is new.
async fn pick_again(browser: &Browser, path: &str) {
    browser
        .client
        .execute("document.getElementById('file').value = ''; document.getElementById('status').textContent = '';", vec![])
        .await
        .unwrap();
    browser.find("#file").await.send_keys(path).await.unwrap();
}

async fn texts(browser: &Browser, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for el in browser.client.find_all(Locator::Css(css)).await.unwrap() {
        out.push(el.text().await.unwrap());
    }
    out
}

#[tokio::test]
async fn picked_file_is_shown_rendered_and_raw_and_copy_and_download_carry_the_markdown() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let _app = open_upload_page(&browser).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.html");
    std::fs::write(&file, REPORT).unwrap();
    browser.client.execute(SPIES, vec![]).await.unwrap();
    // Before any upload there is nothing to copy or download.
    assert_eq!(
        browser.find("#copy").await.prop("disabled").await.unwrap(),
        Some("true".into())
    );

    // The picker is a hidden <input type=file> behind the drop zone's label: give it the path.
    browser
        .find("#file")
        .await
        .send_keys(&file.display().to_string())
        .await
        .unwrap();
    let status = wait_status(&browser, "Converted report.html").await;
    assert!(status.contains("characters"), "{status}");

    // Raw Markdown pane: the converter's output, structure and all.
    let raw = browser
        .find("#raw")
        .await
        .prop("value")
        .await
        .unwrap()
        .unwrap();
    assert!(raw.contains("# Quarterly report"), "{raw}");
    assert!(raw.contains("**grew**"), "{raw}");
    assert!(raw.contains("| Region | Sales |"), "{raw}");
    assert!(
        !raw.contains("injected") && !raw.contains("color: red"),
        "{raw}"
    );

    // Rendered pane: real HTML elements, not Markdown syntax.
    assert_eq!(
        browser.visible_text("#rendered h1").await,
        "Quarterly report"
    );
    assert_eq!(browser.visible_text("#rendered p strong").await, "grew");
    assert_eq!(texts(&browser, "#rendered li").await, ["North", "South"]);
    assert_eq!(
        texts(&browser, "#rendered table th").await,
        ["Region", "Sales"]
    );
    assert_eq!(
        texts(&browser, "#rendered table td").await,
        ["North", "120"]
    );
    let rendered = browser.visible_text("#rendered").await;
    assert!(
        !rendered.contains("**") && !rendered.contains("| ---"),
        "{rendered}"
    );
    // The uploaded page's script did not run in ours.
    assert_ne!(browser.client.title().await.unwrap(), "injected");

    // Copy hands the raw Markdown to the clipboard.
    browser.click("#copy").await;
    wait_status(&browser, "Copied").await;
    let copied = browser
        .client
        .execute("return window.__copied;", vec![])
        .await
        .unwrap();
    assert_eq!(copied, Value::String(raw.clone()));

    // Download offers report.md holding the same Markdown.
    browser.click("#download").await;
    let download = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             const d = window.__downloads[0];
             if (!d || !d.blob) { done(null); return; }
             d.blob.text().then((t) => done([d.name, d.blob.type, t]));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(download[0], "report.md", "{download}");
    assert!(
        download[1].as_str().unwrap().starts_with("text/markdown"),
        "{download}"
    );
    assert_eq!(download[2], Value::String(raw));
    browser.close().await;
}

#[tokio::test]
async fn dropped_file_converts_and_a_refused_file_shows_the_service_message() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let _app = open_upload_page(&browser).await;

    // Drag and drop: a File dropped on the drop zone, as a browser delivers one.
    browser
        .client
        .execute(
            "const dt = new DataTransfer();
             dt.items.add(new File(['fruit;qty\\napple;3\\npear;5\\n'], 'fruit.csv', { type: 'text/csv' }));
             document.getElementById('drop').dispatchEvent(
               new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));",
            vec![],
        )
        .await
        .unwrap();
    wait_status(&browser, "Converted fruit.csv").await;
    assert_eq!(
        texts(&browser, "#rendered table td").await,
        ["apple", "3", "pear", "5"]
    );

    // A file the service cannot convert: its message appears, marked as an error.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("firmware.bin");
    std::fs::write(&file, [0u8, 159, 146, 150, 1, 2, 3, 0, 255, 254, 7, 8]).unwrap();
    browser
        .find("#file")
        .await
        .send_keys(&file.display().to_string())
        .await
        .unwrap();
    let status = wait_status(&browser, "Unsupported file type").await;
    assert!(status.contains(".bin"), "{status}");
    assert_eq!(
        browser
            .find("#status")
            .await
            .attr("class")
            .await
            .unwrap()
            .as_deref(),
        Some("error")
    );
    // The previous conversion stays on screen.
    assert_eq!(
        texts(&browser, "#rendered table td").await,
        ["apple", "3", "pear", "5"]
    );
    browser.close().await;
}

/// An e-mail with a CSV attachment: listed by default; converted, as a table, once the page's
/// "convert attachments" box is ticked.
#[tokio::test]
async fn the_attachments_box_converts_e_mail_attachments() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let _app = open_upload_page(&browser).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("figures.eml");
    std::fs::write(
        &file,
        "From: ann@example.org\r\nSubject: Figures\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XX\r\n\r\n--XX\r\nContent-Type: text/plain\r\n\r\nSee attached.\r\n--XX\r\nContent-Type: text/csv\r\nContent-Disposition: attachment; filename=\"q3.csv\"\r\n\r\nregion,sales\r\nnorth,10\r\n--XX--\r\n",
    )
    .unwrap();
    let path = file.display().to_string();

    browser.find("#file").await.send_keys(&path).await.unwrap();
    wait_status(&browser, "Converted figures.eml").await;
    let raw = browser.find("#raw").await.prop("value").await.unwrap();
    let raw = raw.unwrap_or_default();
    assert!(raw.contains("- q3.csv (csv, "), "{raw}");
    assert!(texts(&browser, "#rendered table td").await.is_empty());

    browser.find("#attachments").await.click().await.unwrap();
    pick_again(&browser, &path).await;
    wait_status(&browser, "Converted figures.eml").await;
    assert_eq!(texts(&browser, "#rendered table td").await, ["north", "10"]);
    browser.close().await;
}

#[tokio::test]
async fn asked_for_chunks_the_page_lists_them_under_their_headings() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let _app = open_upload_page(&browser).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.html");
    std::fs::write(&file, REPORT).unwrap();
    let path = file.display().to_string();
    // Not asked: no chunks pane.
    browser.find("#file").await.send_keys(&path).await.unwrap();
    wait_status(&browser, "Converted report.html").await;
    let hidden = browser
        .client
        .execute(
            "return document.getElementById('chunks-card').hidden;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(hidden, Value::Bool(true));

    browser.find("#chunk").await.click().await.unwrap();
    let tokens = browser.find("#chunk-tokens").await;
    tokens.clear().await.unwrap();
    tokens.send_keys("16").await.unwrap();
    pick_again(&browser, &path).await;
    wait_status(&browser, "Converted report.html").await;
    let title = browser.visible_text("#chunks-title").await;
    let chunks = texts(&browser, "#chunks .chunk pre").await;
    assert!(chunks.len() >= 2, "{chunks:?}");
    assert_eq!(title, format!("Chunks ({})", chunks.len()));
    assert!(chunks[0].starts_with("# Quarterly report"), "{chunks:?}");
    // Every chunk sits under the report's title; the table comes whole, as text, not markup.
    for path in texts(&browser, "#chunks .chunk-path").await {
        assert!(path.starts_with("Quarterly report"), "{path}");
    }
    assert!(
        chunks.iter().any(|c| c.contains("| Region | Sales |")),
        "{chunks:?}"
    );
    browser.close().await;
}
