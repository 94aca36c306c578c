//! The vocabulary every Hearth crate speaks: chat messages, sampling parameters, the events a
//! generation emits and the usage it reports. Plain data with serde; no I/O, no models, no HTTP.

use serde::{Deserialize, Serialize};

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering an assistant's tool call (the OpenAI-compatible routes only;
    /// the spec's routes accept the other three).
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            other => Err(UnknownRole(other.to_string())),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}: expected system, user, assistant or tool")]
pub struct UnknownRole(pub String);

/// One message of a chat conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// The functions an assistant message called (empty for every other message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Which call a `Tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A function call an assistant made: its id, the function's name and its arguments (JSON text,
/// as the model wrote them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// How the next token is chosen. `temperature == 0.0` is greedy decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Nucleus sampling threshold in (0, 1]; 1.0 disables it.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` × the top probability; 0.0 disables it.
    pub min_p: f32,
    /// Penalty applied to tokens already in the context; 1.0 disables it.
    pub repetition_penalty: f32,
    /// Seed of the sampler's random stream, for reproducible sampling.
    pub seed: u64,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// OpenAI's presence penalty, in [-2, 2]: subtracted from the logit of every token this
    /// sequence has generated at least once (the prompt does not count); 0.0 disables it.
    #[serde(default)]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]: subtracted from a token's logit once per time this
    /// sequence has generated it (the prompt does not count); 0.0 disables it.
    #[serde(default)]
    pub frequency_penalty: f32,
    /// `None`: no log-probabilities. `Some(n)`: every generated token reports its own
    /// log-probability and the `n` most likely alternatives (at most [`MAX_TOP_LOGPROBS`]; more
    /// are clipped). See [`TokenLogprob`] for which distribution they describe.
    #[serde(default)]
    pub logprobs: Option<usize>,
    /// Stop strings: generation ends with [`FinishReason::StopString`] as soon as the generated text
    /// contains one of them. Neither the stop string nor anything after it is emitted; text that
    /// might be the start of one is held back until it is known not to be.
    #[serde(default)]
    pub stop: Vec<String>,
}

/// The most alternatives [`SamplingParams::logprobs`] reports per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
            max_tokens: 256,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: None,
            stop: Vec::new(),
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence or end-of-turn token (or a grammar was complete).
    Stop,
    /// The output reached a stop string: the one at this index of [`SamplingParams::stop`].
    StopString(usize),
    /// `max_tokens` was reached.
    Length,
    /// The context window is full.
    ContextFull,
}

/// Why a generation was cut short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "message")]
pub enum AbortReason {
    /// The stream was shut down on request.
    Cancelled,
    /// The receiver went away (the HTTP client disconnected).
    Disconnected,
    /// The server is shutting down and the grace period ran out. `retry_after` is the engine's
    /// figure for when to come back, the same its refusals for load carry.
    Shutdown { retry_after: std::time::Duration },
    /// The engine failed while running this sequence.
    EngineFailure(String),
}

/// Token counts of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// What a running generation sends to its consumer, in order: any number of `Token`s, then
/// exactly one of `Finished` or `Aborted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TokenEvent {
    /// A piece of output text (complete UTF-8) and the id of the token that completed it.
    Token {
        text: String,
        id: u32,
        /// One entry per generated token this piece covers, in order; empty unless
        /// [`SamplingParams::logprobs`] asked for them. A token that completes no text yet (part
        /// of a UTF-8 character, or text held back as a possible stop string) has its entry in
        /// the event that carries its text; the last event of a stream carries whatever is left
        /// (its text may then be empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        usage: Usage,
        reason: FinishReason,
    },
    Aborted {
        usage: Usage,
        reason: AbortReason,
    },
}

/// The log-probability of one generated token and of its most likely alternatives.
///
/// The distribution is the log-softmax of the model's logits after the repetition, presence and
/// frequency penalties and after a token constraint's mask (a token the constraint forbids has
/// probability 0 and is never listed), but before temperature, top-k, top-p and min-p: what the
/// model and the request's penalties make of the next token, whatever the sampling settings.
/// (vLLM's default reports the raw logits, before penalties.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub id: u32,
    /// The token's own text (invalid UTF-8, e.g. half a character, is replaced lossily).
    pub token: String,
    /// The token's exact bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability, `<= 0`.
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first (ties: lower id first); as many
    /// as [`SamplingParams::logprobs`] asked for, fewer when fewer tokens are possible.
    pub top: Vec<TopLogprob>,
}

/// One alternative of a [`TokenLogprob`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub id: u32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_render_as_the_wire_names() {
        for role in [Role::System, Role::User, Role::Assistant, Role::Tool] {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!("function".parse::<Role>().is_err());
    }
}
