//! Headless Chromium through chromedriver (Debian's `chromium` and `chromium-driver`), driven
//! with fantoccini. [`Browser::start`] launches a private chromedriver on a free port with a
//! fresh profile; the driver and the browser die with the value.
//!
//! When chromedriver is missing the browser tests are skipped with a message, except when
//! `HEARTH_BROWSER_TESTS=1` (set by `scripts/test.sh` and CI, which install Chromium): then a
//! missing browser fails the test.
//!
//! [`Browser::layout_problems`] is the layout check every page passes at [`DESKTOP`] and
//! [`PHONE`] sizes; [`Browser::save_screenshot`] keeps a picture of each for review.

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
/// Viewport sizes the pages are checked at, in CSS pixels: a laptop and a phone.
pub const DESKTOP: (u32, u32) = (1280, 900);
pub const PHONE: (u32, u32) = (390, 844);

/// Runs in the page and returns what is wrong with its layout, one line each. Controls are the
/// visible `a, button, input, select, textarea, label`; two overlap when any of their boxes
/// (one per line of an inline element) intersect by more than a pixel each way, unless one
/// holds the other (a label around its checkbox). A label, button or block link whose content
/// is wider or taller than its box is clipped; a control past the viewport's sides, or a page
/// that scrolls sideways, is cut off.
const LAYOUT_CHECK: &str = r##"
const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
  ' "' + (el.innerText || el.value || el.getAttribute("aria-label") || "").trim().slice(0, 30) + '"';
const shown = (el) => {
  const s = getComputedStyle(el);
  return s.visibility !== "hidden" && s.display !== "none" && +s.opacity > 0 &&
    [...el.getClientRects()].some((r) => r.width > 0 && r.height > 0);
};
const controls = [...document.querySelectorAll("a, button, input, select, textarea, label")].filter(shown);
const boxes = controls.map((el) => [...el.getClientRects()].filter((r) => r.width > 0 && r.height > 0));
const problems = [];
for (let i = 0; i < controls.length; i++) {
  for (let j = i + 1; j < controls.length; j++) {
    const [a, b] = [controls[i], controls[j]];
    if (a.contains(b) || b.contains(a)) continue;
    const hit = boxes[i].some((p) => boxes[j].some((q) =>
      Math.min(p.right, q.right) - Math.max(p.left, q.left) > 1 &&
      Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top) > 1));
    if (hit) problems.push("overlap: " + name(a) + " and " + name(b));
  }
}
const width = document.documentElement.clientWidth;
controls.forEach((el, i) => {
  const tag = el.tagName.toLowerCase();
  if (["label", "button", "a"].includes(tag) && getComputedStyle(el).display !== "inline" &&
      (el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1)) {
    problems.push("clipped: " + name(el) + " shows " + el.clientWidth + "x" + el.clientHeight +
      " of " + el.scrollWidth + "x" + el.scrollHeight);
  }
  if (boxes[i].some((r) => r.left < -1 || r.right > width + 1)) problems.push("cut off at the side: " + name(el));
});
if (document.documentElement.scrollWidth > width + 1) {
  problems.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + width);
}
return problems;
"##;
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

    /// Sizes the window so that the page's viewport is `width` x `height` CSS pixels.
    pub async fn set_viewport(&self, (width, height): (u32, u32)) {
        let want = [i64::from(width), i64::from(height)];
        let mut window = want;
        for _ in 0..3 {
            let [w, h] = window.map(|n| u32::try_from(n).unwrap());
            self.client.set_window_size(w, h).await.unwrap();
            let inner = self
                .client
                .execute("return [window.innerWidth, window.innerHeight];", vec![])
                .await
                .unwrap();
            let got = [0, 1].map(|i| inner[i].as_i64().unwrap());
            if got == want {
                return;
            }
            // The window is larger than its viewport (or has a minimum size): make up the difference.
            window = [0, 1].map(|i| window[i] + want[i] - got[i]);
        }
        panic!("the viewport never became {width}x{height}");
    }

    /// The page's layout problems ([`LAYOUT_CHECK`]); empty when none.
    pub async fn layout_problems(&self) -> Vec<String> {
        let found = self.client.execute(LAYOUT_CHECK, vec![]).await.unwrap();
        serde_json::from_value(found).unwrap()
    }

    /// Saves a PNG of the viewport as `<target dir>/screenshots/<name>.png` and prints where.
    pub async fn save_screenshot(&self, name: &str) -> std::path::PathBuf {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
        let dir = target.join("screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, self.client.screenshot().await.unwrap()).unwrap();
        println!("screenshot: {}", path.display());
        path
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
