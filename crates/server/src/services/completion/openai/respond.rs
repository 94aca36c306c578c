//! A generation's events (from the one stream session, `stream.rs`) turned into the OpenAI
//! API's answers: a whole `chat.completion` / `text_completion`, or the chunks of a stream.

use hearth_types::{AbortReason, FinishReason, TokenLogprob};
use serde_json::{Map, Value};

use super::tools::{Piece, Splitter, ToolMode};
use super::wire::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChunkChoice, Delta,
    FunctionDelta, HearthCost, LogprobEntry, TextChoice, TextCompletion, TextLogprobs,
    ToolCallDelta, TopLogprobEntry, Usage, WireFunctionCall, WireToolCall,
};
use crate::error::ApiError;
use crate::services::completion::stream::{abort_error, CompletionResponse, DriverEvent};

/// What every answer of one generation repeats.
#[derive(Debug, Clone)]
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    pub fn new(prefix: &str, stream_id: &str, model: &str) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        Head {
            id: format!("{prefix}-{}", stream_id.replace('-', "")),
            created,
            model: model.to_string(),
        }
    }
}

fn usage(r: &CompletionResponse) -> Usage {
    Usage {
        prompt_tokens: r.usage.prompt_tokens,
        completion_tokens: r.usage.completion_tokens,
        total_tokens: r.usage.prompt_tokens + r.usage.completion_tokens,
    }
}

fn cost(r: &CompletionResponse) -> HearthCost {
    HearthCost {
        input_cost: r.usage.input_cost.clone(),
        output_cost: r.usage.output_cost.clone(),
        balance_before: r.balance_before.clone(),
        balance_after: r.balance_after.clone(),
    }
}

/// The API's `finish_reason`. A stream stopped on request (`/stream/shutdown`) ends as `stop`;
/// a failure is an error, not a finish.
fn finish_reason(outcome: &Result<FinishReason, AbortReason>, called: bool) -> &'static str {
    match outcome {
        _ if called => "tool_calls",
        Ok(FinishReason::Stop | FinishReason::StopString(_))
        | Err(AbortReason::Cancelled | AbortReason::Disconnected) => "stop",
        Ok(FinishReason::Length | FinishReason::ContextFull) => "length",
        Err(_) => "stop",
    }
}

fn logprob_entries(list: &[TokenLogprob]) -> Vec<LogprobEntry> {
    list.iter()
        .map(|t| LogprobEntry {
            token: t.token.clone(),
            logprob: t.logprob,
            bytes: t.bytes.clone(),
            top_logprobs: t
                .top
                .iter()
                .map(|a| TopLogprobEntry {
                    token: a.token.clone(),
                    logprob: a.logprob,
                    bytes: a.bytes.clone(),
                })
                .collect(),
        })
        .collect()
}

/// The end of a generation: how it ended and its settled response, or the error to answer.
enum End {
    Finished(Result<FinishReason, AbortReason>, CompletionResponse),
    Failed(ApiError),
}

fn end_of(event: DriverEvent) -> Option<End> {
    match event {
        DriverEvent::Token { .. } => None,
        DriverEvent::Completed { response, finish } => Some(End::Finished(Ok(finish), response)),
        DriverEvent::Aborted { response, reason } => match reason {
            AbortReason::Cancelled | AbortReason::Disconnected => {
                Some(End::Finished(Err(reason), response))
            }
            other => Some(End::Failed(abort_error(other, response))),
        },
    }
}

/// One kind of answer (chat or text) built from a generation's events. The builders say how a
/// token reads and how an answer ends; [`Answer::on_event`] and [`whole`] are the one
/// reading of the event stream both share.
pub trait Answer: Sized {
    type Whole;

    /// What a stream's last event is followed by (OpenAI's `[DONE]`), if anything.
    const DONE: Option<&'static str> = Some("[DONE]");

    /// A token as the stream sends it: the payloads it makes (none while a piece is held).
    fn chunk_of(&mut self, token: String, logprobs: Vec<TokenLogprob>) -> Vec<String>;
    /// A token kept for the whole answer.
    fn gather(&mut self, token: String, logprobs: Vec<TokenLogprob>);
    /// The stream's last chunks: the final one, and the usage chunk when asked for.
    fn last_chunks(
        &mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Vec<String>;
    /// The whole answer.
    fn finish(
        self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Self::Whole;

    /// The payload of a stream that fails after it started (OpenAI's error body).
    fn failure(&self, error: ApiError) -> String {
        crate::error::OpenAiError(error).body().to_string()
    }

    /// The SSE `data` payloads one event makes; the last event ends with [`Self::DONE`].
    fn on_event(&mut self, event: DriverEvent) -> Vec<String> {
        let mut out = match event {
            DriverEvent::Token { text, logprobs } => return self.chunk_of(text, logprobs),
            terminal => match end_of(terminal) {
                Some(End::Finished(outcome, response)) => self.last_chunks(&outcome, &response),
                Some(End::Failed(error)) => vec![self.failure(error)],
                None => return Vec::new(),
            },
        };
        out.extend(Self::DONE.map(String::from));
        out
    }
}

/// Reads the events to the end: the whole answer, or the error. (A free function rather than a
/// trait method, so that its future is `Send` whenever the builder is.)
pub async fn whole<A: Answer>(
    mut answer: A,
    events: &mut tokio::sync::mpsc::Receiver<DriverEvent>,
) -> Result<A::Whole, ApiError> {
    while let Some(event) = events.recv().await {
        match event {
            DriverEvent::Token { text, logprobs } => answer.gather(text, logprobs),
            terminal => match end_of(terminal) {
                Some(End::Finished(outcome, response)) => {
                    return Ok(answer.finish(&outcome, &response))
                }
                Some(End::Failed(error)) => return Err(error),
                None => {}
            },
        }
    }
    Err(ApiError::internal(
        "the completion driver stopped without an answer",
    ))
}

// ---- chat -----------------------------------------------------------------------------------

/// Builds one chat answer from a generation's events, whole or as chunks.
pub struct Chat {
    head: Head,
    splitter: Splitter,
    logprobs: bool,
    include_usage: bool,
    /// Calls begun so far (the open one is the last).
    calls: Vec<WireToolCall>,
    content: String,
    tokens: Vec<TokenLogprob>,
}

impl Chat {
    pub fn new(head: Head, tools: &ToolMode, logprobs: bool, include_usage: bool) -> Self {
        Chat {
            head,
            splitter: Splitter::new(tools),
            logprobs,
            include_usage,
            calls: Vec::new(),
            content: String::new(),
            tokens: Vec::new(),
        }
    }

    /// Pieces into the answer so far; returns the delta they make.
    fn take(&mut self, pieces: Vec<Piece>) -> Delta {
        let mut delta = Delta::default();
        for piece in pieces {
            match piece {
                Piece::Content(text) => {
                    self.content.push_str(&text);
                    delta
                        .content
                        .get_or_insert_with(String::new)
                        .push_str(&text);
                }
                Piece::CallStart { name } => {
                    let id = format!("call_{}", uuid::Uuid::new_v4().simple());
                    let index = self.calls.len();
                    self.calls.push(WireToolCall {
                        id: id.clone(),
                        kind: "function".into(),
                        function: WireFunctionCall {
                            name: name.clone(),
                            arguments: String::new(),
                        },
                    });
                    delta.tool_calls.push(ToolCallDelta {
                        index,
                        id: Some(id),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    });
                }
                Piece::Arguments(text) => {
                    let Some(index) = self.calls.len().checked_sub(1) else {
                        continue;
                    };
                    self.calls[index].function.arguments.push_str(&text);
                    match delta.tool_calls.last_mut().filter(|d| d.index == index) {
                        Some(open) => open.function.arguments.push_str(&text),
                        None => delta.tool_calls.push(ToolCallDelta {
                            index,
                            id: None,
                            kind: None,
                            function: FunctionDelta {
                                name: None,
                                arguments: text,
                            },
                        }),
                    }
                }
            }
        }
        delta
    }

    fn chunk(
        &self,
        delta: Delta,
        logprobs: Vec<TokenLogprob>,
        finish: Option<&'static str>,
    ) -> ChatChunk {
        let logprobs = (self.logprobs && !logprobs.is_empty()).then(|| ChatLogprobs {
            content: logprob_entries(&logprobs),
        });
        ChatChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs,
                finish_reason: finish,
            }],
            usage: self.include_usage.then_some(None),
            hearth: None,
        }
    }

    /// The stream's first chunk: the assistant's role.
    pub fn opening(&self) -> Value {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..Delta::default()
        };
        serde_json::to_value(self.chunk(delta, Vec::new(), None)).unwrap_or_default()
    }
}

impl Answer for Chat {
    type Whole = ChatCompletion;

    fn chunk_of(&mut self, token: String, logprobs: Vec<TokenLogprob>) -> Vec<String> {
        let pieces = self.splitter.push(&token);
        let delta = self.take(pieces);
        let empty = delta.content.is_none() && delta.tool_calls.is_empty();
        (!empty || (self.logprobs && !logprobs.is_empty()))
            .then(|| self.chunk(delta, logprobs, None).json())
            .into_iter()
            .collect()
    }

    fn gather(&mut self, token: String, logprobs: Vec<TokenLogprob>) {
        let pieces = self.splitter.push(&token);
        self.take(pieces);
        self.tokens.extend(logprobs);
    }

    fn last_chunks(
        &mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Vec<String> {
        let pieces = self.splitter.finish();
        let delta = self.take(pieces);
        let reason = finish_reason(outcome, !self.calls.is_empty());
        let mut last = self.chunk(delta, Vec::new(), Some(reason));
        last.hearth = Some(cost(response));
        let mut out = vec![last.json()];
        if self.include_usage {
            let mut usage_chunk = self.chunk(Delta::default(), Vec::new(), None);
            usage_chunk.choices.clear();
            usage_chunk.usage = Some(Some(usage(response)));
            usage_chunk.hearth = Some(cost(response));
            out.push(usage_chunk.json());
        }
        out
    }

    fn finish(
        mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> ChatCompletion {
        let pieces = self.splitter.finish();
        self.take(pieces);
        let called = !self.calls.is_empty();
        let content = match (called, self.content.is_empty()) {
            (true, true) => None,
            _ => Some(std::mem::take(&mut self.content)),
        };
        let logprobs = self.logprobs.then(|| ChatLogprobs {
            content: logprob_entries(&self.tokens),
        });
        ChatCompletion {
            id: self.head.id,
            object: "chat.completion",
            created: self.head.created,
            model: self.head.model,
            choices: vec![ChatChoice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant",
                    content,
                    tool_calls: self.calls,
                },
                logprobs,
                finish_reason: finish_reason(outcome, called),
            }],
            usage: usage(response),
            hearth: cost(response),
        }
    }
}

// ---- text -----------------------------------------------------------------------------------

/// Builds one `/v1/completions` answer from a generation's events.
pub struct Text {
    head: Head,
    logprobs: bool,
    include_usage: bool,
    text: String,
    tokens: Vec<TokenLogprob>,
}

impl Text {
    pub fn new(head: Head, logprobs: bool, include_usage: bool) -> Self {
        Text {
            head,
            logprobs,
            include_usage,
            text: String::new(),
            tokens: Vec::new(),
        }
    }

    /// The legacy form: parallel lists, offsets into the whole text from `offset`.
    fn legacy(&self, tokens: &[TokenLogprob], mut offset: usize) -> Option<TextLogprobs> {
        if !self.logprobs {
            return None;
        }
        let mut out = TextLogprobs::default();
        for t in tokens {
            out.tokens.push(t.token.clone());
            out.token_logprobs.push(t.logprob);
            let mut top = Map::new();
            for a in &t.top {
                top.insert(a.token.clone(), Value::from(a.logprob));
            }
            out.top_logprobs.push(top);
            out.text_offset.push(offset);
            offset += t.token.len();
        }
        Some(out)
    }

    fn answer(
        &self,
        text: String,
        logprobs: Option<TextLogprobs>,
        finish: Option<&'static str>,
    ) -> TextCompletion {
        TextCompletion {
            id: self.head.id.clone(),
            object: "text_completion",
            created: self.head.created,
            model: self.head.model.clone(),
            choices: vec![TextChoice {
                index: 0,
                text,
                logprobs,
                finish_reason: finish,
            }],
            usage: None,
            hearth: None,
        }
    }
}

impl Answer for Text {
    type Whole = TextCompletion;

    fn chunk_of(&mut self, token: String, logprobs: Vec<TokenLogprob>) -> Vec<String> {
        let legacy = self.legacy(&logprobs, self.text.len());
        self.text.push_str(&token);
        vec![self.answer(token, legacy, None).json()]
    }

    fn gather(&mut self, token: String, logprobs: Vec<TokenLogprob>) {
        self.text.push_str(&token);
        self.tokens.extend(logprobs);
    }

    fn last_chunks(
        &mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Vec<String> {
        let mut last = self.answer(String::new(), None, Some(finish_reason(outcome, false)));
        last.hearth = Some(cost(response));
        let mut out = vec![last.json()];
        if self.include_usage {
            let mut usage_chunk = self.answer(String::new(), None, None);
            usage_chunk.choices.clear();
            usage_chunk.usage = Some(usage(response));
            usage_chunk.hearth = Some(cost(response));
            out.push(usage_chunk.json());
        }
        out
    }

    fn finish(
        mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> TextCompletion {
        let logprobs = self.legacy(&self.tokens, 0);
        let text = std::mem::take(&mut self.text);
        let mut answer = self.answer(text, logprobs, Some(finish_reason(outcome, false)));
        answer.usage = Some(usage(response));
        answer.hearth = Some(cost(response));
        answer
    }
}

/// Serializing the answer types, which cannot fail (no maps with non-string keys).
pub(in crate::services::completion) mod erased {
    pub trait Json {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap_or_default()
        }
    }
}
pub(in crate::services::completion) use erased::Json;
