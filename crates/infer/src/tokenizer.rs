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

use candle_core::quantized::gguf_file;
use hearth_types::ChatMessage;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
    Tokenizer,
};

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
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("add_bos", &self.add_bos)
            .field("stop_ids", &self.stop_ids)
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
        Ok(TextTokenizer {
            inner,
            template,
            bos_id,
            add_bos,
            eos_id,
            stop_ids,
        })
    }

    /// Renders the chat template with `add_generation_prompt = true`.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, Error> {
        self.template.render(messages, true)
    }

    /// Renders the chat template with an explicit `add_generation_prompt`.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.template.render(messages, add_generation_prompt)
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

/// Incremental detokenization: emits only complete UTF-8 text. It decodes a small window of
/// recent ids and emits what the newest id added to that window's text, so the pieces
/// concatenate to `decode(all ids)` for byte-level BPE and SentencePiece alike.
pub struct Detokenizer {
    tok: Arc<TextTokenizer>,
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_offset: usize,
    /// End of what has been emitted.
    read_offset: usize,
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

// ---- construction --------------------------------------------------------------------------

fn special_added_tokens(tokens: &[String], types: &[i32]) -> Vec<AddedToken> {
    tokens
        .iter()
        .zip(types)
        .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
        .filter(|(s, _)| !s.is_empty())
        .map(|(s, &t)| AddedToken::from(s.clone(), t == TOKEN_TYPE_CONTROL).normalized(false))
        .collect()
}

fn split_regex(pattern: &str) -> Result<PreTokenizerWrapper, Error> {
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(Error::tokenizer)?;
    Ok(split.into())
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value.
fn byte_level_pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, Error> {
    let byte_level_no_regex: PreTokenizerWrapper = ByteLevel::new(false, true, false).into();
    Ok(match pre {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            PreSequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into()
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" => {
            PreSequence::new(vec![split_regex(LLAMA3_REGEX)?, byte_level_no_regex]).into()
        }
        "qwen2" | "deepseek-r1-qwen" | "qwen35" => {
            PreSequence::new(vec![split_regex(QWEN2_REGEX)?, byte_level_no_regex]).into()
        }
        "default" | "gpt2" | "gpt-2" | "" => {
            PreSequence::new(vec![split_regex(GPT2_REGEX)?, byte_level_no_regex]).into()
        }
        other => {
            tracing::warn!(
                pre = other,
                "unknown tokenizer.ggml.pre, using the GPT-2 split"
            );
            PreSequence::new(vec![split_regex(GPT2_REGEX)?, byte_level_no_regex]).into()
        }
    })
}

/// Byte-level BPE from a vocabulary (in byte-level form, e.g. `Ġthe`) and merges.
pub(crate) fn byte_level_bpe(
    tokens: &[String],
    types: &[i32],
    merges: Vec<(String, String)>,
    pre: &str,
) -> Result<Tokenizer, Error> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(Error::tokenizer)?;
    let mut tk = Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(byte_level_pre_tokenizer(pre)?));
    tk.with_decoder(Some(ByteLevel::new(false, true, true)));
    tk.add_special_tokens(&special_added_tokens(tokens, types));
    Ok(tk)
}

/// SentencePiece-style BPE (GGUF `llama` model) from tokens and scores.
fn sentencepiece_bpe(
    tokens: &[String],
    types: &[i32],
    scores: &[f32],
    unk_id: Option<u32>,
    add_space_prefix: bool,
) -> Result<Tokenizer, Error> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    // Every normal token that splits into two vocabulary tokens gives a merge, ranked by the
    // merged token's score (higher first), as SentencePiece's BPE picks the best-scoring pair.
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if types.get(id).copied().unwrap_or(TOKEN_TYPE_NORMAL) != TOKEN_TYPE_NORMAL
            || tok.chars().count() < 2
        {
            continue;
        }
        for (split, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(split);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                ranked.push((scores.get(id).copied().unwrap_or(0.0), id as u32, li, ri));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let merges: Vec<(String, String)> = ranked
        .iter()
        .map(|&(_, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk_id.and_then(|u| tokens.get(u as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let bpe = builder.build().map_err(Error::tokenizer)?;
    let mut tk = Tokenizer::new(bpe);
    let replace: NormalizerWrapper = Replace::new(" ", "▁").map_err(Error::tokenizer)?.into();
    if add_space_prefix {
        tk.with_normalizer(Some(tokenizers::normalizers::Sequence::new(vec![
            Prepend::new("▁".to_string()).into(),
            replace,
        ])));
    } else {
        tk.with_normalizer(Some(replace));
    }
    let mut decoders: Vec<DecoderWrapper> = vec![
        tokenizers::normalizers::Replace::new("▁", " ")
            .map_err(Error::tokenizer)?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tk.with_decoder(Some(DecoderSequence::new(decoders)));
    tk.add_special_tokens(&special_added_tokens(tokens, types));
    Ok(tk)
}

/// Builds the tokenizer from GGUF metadata. `template_override` wins over the file's template.
pub(crate) fn from_gguf(
    content: &gguf_file::Content,
    template_override: Option<&str>,
) -> Result<TextTokenizer, Error> {
    let meta = Meta(content);
    let model = meta.string("tokenizer.ggml.model")?;
    let tokens = meta.string_array("tokenizer.ggml.tokens")?;
    let types = meta
        .opt_i32_array("tokenizer.ggml.token_type")?
        .unwrap_or_else(|| vec![TOKEN_TYPE_NORMAL; tokens.len()]);
    let bos_id = meta.opt_u32("tokenizer.ggml.bos_token_id")?;
    let eos_id = meta.opt_u32("tokenizer.ggml.eos_token_id")?;
    let eot_id = meta.opt_u32("tokenizer.ggml.eot_token_id")?;
    let unk_id = meta.opt_u32("tokenizer.ggml.unknown_token_id")?;
    let (inner, default_add_bos) = match model.as_str() {
        "gpt2" => {
            let merges = meta
                .string_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(|m| match m.split_once(' ') {
                    Some((a, b)) => Ok((a.to_string(), b.to_string())),
                    None => Err(Error::metadata(
                        "tokenizer.ggml.merges",
                        format!("merge {m:?} has no space"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let pre = meta.opt_string("tokenizer.ggml.pre")?.unwrap_or_default();
            (byte_level_bpe(&tokens, &types, merges, &pre)?, false)
        }
        "llama" => {
            let scores = meta
                .opt_f32_array("tokenizer.ggml.scores")?
                .unwrap_or_default();
            let add_space_prefix = meta
                .opt_bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(true);
            (
                sentencepiece_bpe(&tokens, &types, &scores, unk_id, add_space_prefix)?,
                true,
            )
        }
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported GGUF tokenizer model {other:?} (gpt2 and llama are)"
            )))
        }
    };
    let add_bos = meta
        .opt_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(default_add_bos);
    let template_source = match template_override {
        Some(t) => t.to_string(),
        None => meta
            .opt_string("tokenizer.chat_template")?
            .unwrap_or_else(|| {
                tracing::warn!("the model has no chat template; using ChatML");
                crate::template::CHATML_TEMPLATE.to_string()
            }),
    };
    TextTokenizer::from_parts(TokenizerParts {
        inner,
        template_source,
        bos_id,
        add_bos,
        eos_id,
        extra_stop_ids: eot_id.into_iter().collect(),
    })
}

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
