//! A generation's events turned into Ollama's answers: for `/api/chat` `{message: {role,
//! content}}` objects, for `/api/generate` `{response}` objects, each with `model`,
//! `created_at` and `done`; the last (or only) one `done: true` with `done_reason` and the
//! counts and durations (nanoseconds). Streamed, each is one NDJSON line. Tool calls are read
//! out of the text by the OpenAI front end's [`Splitter`] and sent whole, with their arguments
//! as an object, in the line before the last.

use std::time::Instant;

use chrono::{SecondsFormat, Utc};
use hearth_types::{AbortReason, FinishReason, TokenLogprob};
use serde_json::{json, Map, Value};

use crate::error::{ApiError, OllamaError};
use crate::services::completion::openai::respond::Answer;
use crate::services::completion::openai::tools::{arguments_object, Piece, Splitter, ToolMode};
use crate::services::completion::stream::CompletionResponse;

/// Which route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Generate,
}

/// Builds one answer from a generation's events, whole or as NDJSON lines.
pub struct Ollama {
    route: Route,
    model: String,
    splitter: Splitter,
    started: Instant,
    first_token: Option<Instant>,
    content: String,
    /// Calls made: name and arguments (JSON text).
    calls: Vec<(String, String)>,
}

/// `created_at`, as Ollama writes it.
pub fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Nanos, true)
}

impl Ollama {
    pub fn new(route: Route, model: &str, tools: &ToolMode, started: Instant) -> Self {
        Ollama {
            route,
            model: model.to_string(),
            splitter: Splitter::new(tools),
            started,
            first_token: None,
            content: String::new(),
            calls: Vec::new(),
        }
    }

    /// The answer for a request that only loads (`reason` `load`) or unloads (`unload`) its
    /// model.
    pub fn loaded(route: Route, model: &str, reason: &str) -> Value {
        let mut line = head(model);
        match route {
            Route::Chat => {
                line.insert(
                    "message".into(),
                    json!({ "role": "assistant", "content": "" }),
                );
            }
            Route::Generate => {
                line.insert("response".into(), json!(""));
            }
        }
        line.insert("done".into(), json!(true));
        line.insert("done_reason".into(), json!(reason));
        Value::Object(line)
    }

    /// Pieces into the answer; the text they add.
    fn take(&mut self, pieces: Vec<Piece>) -> String {
        let mut text = String::new();
        for piece in pieces {
            match piece {
                Piece::Content(t) => text.push_str(&t),
                Piece::CallStart { name } => self.calls.push((name, String::new())),
                Piece::Arguments(a) => {
                    if let Some((_, args)) = self.calls.last_mut() {
                        args.push_str(&a);
                    }
                }
            }
        }
        self.content.push_str(&text);
        text
    }

    /// One object carrying `text` (and `calls`, in a chat), not done.
    fn line(&self, text: String, calls: Option<Value>) -> Map<String, Value> {
        let mut line = head(&self.model);
        match self.route {
            Route::Chat => {
                let mut message = json!({ "role": "assistant", "content": text });
                if let Some(calls) = calls {
                    message["tool_calls"] = calls;
                }
                line.insert("message".into(), message);
            }
            Route::Generate => {
                line.insert("response".into(), json!(text));
            }
        }
        line.insert("done".into(), json!(false));
        line
    }

    /// The calls as Ollama writes them: arguments an object.
    fn tool_calls(&self) -> Option<Value> {
        (!self.calls.is_empty()).then(|| {
            Value::Array(
                self.calls
                    .iter()
                    .map(|(name, args)| {
                        json!({ "function": { "name": name, "arguments": arguments_object(args) } })
                    })
                    .collect(),
            )
        })
    }

    /// `done: true` with the reason, counts and durations, on `line`.
    fn done(
        &self,
        mut line: Map<String, Value>,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Value {
        let end = Instant::now();
        let first = self.first_token.unwrap_or(end);
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        let reason = match outcome {
            Ok(FinishReason::Length | FinishReason::ContextFull) => "length",
            _ => "stop",
        };
        line.insert("done".into(), json!(true));
        line.insert("done_reason".into(), json!(reason));
        line.insert("total_duration".into(), json!(ns(end - self.started)));
        line.insert("load_duration".into(), json!(0));
        line.insert(
            "prompt_eval_count".into(),
            json!(response.usage.prompt_tokens),
        );
        line.insert(
            "prompt_eval_duration".into(),
            json!(ns(first - self.started)),
        );
        line.insert("eval_count".into(), json!(response.usage.completion_tokens));
        line.insert("eval_duration".into(), json!(ns(end - first)));
        Value::Object(line)
    }

    fn seen(&mut self) {
        self.first_token.get_or_insert_with(Instant::now);
    }
}

/// `model` and `created_at`.
fn head(model: &str) -> Map<String, Value> {
    let mut line = Map::new();
    line.insert("model".into(), json!(model));
    line.insert("created_at".into(), json!(now()));
    line
}

impl Answer for Ollama {
    type Whole = Value;

    const DONE: Option<&'static str> = None;

    fn chunk_of(&mut self, token: String, _: Vec<TokenLogprob>) -> Vec<String> {
        self.seen();
        let pieces = self.splitter.push(&token);
        let text = self.take(pieces);
        if text.is_empty() {
            return Vec::new();
        }
        vec![Value::Object(self.line(text, None)).to_string()]
    }

    fn gather(&mut self, token: String, _: Vec<TokenLogprob>) {
        self.seen();
        let pieces = self.splitter.push(&token);
        self.take(pieces);
    }

    fn failure(&self, error: ApiError) -> String {
        OllamaError(error).body().to_string()
    }

    fn last_chunks(
        &mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Vec<String> {
        let pieces = self.splitter.finish();
        let text = self.take(pieces);
        let mut out = Vec::new();
        let calls = self.tool_calls();
        if !text.is_empty() || calls.is_some() {
            out.push(Value::Object(self.line(text, calls)).to_string());
        }
        let last = self.done(self.line(String::new(), None), outcome, response);
        out.push(last.to_string());
        out
    }

    fn finish(
        mut self,
        outcome: &Result<FinishReason, AbortReason>,
        response: &CompletionResponse,
    ) -> Value {
        let pieces = self.splitter.finish();
        self.take(pieces);
        let content = std::mem::take(&mut self.content);
        let line = self.line(content, self.tool_calls());
        self.done(line, outcome, response)
    }
}
