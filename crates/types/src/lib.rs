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
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
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
            other => Err(UnknownRole(other.to_string())),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}: expected system, user or assistant")]
pub struct UnknownRole(pub String);

/// One message of a chat conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
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
}

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
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence or end-of-turn token.
    Stop,
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
    /// The spending cap (the funds held for the request) was used up.
    BudgetExhausted,
    /// The server is shutting down and the grace period ran out.
    Shutdown,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_render_as_the_wire_names() {
        for role in [Role::System, Role::User, Role::Assistant] {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!("tool".parse::<Role>().is_err());
    }
}
