//! Ollama's `/api/chat` and `/api/generate` requests checked into the one [`ValidRequest`]
//! every front end hands to the start pipeline. `options` that decide the answer are applied
//! (`temperature`, `top_p`, `top_k`, `seed`, `num_predict`, `stop`, the penalties) or, when set
//! to something Hearth does not do, refused by name; options that only tune Ollama's own
//! runtime (`num_ctx`, `num_gpu`, `num_thread`, ...) are accepted and ignored. `keep_alive`
//! sets how long the model stays loaded after the request, as Ollama's does ([`keep_alive`]).

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use hearth_types::{ChatMessage, Role, ToolCall};

use crate::error::ApiError;
use crate::models::KeepAlive;
use crate::services::completion::catalog::{Catalog, TextModelSpec};
use crate::services::completion::front::{self, Checked};
use crate::services::completion::openai::tools::{self, ToolMode};
use crate::services::completion::openai::wire::Tool;
use crate::services::completion::validate::{
    output_tokens, temperature, Decode, GrammarRequest, Prompt, ValidRequest,
};

/// At most this many stop strings, each at most this long; at most this many tools.
const MAX_STOP: usize = 16;
const MAX_TOOLS: usize = 128;

/// Options of Ollama's runtime that do not change which tokens are chosen: accepted, ignored.
const RUNTIME_OPTIONS: &[&str] = &[
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "num_keep",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "f16_kv",
    "vocab_only",
    "logits_all",
    "repeat_last_n",
    "penalize_newline",
];

/// Sampling options Hearth does not apply, with the value that leaves them off (accepted).
const OFF_OPTIONS: &[(&str, f64)] = &[
    ("mirostat", 0.0),
    ("repeat_penalty", 1.0),
    ("min_p", 0.0),
    ("typical_p", 1.0),
    ("tfs_z", 1.0),
];

/// `POST /api/chat`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = OllamaChatRequest)]
pub struct ChatBody {
    #[schema(value_type = String, required = true)]
    pub model: Option<String>,
    /// `{role, content, tool_calls?, tool_name?}`; none: the model is loaded and nothing else.
    #[schema(value_type = Vec<Object>)]
    pub messages: Option<Vec<Value>>,
    /// OpenAI-shaped functions the model may call.
    pub tools: Option<Vec<Tool>>,
    /// `"json"`, or a JSON schema object.
    #[schema(value_type = Option<Object>)]
    pub format: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub options: Option<Value>,
    /// NDJSON lines (the default), or one object with `false`.
    pub stream: Option<bool>,
    /// Not supported when true.
    #[schema(value_type = Option<Object>)]
    pub think: Option<Value>,
    /// Not supported when true.
    pub logprobs: Option<bool>,
    /// How long the model stays loaded after this request: seconds, or `"5m"`; negative keeps
    /// it; `0` with no messages unloads it.
    #[schema(value_type = Option<Object>)]
    pub keep_alive: Option<Value>,
}

/// `POST /api/generate`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = OllamaGenerateRequest)]
pub struct GenerateBody {
    #[schema(value_type = String, required = true)]
    pub model: Option<String>,
    /// Empty or absent: the model is loaded and nothing else.
    pub prompt: Option<String>,
    pub system: Option<String>,
    /// The prompt as it is, no chat template.
    pub raw: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub format: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub options: Option<Value>,
    pub stream: Option<bool>,
    /// Not supported: a template of the request's own, `suffix`, `images`, `context`, `think`.
    pub template: Option<String>,
    pub suffix: Option<String>,
    #[schema(value_type = Option<Vec<String>>)]
    pub images: Option<Vec<Value>>,
    pub context: Option<Vec<i64>>,
    #[schema(value_type = Option<Object>)]
    pub think: Option<Value>,
    pub logprobs: Option<bool>,
    /// As `/api/chat`'s; `0` with no prompt unloads the model.
    #[schema(value_type = Option<Object>)]
    pub keep_alive: Option<Value>,
}

/// Ollama's `keep_alive`: a number of seconds or a duration string (`"5m"`, `"1h"`), a negative
/// one keeping the model loaded.
pub fn keep_alive(value: Option<&Value>) -> Result<Option<KeepAlive>, ApiError> {
    let invalid = || {
        bad(
            "keep_alive",
            "must be a number of seconds or a duration such as \"5m\"",
        )
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(s) if s < 0.0 => Ok(Some(KeepAlive::Forever)),
            Some(s) => KeepAlive::parse(&format!("{}ms", (s * 1000.0).round() as u64))
                .map(Some)
                .map_err(|_| invalid()),
            None => Err(invalid()),
        },
        Some(Value::String(s)) if s.trim_start().starts_with('-') => Ok(Some(KeepAlive::Forever)),
        Some(Value::String(s)) => KeepAlive::parse(s).map(Some).map_err(|_| invalid()),
        Some(_) => Err(invalid()),
    }
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

/// `None` when the request only asks for the model to be loaded (no messages).
pub fn chat(body: ChatBody, catalog: &Catalog) -> Result<Option<Checked>, ApiError> {
    let spec = front::model(body.model.as_deref(), catalog)?;
    refuse_true(body.think.as_ref(), "think", "thinking is not supported")?;
    if body.logprobs == Some(true) {
        return Err(bad(
            "logprobs",
            "is not supported here; use /v1/chat/completions",
        ));
    }
    let list = body.messages.unwrap_or_default();
    if list.is_empty() {
        return Ok(None);
    }
    let messages = messages(list)?;
    let tools = tools::mode(body.tools.as_deref(), None, MAX_TOOLS)?;
    let prompt = match tools.offered() {
        Some(tools) => Prompt::ChatWithTools { messages, tools },
        None => Prompt::Chat(messages),
    };
    let valid = valid(spec, prompt, body.options.as_ref(), body.format.as_ref())?;
    Ok(Some(Checked {
        valid,
        stream: body.stream.unwrap_or(true),
        tools,
    }))
}

/// `None` when the request only asks for the model to be loaded (no prompt).
pub fn generate(body: GenerateBody, catalog: &Catalog) -> Result<Option<Checked>, ApiError> {
    let spec = front::model(body.model.as_deref(), catalog)?;
    refuse_true(body.think.as_ref(), "think", "thinking is not supported")?;
    if body.logprobs == Some(true) {
        return Err(bad(
            "logprobs",
            "is not supported here; use /v1/completions",
        ));
    }
    if body.template.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(bad("template", "a request's own template is not supported"));
    }
    if body.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(bad("suffix", "(insertion) is not supported"));
    }
    if body.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(bad("images", "images are not supported"));
    }
    if body.context.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(bad("context", "continuing from a context is not supported"));
    }
    let prompt = body.prompt.unwrap_or_default();
    if prompt.is_empty() {
        return Ok(None);
    }
    let system = body.system.filter(|s| !s.is_empty());
    let prompt = match (body.raw.unwrap_or(false), system) {
        (true, Some(_)) => return Err(bad("system", "cannot be combined with raw")),
        (true, None) => Prompt::Text(prompt),
        (false, system) => Prompt::Chat(
            system
                .map(|s| ChatMessage::new(Role::System, s))
                .into_iter()
                .chain([ChatMessage::new(Role::User, prompt)])
                .collect(),
        ),
    };
    let valid = valid(spec, prompt, body.options.as_ref(), body.format.as_ref())?;
    Ok(Some(Checked {
        valid,
        stream: body.stream.unwrap_or(true),
        tools: ToolMode::None,
    }))
}

fn refuse_true(value: Option<&Value>, field: &str, message: &str) -> Result<(), ApiError> {
    match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(_) => Err(bad(field, message)),
    }
}

/// The request for `prompt` with `options` and `format` applied.
fn valid(
    spec: &TextModelSpec,
    prompt: Prompt,
    options: Option<&Value>,
    format: Option<&Value>,
) -> Result<ValidRequest, ApiError> {
    let empty = serde_json::Map::new();
    let options = match options {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("options", "must be an object")),
    };
    for (key, value) in options {
        let field = format!("options.{key}");
        if RUNTIME_OPTIONS.contains(&key.as_str()) {
            continue;
        }
        if let Some((_, off)) = OFF_OPTIONS.iter().find(|(k, _)| k == key) {
            if value.is_null() || value.as_f64() == Some(*off) {
                continue;
            }
            return Err(bad(&field, format!("is not supported (only {off})")));
        }
        if ![
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "num_predict",
            "stop",
            "presence_penalty",
            "frequency_penalty",
        ]
        .contains(&key.as_str())
        {
            return Err(bad(&field, "is not a supported option"));
        }
    }
    let number = |key: &str| -> Result<Option<f64>, ApiError> {
        match options.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(&format!("options.{key}"), "must be a number")),
        }
    };
    let max_output_tokens = match options.get("num_predict") {
        None | Some(Value::Null) => output_tokens(&None, "options.num_predict", spec),
        Some(v) => match v.as_i64() {
            // -1: no limit but the model's; -2: until the context is full (the same here).
            Some(-1 | -2) => Ok(spec.max_output_tokens),
            Some(n) if n >= 1 => output_tokens(&Some(v.clone()), "options.num_predict", spec),
            _ => return Err(bad("options.num_predict", "must be positive, -1 or -2")),
        },
    }
    .map_err(ApiError::from)?;
    let top_p = front::top_p(number("top_p")?, "options.top_p")?;
    let top_k = match number("top_k")? {
        None => 0,
        Some(k) if k >= 0.0 && k.fract() == 0.0 => k.min(u32::MAX as f64) as usize,
        Some(_) => return Err(bad("options.top_k", "must be a whole number, 0 or more")),
    };
    let seed = match options.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| bad("options.seed", "must be an integer"))? as u64,
        ),
    };
    let stop: Vec<String> = match options.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|s| s.as_str().map(String::from))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("options.stop", "must be strings"))?,
        Some(_) => return Err(bad("options.stop", "must be strings")),
    };
    let stop = front::stop_strings(stop, "options.stop", MAX_STOP)?;
    let penalty = |key: &str| -> Result<f32, ApiError> {
        match number(key)? {
            None => Ok(0.0),
            Some(p) if (-2.0..=2.0).contains(&p) => Ok(p as f32),
            Some(p) => Err(bad(
                &format!("options.{key}"),
                format!("must be from -2 to 2, got {p}"),
            )),
        }
    };
    let grammar = match format {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some(GrammarRequest::JsonObject),
        Some(schema @ Value::Object(_)) => Some(GrammarRequest::JsonSchema(schema.clone())),
        Some(_) => return Err(bad("format", "must be \"json\" or a JSON schema object")),
    };
    Ok(ValidRequest {
        model: spec.id.clone(),
        prompt,
        temperature: temperature(&options.get("temperature").cloned(), spec)
            .map_err(ApiError::from)?,
        max_output_tokens,
        margin: None,
        developer_id: None,
        application_id: None,
        decode: Decode {
            top_p,
            top_k,
            seed,
            stop,
            presence_penalty: penalty("presence_penalty")?,
            frequency_penalty: penalty("frequency_penalty")?,
            grammar,
            ..Decode::default()
        },
    })
}

/// The conversation. Ollama's calls carry no ids: each gets `call_<n>`, and a tool message
/// answers the latest call of its `tool_name` (or the latest call).
fn messages(list: Vec<Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(list.len());
    let mut calls: Vec<(String, String)> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let field = format!("messages[{i}]");
        let role = match m["role"].as_str() {
            Some(r) => r
                .parse::<Role>()
                .map_err(|e| bad(&format!("{field}.role"), e))?,
            None => return Err(bad(&format!("{field}.role"), "is required")),
        };
        let content = match &m["content"] {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            _ => return Err(bad(&format!("{field}.content"), "must be a string")),
        };
        if m["images"].as_array().is_some_and(|a| !a.is_empty()) {
            return Err(bad(&format!("{field}.images"), "images are not supported"));
        }
        let mut message = ChatMessage::new(role, content);
        if let Some(list) = m["tool_calls"].as_array() {
            if role != Role::Assistant {
                return Err(bad(
                    &format!("{field}.tool_calls"),
                    "only assistant messages carry tool_calls",
                ));
            }
            for (j, call) in list.iter().enumerate() {
                let function = &call["function"];
                let Some(name) = function["name"].as_str() else {
                    return Err(bad(
                        &format!("{field}.tool_calls[{j}].function.name"),
                        "is required",
                    ));
                };
                let arguments = match &function["arguments"] {
                    Value::Null => "{}".to_string(),
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                let id = format!("call_{}", calls.len());
                calls.push((id.clone(), name.to_string()));
                message.tool_calls.push(ToolCall {
                    id,
                    name: name.into(),
                    arguments,
                });
            }
        }
        if role == Role::Tool {
            let name = m["tool_name"].as_str().or_else(|| m["name"].as_str());
            let answered = calls
                .iter()
                .rev()
                .find(|(_, n)| name.is_none_or(|name| n == name))
                .map(|(id, _)| id.clone());
            message.tool_call_id = Some(
                answered
                    .or_else(|| name.map(String::from))
                    .unwrap_or_else(|| "call".into()),
            );
        }
        out.push(message);
    }
    Ok(out)
}
