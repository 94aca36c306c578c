//! The OpenAI API's requests checked into the one [`ValidRequest`] both front ends hand to the
//! start pipeline, plus what only this front end needs (streaming, usage chunk, tool mode).
//! Every value Hearth cannot honour is refused by name, never silently ignored.

use serde_json::{json, Value};

use hearth_types::{ChatMessage, Role, ToolCall};

use super::tools::{self, ToolMode};
use super::wire::{
    ChatRequest, Content, PromptField, ResponseFormat, SamplingFields, StopField, TextRequest,
    WireMessage,
};
use crate::error::ApiError;
use crate::services::completion::catalog::{Catalog, TextModelSpec};
use crate::services::completion::front;
use crate::services::completion::validate::{
    output_tokens, temperature, Decode, GrammarRequest, Prompt, ValidRequest,
};
use crate::validate as fields;

/// At most this many stop strings (the API's limit).
const MAX_STOP: usize = 4;
/// At most this many alternatives per token (`top_logprobs`).
const MAX_TOP_LOGPROBS: u64 = 20;
/// At most this many tools offered in one request.
const MAX_TOOLS: usize = 128;
/// `/v1/completions` without `max_tokens` generates this many, as the API documents.
const TEXT_DEFAULT_MAX_TOKENS: u64 = 16;

/// A checked request and how to answer it.
#[derive(Debug)]
pub struct Checked {
    pub valid: ValidRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// The tools offered and how they may be called (chat only).
    pub tools: ToolMode,
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

pub fn chat(req: ChatRequest, catalog: &Catalog) -> Result<Checked, ApiError> {
    let spec = front::model(req.model.as_deref(), catalog)?;
    let messages = messages(req.messages.unwrap_or_default())?;
    let max_tokens = match (&req.max_completion_tokens, &req.max_tokens) {
        (Some(v), _) if !v.is_null() => {
            output_tokens(&Some(v.clone()), "max_completion_tokens", spec)
        }
        (_, v) => output_tokens(v, "max_tokens", spec),
    }
    .map_err(ApiError::from)?;
    let mut decode = sampling(&req.sampling, spec)?;
    decode.logprobs = match (req.logprobs, req.top_logprobs) {
        (Some(true), n) => Some(top_logprobs(
            n.unwrap_or(0),
            "top_logprobs",
            MAX_TOP_LOGPROBS,
        )?),
        (_, Some(n)) if n > 0 => return Err(bad("top_logprobs", "needs logprobs: true")),
        _ => None,
    };
    let tools = tools::mode(req.tools.as_deref(), req.tool_choice.as_ref(), MAX_TOOLS)?;
    decode.grammar = match (&req.response_format, tools.grammar()?) {
        (Some(ResponseFormat::JsonObject | ResponseFormat::JsonSchema { .. }), Some(_)) => {
            return Err(bad(
                "response_format",
                "cannot be combined with a tool_choice that forces a call",
            ))
        }
        (_, Some(call)) => Some(call),
        (Some(format), None) => response_format(format)?,
        (None, None) => None,
    };
    if decode.ignore_eos && decode.grammar.is_some() {
        return Err(bad(
            "ignore_eos",
            "cannot be combined with a response_format or a forced tool call",
        ));
    }
    let prompt = match tools.offered() {
        Some(list) => Prompt::ChatWithTools {
            messages,
            tools: list,
        },
        None => Prompt::Chat(messages),
    };
    Ok(Checked {
        valid: valid(&req.model, spec, prompt, &req.sampling, max_tokens, decode)?,
        stream: req.sampling.stream.unwrap_or(false),
        include_usage: include_usage(&req.sampling),
        tools,
    })
}

pub fn text(req: TextRequest, catalog: &Catalog) -> Result<Checked, ApiError> {
    let spec = front::model(req.model.as_deref(), catalog)?;
    let prompt = match req.prompt {
        Some(PromptField::One(p)) => p,
        Some(PromptField::Many(mut list)) if list.len() == 1 => list.remove(0),
        Some(PromptField::Many(_)) => {
            return Err(bad(
                "prompt",
                "one prompt per request (a list of exactly one)",
            ))
        }
        None => return Err(bad("prompt", "is required")),
    };
    if prompt.is_empty() {
        return Err(bad("prompt", "must not be empty"));
    }
    if req.echo == Some(true) {
        return Err(bad("echo", "is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(bad("suffix", "(insertion) is not supported"));
    }
    if req.best_of.is_some_and(|n| n != 1) {
        return Err(bad("best_of", "must be 1"));
    }
    let max_tokens = match &req.max_tokens {
        Some(v) if !v.is_null() => output_tokens(&Some(v.clone()), "max_tokens", spec),
        _ => output_tokens(
            &Some(json!(
                TEXT_DEFAULT_MAX_TOKENS.min(spec.max_output_tokens as u64)
            )),
            "max_tokens",
            spec,
        ),
    }
    .map_err(ApiError::from)?;
    let mut decode = sampling(&req.sampling, spec)?;
    decode.logprobs = match req.logprobs {
        Some(n) => Some(top_logprobs(n, "logprobs", 5)?),
        None => None,
    };
    Ok(Checked {
        valid: valid(
            &req.model,
            spec,
            Prompt::Text(prompt),
            &req.sampling,
            max_tokens,
            decode,
        )?,
        stream: req.sampling.stream.unwrap_or(false),
        include_usage: include_usage(&req.sampling),
        tools: ToolMode::None,
    })
}

fn valid(
    name: &Option<String>,
    spec: &TextModelSpec,
    prompt: Prompt,
    s: &SamplingFields,
    max_output_tokens: usize,
    decode: Decode,
) -> Result<ValidRequest, ApiError> {
    Ok(ValidRequest {
        model: name.clone().unwrap_or_else(|| spec.id.clone()),
        prompt,
        temperature: temperature(&s.temperature, spec).map_err(ApiError::from)?,
        max_output_tokens,
        margin: None,
        developer_id: fields::id("developer_id", s.developer_id.as_deref())?,
        application_id: fields::id("application_id", s.application_id.as_deref())?,
        decode,
    })
}

fn include_usage(s: &SamplingFields) -> bool {
    s.stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false)
}

fn top_logprobs(n: u64, field: &str, max: u64) -> Result<usize, ApiError> {
    if n > max {
        return Err(bad(field, format!("must be from 0 to {max}")));
    }
    Ok(n as usize)
}

/// The fields both routes share: `n`, `top_p`, `seed`, `stop`, the penalties, `logit_bias`.
fn sampling(s: &SamplingFields, _spec: &TextModelSpec) -> Result<Decode, ApiError> {
    if s.n.is_some_and(|n| n != 1) {
        return Err(bad("n", "must be 1: one choice per request"));
    }
    if s.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(bad("logit_bias", "is not supported"));
    }
    let top_p = front::top_p(s.top_p, "top_p")?;
    let penalty = |v: Option<f64>, field: &str| match v {
        None => Ok(0.0),
        Some(p) if (-2.0..=2.0).contains(&p) => Ok(p as f32),
        Some(p) => Err(bad(field, format!("must be from -2 to 2, got {p}"))),
    };
    let stop = match &s.stop {
        None => Vec::new(),
        Some(StopField::One(one)) => vec![one.clone()],
        Some(StopField::Many(list)) => list.clone(),
    };
    let stop = front::stop_strings(stop, "stop", MAX_STOP)?;
    Ok(Decode {
        top_p,
        top_k: 0,
        seed: s.seed.map(|v| v as u64),
        stop,
        presence_penalty: penalty(s.presence_penalty, "presence_penalty")?,
        frequency_penalty: penalty(s.frequency_penalty, "frequency_penalty")?,
        logprobs: None,
        grammar: None,
        ignore_eos: s.ignore_eos.unwrap_or(false),
    })
}

fn response_format(format: &ResponseFormat) -> Result<Option<GrammarRequest>, ApiError> {
    Ok(match format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(GrammarRequest::JsonObject),
        ResponseFormat::JsonSchema { json_schema } => match &json_schema.schema {
            Some(schema @ Value::Object(_)) => Some(GrammarRequest::JsonSchema(schema.clone())),
            Some(_) => {
                return Err(bad(
                    "response_format",
                    "response_format.json_schema.schema must be an object",
                ))
            }
            None => Some(GrammarRequest::JsonObject),
        },
    })
}

/// The conversation: roles `system` (or `developer`), `user`, `assistant` (with or without
/// `tool_calls`) and `tool`; text content, as a string or text parts.
fn messages(list: Vec<WireMessage>) -> Result<Vec<ChatMessage>, ApiError> {
    if list.is_empty() {
        return Err(bad("messages", "must not be empty"));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let field = format!("messages[{i}]");
            let role = match m.role.as_str() {
                "developer" => Role::System,
                other => other
                    .parse::<Role>()
                    .map_err(|e| bad(&format!("{field}.role"), e))?,
            };
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(text)) => text,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.into_iter().enumerate() {
                        match (part.kind.as_str(), part.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(bad(
                                    &format!("{field}.content[{j}]"),
                                    format!(
                                    "content parts of type {kind:?} are not supported; only text"
                                ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            let mut message = ChatMessage::new(role, content);
            if let Some(calls) = m.tool_calls {
                if role != Role::Assistant {
                    return Err(bad(
                        &format!("{field}.tool_calls"),
                        "only assistant messages carry tool_calls",
                    ));
                }
                message.tool_calls = calls
                    .into_iter()
                    .map(|c| ToolCall {
                        id: c.id,
                        name: c.function.name,
                        arguments: c.function.arguments,
                    })
                    .collect();
            }
            if role == Role::Tool {
                message.tool_call_id = Some(m.tool_call_id.ok_or_else(|| {
                    bad(
                        &format!("{field}.tool_call_id"),
                        "a tool message needs the tool_call_id it answers",
                    )
                })?);
            }
            Ok(message)
        })
        .collect()
}
