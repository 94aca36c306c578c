//! The checks every API front end (OpenAI's chat and Responses routes, Anthropic's, Ollama's)
//! makes the same way, each written once: the model named, `top_p`, stop strings; and what a
//! checked request of the newer front ends is.

use serde_json::json;

use super::catalog::{Catalog, TextModelSpec};
use super::openai::tools::ToolMode;
use super::validate::ValidRequest;
use crate::error::ApiError;

/// A checked request and how to answer it: the pipeline's request, whether to stream, and the
/// tools the answer may call.
#[derive(Debug)]
pub struct Checked {
    pub valid: ValidRequest,
    pub stream: bool,
    pub tools: ToolMode,
}

/// A stop string's most bytes.
const MAX_STOP_BYTES: usize = 256;

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

/// The chat model named (400 when none is; an empty name is none), or 404 naming the models
/// there are (`details.code: model_not_found`, as OpenAI's clients read it).
pub fn model<'c>(name: Option<&str>, catalog: &'c Catalog) -> Result<&'c TextModelSpec, ApiError> {
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("model", "is required"))?;
    catalog.get(name).ok_or_else(|| {
        ApiError::not_found(format!(
            "the model {name:?} does not exist; models: {}",
            catalog.ids().join(", ")
        ))
        .with_details(json!({ "field": "model", "code": "model_not_found" }))
    })
}

/// Nucleus sampling's threshold, in (0, 1]; 1 when absent.
pub fn top_p(value: Option<f64>, field: &str) -> Result<f32, ApiError> {
    match value {
        None => Ok(1.0),
        Some(p) if p > 0.0 && p <= 1.0 => Ok(p as f32),
        Some(p) => Err(bad(field, format!("must be in (0, 1], got {p}"))),
    }
}

/// Stop strings: at most `max`, each 1 to 256 bytes.
pub fn stop_strings(list: Vec<String>, field: &str, max: usize) -> Result<Vec<String>, ApiError> {
    if list.len() > max {
        return Err(bad(field, format!("at most {max} stop sequences")));
    }
    if list
        .iter()
        .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(bad(
            field,
            format!("each stop sequence must be 1 to {MAX_STOP_BYTES} bytes"),
        ));
    }
    Ok(list)
}
