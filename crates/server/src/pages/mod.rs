//! Server-rendered web pages, one product: every page is a fragment of its own markup and script
//! that [`render`] wraps in the same shell: the head with the one stylesheet (`hearth.css`), the
//! header that links the running services' pages and shows who is signed in and their balance,
//! and the shell script (`shell.js`) the page scripts build on. Values from the server go in
//! escaped, through [`escape_html`] or a JSON island ([`json_island`]); icons are inline SVG.

use serde_json::{json, Value};

use crate::service::Service;
use crate::state::AppState;

/// The one stylesheet, inlined in every page's head.
const CSS: &str = include_str!("hearth.css");

/// The shell script, inlined before the page's own script. It defines `hearth`: the service
/// token kept for the tab (taken from the fragment the sign-in page sends back), the header's
/// account line and balance, and sign-in and sign-out.
const SHELL_JS: &str = include_str!("shell.js");

/// The brand mark (a flame), drawn in the header.
const FLAME: &str = r#"<svg viewBox="0 0 24 24" aria-hidden="true"><path fill="currentColor" d="M12 2c.6 3.4 5.5 5.6 5.5 11.3A5.5 5.5 0 0 1 6.5 13.3c0-2.6 1.4-4.5 2.6-5.8.1 1.9.9 3.2 2.1 3.7-.4-3.2.2-6.4.8-9.2z"/></svg>"#;

/// One page: what differs from page to page.
pub struct Page<'a> {
    /// Heading and `<title>` (before " · Hearth").
    pub title: &'a str,
    /// The service whose page it is: its header link is marked current.
    pub service: Service,
    /// The page's own markup and `<script>`, from the binary (not escaped).
    pub body: &'a str,
    /// What the page's script reads from `#page-config`.
    pub config: Value,
}

/// What the header knows of the server.
pub struct Shell {
    /// The running services and their page URLs, in header order.
    pub links: Vec<(Service, String)>,
    /// Base URL of the auth service, when there is one to sign in at.
    pub auth: Option<String>,
}

impl Shell {
    pub fn of(state: &AppState) -> Shell {
        let config = &state.config;
        let runs = |s: &Service| config.services.contains(s);
        // The header's links, in `Service::ALL`'s order; a link appears when its service runs here.
        let links = Service::ALL
            .into_iter()
            .filter(runs)
            .map(|s| (s, state.urls.ui(s)))
            .collect();
        // A separately run auth service counts when its address is configured.
        let auth = (runs(&Service::Auth) || config.auth.public_url.is_some())
            .then(|| state.urls.get(Service::Auth).to_string());
        Shell { links, auth }
    }

    /// The whole document: shell around the page.
    pub fn render(&self, page: Page<'_>) -> String {
        let nav: String = self
            .links
            .iter()
            .map(|(s, url)| {
                let name = s.facts().nav_label;
                let current = if *s == page.service {
                    " aria-current=\"page\""
                } else {
                    ""
                };
                let url = escape_html(url);
                format!(
                    "<a href=\"{url}\" data-href=\"{url}\" data-service=\"{}\"{current}>{name}</a>",
                    s.name()
                )
            })
            .collect();
        let shell = json!({
            "service": page.service.name(),
            "authUi": self.auth.as_ref().map(|a| format!("{a}/ui")),
            "balanceUrl": self.auth.as_ref().map(|a| format!("{a}/balance")),
        });
        let title = escape_html(page.title);
        format!(
            r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Hearth</title>
<style>{CSS}</style>
</head>
<body>
<header class="top"><div class="bar">
  <span class="brand">{FLAME}Hearth</span>
  <nav class="services" aria-label="Services">{nav}</nav>
  <div class="account"><span id="who"></span><span id="account-balance" hidden>balance <span id="balance">—</span></span></div>
  <button type="button" class="quiet" id="signout" hidden>Sign out</button>
</div></header>
<script type="application/json" id="hearth-shell">{shell}</script>
<script>{SHELL_JS}</script>
<script type="application/json" id="page-config">{config}</script>
<main class="page-{service}">
<h1>{title}</h1>
{body}
</main>
</body>
</html>"#,
            shell = json_island(&shell),
            service = page.service.name(),
            body = page.body,
            config = json_island(&page.config),
        )
    }
}

/// A page in the shell of `state`'s server.
pub fn render(state: &AppState, page: Page<'_>) -> String {
    Shell::of(state).render(page)
}

/// Escapes text for HTML element content and attribute values.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON safe to place inside `<script type="application/json">`: no `<`, `>` or `&` survive.
pub fn json_island(value: &Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The sign-in page's own markup and script. `accepted`: the callback sign-in will redirect to;
/// `refused`: a callback that was not allowed, and why.
pub fn auth_body(accepted: Option<&str>, refused: Option<(&str, &str)>) -> String {
    let notice = match (accepted, refused) {
        (Some(cb), _) => format!(
            "<p class=\"notice ok\" id=\"callback-notice\">After signing in you will be sent to <code>{}</code>.</p>",
            escape_html(cb)
        ),
        (None, Some((cb, why))) => format!(
            "<p class=\"notice refused\" id=\"callback-refused\">The requested return address <code>{}</code> was refused: {}. \
             You can still sign in here and copy your token; ask the operator to add the origin to \
             <code>[auth] callback_origins</code> if it should be trusted.</p>",
            escape_html(cb),
            escape_html(why)
        ),
        (None, None) => String::new(),
    };
    include_str!("auth.html").replace("{{NOTICE}}", &notice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell() -> Shell {
        Shell {
            links: vec![
                (Service::Auth, "http://a:1/ui".into()),
                (Service::Markdown, "http://m:3/ui".into()),
            ],
            auth: Some("http://a:1".into()),
        }
    }

    #[test]
    fn hostile_callback_text_is_escaped_on_the_page() {
        let body = auth_body(
            None,
            Some(("https://x/\"><script>alert(1)</script>", "nope")),
        );
        assert!(!body.contains("<script>alert(1)"));
        assert!(body.contains("&lt;script&gt;"));
    }

    #[test]
    fn json_island_cannot_close_its_script_tag() {
        let s = json_island(&json!({ "a": "</script><b>" }));
        assert!(!s.contains("</script>"));
    }

    #[test]
    fn every_page_gets_the_one_stylesheet_and_a_header_of_the_running_services() {
        let page = shell().render(Page {
            title: "Documents <&>",
            service: Service::Markdown,
            body: "<p id=\"mine\">hi</p>",
            config: json!({ "x": "</script>" }),
        });
        assert!(page.contains(CSS) && page.contains("<p id=\"mine\">hi</p>"));
        assert!(page.contains("<title>Documents &lt;&amp;&gt; · Hearth</title>"));
        assert!(page.contains(
            "<a href=\"http://m:3/ui\" data-href=\"http://m:3/ui\" data-service=\"markdown\" aria-current=\"page\">Documents</a>"
        ));
        assert!(page.contains("data-service=\"auth\">Account</a>"));
        assert!(!page.contains("data-service=\"completion\""));
        assert!(page.contains("\"balanceUrl\":\"http://a:1/balance\""));
        assert!(
            page.contains("{\"x\":\"\\u003c/script\\u003e\"}"),
            "the island stays closed"
        );
    }

    #[test]
    fn the_pages_draw_their_icons_and_use_no_emoji() {
        let sources = [
            CSS,
            SHELL_JS,
            FLAME,
            include_str!("auth.html"),
            include_str!("../services/completion/chat.html"),
            include_str!("../services/markdown/markdown.html"),
            include_str!("../services/imagine/imagine.html"),
        ];
        for source in sources {
            let emoji = source
                .chars()
                .find(|&c| matches!(c as u32, 0x1F000..=0x1FAFF | 0x2600..=0x27BF | 0xFE0F));
            assert_eq!(emoji, None, "an emoji the default fonts may lack");
        }
        assert!(include_str!("../services/imagine/imagine.html").contains("<svg"));
    }
}
