//! Grammars driven token by token with the real SmolLM2 tokenizer (and the tiny test model's):
//! random walks among the allowed tokens always end in output the grammar describes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_infer::{TextModel, TextTokenizer, TokenConstraint};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::*;

const SMOLLM2: &str = "../../weights/SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "../../weights/gemma-3-270m-Q4_K_M.gguf";

fn gguf_tokenizer(file: &str) -> Arc<TextTokenizer> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-weights.sh",
        path.display()
    );
    Arc::new(TextTokenizer::from_gguf_file(&path).expect("tokenizer"))
}

/// Walks `constraint` choosing uniformly among the allowed tokens (a stop token, once allowed,
/// with probability `p_stop`), at most `max` tokens. Returns the output bytes and whether the
/// walk ended properly (stop token or finished grammar).
fn walk(
    tok: &TextTokenizer,
    constraint: &mut dyn TokenConstraint,
    rng: &mut StdRng,
    p_stop: f64,
    max: usize,
) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    for _ in 0..max {
        let mask = constraint.allowed().expect("mask");
        let allowed: Vec<u32> = mask.allowed().collect();
        assert!(!allowed.is_empty(), "a live grammar allows some token");
        let (stops, text): (Vec<u32>, Vec<u32>) =
            allowed.into_iter().partition(|&t| tok.is_stop(t));
        assert!(
            text.iter().all(|&t| !tok.is_special(t)),
            "a grammar never allows special tokens as text"
        );
        if !stops.is_empty() && (text.is_empty() || rng.gen_bool(p_stop)) {
            return (out, true);
        }
        let id = text[rng.gen_range(0..text.len())];
        constraint.commit(id).expect("an allowed token commits");
        out.extend(tok.token_bytes(id));
        if constraint.is_finished() {
            return (out, true);
        }
    }
    (out, false)
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "active": {"type": "boolean"},
            "tags": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue"]},
                "maxItems": 3
            },
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "active", "tags"],
        "additionalProperties": false
    })
}

fn check_person(v: &Value) {
    let obj = v.as_object().expect("an object");
    let name = obj["name"].as_str().expect("name is a string");
    assert!(name.chars().count() <= 12, "name {name:?}");
    let age = obj["age"].as_i64().expect("age is an integer");
    assert!((0..=150).contains(&age), "age {age}");
    assert!(obj["active"].is_boolean());
    let tags = obj["tags"].as_array().expect("tags is an array");
    assert!(tags.len() <= 3);
    assert!(tags
        .iter()
        .all(|t| matches!(t.as_str(), Some("red" | "green" | "blue"))));
    if let Some(address) = obj.get("address") {
        assert!(address["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 8));
        assert_eq!(address.as_object().map(|a| a.len()), Some(1));
    }
    for key in obj.keys() {
        assert!(
            ["name", "age", "active", "tags", "address"].contains(&key.as_str()),
            "unexpected key {key}"
        );
    }
}

#[test]
fn random_walks_under_a_schema_always_give_json_that_validates() {
    let tok = gguf_tokenizer(SMOLLM2);
    let grammars = Grammars::new(&tok).expect("token table");
    let mut rng = StdRng::seed_from_u64(17);
    let mut steps = 0;
    let started = Instant::now();
    for walk_no in 0..40 {
        let mut c = grammars.json_schema(&person_schema()).expect("compiles");
        let (bytes, ended) = walk(&tok, c.as_mut(), &mut rng, 0.5, 400);
        steps += bytes.len();
        let text = String::from_utf8(bytes).expect("UTF-8");
        assert!(ended, "walk {walk_no} did not end: {text}");
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("walk {walk_no}: {e} in {text}"));
        check_person(&value);
        assert!(!text.contains('\n'), "the layout has no newlines: {text}");
    }
    eprintln!("40 walks, {steps} bytes, {:?}", started.elapsed());
}

#[test]
fn json_object_allows_an_object_and_nothing_else_to_start() {
    let tok = gguf_tokenizer(SMOLLM2);
    let grammars = Grammars::new(&tok).expect("token table");
    let mut c = grammars.json_object().expect("compiles");
    let mask = c.allowed().expect("mask");
    let open = tok.encode_plain("{").unwrap();
    let array = tok.encode_plain("[").unwrap();
    assert!(mask.is_allowed(open[0]));
    assert!(!mask.is_allowed(array[0]));
    assert!(
        tok.stop_ids().iter().all(|&s| !mask.is_allowed(s)),
        "no stop before the object"
    );
    for id in tok.encode_plain(r#"{"a": [1, "x"]}"#).unwrap() {
        assert!(c.allowed().unwrap().is_allowed(id), "token {id}");
        c.commit(id).unwrap();
    }
    let done = c.is_finished()
        || tok
            .stop_ids()
            .iter()
            .any(|&s| c.allowed().unwrap().is_allowed(s));
    assert!(done, "a complete object may end");
}

#[test]
fn a_lark_grammar_with_an_embedded_schema_is_followed() {
    let tok = gguf_tokenizer(SMOLLM2);
    let grammars = Grammars::new(&tok).expect("token table");
    let args = lark_json(&json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": false
    }))
    .unwrap();
    let lark = format!("start: \"<tool_call>\" call \"</tool_call>\"\ncall: {args}\n");
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..10 {
        let mut c = grammars.lark(&lark).expect("compiles");
        let (bytes, ended) = walk(&tok, c.as_mut(), &mut rng, 0.5, 300);
        let text = String::from_utf8(bytes).unwrap();
        assert!(ended, "{text}");
        let inner = text
            .strip_prefix("<tool_call>")
            .and_then(|t| t.strip_suffix("</tool_call>"))
            .unwrap_or_else(|| panic!("{text}"));
        let v: Value = serde_json::from_str(inner).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v["city"].is_string(), "{text}");
    }
    let mut yes_no = grammars.lark("start: \"yes\" | \"no\"").unwrap();
    let (bytes, _) = walk(&tok, yes_no.as_mut(), &mut rng, 1.0, 10);
    assert!(bytes == b"yes" || bytes == b"no");
}

#[test]
fn bad_schemas_and_grammars_are_refused_with_a_message() {
    let tok = TextModel::tiny_random(7).tokenizer();
    let grammars = Grammars::new(&tok).expect("token table");
    for schema in [
        json!({"type": "strin"}),
        json!({"type": "object", "properties": {"a": {"$ref": "https://example.com/x.json"}}}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ] {
        let Err(err) = grammars.json_schema(&schema) else {
            panic!("{schema} was accepted");
        };
        assert!(err.is_client_error(), "{err}");
        assert!(
            !err.to_string().is_empty() && err.to_string().len() <= 410,
            "{err}"
        );
    }
    for grammar in ["", "start: missing_rule", "start: (\"a\""] {
        let Err(err) = grammars.lark(grammar) else {
            panic!("{grammar:?} was accepted");
        };
        assert!(err.is_client_error(), "{grammar}: {err}");
    }
}

/// Compiles `schema` (or `lark`) and takes up to 50 masks of a random walk; returns how long it
/// took and whether it was refused.
fn hostile(
    grammars: &Grammars,
    tok: &TextTokenizer,
    build: impl Fn(&Grammars) -> Result<Box<dyn TokenConstraint>, GrammarError>,
) -> (Duration, bool) {
    let started = Instant::now();
    let refused = match build(grammars) {
        Err(_) => true,
        Ok(mut c) => {
            let mut rng = StdRng::seed_from_u64(1);
            let mut refused = false;
            for _ in 0..50 {
                let Ok(mask) = c.allowed() else {
                    refused = true;
                    break;
                };
                let ids: Vec<u32> = mask.allowed().filter(|&t| !tok.is_stop(t)).collect();
                if ids.is_empty() {
                    break;
                }
                if c.commit(ids[rng.gen_range(0..ids.len())]).is_err() || c.is_finished() {
                    break;
                }
            }
            refused
        }
    };
    eprintln!("hostile case: {:?}, refused: {refused}", started.elapsed());
    (started.elapsed(), refused)
}

#[test]
fn pathological_schemas_are_refused_or_bounded_quickly() {
    let tok = gguf_tokenizer(SMOLLM2);
    let grammars = Grammars::new(&tok).expect("token table");
    // An enum of 300,000 strings: over the grammar size limit.
    let huge_enum: Vec<Value> = (0..300_000).map(|i| json!(format!("value-{i}"))).collect();
    let (t, refused) = hostile(&grammars, &tok, |g| {
        g.json_schema(&json!({"enum": huge_enum}))
    });
    assert!(refused, "a 300k-string enum is refused");
    assert!(t < Duration::from_secs(1), "refused in {t:?}");
    // Just under the value limit: refused or compiled, within a second or two.
    let big_enum: Vec<Value> = (0..49_000).map(|i| json!(format!("value-{i}"))).collect();
    let (t, _) = hostile(&grammars, &tok, |g| {
        g.json_schema(&json!({"enum": big_enum}))
    });
    assert!(t < Duration::from_secs(2), "bounded: {t:?}");
    // A pattern whose DFA explodes: any a/b string with an `a` 30 places from the end.
    let (t, _) = hostile(&grammars, &tok, |g| {
        g.json_schema(&json!({"type": "string", "pattern": "^[ab]*a[ab]{30}$"}))
    });
    assert!(t < Duration::from_secs(2), "bounded: {t:?}");
    // Nested far too deep, as a schema and as a grammar.
    let mut deep = json!({"type": "integer"});
    // (Deeper than this and dropping the test's own `Value` would overflow the stack.)
    for _ in 0..1_000 {
        deep = json!({"type": "array", "items": deep});
    }
    let (t, refused) = hostile(&grammars, &tok, |g| g.json_schema(&deep));
    assert!(refused && t < Duration::from_secs(1), "{t:?}");
    let lark = format!("start: {}\"a\"{}", "(".repeat(100_000), ")".repeat(100_000));
    let (t, refused) = hostile(&grammars, &tok, |g| g.lark(&lark));
    assert!(refused && t < Duration::from_secs(1), "{t:?}");
    // A grammar that is ambiguous everywhere.
    let (t, _) = hostile(&grammars, &tok, |g| {
        g.lark("start: x\nx: x x | x x x | \"a\" | \"aa\" | \"\"")
    });
    assert!(t < Duration::from_secs(2), "bounded: {t:?}");
    // Deep `$ref` recursion and a huge repetition count.
    let (t, _) = hostile(&grammars, &tok, |g| {
        g.json_schema(&json!({"type": "string", "pattern": "^(a{1000}){1000}$"}))
    });
    assert!(t < Duration::from_secs(2), "bounded: {t:?}");
}

#[test]
fn token_bytes_round_trip_with_the_real_tokenizers() {
    const SAMPLES: &[&str] = &[
        "Hello world! How are you today?",
        "  two leading spaces, tabs\tand\nnew\n\nlines",
        "Accents: café, naïve; CJK: 你好，世界; emoji: 🦀🔥",
        r#"{"key": [1, 2.5e-3, true, null], "nested": {"x": "y"}}"#,
        "digits 1234567890",
    ];
    let smol = gguf_tokenizer(SMOLLM2);
    let gemma = gguf_tokenizer(GEMMA3);
    for tok in [&smol, &gemma] {
        for s in SAMPLES {
            let ids = tok.encode_plain(s).unwrap();
            let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
            // SentencePiece with a space prefix adds one leading space.
            let bytes = match bytes.strip_prefix(b" ") {
                Some(rest) if !s.starts_with(' ') => rest.to_vec(),
                _ => bytes,
            };
            assert_eq!(String::from_utf8_lossy(&bytes), *s, "ids {ids:?}");
        }
    }
    // Special tokens are marked; ordinary ones are not.
    let im_end = smol.token_to_id("<|im_end|>").unwrap();
    assert!(smol.is_special(im_end) && smol.token_bytes(im_end) == b"<|im_end|>");
    assert!(!smol.is_special(smol.encode_plain("Hello").unwrap()[0]));
    // The Gemma table builds too (262k tokens).
    Grammars::new(&gemma).expect("gemma token table");
}
