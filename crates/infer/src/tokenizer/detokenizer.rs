//! Incremental detokenization.

use super::*;

/// Incremental detokenization: emits only complete UTF-8 text. It decodes a small window of
/// recent ids and emits what the newest id added to that window's text, so the pieces
/// concatenate to `decode(all ids)` for byte-level BPE and SentencePiece alike.
pub struct Detokenizer {
    pub(super) tok: Arc<TextTokenizer>,
    pub(super) ids: Vec<u32>,
    /// Start of the window decoded for context.
    pub(super) prefix_offset: usize,
    /// End of what has been emitted.
    pub(super) read_offset: usize,
}

impl Detokenizer {
    /// Adds one id; returns the new text once it forms complete characters.
    pub fn push(&mut self, id: u32) -> Option<String> {
        self.ids.push(id);
        self.flush(false)
    }

    /// Returns whatever is still held back (an incomplete character decodes to U+FFFD).
    pub fn finish(&mut self) -> Option<String> {
        self.flush(true)
    }

    fn flush(&mut self, force: bool) -> Option<String> {
        if self.read_offset >= self.ids.len() {
            return None;
        }
        let prefix = self
            .tok
            .decode(&self.ids[self.prefix_offset..self.read_offset])
            .ok()?;
        let full = self.tok.decode(&self.ids[self.prefix_offset..]).ok()?;
        if !force && full.ends_with('\u{FFFD}') {
            return None; // an incomplete UTF-8 sequence: wait for its remaining bytes
        }
        let new = match full.strip_prefix(prefix.as_str()) {
            Some(rest) => rest.to_string(),
            None => full.get(prefix.len()..).unwrap_or_default().to_string(),
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        if new.is_empty() {
            None
        } else {
            Some(new)
        }
    }
}
