//! Anthropic's Messages API bodies, as far as Hearth serves them. Requests are read leniently
//! where a field only tunes a hosted service (`cache_control` on blocks, `service_tier`); a
//! field that would change the answer and that Hearth cannot honour is refused by name
//! (`request.rs`). Content blocks are read as raw JSON and checked there, so an error names the
//! block (`messages[2].content[1]`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

// ---- requests -------------------------------------------------------------------------------

/// `POST /v1/messages`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = AnthropicMessagesRequest)]
pub struct MessagesRequest {
    /// A model id (`GET /v1/models`); unknown: 404 `not_found_error`.
    #[schema(value_type = String, required = true)]
    pub model: Option<String>,
    /// Turns of `user` and `assistant`; content a string or blocks (`text`, `tool_use`,
    /// `tool_result`).
    #[schema(value_type = Vec<Object>, required = true, min_items = 1)]
    pub messages: Option<Vec<Value>>,
    /// Required: 1 to the model's maximum output.
    #[schema(value_type = u32, required = true, minimum = 1)]
    pub max_tokens: Option<Value>,
    /// A string, or text blocks.
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    /// Up to 16 strings; the answer ends before the first one generated.
    pub stop_sequences: Option<Vec<String>>,
    /// 0 to the model's maximum; the model's default when absent.
    #[schema(value_type = Option<f64>, minimum = 0.0)]
    pub temperature: Option<Value>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Sample from the `top_k` most likely tokens only.
    #[schema(minimum = 1)]
    pub top_k: Option<u64>,
    /// `{name, description, input_schema}`.
    pub tools: Option<Vec<AnthropicTool>>,
    /// `{type: "auto" | "any" | "tool" | "none", name?}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `{user_id}`: logged, not stored.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Answer as server-sent events (`message_start` ... `message_stop`).
    pub stream: Option<bool>,
    /// Not supported: extended thinking is refused when enabled.
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
    /// `{format: {type: "json_schema", schema}}`: the answer is decoded under that schema
    /// (`effort` is accepted and ignored).
    #[schema(value_type = Option<Object>)]
    pub output_config: Option<Value>,
}

/// `POST /v1/messages/count_tokens`: a messages request without its generation fields.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = AnthropicCountTokensRequest)]
pub struct CountRequest {
    #[schema(value_type = String, required = true)]
    pub model: Option<String>,
    #[schema(value_type = Vec<Object>, required = true, min_items = 1)]
    pub messages: Option<Vec<Value>>,
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    pub tools: Option<Vec<AnthropicTool>>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct AnthropicTool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of the input (an object).
    #[schema(value_type = Object)]
    pub input_schema: Option<Value>,
    /// Server tools (`web_search_...`) have a type; custom tools have none or `custom`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

// ---- responses ------------------------------------------------------------------------------

/// A whole answer (`type: "message"`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AnthropicMessage)]
pub struct Message {
    /// `msg_` and the stream's id.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<Block>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use` (null until the end of a stream).
    pub stop_reason: Option<&'static str>,
    /// The stop sequence that ended the answer, with `stop_reason: "stop_sequence"`.
    pub stop_sequence: Option<String>,
    pub usage: AnthropicUsage,
}

/// One block of an answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        /// `toolu_` and a unique suffix.
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AnthropicUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// `POST /v1/messages/count_tokens`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCount {
    /// The prompt's tokens as the model reads it (template included).
    pub input_tokens: usize,
}
