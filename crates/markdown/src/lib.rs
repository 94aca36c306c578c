//! Document bytes to Markdown: one converter per format and a registry that sniffs content. No HTTP.
