//! Anthropic's Messages requests checked into the one [`ValidRequest`] every front end hands to
//! the start pipeline: `system` and the turns become chat messages (`tool_use` blocks the
//! assistant's calls, `tool_result` blocks tool messages), `tools` and `tool_choice` the OpenAI
//! front end's tool mode (one owner of tools, their grammar and reading calls back), and the
//! sampling fields a [`Decode`]. What Hearth cannot honour is refused by name.

use serde_json::{json, Value};
use tracing::debug;

use hearth_types::{ChatMessage, Role, ToolCall};

use super::wire::{AnthropicTool, CountRequest, MessagesRequest};
use crate::error::ApiError;
use crate::services::completion::catalog::Catalog;
use crate::services::completion::front::{self, Checked};
use crate::services::completion::openai::tools::{self, ToolMode};
use crate::services::completion::openai::wire::{FunctionDef, NamedFunction, Tool, ToolChoice};
use crate::services::completion::validate::{
    output_tokens, temperature, Decode, GrammarRequest, Prompt, ValidRequest,
};

/// At most this many stop sequences.
const MAX_STOP: usize = 16;
/// At most this many tools offered in one request.
const MAX_TOOLS: usize = 128;

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

pub fn messages_request(req: MessagesRequest, catalog: &Catalog) -> Result<Checked, ApiError> {
    let spec = front::model(req.model.as_deref(), catalog)?;
    thinking(&req.thinking)?;
    if req.max_tokens.is_none() {
        return Err(bad("max_tokens", "is required"));
    }
    let max_tokens = output_tokens(&req.max_tokens, "max_tokens", spec).map_err(ApiError::from)?;
    if let Some(user) = req.metadata.as_ref().and_then(|m| m["user_id"].as_str()) {
        debug!(end_user = %user, "request for an end user");
    }
    let messages = conversation(req.system.as_ref(), req.messages)?;
    let tools = tool_mode(req.tools.as_deref(), req.tool_choice.as_ref())?;
    let top_p = front::top_p(req.top_p, "top_p")?;
    let stop = front::stop_strings(
        req.stop_sequences.unwrap_or_default(),
        "stop_sequences",
        MAX_STOP,
    )?;
    let grammar = match (output_format(req.output_config.as_ref())?, tools.grammar()?) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "output_config.format",
                "cannot be combined with a tool_choice that forces a call",
            ))
        }
        (format, call) => format.or(call),
    };
    let decode = Decode {
        top_p,
        top_k: req.top_k.unwrap_or(0).min(u32::MAX as u64) as usize,
        stop,
        grammar,
        ..Decode::default()
    };
    Ok(Checked {
        valid: ValidRequest {
            model: spec.id.clone(),
            prompt: prompt(messages, &tools),
            temperature: temperature(&req.temperature, spec).map_err(ApiError::from)?,
            max_output_tokens: max_tokens,
            margin: None,
            developer_id: None,
            application_id: None,
            decode,
        },
        stream: req.stream.unwrap_or(false),
        tools,
    })
}

/// `count_tokens`: the prompt a messages request would read (its length checked only by the
/// generation that would follow).
pub fn count_request(req: CountRequest, catalog: &Catalog) -> Result<ValidRequest, ApiError> {
    let spec = front::model(req.model.as_deref(), catalog)?;
    thinking(&req.thinking)?;
    let messages = conversation(req.system.as_ref(), req.messages)?;
    let tools = tool_mode(req.tools.as_deref(), req.tool_choice.as_ref())?;
    Ok(ValidRequest {
        model: spec.id.clone(),
        prompt: prompt(messages, &tools),
        temperature: 0.0,
        max_output_tokens: 1,
        margin: None,
        developer_id: None,
        application_id: None,
        decode: Decode::default(),
    })
}

fn prompt(messages: Vec<ChatMessage>, tools: &ToolMode) -> Prompt {
    match tools.offered() {
        Some(tools) => Prompt::ChatWithTools { messages, tools },
        None => Prompt::Chat(messages),
    }
}

/// `output_config.format`: a JSON schema the answer follows.
fn output_format(config: Option<&Value>) -> Result<Option<GrammarRequest>, ApiError> {
    let format = match config.map(|c| &c["format"]) {
        None | Some(Value::Null) => return Ok(None),
        Some(f) => f,
    };
    match (format["type"].as_str(), &format["schema"]) {
        (Some("json_schema"), schema @ Value::Object(_)) => {
            Ok(Some(GrammarRequest::JsonSchema(schema.clone())))
        }
        _ => Err(bad(
            "output_config.format",
            "must be {\"type\": \"json_schema\", \"schema\": {...}}",
        )),
    }
}

/// Extended thinking is refused when enabled (Hearth's models answer directly).
fn thinking(value: &Option<Value>) -> Result<(), ApiError> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v["type"] == "disabled" => Ok(()),
        Some(_) => Err(bad("thinking", "extended thinking is not supported")),
    }
}

/// Anthropic's tools as the OpenAI front end's, checked there (names, schemas, uniqueness);
/// `tool_choice` `auto`, `any` (a call is required), `tool` (that one) or `none`.
fn tool_mode(list: Option<&[AnthropicTool]>, choice: Option<&Value>) -> Result<ToolMode, ApiError> {
    let tools = list
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind.as_deref().is_some_and(|k| k != "custom") {
                return Err(bad(
                    &format!("tools[{i}].type"),
                    "server tools are not supported; only custom tools",
                ));
            }
            match &t.input_schema {
                Some(Value::Object(_)) => {}
                _ => {
                    return Err(bad(
                        &format!("tools[{i}].input_schema"),
                        "is required: a JSON schema object",
                    ))
                }
            }
            Ok(Tool {
                kind: "function".into(),
                function: FunctionDef {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t.input_schema.clone(),
                },
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let choice = match choice {
        None | Some(Value::Null) => None,
        Some(c) => Some(match c["type"].as_str() {
            Some("auto") => ToolChoice::Mode("auto".into()),
            Some("any") => ToolChoice::Mode("required".into()),
            Some("none") => ToolChoice::Mode("none".into()),
            Some("tool") => match c["name"].as_str() {
                Some(name) => ToolChoice::Named {
                    function: NamedFunction { name: name.into() },
                },
                None => return Err(bad("tool_choice.name", "is required with type \"tool\"")),
            },
            _ => {
                return Err(bad(
                    "tool_choice",
                    "must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                ))
            }
        }),
    };
    if matches!(&choice, Some(ToolChoice::Mode(m)) if m == "required") && tools.is_empty() {
        return Err(bad("tool_choice", "tool_choice \"any\" needs tools"));
    }
    tools::mode(Some(&tools), choice.as_ref(), MAX_TOOLS)
}

/// `system` and the turns as chat messages.
fn conversation(
    system: Option<&Value>,
    turns: Option<Vec<Value>>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    match system {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            if !s.is_empty() {
                out.push(ChatMessage::new(Role::System, s.clone()));
            }
        }
        Some(Value::Array(blocks)) => {
            let text = blocks
                .iter()
                .enumerate()
                .map(|(j, b)| text_block(b, &format!("system[{j}]")))
                .collect::<Result<Vec<_>, _>>()?
                .join("\n");
            if !text.is_empty() {
                out.push(ChatMessage::new(Role::System, text));
            }
        }
        Some(_) => return Err(bad("system", "must be a string or text blocks")),
    }
    let turns = turns.unwrap_or_default();
    if turns.is_empty() {
        return Err(bad("messages", "must not be empty"));
    }
    for (i, turn) in turns.iter().enumerate() {
        let field = format!("messages[{i}]");
        let role = match turn["role"].as_str() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            _ => {
                return Err(bad(
                    &format!("{field}.role"),
                    "must be \"user\" or \"assistant\"",
                ))
            }
        };
        match &turn["content"] {
            Value::String(text) => out.push(ChatMessage::new(role, text.clone())),
            Value::Array(blocks) => turn_blocks(role, blocks, &field, &mut out)?,
            _ => {
                return Err(bad(
                    &format!("{field}.content"),
                    "must be a string or an array of blocks",
                ))
            }
        }
    }
    Ok(out)
}

/// One turn's blocks: a user's text and tool results (each result its own tool message, before
/// the text), or an assistant's text and tool calls.
fn turn_blocks(
    role: Role,
    blocks: &[Value],
    field: &str,
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{field}.content[{j}]");
        match (role, block["type"].as_str()) {
            (_, Some("text")) => text.push_str(&text_block(block, &at)?),
            (Role::Assistant, Some("tool_use")) => {
                let (Some(id), Some(name)) = (block["id"].as_str(), block["name"].as_str()) else {
                    return Err(bad(&at, "a tool_use block needs id and name"));
                };
                let input = match &block["input"] {
                    Value::Null => json!({}),
                    v @ Value::Object(_) => v.clone(),
                    _ => return Err(bad(&format!("{at}.input"), "must be an object")),
                };
                calls.push(ToolCall {
                    id: id.into(),
                    name: name.into(),
                    arguments: input.to_string(),
                });
            }
            (Role::User, Some("tool_result")) => {
                let Some(id) = block["tool_use_id"].as_str() else {
                    return Err(bad(&at, "a tool_result block needs tool_use_id"));
                };
                let content = match &block["content"] {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => parts
                        .iter()
                        .enumerate()
                        .map(|(k, p)| text_block(p, &format!("{at}.content[{k}]")))
                        .collect::<Result<Vec<_>, _>>()?
                        .join("\n"),
                    _ => return Err(bad(&format!("{at}.content"), "must be text")),
                };
                let content = if block["is_error"] == true {
                    format!("Error: {content}")
                } else {
                    content
                };
                let mut message = ChatMessage::new(Role::Tool, content);
                message.tool_call_id = Some(id.into());
                out.push(message);
            }
            (_, kind) => {
                return Err(bad(
                    &at,
                    format!(
                        "blocks of type {} are not supported in a {} turn",
                        kind.map_or_else(|| "(none)".to_string(), |k| format!("{k:?}")),
                        if role == Role::User {
                            "user"
                        } else {
                            "assistant"
                        }
                    ),
                ))
            }
        }
    }
    if !text.is_empty() || !calls.is_empty() || blocks.is_empty() {
        let mut message = ChatMessage::new(role, text);
        message.tool_calls = calls;
        out.push(message);
    }
    Ok(())
}

/// A `{"type": "text", "text": ...}` block's text (`cache_control` and citations ignored).
fn text_block(block: &Value, field: &str) -> Result<String, ApiError> {
    match (block["type"].as_str(), &block["text"]) {
        (Some("text"), Value::String(t)) => Ok(t.clone()),
        _ => Err(bad(
            field,
            "must be a text block {\"type\": \"text\", \"text\": ...}",
        )),
    }
}
