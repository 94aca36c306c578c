//! `POST /v1/rerank` (also `/rerank` and `/v2/rerank`) on the completion listener, in the shape
//! llama-server, vLLM, Jina and Cohere clients use, and the `[rerank."id"]` rows of the model
//! table behind it.
//!
//! A row's keys are an embedding row's without `shortens`, its `precision` `f32` by default
//! (scores to the reference's digits; `bf16` for speed): `weights` (a cross-encoder folder:
//! `config.json` of a `BertForSequenceClassification` with one label, `model.safetensors`,
//! `tokenizer.json`; or a GGUF Qwen3 reranker file, scored as llama.cpp scores it; required), `input_price_per_million` (required), `device`, `max_inputs`
//! (documents per request, default 2048), `max_batch_tokens`, `max_queued`, `keep_alive` and
//! `pinned`.
//!
//! The model reads the query with each document and scores the pair; a pair longer than the
//! model reads is cut: a cross-encoder's longer text first, as sentence-transformers'
//! `CrossEncoder` cuts it, a decoder's document.
//! The tokens read (the query once per document, as the model reads it) are billed at the
//! model's price with the same holds as the other routes.

use std::path::Path;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use hearth_embed::{Precision, Reranker, Tokens};
use serde::Serialize;
use serde_json::Value;
use tracing::{instrument, Span};
use utoipa::ToSchema;

use super::encoders::{charged, object_and_model, refusal, EncoderModels, EncoderRows};
use super::CompletionState;
use crate::error::{ApiError, OpenAiError, OpenAiJson};
use crate::model_table::{RawModelTable, TableError};

/// Every `[rerank."id"]` row of the table read from `path`, resolved.
pub fn resolve(table: &RawModelTable, path: &Path) -> Result<EncoderRows<Reranker>, TableError> {
    if let Some((id, _)) = table.rerank.iter().find(|(_, m)| m.shortens.is_some()) {
        return Err(TableError::Invalid {
            path: path.to_path_buf(),
            section: "rerank",
            id: id.clone(),
            message: "shortens is a key of embedding rows only".into(),
        });
    }
    EncoderModels::resolve(
        &table.rerank,
        &table.defaults,
        path,
        "rerank",
        Reranker::load_with,
        Precision::F32,
    )
}

/// The request body of `POST /v1/rerank`.
#[derive(ToSchema)]
#[allow(dead_code)] // describes the request; parsed by hand for field-precise errors
pub struct RerankRequestBody {
    /// A `[rerank."id"]` model of the table.
    model: String,
    /// What the documents are ranked against; not empty.
    query: String,
    /// Strings, or objects `{"text": ...}` (all of one kind).
    #[schema(value_type = Vec<Object>)]
    documents: Vec<Value>,
    /// Answer only the best this many (default: all).
    top_n: Option<usize>,
    /// Echo each document in its result as `{"text": ...}` (default false).
    return_documents: Option<bool>,
}

/// A checked request.
struct RerankRequest {
    model: String,
    query: String,
    documents: Vec<String>,
    top_n: Option<usize>,
    return_documents: bool,
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

impl RerankRequest {
    fn parse(body: &Value) -> Result<RerankRequest, ApiError> {
        let (object, model) = object_and_model(
            body,
            &["model", "query", "documents", "top_n", "return_documents"],
        )?;
        let query = match object.get("query") {
            Some(Value::String(q)) if !q.trim().is_empty() => q.clone(),
            Some(Value::String(_)) => return Err(bad("query", "must not be empty")),
            Some(_) => return Err(bad("query", "must be a string")),
            None => return Err(bad("query", "is required")),
        };
        let documents = match object.get("documents") {
            None => return Err(bad("documents", "is required")),
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(bad("documents", "must not be an empty array"))
            }
            Some(Value::Array(items)) => {
                let objects = items[0].is_object();
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match (v, objects) {
                        (Value::String(s), false) => Ok(s.clone()),
                        (Value::Object(o), true) => match (o.get("text"), o.len()) {
                            (Some(Value::String(s)), 1) => Ok(s.clone()),
                            _ => Err(bad(
                                "documents",
                                format!("document {i} must be {{\"text\": string}} and no more"),
                            )),
                        },
                        _ => Err(bad(
                            "documents",
                            format!(
                                "document {i} is not {} like the first",
                                if objects {
                                    "an object {\"text\": ...}"
                                } else {
                                    "a string"
                                }
                            ),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            Some(_) => {
                return Err(bad(
                    "documents",
                    "must be an array of strings or of {\"text\": ...}",
                ))
            }
        };
        let top_n = match object.get("top_n") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Some(n as usize),
                _ => return Err(bad("top_n", "must be a positive integer")),
            },
        };
        let return_documents = match object.get("return_documents") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("return_documents", "must be true or false")),
        };
        Ok(RerankRequest {
            model,
            query,
            documents,
            top_n,
            return_documents,
        })
    }
}

/// The answer: the documents best first.
#[derive(Serialize, ToSchema)]
pub struct RerankResponse {
    /// `rerank-` and a unique suffix.
    id: String,
    model: String,
    results: Vec<RerankResult>,
    usage: RerankUsage,
}

/// One document's place.
#[derive(Serialize, ToSchema)]
pub struct RerankResult {
    /// The document's position in the request.
    index: usize,
    /// The model's score: higher is more relevant (between 0 and 1 for the usual models:
    /// a cross-encoder's sigmoid, a decoder reranker's probability of "yes").
    relevance_score: f32,
    /// The document, when `return_documents` asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<RerankDocument>,
}

/// A document echoed.
#[derive(Serialize, ToSchema)]
pub struct RerankDocument {
    text: String,
}

/// Tokens read (and billed).
#[derive(Serialize, ToSchema)]
pub struct RerankUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// `POST /v1/rerank`.
#[utoipa::path(
    post,
    path = "/v1/rerank",
    tag = "openai",
    operation_id = "rerank",
    description = "Documents ordered by a `[rerank.\"id\"]` model's score (a cross-encoder's or \
        a GGUF decoder reranker's) against the query, billed per token read (the query with each document) at the model's price with \
        the same holds as the other routes. Also served at `/rerank` and `/v2/rerank`.",
    request_body = RerankRequestBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The documents best first.", body = RerankResponse),
        super::openai::CompletionErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
pub async fn rerank(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OpenAiJson(body): OpenAiJson<Value>,
) -> Result<Json<RerankResponse>, OpenAiError> {
    let session = super::openai::session(&cs, &headers).await?;
    let request = RerankRequest::parse(&body)?;
    Span::current().record("model", request.model.as_str());
    let entry = cs.core.rerankers.admit(
        &request.model,
        request.documents.len(),
        "documents",
        "documents",
    )?;
    // Held until the scores are back: the model stays loaded meanwhile.
    let engine = cs.core.rerankers.lease(&entry).await?;
    let _slot = cs
        .core
        .user_slots
        .take(&session.user_id)
        .map_err(ApiError::rate_limited)?;
    let tokenizing = (*engine).clone();
    let (query, documents) = (request.query, request.documents);
    let (pairs, documents) = tokio::task::spawn_blocking(move || {
        let model = tokenizing.model();
        documents
            .iter()
            .enumerate()
            .map(|(i, d)| model.tokenize(i, &query, d))
            .collect::<hearth_embed::Result<Vec<Tokens>>>()
            .map(|pairs| (pairs, documents))
            .map_err(|e| refusal(e, "documents"))
    })
    .await
    .map_err(ApiError::internal)??;
    let tokens: usize = pairs.iter().map(Tokens::len).sum();
    let scores = charged(
        &cs,
        &session.user_id,
        &entry,
        tokens,
        "rerank",
        "documents",
        engine.encode(pairs),
    )
    .await?;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Best first; equal scores keep the request's order.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(request.top_n.unwrap_or(order.len()));
    // Each document taken once, by the result that echoes it.
    let mut documents: Vec<Option<String>> = if request.return_documents {
        documents.into_iter().map(Some).collect()
    } else {
        Vec::new()
    };
    let results = order
        .into_iter()
        .map(|index| RerankResult {
            index,
            relevance_score: scores[index],
            document: documents
                .get_mut(index)
                .and_then(Option::take)
                .map(|text| RerankDocument { text }),
        })
        .collect();
    Ok(Json(RerankResponse {
        id: format!("rerank-{}", uuid::Uuid::new_v4().simple()),
        model: entry.id.clone(),
        results,
        usage: RerankUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    }))
}
