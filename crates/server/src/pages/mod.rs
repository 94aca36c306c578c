//! Server-rendered web pages. Each page is one HTML file with its own small script; values from
//! the server go in escaped, through [`escape_html`] or a JSON island ([`json_island`]).

/// Stylesheet shared by every page (`<style>` in the head).
pub const BASE_CSS: &str = include_str!("base.css");

/// Sign-in script shared by the service pages, inlined where a page says `__SIGNIN_JS__`: takes
/// the token the auth page sends back, keeps it for the tab, shows who is signed in.
pub const SIGNIN_JS: &str = include_str!("signin.js");

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
pub fn json_island(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The sign-in page. `accepted`: the callback sign-in will redirect to; `refused`: a callback
/// that was not allowed, and why.
pub fn auth_page(
    config: &serde_json::Value,
    accepted: Option<&str>,
    refused: Option<(&str, &str)>,
) -> String {
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
    include_str!("auth.html")
        .replace("{{CSS}}", BASE_CSS)
        .replace("{{NOTICE}}", &notice)
        .replace("{{CONFIG}}", &json_island(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_callback_text_is_escaped_on_the_page() {
        let page = auth_page(
            &serde_json::json!({}),
            None,
            Some(("https://x/\"><script>alert(1)</script>", "nope")),
        );
        assert!(!page.contains("<script>alert(1)"));
        assert!(page.contains("&lt;script&gt;"));
    }

    #[test]
    fn json_island_cannot_close_its_script_tag() {
        let s = json_island(&serde_json::json!({ "a": "</script><b>" }));
        assert!(!s.contains("</script>"));
    }
}
