//! Tokenizer + chat template of one model, and incremental detokenization.
//!
//! The tokenizer comes from a `tokenizer.json` when there is one, otherwise it is rebuilt from the
//! GGUF metadata (`tokenizer.ggml.*`) with the `tokenizers` crate:
//! - `gpt2` (byte-level BPE): vocabulary + merges; `tokenizer.ggml.pre` picks the pre-tokenizer
//!   split (e.g. `smollm` splits digits one by one before the GPT-2 regex);
//! - `llama` (SentencePiece BPE): vocabulary + scores; merges are derived from the scores (a
//!   pair merges earlier when the token it makes scores higher), spaces become `▁`, unknown bytes
//!   fall back to `<0xNN>` tokens.
//!
//! Control tokens become special added tokens, so `<|im_start|>` in rendered template text
//! encodes to its id.

use std::path::Path;
use std::sync::Arc;

use hearth_types::ChatMessage;
use tokenizers::Tokenizer;

use crate::gguf::Meta;
use crate::template::ChatTemplate;
use crate::Error;

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_NORMAL: i32 = 1;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// End-of-turn markers of common chat templates; one that both exists as a token and appears in
/// the template source stops generation.
const END_OF_TURN_MARKERS: &[&str] = &[
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|end|>",
    "<|eom_id|>",
];

/// The GPT-2 pre-tokenizer regex (as llama.cpp writes it for most BPE vocabularies).
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tokenizer + chat template + stop tokens of one model. `Send + Sync`; share it through `Arc`.
pub struct TextTokenizer {
    inner: Tokenizer,
    template: ChatTemplate,
    bos_id: Option<u32>,
    add_bos: bool,
    eos_id: Option<u32>,
    stop_ids: Vec<u32>,
    /// How vocabulary strings spell bytes (see [`TextTokenizer::token_bytes`]).
    format: TokenFormat,
    /// Added tokens (plain text, not vocabulary spelling) by id, with whether each is special.
    added: Vec<(u32, bool)>,
    /// `inner` reading special tokens' spellings as text ([`TextTokenizer::encode_literal`]),
    /// made when first asked for.
    literal: std::sync::OnceLock<Tokenizer>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("add_bos", &self.add_bos)
            .field("stop_ids", &self.stop_ids)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// What the tokenizer needs besides the `tokenizers::Tokenizer` itself.
pub(crate) struct TokenizerParts {
    pub inner: Tokenizer,
    pub template_source: String,
    pub bos_id: Option<u32>,
    pub add_bos: bool,
    pub eos_id: Option<u32>,
    pub extra_stop_ids: Vec<u32>,
}

impl TextTokenizer {
    pub(crate) fn from_parts(parts: TokenizerParts) -> Result<Self, Error> {
        let TokenizerParts {
            inner,
            template_source,
            bos_id,
            add_bos,
            eos_id,
            extra_stop_ids,
        } = parts;
        let token_text =
            |id: Option<u32>| id.and_then(|i| inner.id_to_token(i)).unwrap_or_default();
        let template =
            ChatTemplate::new(&template_source, &token_text(bos_id), &token_text(eos_id))?;
        let mut stop_ids: Vec<u32> = eos_id.into_iter().chain(extra_stop_ids).collect();
        for marker in END_OF_TURN_MARKERS {
            if template_source.contains(marker) {
                if let Some(id) = inner.token_to_id(marker) {
                    stop_ids.push(id);
                }
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let format = TokenFormat::of(&inner);
        let mut added: Vec<(u32, bool)> = inner
            .get_added_vocabulary()
            .get_added_tokens_decoder()
            .iter()
            .map(|(&id, token)| (id, token.special))
            .collect();
        added.sort_unstable();
        Ok(TextTokenizer {
            inner,
            template,
            bos_id,
            add_bos,
            eos_id,
            stop_ids,
            format,
            added,
            literal: std::sync::OnceLock::new(),
        })
    }

    /// The tokenizer of a GGUF file, read from its metadata alone (no tensor is loaded).
    pub fn from_gguf_file(path: &Path) -> Result<TextTokenizer, Error> {
        Self::from_gguf_file_with_template(path, None)
    }

    /// [`Self::from_gguf_file`] with `chat_template` (Jinja source) in place of the file's own
    /// when given, as `TextModelConfig::chat_template` overrides it.
    pub fn from_gguf_file_with_template(
        path: &Path,
        chat_template: Option<&str>,
    ) -> Result<TextTokenizer, Error> {
        let file = crate::gguf::GgufFile::open(path)?;
        from_gguf(&file.content, chat_template)
    }

    /// Renders the chat template with `add_generation_prompt = true`.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, Error> {
        self.template.render(messages, None, true)
    }

    /// Renders a conversation that offers `tools` (OpenAI's `[{type: "function", function:
    /// {name, description, parameters}}]`) with `add_generation_prompt = true`: through the
    /// model's own template where it renders tools, otherwise with the tools described in the
    /// system message and calls and results written in the `<tool_call>` format
    /// ([`crate::tool_calls`]).
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &serde_json::Value,
    ) -> Result<String, Error> {
        if self.template.knows_tools() {
            self.template.render(messages, Some(tools), true)
        } else {
            let folded = crate::tool_calls::fold_into_messages(messages, tools);
            self.template.render(&folded, None, true)
        }
    }

    /// Renders the chat template with an explicit `add_generation_prompt`.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.template.render(messages, None, add_generation_prompt)
    }

    /// Encodes rendered template text: special tokens in the text become their ids; BOS is
    /// added only when the model wants one and the text does not already start with it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(Error::tokenizer)?;
        let ids = enc.get_ids();
        match self.bos_id {
            Some(bos) if self.add_bos && ids.first() != Some(&bos) => {
                let mut out = Vec::with_capacity(ids.len() + 1);
                out.push(bos);
                out.extend_from_slice(ids);
                Ok(out)
            }
            _ => Ok(ids.to_vec()),
        }
    }

    /// Encodes text as it is: no BOS is added (special tokens written in the text still become
    /// their ids).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, Error> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(Error::tokenizer)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encodes text as plain text: a special token's spelling in it stays text (as llama.cpp
    /// tokenizes without parsing specials), and no BOS is added.
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>, Error> {
        let literal = self.literal.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let enc = literal.encode_fast(text, false).map_err(Error::tokenizer)?;
        Ok(enc.get_ids().to_vec())
    }

    /// The BOS id when the model wants one at the start of a text.
    pub fn bos_to_add(&self) -> Option<u32> {
        self.bos_id.filter(|_| self.add_bos)
    }

    /// The exact bytes of token `id` (empty for an unknown id): byte-level BPE's characters and
    /// SentencePiece's `▁` and `<0xNN>` pieces turned back into the bytes they stand for; an
    /// added token's text as it is (a special token's included, e.g. `<|im_end|>`).
    /// Concatenated over `encode_plain(text)`, they give `text`'s bytes.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
        if self.added.binary_search_by_key(&id, |&(t, _)| t).is_ok() {
            return piece.into_bytes();
        }
        self.format.bytes(&piece)
    }

    /// Where `other` reads ids differently from this tokenizer, if anywhere among the ids both
    /// have: the first id whose bytes or special-ness differ, described. A draft model must
    /// speak its target's ids; ids only one of them has (a padded vocabulary) are not compared.
    pub fn id_mismatch(&self, other: &TextTokenizer) -> Option<String> {
        let shared = self.vocab_size().min(other.vocab_size()) as u32;
        let id = (0..shared).find(|&id| {
            self.token_bytes(id) != other.token_bytes(id)
                || self.is_special(id) != other.is_special(id)
        })?;
        Some(format!(
            "token {id} is {:?} in one vocabulary and {:?} in the other",
            String::from_utf8_lossy(&self.token_bytes(id)),
            String::from_utf8_lossy(&other.token_bytes(id))
        ))
    }

    /// True for special (control) tokens: `decode` leaves them out, grammars never produce them.
    pub fn is_special(&self, id: u32) -> bool {
        self.added
            .binary_search_by_key(&id, |&(t, _)| t)
            .is_ok_and(|i| self.added[i].1)
    }

    /// Decodes ids to text, leaving out special (control) tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String, Error> {
        self.inner.decode(ids, true).map_err(Error::tokenizer)
    }

    /// True for EOS and the template's end-of-turn tokens.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.binary_search(&id).is_ok()
    }

    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The chat template's Jinja source.
    pub fn chat_template(&self) -> &str {
        self.template.source()
    }

    pub fn detokenizer(self: &Arc<Self>) -> Detokenizer {
        Detokenizer {
            tok: Arc::clone(self),
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }
}

mod bytes;
mod detokenizer;
mod gguf;

use bytes::TokenFormat;
pub use detokenizer::Detokenizer;
pub(crate) use gguf::*;

/// Loads `tokenizer.json` (+ `tokenizer_config.json` beside it for the template and BOS/EOS).
pub(crate) fn from_files(
    tokenizer_json: &Path,
    template_override: Option<&str>,
) -> Result<TextTokenizer, Error> {
    if !tokenizer_json.exists() {
        return Err(Error::Io {
            path: tokenizer_json.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no tokenizer.json"),
        });
    }
    let inner = Tokenizer::from_file(tokenizer_json)
        .map_err(|e| Error::Tokenizer(format!("{}: {e}", tokenizer_json.display())))?;
    let config_path = tokenizer_json.with_file_name("tokenizer_config.json");
    let config: serde_json::Value = match std::fs::read_to_string(&config_path) {
        Ok(s) => serde_json::from_str(&s)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", config_path.display())))?,
        Err(_) => serde_json::Value::Null,
    };
    // tokenizer_config.json names tokens either as strings or as {"content": ...} objects.
    let token_field = |key: &str| -> Option<u32> {
        let v = config.get(key)?;
        let s = v
            .as_str()
            .or_else(|| v.get("content").and_then(|c| c.as_str()))?;
        inner.token_to_id(s)
    };
    let bos_id = token_field("bos_token");
    let eos_id = token_field("eos_token");
    let add_bos = config
        .get("add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let template_source = match template_override {
        Some(t) => t.to_string(),
        None => match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            // A list of named templates: take "default".
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template").and_then(|s| s.as_str()))
                .unwrap_or(crate::template::CHATML_TEMPLATE)
                .to_string(),
            _ => crate::template::CHATML_TEMPLATE.to_string(),
        },
    };
    TextTokenizer::from_parts(TokenizerParts {
        inner,
        template_source,
        bos_id,
        add_bos,
        eos_id,
        extra_stop_ids: Vec::new(),
    })
}

/// GPT-2's reversible byte -> printable char map used by byte-level BPE vocabularies.
pub(crate) fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// The tiny test model's tokenizer: a real byte-level BPE with all 256 bytes, merges for a few
/// common English words, and ChatML control tokens (ids 0..3: `<|endoftext|>` = EOS,
/// `<|im_start|>`, `<|im_end|>`).
pub(crate) fn tiny() -> TextTokenizer {
    TextTokenizer::from_parts(TokenizerParts {
        inner: tiny_inner(),
        template_source: crate::template::CHATML_TEMPLATE.to_string(),
        bos_id: None,
        add_bos: false,
        eos_id: Some(0),
        extra_stop_ids: Vec::new(),
    })
    .expect("the ChatML template compiles")
}

pub(crate) fn tiny_inner() -> Tokenizer {
    const WORDS: &[&str] = &[
        "the",
        "and",
        "you",
        "that",
        "is",
        "in",
        "of",
        "to",
        "it",
        "hello",
        "world",
        "what",
        "how",
        "are",
        "user",
        "assistant",
        "system",
        "can",
        "help",
        "with",
        "today",
        "this",
        "for",
        "on",
        "be",
        "a",
        "I",
        "model",
    ];
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![TOKEN_TYPE_CONTROL; 3];
    for b in 0..=255u8 {
        tokens.push(byte_to_char(b).to_string());
        types.push(TOKEN_TYPE_NORMAL);
    }
    let mut merges: Vec<(String, String)> = Vec::new();
    let mut known: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    for word in WORDS {
        for form in [word.to_string(), format!("{}{word}", byte_to_char(b' '))] {
            let chars: Vec<String> = form.chars().map(|c| c.to_string()).collect();
            let mut acc = chars[0].clone();
            for c in &chars[1..] {
                let merged = format!("{acc}{c}");
                if known.insert(merged.clone()) {
                    merges.push((acc.clone(), c.clone()));
                    tokens.push(merged.clone());
                    types.push(TOKEN_TYPE_NORMAL);
                }
                acc = merged;
            }
        }
    }
    byte_level_bpe(&tokens, &types, merges, "smollm").expect("the tiny tokenizer is well-formed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_types::Role;

    const SAMPLES: &[&str] = &[
        "Hello world",
        "  leading and trailing spaces  ",
        "tabs\tand\nnew\n\nlines\r\n",
        "Accents: café, naïve, Ærøskøbing, façade",
        "Emoji: 🦀🔥👩‍👩‍👧 ok",
        "CJK: 你好，世界。こんにちは 안녕하세요",
        "digits 1234567890 and 3.14159",
        "",
    ];

    #[test]
    fn tiny_tokenizer_round_trips_unicode_text() {
        let tok = tiny();
        for s in SAMPLES {
            let ids = tok.encode(s).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), *s, "ids {ids:?}");
        }
    }

    #[test]
    fn control_tokens_in_text_become_their_ids_and_digits_split_one_by_one() {
        let tok = tiny();
        let ids = tok.encode("<|im_start|>user\nhello 42<|im_end|>").unwrap();
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(ids.last(), Some(&2));
        let four = tok.token_to_id("4").unwrap();
        let two = tok.token_to_id("2").unwrap();
        assert!(ids.windows(2).any(|w| w == [four, two]), "{ids:?}");
        assert!(ids.contains(&tok.token_to_id("hello").unwrap()));
        assert_eq!(
            tok.encode("hello").unwrap(),
            vec![tok.token_to_id("hello").unwrap()]
        );
    }

    #[test]
    fn stop_tokens_are_eos_and_the_templates_end_of_turn() {
        let tok = tiny();
        assert!(tok.is_stop(0));
        assert!(tok.is_stop(2));
        assert!(!tok.is_stop(1));
        assert!(!tok.is_stop(tok.token_to_id("a").unwrap()));
    }

    #[test]
    fn detokenizer_pieces_concatenate_to_the_full_decode() {
        let tok = Arc::new(tiny());
        for s in SAMPLES {
            let ids = tok.encode(s).unwrap();
            let mut d = tok.detokenizer();
            let mut out = String::new();
            for &id in &ids {
                if let Some(piece) = d.push(id) {
                    assert!(
                        !piece.contains('\u{FFFD}'),
                        "emitted a partial character for {s:?}"
                    );
                    out.push_str(&piece);
                }
            }
            out.extend(d.finish());
            assert_eq!(out, tok.decode(&ids).unwrap());
        }
    }

    #[test]
    fn chat_template_renders_and_encodes_with_control_ids() {
        let tok = tiny();
        let text = tok
            .apply_chat_template(&[ChatMessage::new(Role::User, "hello")])
            .unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"));
        let ids = tok.encode(&text).unwrap();
        assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 2);
    }

    #[test]
    fn byte_map_is_a_bijection() {
        let set: std::collections::HashSet<char> = (0..=255u8).map(byte_to_char).collect();
        assert_eq!(set.len(), 256);
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
    }
}
