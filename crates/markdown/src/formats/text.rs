//! Plain text and Markdown: decoded with charset detection, otherwise passed through.

/// Plain text: decoded, line endings normalised, nothing escaped (text is valid Markdown and
/// escaping would change what a reader or a model sees).
pub fn plain(bytes: &[u8]) -> String {
    normalise(&crate::text::decode(bytes))
}

/// Markdown: decoded and passed through as is.
pub fn markdown(bytes: &[u8]) -> String {
    normalise(&crate::text::decode(bytes))
}

fn normalise(text: &str) -> String {
    text.trim_start_matches('\u{feff}')
        .replace("\r\n", "\n")
        .replace('\r', "\n")
}
