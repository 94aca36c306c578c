//! Headless Chromium through chromedriver (Debian's `chromium` and `chromium-driver`), driven
//! with fantoccini. [`Browser::start`] launches a private chromedriver on a free port with a
//! fresh profile; the driver and the browser die with the value.
//!
//! When chromedriver is missing the browser tests are skipped with a message, except when
//! `HEARTH_BROWSER_TESTS=1` (set by `scripts/test.sh` and CI, which install Chromium): then a
//! missing browser fails the test.

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn required() -> bool {
    std::env::var("HEARTH_BROWSER_TESTS").is_ok_and(|v| v == "1")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// Starts a browser, or returns `None` (after saying why) when none is installed and
    /// `HEARTH_BROWSER_TESTS=1` is not set.
    pub async fn start() -> Option<Browser> {
        let driver_bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| CHROMEDRIVER.into());
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| CHROMIUM.into());
        if !std::path::Path::new(&driver_bin).exists() || !std::path::Path::new(&chromium).exists()
        {
            let msg = format!(
                "browser test needs {driver_bin} and {chromium} (apt-get install chromium chromium-driver; scripts/test.sh does)"
            );
            if required() {
                panic!("{msg}; HEARTH_BROWSER_TESTS=1 makes this a failure");
            }
            eprintln!("SKIPPED: {msg}");
            return None;
        }
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {driver_bin}: {e}"));
        let profile = tempfile::tempdir().unwrap();
        let webdriver = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while reqwest::get(format!("{webdriver}/status")).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not come up on port {port}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--user-data-dir={}", profile.path().display())])
        .collect::<Vec<_>>();
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
        });
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(caps.as_object().unwrap().clone());
        let client = builder
            .connect(&webdriver)
            .await
            .expect("new WebDriver session");
        Some(Browser {
            client,
            driver,
            _profile: profile,
        })
    }

    /// Waits (up to 15 s) for an element matching `css` to exist, and returns it.
    pub async fn find(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(15))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    /// Waits until `css` is displayed and returns its text.
    pub async fn visible_text(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let el = self.find(css).await;
            if el.is_displayed().await.unwrap_or(false) {
                return el.text().await.unwrap();
            }
            assert!(Instant::now() < deadline, "{css} never became visible");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Types into a field (after clearing it).
    pub async fn fill(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        el.clear().await.unwrap();
        el.send_keys(text).await.unwrap();
    }

    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap();
    }

    /// Waits until the page URL satisfies `pred`, returning it.
    pub async fn wait_for_url(&self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let url = self.client.current_url().await.unwrap().to_string();
            if pred(&url) {
                return url;
            }
            assert!(Instant::now() < deadline, "URL never matched; last {url}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
