//! Tool calls in the text a model reads and writes.
//!
//! A model whose chat template renders `tools` gets them through its own template. Every other
//! model gets them described in its system message, and calls and results written as tagged
//! JSON, one call per block:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Oslo"}}
//! </tool_call>
//! ```
//!
//! [`parse`] reads calls back out of generated text in that format, in the `[TOOL_CALLS] [..]`
//! format, and as a bare `{"name", "arguments" | "parameters"}` object (what a constrained
//! "required" call and Llama 3.1-style templates produce).

use hearth_types::{ChatMessage, Role};
use serde_json::Value;

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";
const RESPONSE_OPEN: &str = "<tool_response>";
const RESPONSE_CLOSE: &str = "</tool_response>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";

/// The conversation rewritten for a template that knows only system, user and assistant turns:
/// the tools described at the head of the system message, an assistant's calls written as
/// `<tool_call>` blocks after its text, a tool's result as a user turn in `<tool_response>`.
pub(crate) fn fold_into_messages(messages: &[ChatMessage], tools: &Value) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    let preamble = describe(tools);
    match messages.first() {
        Some(first) if first.role == Role::System => {
            out.push(ChatMessage::new(
                Role::System,
                format!("{}\n\n{preamble}", first.content),
            ));
        }
        _ => out.push(ChatMessage::new(Role::System, preamble)),
    }
    let skip = usize::from(messages.first().is_some_and(|m| m.role == Role::System));
    for m in &messages[skip..] {
        match m.role {
            Role::Tool => out.push(ChatMessage::new(
                Role::User,
                format!("{RESPONSE_OPEN}\n{}\n{RESPONSE_CLOSE}", m.content),
            )),
            Role::Assistant if !m.tool_calls.is_empty() => {
                let mut text = m.content.clone();
                for call in &m.tool_calls {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    let arguments = serde_json::from_str::<Value>(&call.arguments)
                        .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                    let body = serde_json::json!({ "name": call.name, "arguments": arguments });
                    text.push_str(&format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}"));
                }
                out.push(ChatMessage::new(Role::Assistant, text));
            }
            _ => out.push(ChatMessage::new(m.role, m.content.clone())),
        }
    }
    out
}

/// The system message's description of the tools and of how to call them.
fn describe(tools: &Value) -> String {
    let mut listed = String::new();
    for tool in tools.as_array().into_iter().flatten() {
        let function = tool.get("function").unwrap_or(tool);
        let entry = serde_json::json!({
            "name": function.get("name"),
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        });
        listed.push_str(&entry.to_string());
        listed.push('\n');
    }
    format!(
        "You have functions you can call. Each is described by its name, what it does and a JSON \
         schema of its arguments:\n<tools>\n{listed}</tools>\n\
         To call one, answer with a block like this for each call, and nothing else:\n\
         {CALL_OPEN}\n{{\"name\": \"the function's name\", \"arguments\": {{...}}}}\n{CALL_CLOSE}\n\
         A function's result comes back in a {RESPONSE_OPEN} block."
    )
}

/// A call read out of generated text: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// Generated text split into its plain content and the calls it makes to functions named in
/// `names`. Text that looks like a call but does not parse, or names another function, stays
/// content.
pub fn parse(text: &str, names: &[&str]) -> (String, Vec<ParsedCall>) {
    let trimmed = text.trim();
    if let Some(list) = trimmed.strip_prefix(MISTRAL_CALLS) {
        if let Ok(Value::Array(items)) = serde_json::from_str::<Value>(list.trim()) {
            let calls: Option<Vec<ParsedCall>> = items.iter().map(|v| call(v, names)).collect();
            if let Some(calls) = calls.filter(|c| !c.is_empty()) {
                return (String::new(), calls);
            }
        }
    }
    if trimmed.starts_with('{') {
        if let Some(found) = serde_json::from_str::<Value>(trimmed)
            .ok()
            .and_then(|v| call(&v, names))
        {
            return (String::new(), vec![found]);
        }
    }
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(CALL_OPEN) {
        let after = &rest[at + CALL_OPEN.len()..];
        let (body, next) = match after.find(CALL_CLOSE) {
            Some(end) => (&after[..end], &after[end + CALL_CLOSE.len()..]),
            None => (after, ""),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| call(&v, names))
        {
            Some(found) => {
                content.push_str(&rest[..at]);
                calls.push(found);
            }
            None => content.push_str(&rest[..at + CALL_OPEN.len() + body.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    if calls.is_empty() {
        return (text.to_string(), calls);
    }
    (content.trim().to_string(), calls)
}

fn call(value: &Value, names: &[&str]) -> Option<ParsedCall> {
    let name = value.get("name")?.as_str()?;
    if !names.contains(&name) {
        return None;
    }
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_types::ToolCall;
    use serde_json::json;

    fn tools() -> Value {
        json!([{ "type": "function", "function": {
            "name": "get_weather", "description": "Weather now",
            "parameters": { "type": "object", "properties": { "city": { "type": "string" } } }
        }}])
    }

    #[test]
    fn calls_come_out_of_every_format_a_model_writes() {
        let names = ["get_weather"];
        let tagged = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (content, calls) = parse(tagged, &names);
        assert_eq!(content, "Let me look.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"city": "Oslo"})
        );
        let bare = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}";
        assert_eq!(parse(bare, &names).1[0].arguments, "{\"city\":\"Rome\"}");
        let mistral = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {}}]";
        assert_eq!(parse(mistral, &names).1.len(), 1);
        // An unclosed block at the end of a generation that ran out still counts.
        let cut = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}";
        assert_eq!(parse(cut, &names).1.len(), 1);
    }

    #[test]
    fn text_that_only_looks_like_a_call_stays_content() {
        let names = ["get_weather"];
        for text in [
            "plain answer",
            "{\"name\": \"rm_rf\", \"arguments\": {}}",
            "<tool_call>not json</tool_call> after",
            "{\"broken\": ",
        ] {
            let (content, calls) = parse(text, &names);
            assert!(calls.is_empty(), "{text}");
            assert_eq!(content, text);
        }
    }

    #[test]
    fn a_template_without_tools_gets_them_in_the_system_message() {
        let mut call = ChatMessage::new(Role::Assistant, "");
        call.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"Oslo\"}".into(),
        });
        let mut answer = ChatMessage::new(Role::Tool, "{\"celsius\": 3}");
        answer.tool_call_id = Some("c1".into());
        let messages = [
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Weather in Oslo?"),
            call,
            answer,
        ];
        let folded = fold_into_messages(&messages, &tools());
        assert_eq!(folded.len(), 4);
        assert_eq!(folded[0].role, Role::System);
        assert!(folded[0].content.starts_with("Be brief.\n\n"));
        assert!(folded[0].content.contains("\"name\":\"get_weather\""));
        assert!(folded[2].content.contains(CALL_OPEN));
        assert_eq!(
            parse(&folded[2].content, &["get_weather"]).1[0].arguments,
            "{\"city\":\"Oslo\"}"
        );
        assert_eq!(folded[3].role, Role::User);
        assert!(folded[3].content.starts_with(RESPONSE_OPEN));
    }
}
