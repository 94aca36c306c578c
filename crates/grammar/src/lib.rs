//! Constrained decoding for Hearth: JSON schemas, "any JSON object" and Lark grammars compiled
//! with [llguidance](https://github.com/guidance-ai/llguidance) into per-sequence
//! [`TokenConstraint`]s that the engine asks for a token mask each step.
//!
//! [`Grammars`] is built once per model: it turns the tokenizer into llguidance's token trie
//! (every id's exact bytes, special tokens marked, the model's stop tokens as end of sequence).
//! Each request then compiles its schema or grammar into a constraint of its own. Schemas and
//! grammars are untrusted input: compilation and every mask run under [`ParserLimits`] that
//! refuse a huge or pathological grammar quickly and bound the memory and time of each step, and
//! a panic inside llguidance becomes an error of that one request.
//!
//! Deliberately absent: HTTP and the wire format of `response_format`/tools (the server maps
//! [`GrammarError`] to a 400), sampling (hearth-infer applies the mask), scheduling.

use std::sync::Arc;

use hearth_infer::{ConstraintError, TextTokenizer, TokenConstraint, TokenMask};
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;

/// The longest error message passed on (llguidance's can quote a whole grammar).
const MAX_MESSAGE: usize = 400;
/// The deepest nesting of a schema (objects and arrays) or of a Lark grammar's brackets.
/// llguidance compiles both recursively, and a stack overflow cannot be caught; real schemas
/// nest a few levels, and the server's JSON parser stops at 128 anyway.
pub const MAX_DEPTH: usize = 100;
/// The most JSON values (objects, arrays, strings, numbers...) a schema may hold. llguidance's
/// grammar-size limit would refuse a bigger one too, but only after seconds of building it.
pub const MAX_SCHEMA_VALUES: usize = 50_000;

/// Why a schema or grammar cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The model's tokenizer cannot be turned into a token table (a model problem).
    #[error("the tokenizer cannot drive grammars: {0}")]
    Tokenizer(String),
    /// The schema or grammar does not compile, uses something unsupported, or is over the
    /// limits. The message is meant for the client (an HTTP 400).
    #[error("{0}")]
    Invalid(String),
}

impl GrammarError {
    /// True when the request is at fault (not the model).
    pub fn is_client_error(&self) -> bool {
        matches!(self, GrammarError::Invalid(_))
    }
}

/// The budgets every schema and grammar runs under. llguidance's defaults are sized for large
/// GPUs serving one grammar per sequence; the mask is computed on the engine thread here, so a
/// step's budget is a few milliseconds and a grammar's lexer a few tens of megabytes.
pub fn limits() -> ParserLimits {
    ParserLimits {
        // Earley items per row: the grammar's branching.
        max_items_in_row: 2_000,
        // Building the lexer's regexes at compile time (about 50k per ms): ~20 ms.
        initial_lexer_fuel: 1_000_000,
        // Lexer work for one mask (about 14k per ms): ~7 ms.
        step_lexer_fuel: 100_000,
        // Earley items for one mask (about 20k per ms): ~1 ms.
        step_max_items: 25_000,
        // Lexer states (1-2 kB each): ~25-50 MB per sequence at most.
        max_lexer_states: 25_000,
        // Symbols in the grammar's productions (a few MB of schema JSON at the default 500k).
        max_grammar_size: 200_000,
        precompute_large_lexemes: true,
        // Errors go to clients: no parser state or grammar dump in them.
        verbose_errors: false,
    }
}

/// How generated JSON is laid out: `", "` and `": "` between items, no other whitespace, so a
/// model cannot spend its tokens on blank lines.
fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    }
}

/// llguidance's view of our tokenizer: the trie of every token's bytes. Tokenizing is greedy
/// over the trie (declared non-canonical), which llguidance needs only for forced tokens and
/// prompt healing, neither of which Hearth uses.
struct Vocabulary {
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Compiles schemas and grammars for one model. Cheap to clone; build it once per tokenizer.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .finish()
    }
}

impl Grammars {
    /// Builds the token table of `tokenizer`: every id's bytes (special tokens marked, so no
    /// grammar produces them as text) with the tokenizer's stop tokens as end of sequence.
    pub fn new(tokenizer: &TextTokenizer) -> Result<Grammars, GrammarError> {
        let vocab = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id);
                if tokenizer.is_special(id) && !bytes.is_empty() {
                    let mut marked = Vec::with_capacity(bytes.len() + 1);
                    marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    marked.extend_from_slice(&bytes);
                    marked
                } else {
                    bytes
                }
            })
            .collect();
        let stops: Vec<u32> = tokenizer
            .stop_ids()
            .iter()
            .copied()
            .filter(|&id| (id as usize) < vocab)
            .collect();
        let Some(&eos) = tokenizer
            .eos_id()
            .filter(|&id| (id as usize) < vocab)
            .as_ref()
            .or(stops.first())
        else {
            return Err(GrammarError::Tokenizer(
                "the tokenizer has no end-of-sequence token".into(),
            ));
        };
        let info = TokRxInfo {
            vocab_size: vocab as u32,
            tok_eos: eos,
            tok_bos: tokenizer.bos_id().filter(|&id| (id as usize) < vocab),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let mut eos_tokens = vec![eos];
        eos_tokens.extend(stops.iter().copied().filter(|&id| id != eos));
        let trie = catch(|| Ok(TokTrie::from(&info, &words).with_eos_tokens(&eos_tokens)))
            .map_err(|e| GrammarError::Tokenizer(short(&e)))?;
        let env: TokEnv = Arc::new(Vocabulary { trie });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| GrammarError::Tokenizer(short(&e.to_string())))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        tracing::debug!(
            vocab,
            stop_tokens = eos_tokens.len(),
            "grammar token table built"
        );
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// Output that is one JSON value valid against `schema` (JSON Schema; the features
    /// llguidance supports, no remote `$ref`s).
    pub fn json_schema(&self, schema: &Value) -> Result<Box<dyn TokenConstraint>, GrammarError> {
        self.compile(TopLevelGrammar::from_json_schema(with_layout(schema)?))
    }

    /// Output that is any one JSON object (OpenAI's `json_object` response format).
    pub fn json_object(&self) -> Result<Box<dyn TokenConstraint>, GrammarError> {
        self.json_schema(&serde_json::json!({ "type": "object" }))
    }

    /// Output that matches a Lark grammar in llguidance's dialect (`start` is the top rule;
    /// `%json { ... }` embeds a JSON schema: see [`lark_json`] for one laid out as
    /// [`json_schema`](Grammars::json_schema) lays its output out).
    pub fn lark(&self, grammar: &str) -> Result<Box<dyn TokenConstraint>, GrammarError> {
        if grammar.trim().is_empty() {
            return Err(GrammarError::Invalid("the grammar is empty".into()));
        }
        let depth = bracket_depth(grammar);
        if depth > MAX_DEPTH {
            return Err(GrammarError::Invalid(format!(
                "the grammar nests brackets {depth} deep; at most {MAX_DEPTH} are allowed"
            )));
        }
        self.compile(TopLevelGrammar::from_lark(grammar.to_string()))
    }

    fn compile(&self, grammar: TopLevelGrammar) -> Result<Box<dyn TokenConstraint>, GrammarError> {
        let started = std::time::Instant::now();
        let mut matcher = catch(|| Ok(Matcher::new(self.factory.create_parser(grammar))))
            .map_err(|e| GrammarError::Invalid(short(&e)))?;
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(short(&e)));
        }
        for warning in matcher.grammar_warnings() {
            tracing::debug!(%warning, "grammar warning");
        }
        // The first mask proves the grammar can start (and warms its lexer) before the request
        // is admitted, so a grammar that fails at once is the client's 400, not a failed stream.
        let vob = matcher
            .compute_mask()
            .map_err(|e| GrammarError::Invalid(short(&e.to_string())))?;
        let mut mask = TokenMask::none(0);
        mask.copy_from_words(vob.as_slice(), vob.len());
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            allowed = mask.count_allowed(),
            "grammar compiled"
        );
        Ok(Box::new(Constraint {
            matcher,
            mask,
            fresh: true,
        }))
    }
}

/// `%json { ... }` for a Lark grammar: `schema` with the layout [`Grammars::json_schema`] uses
/// (`", "` and `": "`, no other whitespace), checked for depth like a schema.
pub fn lark_json(schema: &Value) -> Result<String, GrammarError> {
    Ok(format!("%json {}", with_layout(schema)?))
}

/// `schema` with Hearth's JSON layout as its `x-guidance` options (overriding any the client
/// sent), after checking its depth.
fn with_layout(schema: &Value) -> Result<Value, GrammarError> {
    let (depth, values) = measure(schema);
    if depth > MAX_DEPTH {
        return Err(GrammarError::Invalid(format!(
            "the schema nests more than {MAX_DEPTH} levels deep"
        )));
    }
    if values > MAX_SCHEMA_VALUES {
        return Err(GrammarError::Invalid(format!(
            "the schema holds more than {MAX_SCHEMA_VALUES} values"
        )));
    }
    let mut schema = schema.clone();
    if schema.is_object() {
        json_options().apply_to(&mut schema);
    }
    Ok(schema)
}

/// How deeply objects and arrays nest in `value` and how many values it holds, without
/// recursion; the walk stops once either is past its limit.
fn measure(value: &Value) -> (usize, usize) {
    let (mut deepest, mut values) = (0, 0);
    let mut stack = vec![(value, 1usize)];
    while let Some((v, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        values += 1;
        if deepest > MAX_DEPTH || values > MAX_SCHEMA_VALUES {
            break;
        }
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, depth + 1))),
            _ => {}
        }
    }
    (deepest, values)
}

/// The deepest nesting of `(`, `[` and `{` in a grammar's text (quoted ones included: a cheap
/// upper bound of what the recursive parser will see).
fn bracket_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// One sequence's place in its grammar.
struct Constraint {
    matcher: Matcher,
    mask: TokenMask,
    /// The mask belongs to the current state (no commit since it was computed).
    fresh: bool,
}

impl TokenConstraint for Constraint {
    fn allowed(&mut self) -> Result<&TokenMask, ConstraintError> {
        if !self.fresh {
            let vob = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| ConstraintError::Failed(short(&e.to_string())))?;
            self.mask.copy_from_words(vob.as_slice(), vob.len());
            self.fresh = true;
        }
        Ok(&self.mask)
    }

    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.fresh = false;
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Rejected {
                token,
                reason: short(&e.to_string()),
            })
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// llguidance's own check of a draft, which leaves the parser where it was.
    fn allows_prefix(&mut self, tokens: &[u32]) -> usize {
        if self.matcher.is_stopped() {
            return 0;
        }
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }
}

/// Runs llguidance code, turning a panic into an error (its messages quieted).
fn catch<R>(f: impl FnOnce() -> anyhow::Result<R>) -> Result<R, String> {
    llguidance::panic_utils::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|e| e.to_string())
}

/// An error message on one line, without a panic's backtrace, at most [`MAX_MESSAGE`] bytes.
fn short(message: &str) -> String {
    let message = message.split("<backtrace>").next().unwrap_or("");
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() <= MAX_MESSAGE {
        return line;
    }
    let mut end = MAX_MESSAGE;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

#[cfg(test)]
mod tests;
