//! OpenAI's Responses requests (stateless) checked into the one [`ValidRequest`] every front
//! end hands to the start pipeline: `instructions` and `input` (a string, or message, function
//! call and function call output items) become chat messages, `tools` and `tool_choice` the
//! chat route's tool mode, `text.format` a grammar. Hearth keeps no responses: `store: true`,
//! `previous_response_id` and `conversation` are refused by name, as is what Hearth cannot do.

use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use hearth_types::{ChatMessage, Role, ToolCall};

use crate::error::ApiError;
use crate::services::completion::catalog::Catalog;
use crate::services::completion::front::{self, Checked};
use crate::services::completion::openai::tools::{self, ToolMode};
use crate::services::completion::openai::wire::{FunctionDef, NamedFunction, Tool, ToolChoice};
use crate::services::completion::validate::{
    output_tokens, temperature, Decode, GrammarRequest, Prompt, ValidRequest,
};

const MAX_TOOLS: usize = 128;

/// `POST /v1/responses`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = CreateResponseRequest)]
pub struct ResponsesBody {
    #[schema(value_type = String, required = true)]
    pub model: Option<String>,
    /// A string (one user message) or items: messages (`role`, `content` as a string or
    /// `input_text`/`output_text` parts), `function_call` and `function_call_output`.
    #[schema(value_type = Object, required = true)]
    pub input: Option<Value>,
    /// A system message before the input.
    pub instructions: Option<String>,
    /// `{type: "function", name, description, parameters}`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required`, or `{type: "function", name}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `{format: {type: "text" | "json_object" | "json_schema", schema?}}`.
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
    #[schema(value_type = Option<u32>, minimum = 1)]
    pub max_output_tokens: Option<Value>,
    #[schema(value_type = Option<f64>, minimum = 0.0)]
    pub temperature: Option<Value>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Answer as server-sent events (`response.created` ... `response.completed`).
    pub stream: Option<bool>,
    /// Refused when true: Hearth keeps no responses.
    pub store: Option<bool>,
    /// Refused: Hearth keeps no responses; send the conversation as `input`.
    pub previous_response_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub conversation: Option<Value>,
    /// Refused when true.
    pub background: Option<bool>,
    /// Refused unless empty.
    #[schema(value_type = Option<Vec<String>>)]
    pub include: Option<Vec<Value>>,
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub prompt: Option<Value>,
    pub top_logprobs: Option<u64>,
    /// Echoed; the tools are called one at a time.
    pub parallel_tool_calls: Option<bool>,
    /// Echoed.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
}

/// The request's settings, as the answer repeats them.
#[derive(Debug, Clone)]
pub struct Echo {
    pub instructions: Option<String>,
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub text: Value,
    pub max_output_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub parallel_tool_calls: bool,
    pub metadata: Value,
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

/// The checked request, and what its answer echoes.
pub fn check(body: ResponsesBody, catalog: &Catalog) -> Result<(Checked, Echo), ApiError> {
    let spec = front::model(body.model.as_deref(), catalog)?;
    if body.store == Some(true) {
        return Err(bad(
            "store",
            "Hearth keeps no responses: store must be false",
        ));
    }
    if body.previous_response_id.is_some() {
        return Err(bad(
            "previous_response_id",
            "Hearth keeps no responses: send the conversation as input",
        ));
    }
    if body.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(bad("conversation", "Hearth keeps no conversations"));
    }
    if body.background == Some(true) {
        return Err(bad("background", "background responses are not supported"));
    }
    if body.include.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(bad("include", "is not supported"));
    }
    if body
        .reasoning
        .as_ref()
        .is_some_and(|r| !r.is_null() && !r["effort"].is_null())
    {
        return Err(bad("reasoning", "reasoning effort is not supported"));
    }
    if body.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(bad("prompt", "stored prompts are not supported"));
    }
    if body.top_logprobs.is_some_and(|n| n > 0) {
        return Err(bad(
            "top_logprobs",
            "is not supported here; use /v1/chat/completions",
        ));
    }
    let mut messages = Vec::new();
    if let Some(i) = body.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(ChatMessage::new(Role::System, i.clone()));
    }
    input(body.input.as_ref(), &mut messages)?;
    let (tools, tool_list) = tool_mode(body.tools.as_deref(), body.tool_choice.as_ref())?;
    let (format, text) = text_format(body.text.as_ref())?;
    let grammar = match (format, tools.grammar()?) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "text.format",
                "cannot be combined with a tool_choice that forces a call",
            ))
        }
        (format, call) => format.or(call),
    };
    let top_p = front::top_p(body.top_p, "top_p")?;
    let max_output_tokens = output_tokens(&body.max_output_tokens, "max_output_tokens", spec)
        .map_err(ApiError::from)?;
    let temperature = temperature(&body.temperature, spec).map_err(ApiError::from)?;
    let prompt = match tools.offered() {
        Some(tools) => Prompt::ChatWithTools { messages, tools },
        None => Prompt::Chat(messages),
    };
    let echo = Echo {
        instructions: body.instructions,
        tools: tool_list,
        tool_choice: body.tool_choice.unwrap_or_else(|| json!("auto")),
        text,
        max_output_tokens,
        temperature,
        top_p,
        parallel_tool_calls: body.parallel_tool_calls.unwrap_or(true),
        metadata: body.metadata.unwrap_or_else(|| json!({})),
    };
    let checked = Checked {
        valid: ValidRequest {
            model: spec.id.clone(),
            prompt,
            temperature,
            max_output_tokens,
            margin: None,
            developer_id: None,
            application_id: None,
            decode: Decode {
                top_p,
                grammar,
                ..Decode::default()
            },
        },
        stream: body.stream.unwrap_or(false),
        tools,
    };
    Ok((checked, echo))
}

/// `input` into `out`.
fn input(input: Option<&Value>, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let items = match input {
        Some(Value::String(s)) if !s.is_empty() => {
            out.push(ChatMessage::new(Role::User, s.clone()));
            return Ok(());
        }
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::String(_) | Value::Array(_)) => return Err(bad("input", "must not be empty")),
        None | Some(Value::Null) => return Err(bad("input", "is required")),
        Some(_) => return Err(bad("input", "must be a string or an array of items")),
    };
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        match item["type"].as_str() {
            None | Some("message") => {
                let role = match item["role"].as_str() {
                    Some("developer") => Role::System,
                    Some(r @ ("system" | "user" | "assistant")) => r
                        .parse::<Role>()
                        .map_err(|e| bad(&format!("{field}.role"), e))?,
                    _ => {
                        return Err(bad(
                            &format!("{field}.role"),
                            "must be user, assistant, system or developer",
                        ))
                    }
                };
                let content = match &item["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => {
                        let mut text = String::new();
                        for (j, part) in parts.iter().enumerate() {
                            match (part["type"].as_str(), part["text"].as_str()) {
                                (Some("input_text" | "output_text"), Some(t)) => text.push_str(t),
                                (kind, _) => {
                                    return Err(bad(
                                        &format!("{field}.content[{j}]"),
                                        format!(
                                            "content of type {} is not supported; only text",
                                            kind.unwrap_or("(none)")
                                        ),
                                    ))
                                }
                            }
                        }
                        text
                    }
                    _ => return Err(bad(&format!("{field}.content"), "must be text")),
                };
                out.push(ChatMessage::new(role, content));
            }
            Some("function_call") => {
                let (Some(call_id), Some(name)) = (item["call_id"].as_str(), item["name"].as_str())
                else {
                    return Err(bad(&field, "a function_call needs call_id and name"));
                };
                let call = ToolCall {
                    id: call_id.into(),
                    name: name.into(),
                    arguments: item["arguments"].as_str().unwrap_or("{}").into(),
                };
                // Consecutive calls belong to one assistant turn.
                match out.last_mut() {
                    Some(m) if m.role == Role::Assistant && !m.tool_calls.is_empty() => {
                        m.tool_calls.push(call)
                    }
                    _ => {
                        let mut m = ChatMessage::new(Role::Assistant, String::new());
                        m.tool_calls.push(call);
                        out.push(m);
                    }
                }
            }
            Some("function_call_output") => {
                let Some(call_id) = item["call_id"].as_str() else {
                    return Err(bad(&field, "a function_call_output needs call_id"));
                };
                let output = match &item["output"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let mut m = ChatMessage::new(Role::Tool, output);
                m.tool_call_id = Some(call_id.into());
                out.push(m);
            }
            Some(other) => {
                return Err(bad(
                    &field,
                    format!("items of type {other:?} are not supported"),
                ))
            }
        }
    }
    Ok(())
}

/// The tools as the chat route's, and as the answer echoes them.
fn tool_mode(
    list: Option<&[Value]>,
    choice: Option<&Value>,
) -> Result<(ToolMode, Vec<Value>), ApiError> {
    let list = list.unwrap_or_default();
    let tools = list
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t["type"] != "function" {
                return Err(bad(
                    &format!("tools[{i}].type"),
                    "the only tool type is function",
                ));
            }
            let Some(name) = t["name"].as_str() else {
                return Err(bad(&format!("tools[{i}].name"), "is required"));
            };
            Ok(Tool {
                kind: "function".into(),
                function: FunctionDef {
                    name: name.into(),
                    description: t["description"].as_str().map(String::from),
                    parameters: (!t["parameters"].is_null()).then(|| t["parameters"].clone()),
                },
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let choice = match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(ToolChoice::Mode(m.clone())),
        Some(c) if c["type"] == "function" => match c["name"].as_str() {
            Some(name) => Some(ToolChoice::Named {
                function: NamedFunction { name: name.into() },
            }),
            None => return Err(bad("tool_choice.name", "is required")),
        },
        Some(_) => {
            return Err(bad(
                "tool_choice",
                "must be auto, none, required or {\"type\": \"function\", \"name\"}",
            ))
        }
    };
    Ok((
        tools::mode(Some(&tools), choice.as_ref(), MAX_TOOLS)?,
        list.to_vec(),
    ))
}

/// `text.format`: the grammar, and the `text` the answer echoes.
fn text_format(text: Option<&Value>) -> Result<(Option<GrammarRequest>, Value), ApiError> {
    let format = text.map(|t| &t["format"]).filter(|f| !f.is_null());
    let grammar = match format {
        None => None,
        Some(f) => match f["type"].as_str() {
            Some("text") => None,
            Some("json_object") => Some(GrammarRequest::JsonObject),
            Some("json_schema") => match &f["schema"] {
                s @ Value::Object(_) => Some(GrammarRequest::JsonSchema(s.clone())),
                _ => return Err(bad("text.format.schema", "must be a JSON schema object")),
            },
            _ => {
                return Err(bad(
                    "text.format",
                    "must be of type text, json_object or json_schema",
                ))
            }
        },
    };
    let echo = match format {
        Some(f) => json!({ "format": f }),
        None => json!({ "format": { "type": "text" } }),
    };
    Ok((grammar, echo))
}
