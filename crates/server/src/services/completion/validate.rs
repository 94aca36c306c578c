//! Parse, don't validate: the wire request (every field optional, any JSON type) becomes a
//! [`ValidRequest`] or a [`FieldError`] naming the offending field; the fields every service
//! shares take their rules from `crate::validate`. Section 8 of the spec:
//! temperature and `maxOutputTokens` within the model's row, margin 0..=99, a non-empty message
//! list with known roles, and a prompt that fits both the input limit and the context left after
//! the output.

use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use hearth_billing::Margin;
use hearth_types::{ChatMessage, Role};

use super::catalog::{Catalog, TextModelSpec};
use crate::validate::{self as fields, FieldError};

/// The completion request as it arrives; fields stay raw JSON so that each type error names
/// its field instead of surfacing serde's message. Its schema says what each field must hold.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(
    as = CompletionRequest,
    description = "Completion request (spec 2.4). A bad field is a 400 `InvalidRequest` naming \
        it in `details.field`; a missing or bad `serviceToken` is a 401 `InvalidCredentials`."
)]
pub struct RawCompletionRequest {
    /// The service token (`POST /token` on the auth listener): the credential of this route.
    #[schema(value_type = String, required = true)]
    pub service_token: Option<Value>,
    /// The conversation, oldest first.
    #[schema(value_type = Vec<super::openapi::Message>, required = true, min_items = 1)]
    pub messages: Option<Value>,
    /// A model id of the table (`GET /v1/models`), e.g. `alpha-3.3`, `beta-4-mini`,
    /// `gamma-3.5-sonnet`.
    #[schema(value_type = String, required = true)]
    pub model: Option<Value>,
    /// Recorded in the ledger.
    #[schema(value_type = Option<String>)]
    pub developer_id: Option<Value>,
    /// Recorded in the ledger.
    #[schema(value_type = Option<String>)]
    pub application_id: Option<Value>,
    /// 0 to the model's maximum (spec section 8); the model's default when absent.
    #[schema(value_type = Option<f64>, minimum = 0.0, maximum = 5.0)]
    pub temperature: Option<Value>,
    /// 1 to the model's maximum (spec section 8); the model's default when absent.
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 16384)]
    pub max_output_tokens: Option<Value>,
    /// The gross margin of this request's price, instead of the configured one.
    #[schema(value_type = Option<f64>, minimum = 0.0, maximum = 99.0)]
    pub override_gross_margin_percent: Option<Value>,
}

/// A request every later stage can trust.
/// A request every field of which was checked against the model's row of the table, from
/// either front end (the spec's routes or the OpenAI-compatible ones).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub model: String,
    pub prompt: Prompt,
    pub temperature: f32,
    pub max_output_tokens: usize,
    pub margin: Option<Margin>,
    pub developer_id: Option<String>,
    pub application_id: Option<String>,
    pub decode: Decode,
}

/// What the model reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A conversation, rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// A conversation that offers functions (OpenAI's `tools` list) to call.
    ChatWithTools {
        messages: Vec<ChatMessage>,
        tools: Value,
    },
    /// Text the model continues as it is (`/v1/completions`).
    Text(String),
}

/// Decoding options beyond temperature and length; the spec's routes use the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Decode {
    pub top_p: f32,
    /// Sample from this many most likely tokens only; 0: all.
    pub top_k: usize,
    /// `None`: a seed drawn per request.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// The most likely alternatives to report with each token's log probability.
    pub logprobs: Option<usize>,
    pub grammar: Option<GrammarRequest>,
    /// Keep generating past the end-of-sequence token (never with a grammar).
    pub ignore_eos: bool,
}

impl Default for Decode {
    fn default() -> Self {
        Decode {
            top_p: 1.0,
            top_k: 0,
            seed: None,
            stop: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: None,
            grammar: None,
            ignore_eos: false,
        }
    }
}

/// A grammar the output must follow, enforced token by token while decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarRequest {
    /// Any JSON object.
    JsonObject,
    /// JSON valid against this schema (`response_format`).
    JsonSchema(Value),
    /// A forced tool call: JSON valid against this schema, built from `tools`.
    ToolCall(Value),
}

pub fn validate(raw: &RawCompletionRequest, catalog: &Catalog) -> Result<ValidRequest, FieldError> {
    let model_id = match &raw.model {
        None | Some(Value::Null) => {
            return Err(
                FieldError::new("model", "is required").with("validModels", json!(catalog.ids()))
            )
        }
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(FieldError::new("model", "must be a string")),
    };
    let Some(spec) = catalog.get(&model_id) else {
        let ids = catalog.ids();
        return Err(FieldError::new(
            "model",
            format!(
                "unknown model {model_id:?}; valid models: {}",
                ids.join(", ")
            ),
        )
        .with("validModels", json!(ids)));
    };

    let messages = messages(&raw.messages)?;
    let temperature = temperature(&raw.temperature, spec)?;
    let max_output_tokens = output_tokens(&raw.max_output_tokens, "maxOutputTokens", spec)?;
    let margin = fields::margin(&raw.override_gross_margin_percent)?;
    Ok(ValidRequest {
        model: model_id,
        prompt: Prompt::Chat(messages),
        temperature,
        max_output_tokens,
        margin,
        developer_id: fields::optional_id("developerId", &raw.developer_id)?,
        application_id: fields::optional_id("applicationId", &raw.application_id)?,
        decode: Decode::default(),
    })
}

fn messages(value: &Option<Value>) -> Result<Vec<ChatMessage>, FieldError> {
    let list = match value {
        None | Some(Value::Null) => return Err(FieldError::new("messages", "is required")),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(FieldError::new(
                "messages",
                "must be an array of {role, content}",
            ))
        }
    };
    if list.is_empty() {
        return Err(FieldError::new("messages", "must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let field = format!("messages[{i}]");
            let obj = m.as_object().ok_or_else(|| {
                FieldError::new(&field, "must be an object with role and content")
            })?;
            let role = match obj.get("role") {
                // The spec's roles; `tool` belongs to the OpenAI-compatible routes.
                Some(Value::String(r)) => match r.parse::<Role>() {
                    Ok(role) if role != Role::Tool => role,
                    _ => {
                        return Err(FieldError::new(
                            format!("{field}.role"),
                            format!("unknown role {r:?}: expected system, user or assistant"),
                        )
                        .with("allowed", json!(["system", "user", "assistant"])))
                    }
                },
                _ => return Err(FieldError::new(format!("{field}.role"), "must be a string")),
            };
            let content = match obj.get("content") {
                Some(Value::String(c)) => c.clone(),
                _ => {
                    return Err(FieldError::new(
                        format!("{field}.content"),
                        "must be a string",
                    ))
                }
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

pub(super) fn temperature(value: &Option<Value>, spec: &TextModelSpec) -> Result<f32, FieldError> {
    let Some(value) = value.as_ref().filter(|v| !v.is_null()) else {
        return Ok(spec.default_temperature);
    };
    let t = fields::number("temperature", value)?;
    let (lo, hi) = (spec.temperature_min as f64, spec.temperature_max as f64);
    if !(lo..=hi).contains(&t) {
        return Err(FieldError::new(
            "temperature",
            format!("must be between {lo} and {hi} for {}, got {t}", spec.id),
        )
        .with("min", json!(lo))
        .with("max", json!(hi)));
    }
    Ok(t as f32)
}

/// The most output tokens, from 1 to the model's limit; the model's default when absent.
/// `field` is the name the front end gives it (`maxOutputTokens`, `max_tokens`).
pub(super) fn output_tokens(
    value: &Option<Value>,
    field: &str,
    spec: &TextModelSpec,
) -> Result<usize, FieldError> {
    let Some(value) = value.as_ref().filter(|v| !v.is_null()) else {
        return Ok(spec.default_max_output_tokens);
    };
    let n = fields::integer(
        field,
        &Some(value.clone()),
        1,
        spec.max_output_tokens as u64,
    )?;
    Ok(n.map_or(spec.default_max_output_tokens, |n| n as usize))
}

/// The prompt must fit both the model's input limit and the context left for the output.
pub fn check_prompt_length(
    prompt_tokens: usize,
    max_output_tokens: usize,
    spec: &TextModelSpec,
    context_length: usize,
) -> Result<(), FieldError> {
    let room = context_length.saturating_sub(max_output_tokens);
    let limit = spec.max_input_tokens.min(room);
    if prompt_tokens > limit {
        let why = if room < spec.max_input_tokens {
            format!(
                "the model's context of {context_length} tokens minus maxOutputTokens {max_output_tokens}"
            )
        } else {
            format!("the input limit of {}", spec.id)
        };
        return Err(FieldError::new(
            "messages",
            format!("the prompt is {prompt_tokens} tokens; at most {limit} fit ({why})"),
        )
        .with("promptTokens", json!(prompt_tokens))
        .with("maxPromptTokens", json!(limit)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::completion::catalog::{DEFAULT_MAX_OUTPUT_TOKENS, DEFAULT_TEMPERATURE};
    use std::path::Path;

    fn catalog() -> Catalog {
        super::super::catalog::parse(
            r#"
[text."alpha-3.3"]
weights = "a.gguf"
temperature_max = 5.0
max_output_tokens = 2048
max_input_tokens = 128000
input_price_per_million = "0.60"
output_price_per_million = "2.40"

[text."gamma-3.5-sonnet"]
weights = "g.gguf"
temperature_max = 1.0
max_output_tokens = 8192
max_input_tokens = 200000
input_price_per_million = "3.00"
output_price_per_million = "15.00"
"#,
            Path::new("."),
        )
        .unwrap()
    }

    fn raw(v: Value) -> RawCompletionRequest {
        serde_json::from_value(v).unwrap()
    }

    fn ok() -> Value {
        json!({"serviceToken": "t", "model": "alpha-3.3", "messages": [{"role": "user", "content": "hi"}]})
    }

    fn field_of(mut v: Value, key: &str, value: Value) -> String {
        v[key] = value;
        validate(&raw(v), &catalog()).unwrap_err().field
    }

    #[test]
    fn a_minimal_request_gets_the_documented_defaults() {
        let v = validate(&raw(ok()), &catalog()).unwrap();
        assert_eq!(v.max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS);
        assert_eq!(v.temperature, DEFAULT_TEMPERATURE);
        assert_eq!(v.margin, None);
        assert_eq!(
            v.prompt,
            Prompt::Chat(vec![ChatMessage::new(Role::User, "hi")])
        );
        assert_eq!(v.decode, Decode::default());
    }

    #[test]
    fn every_violation_names_its_field() {
        assert_eq!(field_of(ok(), "model", json!("nope")), "model");
        assert_eq!(field_of(ok(), "model", json!(3)), "model");
        assert_eq!(field_of(ok(), "messages", json!([])), "messages");
        assert_eq!(field_of(ok(), "messages", json!("hi")), "messages");
        assert_eq!(
            field_of(ok(), "messages", json!([{"role": "robot", "content": "x"}])),
            "messages[0].role"
        );
        assert_eq!(
            field_of(ok(), "messages", json!([{"role": "tool", "content": "x"}])),
            "messages[0].role",
            "the spec's routes take system, user and assistant only"
        );
        assert_eq!(
            field_of(ok(), "messages", json!([{"role": "user"}])),
            "messages[0].content"
        );
        assert_eq!(field_of(ok(), "temperature", json!(5.5)), "temperature");
        assert_eq!(field_of(ok(), "temperature", json!(-0.1)), "temperature");
        assert_eq!(field_of(ok(), "temperature", json!("hot")), "temperature");
        assert_eq!(
            field_of(ok(), "maxOutputTokens", json!(0)),
            "maxOutputTokens"
        );
        assert_eq!(
            field_of(ok(), "maxOutputTokens", json!(2049)),
            "maxOutputTokens"
        );
        assert_eq!(
            field_of(ok(), "maxOutputTokens", json!(1.5)),
            "maxOutputTokens"
        );
        assert_eq!(
            field_of(ok(), "overrideGrossMarginPercent", json!(100)),
            "overrideGrossMarginPercent"
        );
        assert_eq!(
            field_of(ok(), "overrideGrossMarginPercent", json!(-1)),
            "overrideGrossMarginPercent"
        );
        assert_eq!(field_of(ok(), "developerId", json!(5)), "developerId");
        assert_eq!(
            field_of(ok(), "developerId", json!("x".repeat(257))),
            "developerId",
            "the ledger ids' length rule is the same as the image service's"
        );
        assert_eq!(
            field_of(ok(), "applicationId", json!("x".repeat(257))),
            "applicationId"
        );
        let mut no_model = ok();
        no_model.as_object_mut().unwrap().remove("model");
        assert_eq!(
            validate(&raw(no_model), &catalog()).unwrap_err().field,
            "model"
        );
    }

    #[test]
    fn limits_follow_the_model_row() {
        let mut v = ok();
        v["model"] = json!("gamma-3.5-sonnet");
        v["temperature"] = json!(1.5);
        let e = validate(&raw(v.clone()), &catalog()).unwrap_err();
        assert_eq!(e.details["max"], json!(1.0));
        v["temperature"] = json!(1.0);
        v["maxOutputTokens"] = json!(8192);
        let ok = validate(&raw(v), &catalog()).unwrap();
        assert_eq!((ok.temperature, ok.max_output_tokens), (1.0, 8192));
    }

    #[test]
    fn unknown_model_lists_the_valid_ids() {
        let mut v = ok();
        v["model"] = json!("gpt-9");
        let e = validate(&raw(v), &catalog()).unwrap_err();
        assert!(e.message.contains("alpha-3.3") && e.message.contains("gamma-3.5-sonnet"));
        assert_eq!(
            e.details["validModels"],
            json!(["alpha-3.3", "gamma-3.5-sonnet"])
        );
    }

    #[test]
    fn the_prompt_limit_message_gives_both_numbers() {
        let c = catalog();
        let spec = c.get("alpha-3.3").unwrap();
        assert!(check_prompt_length(100, 512, spec, 8192).is_ok());
        let e = check_prompt_length(8000, 512, spec, 8192).unwrap_err();
        assert_eq!(e.field, "messages");
        assert!(
            e.message.contains("8000") && e.message.contains("7680"),
            "{}",
            e.message
        );
    }
}
