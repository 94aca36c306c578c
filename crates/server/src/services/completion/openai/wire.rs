//! The OpenAI API's request and response bodies, as far as Hearth serves them. Requests are
//! read leniently (fields Hearth does not use are ignored, as that API's other servers do);
//! every field Hearth does use is checked in `request.rs`. Their schemas (`ToSchema`) name the
//! fields Hearth reads; a field read as a raw JSON value says what it must hold.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

// ---- requests -------------------------------------------------------------------------------

/// `POST /v1/chat/completions`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = CreateChatCompletionRequest)]
pub struct ChatRequest {
    /// A model id (`GET /v1/models`); unknown: 404 `model_not_found`.
    #[schema(value_type = String, required = true)]
    pub model: Option<String>,
    #[schema(value_type = Vec<WireMessage>, required = true, min_items = 1)]
    pub messages: Option<Vec<WireMessage>>,
    /// 1 to the model's maximum output; the model's default when absent.
    #[schema(value_type = Option<u32>, minimum = 1)]
    pub max_tokens: Option<Value>,
    /// The same as `max_tokens`, which it overrides.
    #[schema(value_type = Option<u32>, minimum = 1)]
    pub max_completion_tokens: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Report each token's log probability.
    pub logprobs: Option<bool>,
    /// With `logprobs`: the most likely alternatives per token, 0 to 20.
    #[schema(maximum = 20)]
    pub top_logprobs: Option<u64>,
    /// `json_object` or `json_schema`: the answer is decoded under that grammar.
    pub response_format: Option<ResponseFormat>,
    /// Functions the model may call.
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
}

/// `POST /v1/completions`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = CreateCompletionRequest)]
pub struct TextRequest {
    /// A model id (`GET /v1/models`); unknown: 404 `model_not_found`.
    #[schema(value_type = String, required = true)]
    pub model: Option<String>,
    /// Continued as it is, with no chat template: a non-empty string, or a list of one.
    #[schema(value_type = PromptField, required = true)]
    pub prompt: Option<PromptField>,
    /// 1 to the model's maximum output; default 16.
    #[schema(value_type = Option<u32>, minimum = 1)]
    pub max_tokens: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// The legacy API's form: how many alternatives to report per token (0 to 5).
    #[schema(maximum = 5)]
    pub logprobs: Option<u64>,
    /// Not supported: `true` is refused.
    pub echo: Option<bool>,
    /// Not supported: a non-empty suffix is refused.
    pub suffix: Option<String>,
    /// 1 only.
    pub best_of: Option<u64>,
}

/// Fields both routes share.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct SamplingFields {
    /// 0 to the model's maximum; the model's default when absent.
    #[schema(value_type = Option<f64>, minimum = 0.0)]
    pub temperature: Option<Value>,
    /// In (0, 1].
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// For reproducible output; random when absent.
    pub seed: Option<i64>,
    /// Up to 4 stop sequences.
    pub stop: Option<StopField>,
    /// 1 only.
    pub n: Option<u64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f64>,
    /// Answer as server-sent events: `data: {chunk}` ... `data: [DONE]`.
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Not supported: a non-empty map is refused.
    #[schema(value_type = Option<Object>)]
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// An end user's id, for the caller's own tracking; logged, not stored.
    pub user: Option<String>,
    /// vLLM's extension: generate past the end-of-sequence token, until `max_tokens` or a stop
    /// sequence (for benchmarks that need a fixed length). Not with a grammar.
    pub ignore_eos: Option<bool>,
    /// Hearth's extensions: the spec's attribution fields.
    pub developer_id: Option<String>,
    pub application_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send `usage` (null until the last chunk, which carries it).
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PromptField {
    One(String),
    Many(Vec<String>),
}

/// A chat message.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ChatMessage)]
pub struct WireMessage {
    /// `system` (or `developer`), `user`, `assistant` or `tool`.
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub tool_calls: Option<Vec<WireToolCall>>,
    /// The call a `tool` message answers (required there).
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// A message's content: text, or a list of parts of which Hearth reads the text ones.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ContentPart {
    /// `text` only: other parts are refused.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// A function call the assistant made.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(as = ToolCall)]
pub struct WireToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: WireFunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(as = FunctionCall)]
pub struct WireFunctionCall {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct JsonSchemaFormat {
    /// The schema (its `name`, and `strict`, which Hearth always is, are not needed).
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct Tool {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema of the arguments.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
}

/// `none`, `auto` (the default with tools), `required`, or one function by name.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    Named {
        function: NamedFunction,
    },
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NamedFunction {
    pub name: String,
}

// ---- responses ------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// Hearth's extra fields on a response and on a stream's last chunk: what the request cost and
/// the balance before and after (decimal strings, as on the spec's routes).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = HearthCost)]
pub struct HearthCost {
    pub input_cost: String,
    pub output_cost: String,
    pub balance_before: String,
    pub balance_after: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub hearth: HearthCost,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireToolCall>,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<LogprobEntry>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprobEntry>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// Present (null until the last chunk) when `stream_options.include_usage` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Usage>)]
    pub usage: Option<Option<Usage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hearth: Option<HearthCost>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hearth: Option<HearthCost>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TextChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<TextLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The legacy completions API's log probabilities: parallel lists.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Each token's alternatives: token -> log probability.
    #[schema(value_type = Vec<Object>)]
    pub top_logprobs: Vec<serde_json::Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = Model)]
pub struct ModelObject {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}
