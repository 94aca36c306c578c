//! A generation's events turned into OpenAI's Responses answers: a whole `response` object, or
//! a stream's events (`response.created`, `response.in_progress`, per output item
//! `response.output_item.added`, its text's `content_part.added`, `output_text.delta`s,
//! `output_text.done` and `content_part.done`, or a call's `function_call_arguments.delta`s and
//! `.done`, then `response.output_item.done`; at the end `response.completed`, or
//! `response.incomplete` when the output limit cut it). Each event's payload carries its
//! `type` (the event's name) and a `sequence_number`. Text and calls are read out of the
//! generated text by the chat route's [`Splitter`].

use hearth_types::{AbortReason, FinishReason, TokenLogprob};
use serde_json::{json, Value};

use super::request::Echo;
use crate::error::{ApiError, OpenAiError};
use crate::services::completion::openai::respond::Answer;
use crate::services::completion::openai::tools::{Piece, Splitter, ToolMode};
use crate::services::completion::stream::CompletionResponse;

/// One output item.
#[derive(Debug, Clone)]
enum Item {
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Message { id, .. } | Item::Call { id, .. } => id,
        }
    }

    fn json(&self, status: &str) -> Value {
        match self {
            Item::Message { id, text } => {
                let content = if status == "in_progress" {
                    json!([])
                } else {
                    json!([part(text)])
                };
                json!({ "type": "message", "id": id, "status": status, "role": "assistant",
                        "content": content })
            }
            Item::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({ "type": "function_call", "id": id, "call_id": call_id, "name": name,
                         "arguments": arguments, "status": status }),
        }
    }
}

fn part(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [] })
}

/// Builds one answer from a generation's events, whole or as a stream's events.
pub struct Responses {
    id: String,
    model: String,
    created_at: u64,
    echo: Echo,
    splitter: Splitter,
    items: Vec<Item>,
    /// A stream's open item (the last).
    open: bool,
    sequence: u64,
}

impl Responses {
    pub fn new(stream_id: &str, model: &str, tools: &ToolMode, echo: Echo) -> Self {
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        Responses {
            id: format!("resp_{}", stream_id.replace('-', "")),
            model: model.to_string(),
            created_at,
            echo,
            splitter: Splitter::new(tools),
            items: Vec::new(),
            open: false,
            sequence: 0,
        }
    }

    /// The response object in `status`, with its usage once known.
    fn response(&self, status: &str, response: Option<&CompletionResponse>) -> Value {
        let usage = response.map(|r| {
            let (input, output) = (r.usage.prompt_tokens, r.usage.completion_tokens);
            json!({ "input_tokens": input, "input_tokens_details": { "cached_tokens": 0 },
                    "output_tokens": output, "output_tokens_details": { "reasoning_tokens": 0 },
                    "total_tokens": input + output })
        });
        let incomplete = (status == "incomplete").then(|| json!({ "reason": "max_output_tokens" }));
        let e = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.items.iter().map(|i| i.json("completed")).collect::<Vec<_>>(),
            "usage": usage,
            "incomplete_details": incomplete,
            "error": null,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "temperature": e.temperature,
            "top_p": e.top_p,
            "tools": e.tools,
            "tool_choice": e.tool_choice,
            "text": e.text,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": null,
            "store": false,
            "metadata": e.metadata,
        })
    }

    /// An event: `body` with its type and the next sequence number.
    fn event(&mut self, kind: &str, mut body: Value) -> String {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        body.to_string()
    }

    /// The stream's first events.
    pub fn opening(&mut self) -> Vec<String> {
        let created = self.response("in_progress", None);
        vec![
            self.event("response.created", json!({ "response": created.clone() })),
            self.event("response.in_progress", json!({ "response": created })),
        ]
    }

    /// Opens a new item: its added events.
    fn add(&mut self, item: Item) -> Vec<String> {
        let mut out = self.close();
        let index = self.items.len();
        let added = item.json("in_progress");
        let id = item.id().to_string();
        let is_message = matches!(item, Item::Message { .. });
        self.items.push(item);
        self.open = true;
        out.push(self.event(
            "response.output_item.added",
            json!({ "output_index": index, "item": added }),
        ));
        if is_message {
            out.push(self.event(
                "response.content_part.added",
                json!({ "item_id": id, "output_index": index, "content_index": 0,
                        "part": part("") }),
            ));
        }
        out
    }

    /// Closes the open item: its done events.
    fn close(&mut self) -> Vec<String> {
        if !std::mem::take(&mut self.open) {
            return Vec::new();
        }
        let index = self.items.len() - 1;
        let item = self.items[index].clone();
        let mut out = Vec::new();
        match &item {
            Item::Message { id, text } => {
                out.push(self.event(
                    "response.output_text.done",
                    json!({ "item_id": id, "output_index": index, "content_index": 0,
                            "text": text }),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({ "item_id": id, "output_index": index, "content_index": 0,
                            "part": part(text) }),
                ));
            }
            Item::Call { id, arguments, .. } => {
                out.push(self.event(
                    "response.function_call_arguments.done",
                    json!({ "item_id": id, "output_index": index, "arguments": arguments }),
                ));
            }
        }
        out.push(self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": item.json("completed") }),
        ));
        out
    }

    /// Pieces into the answer; the events they make on a stream.
    fn take(&mut self, pieces: Vec<Piece>) -> Vec<String> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Content(text) if text.is_empty() => {}
                Piece::Content(text) => {
                    if !(self.open && matches!(self.items.last(), Some(Item::Message { .. }))) {
                        out.extend(self.add(Item::Message {
                            id: unique("msg"),
                            text: String::new(),
                        }));
                    }
                    let index = self.items.len() - 1;
                    let Some(Item::Message { id, text: all }) = self.items.last_mut() else {
                        continue;
                    };
                    all.push_str(&text);
                    let id = id.clone();
                    out.push(self.event(
                        "response.output_text.delta",
                        json!({ "item_id": id, "output_index": index, "content_index": 0,
                                "delta": text, "logprobs": [] }),
                    ));
                }
                Piece::CallStart { name } => out.extend(self.add(Item::Call {
                    id: unique("fc"),
                    call_id: unique("call"),
                    name,
                    arguments: String::new(),
                })),
                Piece::Arguments(delta) => {
                    let index = self.items.len().saturating_sub(1);
                    let Some(Item::Call { id, arguments, .. }) = self.items.last_mut() else {
                        continue;
                    };
                    arguments.push_str(&delta);
                    let id = id.clone();
                    out.push(self.event(
                        "response.function_call_arguments.delta",
                        json!({ "item_id": id, "output_index": index, "delta": delta }),
                    ));
                }
            }
        }
        out
    }
}

/// `completed`, or `incomplete` when the output limit (or the context) cut the answer. A
/// stream stopped on request or by its client is complete as far as it went.
fn status(outcome: &Result<FinishReason, AbortReason>) -> &'static str {
    match outcome {
        Ok(FinishReason::Length | FinishReason::ContextFull) => "incomplete",
        _ => "completed",
    }
}

impl Answer for Responses {
    type Whole = Value;

    const DONE: Option<&'static str> = None;

    fn chunk_of(&mut self, token: String, _: Vec<TokenLogprob>) -> Vec<String> {
        let pieces = self.splitter.push(&token);
        self.take(pieces)
    }

    fn gather(&mut self, token: String, _: Vec<TokenLogprob>) {
        let pieces = self.splitter.push(&token);
        self.take(pieces);
    }

    fn failure(&self, error: ApiError) -> String {
        let body = OpenAiError(error).body();
        let e = &body["error"];
        json!({ "type": "error", "code": e["code"], "message": e["message"], "param": e["param"],
                "sequence_number": self.sequence })
        .to_string()
    }

    fn last_chunks(
        &mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Vec<String> {
        let pieces = self.splitter.finish();
        let mut out = self.take(pieces);
        out.extend(self.close());
        let status = status(outcome);
        let whole = self.response(status, Some(response));
        out.push(self.event(&format!("response.{status}"), json!({ "response": whole })));
        out
    }

    fn finish(
        mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Value {
        let pieces = self.splitter.finish();
        self.take(pieces);
        self.response(status(outcome), Some(response))
    }
}
