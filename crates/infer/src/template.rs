//! Chat templates: the model's own Jinja template (or an override) rendered with minijinja, with
//! the helpers Hugging Face templates use (`raise_exception`, `strftime_now`, `tojson`, Python
//! string methods such as `.strip()`), `bos_token`/`eos_token` and `add_generation_prompt`.

use crate::Error;
use hearth_types::ChatMessage;
use minijinja::{Environment, ErrorKind, Value};

/// The ChatML template (SmolLM2's own, without its default system prompt); used by the tiny test
/// model and as the fallback for a model that ships none.
pub(crate) const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template with its special-token variables.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("bad strftime format {format:?}"),
        )
    })?;
    Ok(out)
}

impl ChatTemplate {
    pub(crate) fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        // HF renders with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| Error::Template(format!("does not compile: {e:#}")))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// True when the template renders a `tools` list itself (the model was trained on its own
    /// tool-call format).
    pub(crate) fn knows_tools(&self) -> bool {
        self.source.contains("tools")
    }

    pub(crate) fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let messages: Vec<Value> = messages.iter().map(message_value).collect();
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools.map(Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(|e| Error::Template(format!("{e:#}")))
    }
}

/// A message as Hugging Face templates read it: `role`, `content`, and for an assistant's calls
/// `tool_calls: [{id, type: "function", function: {name, arguments}}]` with the arguments as an
/// object where they parse as one (templates write them with `tojson`), `tool_call_id` on a
/// tool's answer.
fn message_value(m: &ChatMessage) -> Value {
    let calls: Vec<serde_json::Value> = m
        .tool_calls
        .iter()
        .map(|c| {
            let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments)
                .unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone()));
            serde_json::json!({
                "id": c.id,
                "type": "function",
                "function": { "name": c.name, "arguments": arguments },
            })
        })
        .collect();
    let mut value = serde_json::json!({ "role": m.role.as_str(), "content": m.content });
    if !calls.is_empty() {
        value["tool_calls"] = serde_json::Value::Array(calls);
    }
    if let Some(id) = &m.tool_call_id {
        value["tool_call_id"] = serde_json::Value::String(id.clone());
    }
    Value::from_serialize(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_types::Role;

    #[test]
    fn chatml_renders_every_turn_and_the_generation_prompt() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::new(Role::System, "Be brief."),
                    ChatMessage::new(Role::User, "Hi"),
                ],
                None,
                true,
            )
            .unwrap();
        assert_eq!(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let out = t
            .render(&[ChatMessage::new(Role::User, "Hi")], None, false)
            .unwrap();
        assert!(!out.ends_with("assistant\n"));
    }

    #[test]
    fn hf_helpers_work_in_templates() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}{{ m.content.strip() | upper }}{{ m | tojson }}{% endfor %}{{ strftime_now('%Y') | length }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(&[ChatMessage::new(Role::User, "  hi  ")], None, true)
            .unwrap();
        assert!(out.starts_with("<s>HI{"), "{out}");
        assert!(out.ends_with('4'), "{out}");
        let err = t
            .render(&[ChatMessage::new(Role::System, "x")], None, true)
            .unwrap_err();
        assert!(err.to_string().contains("no system"), "{err}");
    }

    #[test]
    fn a_broken_template_is_a_typed_error() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(Error::Template(_))
        ));
    }
}
