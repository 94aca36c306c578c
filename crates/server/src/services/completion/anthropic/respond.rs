//! A generation's events turned into Anthropic's answers: a whole `message`, or a stream's
//! events (`message_start`, `ping`, per block `content_block_start`, `content_block_delta`s and
//! `content_block_stop`, then `message_delta` with the stop reason and usage, `message_stop`).
//! Text and tool calls are read out of the generated text by the OpenAI front end's
//! [`Splitter`] (one reader of calls for every front end). Each payload's `type` is its event's
//! name.

use hearth_types::{AbortReason, FinishReason, TokenLogprob};
use serde_json::{json, Value};

use super::wire::{AnthropicUsage, Block, Message};
use crate::error::{AnthropicError, ApiError};
use crate::services::completion::openai::respond::{Answer, Json as _};
use crate::services::completion::openai::tools::{arguments_object, Piece, Splitter, ToolMode};
use crate::services::completion::stream::CompletionResponse;

/// What the open block of a stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    ToolUse,
}

/// Builds one answer from a generation's events, whole or as a stream's events.
pub struct Messages {
    id: String,
    model: String,
    splitter: Splitter,
    stops: Vec<String>,
    prompt_tokens: usize,
    /// The answer's blocks so far; a tool call's input kept as JSON text until the end.
    blocks: Vec<Block>,
    arguments: Vec<String>,
    /// A stream's open block.
    open: Option<Open>,
}

impl Messages {
    pub fn new(
        stream_id: &str,
        model: &str,
        tools: &ToolMode,
        stops: Vec<String>,
        prompt_tokens: usize,
    ) -> Self {
        Messages {
            id: format!("msg_{}", stream_id.replace('-', "")),
            model: model.to_string(),
            splitter: Splitter::new(tools),
            stops,
            prompt_tokens,
            blocks: Vec::new(),
            arguments: Vec::new(),
            open: None,
        }
    }

    /// The stream's first events: the message, empty, then a ping.
    pub fn opening(&self) -> Vec<String> {
        let message = Message {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: AnthropicUsage {
                input_tokens: self.prompt_tokens,
                output_tokens: 0,
            },
        };
        vec![
            json!({ "type": "message_start", "message": message }).to_string(),
            json!({ "type": "ping" }).to_string(),
        ]
    }

    /// Pieces into the answer; the events they make on a stream.
    fn take(&mut self, pieces: Vec<Piece>) -> Vec<Value> {
        let mut events = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Content(text) if text.is_empty() => {}
                Piece::Content(text) => {
                    if self.open != Some(Open::Text) {
                        events.extend(self.close());
                        self.blocks.push(Block::Text {
                            text: String::new(),
                        });
                        self.arguments.push(String::new());
                        self.open = Some(Open::Text);
                        events.push(json!({
                            "type": "content_block_start",
                            "index": self.blocks.len() - 1,
                            "content_block": { "type": "text", "text": "" },
                        }));
                    }
                    if let Some(Block::Text { text: all }) = self.blocks.last_mut() {
                        all.push_str(&text);
                    }
                    events.push(json!({
                        "type": "content_block_delta",
                        "index": self.blocks.len() - 1,
                        "delta": { "type": "text_delta", "text": text },
                    }));
                }
                Piece::CallStart { name } => {
                    events.extend(self.close());
                    let id = format!("toolu_{}", uuid::Uuid::new_v4().simple());
                    self.blocks.push(Block::ToolUse {
                        id: id.clone(),
                        name: name.clone(),
                        input: json!({}),
                    });
                    self.arguments.push(String::new());
                    self.open = Some(Open::ToolUse);
                    events.push(json!({
                        "type": "content_block_start",
                        "index": self.blocks.len() - 1,
                        "content_block": { "type": "tool_use", "id": id, "name": name, "input": {} },
                    }));
                }
                Piece::Arguments(text) => {
                    let Some(args) = self.arguments.last_mut() else {
                        continue;
                    };
                    args.push_str(&text);
                    events.push(json!({
                        "type": "content_block_delta",
                        "index": self.blocks.len() - 1,
                        "delta": { "type": "input_json_delta", "partial_json": text },
                    }));
                }
            }
        }
        events
    }

    /// Closes the open block: its stop event.
    fn close(&mut self) -> Option<Value> {
        self.open
            .take()
            .map(|_| json!({ "type": "content_block_stop", "index": self.blocks.len() - 1 }))
    }

    /// `stop_reason` and `stop_sequence`. A stream stopped on request (`/stream/shutdown`) or
    /// by its client ends as `end_turn`; a failure is an error, not a stop.
    fn stop(&self, outcome: &Result<FinishReason, AbortReason>) -> (&'static str, Option<String>) {
        let called = self
            .blocks
            .iter()
            .any(|b| matches!(b, Block::ToolUse { .. }));
        match outcome {
            _ if called => ("tool_use", None),
            Ok(FinishReason::StopString(i)) => ("stop_sequence", self.stops.get(*i).cloned()),
            Ok(FinishReason::Length | FinishReason::ContextFull) => ("max_tokens", None),
            Ok(FinishReason::Stop) | Err(_) => ("end_turn", None),
        }
    }

    /// Each tool call's input, from its JSON text.
    fn inputs(&mut self) {
        for (block, args) in self.blocks.iter_mut().zip(&self.arguments) {
            if let Block::ToolUse { input, .. } = block {
                *input = arguments_object(args);
            }
        }
    }
}

fn usage(response: &CompletionResponse) -> AnthropicUsage {
    AnthropicUsage {
        input_tokens: response.usage.prompt_tokens,
        output_tokens: response.usage.completion_tokens,
    }
}

impl Answer for Messages {
    type Whole = Message;

    const DONE: Option<&'static str> = None;

    fn chunk_of(&mut self, token: String, _: Vec<TokenLogprob>) -> Vec<String> {
        let pieces = self.splitter.push(&token);
        self.take(pieces).iter().map(|e| e.json()).collect()
    }

    fn gather(&mut self, token: String, _: Vec<TokenLogprob>) {
        let pieces = self.splitter.push(&token);
        self.take(pieces);
    }

    fn failure(&self, error: ApiError) -> String {
        AnthropicError(error).body().to_string()
    }

    fn last_chunks(
        &mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Vec<String> {
        let pieces = self.splitter.finish();
        let mut events = self.take(pieces);
        events.extend(self.close());
        let (reason, sequence) = self.stop(outcome);
        events.push(json!({
            "type": "message_delta",
            "delta": { "stop_reason": reason, "stop_sequence": sequence },
            "usage": usage(response),
        }));
        events.push(json!({ "type": "message_stop" }));
        events.iter().map(|e| e.json()).collect()
    }

    fn finish(
        mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Message {
        let pieces = self.splitter.finish();
        self.take(pieces);
        self.inputs();
        let (reason, sequence) = self.stop(outcome);
        Message {
            id: self.id,
            kind: "message",
            role: "assistant",
            model: self.model,
            content: self.blocks,
            stop_reason: Some(reason),
            stop_sequence: sequence,
            usage: usage(response),
        }
    }
}
