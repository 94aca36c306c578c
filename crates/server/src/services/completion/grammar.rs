//! Grammars the output must follow (a JSON schema, any JSON object, a tool call), compiled per
//! request against the model's vocabulary. The vocabulary's token trie is built once per model,
//! on first use, off the async workers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hearth_grammar::Grammars;
use hearth_infer::TokenConstraint;
use hearth_scheduler::SchedulerHandle;

use super::validate::GrammarRequest;
use crate::error::ApiError;

/// Each model's compiled vocabulary, by model id.
#[derive(Default)]
pub struct GrammarCache(Mutex<HashMap<String, Arc<Grammars>>>);

impl GrammarCache {
    /// The constraint for one request: `InvalidRequest` naming `response_format` (or `tools`)
    /// when the schema does not compile or is over the grammar limits.
    pub async fn compile(
        &self,
        model: &str,
        engine: &SchedulerHandle,
        request: &GrammarRequest,
    ) -> Result<Box<dyn TokenConstraint>, ApiError> {
        let cached = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
            .cloned();
        let grammars = match cached {
            Some(g) => g,
            None => {
                let tokenizer = engine.tokenizer();
                let built = tokio::task::spawn_blocking(move || Grammars::new(&tokenizer))
                    .await
                    .map_err(ApiError::internal)?
                    .map_err(ApiError::internal)?;
                let built = Arc::new(built);
                self.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(model.to_string())
                    .or_insert(built)
                    .clone()
            }
        };
        let request = request.clone();
        let field = match request {
            GrammarRequest::ToolCall(_) => "tools",
            _ => "response_format",
        };
        tokio::task::spawn_blocking(move || match &request {
            GrammarRequest::JsonObject => grammars.json_object(),
            GrammarRequest::JsonSchema(schema) | GrammarRequest::ToolCall(schema) => {
                grammars.json_schema(schema)
            }
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| {
            if e.is_client_error() {
                ApiError::invalid_request(field, e)
            } else {
                ApiError::internal(e)
            }
        })
    }
}
