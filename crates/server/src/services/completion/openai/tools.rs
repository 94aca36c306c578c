//! Tools on the chat route: which are offered and how they may be called (`tool_choice`), the
//! grammar that makes a forced call valid JSON for its function, and reading calls out of the
//! generated text as it streams.
//!
//! A forced call (`required`, or a named function) is generated under a JSON schema as
//! `{"name": ..., "arguments": {...}}`, so its arguments stream as they are generated. With
//! `auto` the model writes freely: text streams until something that may start a call appears
//! (`<tool_call>`, `[TOOL_CALLS]`, or a `{` opening the answer), and from there the rest is
//! read whole at the end ([`hearth_infer::tool_calls::parse`]).

use hearth_infer::tool_calls::{self, CALL_OPEN};
use serde_json::{json, Value};

use super::wire::{Tool, ToolChoice};
use crate::error::ApiError;
use crate::services::completion::validate::GrammarRequest;

/// Markers after which `auto` output is read as a possible call.
const MARKERS: &[&str] = &[CALL_OPEN, "[TOOL_CALLS]"];

#[derive(Debug, Clone)]
pub enum ToolMode {
    /// No tools offered, or `tool_choice: "none"`.
    None,
    /// The model may answer or call.
    Auto(Vec<Tool>),
    /// The model must call one of these.
    Required(Vec<Tool>),
    /// The model must call this function (the others stay offered).
    Named(Vec<Tool>, String),
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

/// Checks `tools` and `tool_choice` (default `auto` with tools, `none` without).
pub fn mode(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    max: usize,
) -> Result<ToolMode, ApiError> {
    let tools = tools.unwrap_or_default().to_vec();
    if tools.len() > max {
        return Err(bad("tools", format!("at most {max} tools")));
    }
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(bad(
                &format!("tools[{i}].type"),
                "the only tool type is function",
            ));
        }
        let name = &t.function.name;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(bad(
                &format!("tools[{i}].function.name"),
                "a function name is 1 to 64 of a-z, A-Z, 0-9, _ and -",
            ));
        }
        match &t.function.parameters {
            None | Some(Value::Object(_)) => {}
            Some(_) => {
                return Err(bad(
                    &format!("tools[{i}].function.parameters"),
                    "parameters must be a JSON schema object",
                ))
            }
        }
        if tools[..i].iter().any(|o| o.function.name == *name) {
            return Err(bad(
                &format!("tools[{i}].function.name"),
                "function names must be unique",
            ));
        }
    }
    let mode = match choice {
        None if tools.is_empty() => ToolMode::None,
        None => ToolMode::Auto(tools),
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => ToolMode::None,
            "auto" if tools.is_empty() => ToolMode::None,
            "auto" => ToolMode::Auto(tools),
            "required" if tools.is_empty() => {
                return Err(bad("tool_choice", "tool_choice \"required\" needs tools"))
            }
            "required" => ToolMode::Required(tools),
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("tool_choice {other:?}: expected none, auto, required or a function"),
                ))
            }
        },
        Some(ToolChoice::Named { function }) => {
            if !tools.iter().any(|t| t.function.name == function.name) {
                return Err(bad(
                    "tool_choice",
                    format!(
                        "tool_choice names {:?}, which is not in tools",
                        function.name
                    ),
                ));
            }
            ToolMode::Named(tools, function.name.clone())
        }
    };
    Ok(mode)
}

impl ToolMode {
    fn tools(&self) -> &[Tool] {
        match self {
            ToolMode::None => &[],
            ToolMode::Auto(t) | ToolMode::Required(t) | ToolMode::Named(t, _) => t,
        }
    }

    /// The tools as the chat template reads them, when any are offered.
    pub fn offered(&self) -> Option<Value> {
        let tools = self.tools();
        (!tools.is_empty()).then(|| {
            Value::Array(
                tools
                    .iter()
                    .map(|t| json!({ "type": "function", "function": t.function }))
                    .collect(),
            )
        })
    }

    pub fn names(&self) -> Vec<&str> {
        self.tools()
            .iter()
            .map(|t| t.function.name.as_str())
            .collect()
    }

    /// True when the output must be a call.
    pub fn forced(&self) -> bool {
        matches!(self, ToolMode::Required(_) | ToolMode::Named(..))
    }

    /// The schema a forced call is generated under: `{"name": <one of the functions>,
    /// "arguments": <its parameters>}`, name first.
    pub fn grammar(&self) -> Result<Option<GrammarRequest>, ApiError> {
        let call = |t: &Tool| {
            let parameters = t
                .function
                .parameters
                .clone()
                .unwrap_or_else(|| json!({ "type": "object" }));
            json!({
                "type": "object",
                "properties": {
                    "name": { "const": t.function.name },
                    "arguments": parameters,
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        };
        Ok(match self {
            ToolMode::None | ToolMode::Auto(_) => None,
            ToolMode::Required(tools) => {
                let one_of: Vec<Value> = tools.iter().map(call).collect();
                Some(GrammarRequest::ToolCall(if one_of.len() == 1 {
                    one_of[0].clone()
                } else {
                    json!({ "anyOf": one_of })
                }))
            }
            ToolMode::Named(tools, name) => {
                let tool = tools
                    .iter()
                    .find(|t| t.function.name == *name)
                    .ok_or_else(|| bad("tool_choice", "the named function is not in tools"))?;
                Some(GrammarRequest::ToolCall(call(tool)))
            }
        })
    }
}

/// A call's arguments (JSON text, as generated) as an object, for the APIs that send them as
/// one (Anthropic's `input`, Ollama's `arguments`): a forced call's are an object by its
/// grammar; text that is not one stays a string, so nothing is lost; none is `{}`.
pub fn arguments_object(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => v,
        _ if text.trim().is_empty() => json!({}),
        _ => Value::String(text.to_string()),
    }
}

/// What a piece of generated text contributes to the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    /// A call begins: its function's name.
    CallStart {
        name: String,
    },
    /// More of the current call's arguments (JSON text).
    Arguments(String),
}

/// Splits generated text into content and calls as it arrives.
#[derive(Debug)]
pub struct Splitter {
    forced: bool,
    names: Vec<String>,
    text: String,
    /// Forced: where the arguments begin, once the name is read; how much of them went out.
    arguments_at: Option<usize>,
    sent: usize,
    /// Auto: how much of `text` went out as content; whether the rest is held for the end.
    holding: bool,
}

impl Splitter {
    pub fn new(mode: &ToolMode) -> Self {
        Splitter {
            forced: mode.forced(),
            names: mode.names().into_iter().map(String::from).collect(),
            text: String::new(),
            arguments_at: None,
            sent: 0,
            holding: false,
        }
    }

    /// The pieces `chunk` completes.
    pub fn push(&mut self, chunk: &str) -> Vec<Piece> {
        self.text.push_str(chunk);
        if self.forced {
            self.push_forced()
        } else {
            self.push_auto()
        }
    }

    /// Everything still held, at the end of the generation.
    pub fn finish(&mut self) -> Vec<Piece> {
        if self.forced {
            let mut out = self.push_forced();
            if let Some(at) = self.arguments_at {
                // The held tail is the arguments' end and the call object's closing brace.
                let rest = self.text[at + self.sent..].trim_end();
                let rest = rest.strip_suffix('}').unwrap_or(rest).trim_end();
                if !rest.is_empty() {
                    out.push(Piece::Arguments(rest.to_string()));
                }
                self.sent = self.text.len() - at;
            }
            return out;
        }
        let rest = &self.text[self.sent..];
        self.sent = self.text.len();
        if rest.is_empty() {
            return Vec::new();
        }
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let (content, calls) = tool_calls::parse(rest, &names);
        let mut out = Vec::new();
        if !content.is_empty() {
            out.push(Piece::Content(content));
        }
        for call in calls {
            out.push(Piece::CallStart { name: call.name });
            out.push(Piece::Arguments(call.arguments));
        }
        out
    }

    fn push_forced(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.arguments_at.is_none() {
            let Some((name, at)) = read_call_head(&self.text) else {
                return out;
            };
            out.push(Piece::CallStart { name });
            self.arguments_at = Some(at);
        }
        let at = self.arguments_at.unwrap_or_default();
        // Hold back from the last `}`: it may close the call object rather than the arguments.
        let args = &self.text[at..];
        let safe = args.rfind('}').unwrap_or(args.len());
        if safe > self.sent {
            out.push(Piece::Arguments(args[self.sent..safe].to_string()));
            self.sent = safe;
        }
        out
    }

    fn push_auto(&mut self) -> Vec<Piece> {
        if self.holding {
            return Vec::new();
        }
        let rest = &self.text[self.sent..];
        if self.sent == 0 && rest.trim_start().starts_with('{') {
            self.holding = true;
            return Vec::new();
        }
        // Text up to a marker goes out; from a marker on, everything waits for the end.
        let marker = MARKERS.iter().filter_map(|m| rest.find(m)).min();
        let cut = match marker {
            Some(at) => {
                self.holding = true;
                at
            }
            // A tail that may be the start of a marker waits for the next piece.
            None => rest.len() - held_prefix(rest),
        };
        let content = rest[..cut].to_string();
        self.sent += cut;
        if content.is_empty() {
            Vec::new()
        } else {
            vec![Piece::Content(content)]
        }
    }
}

/// The length of the longest suffix of `text` that begins a marker.
fn held_prefix(text: &str) -> usize {
    MARKERS
        .iter()
        .flat_map(|m| (1..m.len()).rev().map(move |n| &m[..n]))
        .filter(|p| text.ends_with(p))
        .map(str::len)
        .max()
        .unwrap_or(0)
}

/// In `{"name": "f", "arguments": ...`: the name and where the arguments' value begins, once
/// both are written.
fn read_call_head(text: &str) -> Option<(String, usize)> {
    let key = text.find("\"name\"")?;
    let after = text[key + 6..].trim_start().strip_prefix(':')?;
    let value_at = text.len() - after.trim_start().len();
    let mut strings = serde_json::Deserializer::from_str(&text[value_at..]).into_iter::<String>();
    let name = strings.next()?.ok()?;
    let name_end = value_at + strings.byte_offset();
    let args_key = text[name_end..].find("\"arguments\"")? + name_end;
    let after = text[args_key + 11..].trim_start().strip_prefix(':')?;
    let args_at = text.len() - after.trim_start().len();
    if args_at >= text.len() {
        return None;
    }
    Some((name, args_at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::completion::openai::wire::FunctionDef;

    fn tool(name: &str) -> Tool {
        Tool {
            kind: "function".into(),
            function: FunctionDef {
                name: name.into(),
                description: None,
                parameters: Some(
                    json!({"type": "object", "properties": {"city": {"type": "string"}}}),
                ),
            },
        }
    }

    fn run(splitter: &mut Splitter, pieces: &[&str]) -> Vec<Piece> {
        let mut out: Vec<Piece> = pieces.iter().flat_map(|p| splitter.push(p)).collect();
        out.extend(splitter.finish());
        out
    }

    fn arguments(pieces: &[Piece]) -> String {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Arguments(a) => Some(a.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_forced_call_streams_its_arguments_as_they_come() {
        let mode = ToolMode::Required(vec![tool("get_weather")]);
        let mut s = Splitter::new(&mode);
        let out = run(
            &mut s,
            &[
                "{\"na",
                "me\": \"get_weather\", ",
                "\"arguments\": {\"ci",
                "ty\": \"Oslo\"}",
                "}",
            ],
        );
        assert_eq!(
            out[0],
            Piece::CallStart {
                name: "get_weather".into()
            }
        );
        let args = arguments(&out);
        assert_eq!(
            serde_json::from_str::<Value>(&args).unwrap(),
            json!({"city": "Oslo"})
        );
        assert!(out.iter().skip(1).all(|p| matches!(p, Piece::Arguments(_))));
    }

    #[test]
    fn auto_output_streams_text_and_holds_what_may_be_a_call() {
        let mode = ToolMode::Auto(vec![tool("get_weather")]);
        let mut s = Splitter::new(&mode);
        let out = run(
            &mut s,
            &[
                "Hello",
                " there <tool",
                "_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
            ],
        );
        assert_eq!(out[0], Piece::Content("Hello".into()));
        assert!(out.contains(&Piece::CallStart {
            name: "get_weather".into()
        }));
        let content: String = out
            .iter()
            .filter_map(|p| match p {
                Piece::Content(c) => Some(c.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(content.trim(), "Hello there");

        let mut s = Splitter::new(&mode);
        let out = run(&mut s, &["Just ", "an answer <tool"]);
        assert_eq!(
            out,
            vec![
                Piece::Content("Just ".into()),
                Piece::Content("an answer ".into()),
                Piece::Content("<tool".into())
            ]
        );
    }

    #[test]
    fn tool_choice_is_checked() {
        let tools = [tool("a")];
        assert!(matches!(mode(Some(&tools), None, 8), Ok(ToolMode::Auto(_))));
        assert!(matches!(mode(None, None, 8), Ok(ToolMode::None)));
        let named: ToolChoice =
            serde_json::from_value(json!({"type": "function", "function": {"name": "b"}})).unwrap();
        assert!(mode(Some(&tools), Some(&named), 8).is_err());
        let required = ToolChoice::Mode("required".into());
        assert!(mode(None, Some(&required), 8).is_err());
        let mut bad_name = tool("no spaces allowed");
        bad_name.function.name = "no spaces".into();
        assert!(mode(Some(&[bad_name]), None, 8).is_err());
        assert!(mode(Some(&[tool("a"), tool("a")]), None, 8).is_err());
        assert!(mode(Some(&[tool("a"), tool("b")]), None, 1).is_err());
    }
}
