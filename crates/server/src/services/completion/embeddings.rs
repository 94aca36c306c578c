//! `POST /v1/embeddings` on the completion listener, in the OpenAI API's shape, and the
//! `[embedding."id"]` rows of the model table behind it.
//!
//! A row's keys: `weights` (a sentence-transformers folder, relative to the table; required),
//! `input_price_per_million` (credits per million input tokens; required), `device` (default
//! `[defaults] device`), `precision` (`bf16`, the default: the matrix products in bf16 on a CPU
//! with AVX-512 BF16, f32 elsewhere; or `f32`), `shortens` (the model was trained so that its vectors may be cut short,
//! as Matryoshka models are: `dimensions` is honoured; default false, and a request naming
//! `dimensions` is refused), `max_inputs` (inputs per request, default 2048), `max_batch_tokens`
//! (padded tokens per forward pass, default 1024: on a CPU, passes that stay in cache beat bigger ones), `max_queued` (inputs waiting, default
//! 4096), `keep_alive` (how long it stays loaded idle; default `[loading] keep_alive`) and
//! `pinned` (never unloaded). The model loads on its first request (docs/loading.md).
//!
//! A request is authenticated as the other `/v1` routes are, checked, tokenized off the async
//! workers, priced per input token, held, embedded by the model's engine (which batches clients'
//! inputs together) and settled at the same price. A client that goes away drops its hold
//! (released) and its inputs are skipped by the engine.

use std::path::Path;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine as _;
use hearth_embed::{EmbeddingModel, Precision, Tokens};
use serde::Serialize;
use serde_json::Value;
use tracing::{instrument, Span};
use utoipa::ToSchema;

use super::encoders::{charged, object_and_model, refusal, EncoderModels, EncoderRows};
use super::CompletionState;
use crate::error::{ApiError, OpenAiError, OpenAiJson};
use crate::model_table::{RawModelTable, TableError};

/// Every `[embedding."id"]` row of the table read from `path`, resolved.
pub fn resolve(
    table: &RawModelTable,
    path: &Path,
) -> Result<EncoderRows<EmbeddingModel>, TableError> {
    EncoderModels::resolve(
        &table.embedding,
        &table.defaults,
        path,
        "embedding",
        EmbeddingModel::load_with,
        Precision::Bf16,
    )
}

/// What a request asks to embed: texts, or token ids as they are.
enum Inputs {
    Texts(Vec<String>),
    Ids(Vec<Vec<u64>>),
}

/// A checked request.
pub(super) struct EmbeddingRequest {
    model: String,
    inputs: Inputs,
    base64: bool,
    dimensions: Option<usize>,
    truncate: bool,
}

impl EmbeddingRequest {
    /// Texts to embed with `model` (another front end's request: Ollama's `/api/embed`).
    pub(super) fn texts(
        model: String,
        texts: Vec<String>,
        dimensions: Option<usize>,
        truncate: bool,
    ) -> Self {
        EmbeddingRequest {
            model,
            inputs: Inputs::Texts(texts),
            base64: false,
            dimensions,
            truncate,
        }
    }
}

/// What a request got: its model, each input's vector (shortened where asked), the tokens
/// read and billed.
pub(super) struct Embedded {
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
    pub tokens: usize,
}

/// The request body of `POST /v1/embeddings`.
#[derive(ToSchema)]
#[allow(dead_code)] // describes the request; parsed by hand for field-precise errors
pub struct EmbeddingRequestBody {
    /// A string, an array of strings, an array of token ids, or an array of such arrays.
    #[schema(value_type = Object)]
    input: Value,
    /// An `[embedding."id"]` model of the table.
    model: String,
    /// `float` (default) or `base64` (little-endian float32).
    encoding_format: Option<String>,
    /// Cut each vector to this many dimensions and normalise it again (models trained for it).
    dimensions: Option<usize>,
    /// `-1` or a positive number: cut inputs longer than the model reads instead of refusing
    /// them (vLLM's parameter; the model's own limit is the cut).
    truncate_prompt_tokens: Option<i64>,
    /// Recorded nowhere; accepted as the API does.
    user: Option<String>,
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request(field, message)
}

impl EmbeddingRequest {
    fn parse(body: &Value) -> Result<EmbeddingRequest, ApiError> {
        let (object, model) = object_and_model(
            body,
            &[
                "input",
                "model",
                "encoding_format",
                "dimensions",
                "truncate_prompt_tokens",
                "user",
            ],
        )?;
        let inputs = match object.get("input") {
            None => return Err(bad("input", "is required")),
            Some(Value::String(s)) => Inputs::Texts(vec![s.clone()]),
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(bad("input", "must not be an empty array"))
            }
            Some(Value::Array(items)) => match &items[0] {
                Value::String(_) => Inputs::Texts(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| match v {
                            Value::String(s) => Ok(s.clone()),
                            _ => Err(bad(
                                "input",
                                format!("input {i} is not a string like the first"),
                            )),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                Value::Number(_) => Inputs::Ids(vec![token_ids(0, &Value::Array(items.clone()))?]),
                Value::Array(_) => Inputs::Ids(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| token_ids(i, v))
                        .collect::<Result<_, _>>()?,
                ),
                _ => {
                    return Err(bad(
                        "input",
                        "must be a string, an array of strings, or token ids",
                    ))
                }
            },
            Some(_) => {
                return Err(bad(
                    "input",
                    "must be a string, an array of strings, or token ids",
                ))
            }
        };
        let base64 = match object.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(_) => return Err(bad("encoding_format", "must be \"float\" or \"base64\"")),
        };
        let dimensions = match object.get("dimensions") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(d) if d >= 1 => Some(d as usize),
                _ => return Err(bad("dimensions", "must be a positive integer")),
            },
        };
        let truncate = match object.get("truncate_prompt_tokens") {
            None | Some(Value::Null) => false,
            Some(v) => match v.as_i64() {
                Some(-1) | Some(1..) => true,
                _ => {
                    return Err(bad(
                        "truncate_prompt_tokens",
                        "must be -1 or a positive integer",
                    ))
                }
            },
        };
        match object.get("user") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(_) => return Err(bad("user", "must be a string")),
        }
        Ok(EmbeddingRequest {
            model,
            inputs,
            base64,
            dimensions,
            truncate,
        })
    }

    fn len(&self) -> usize {
        match &self.inputs {
            Inputs::Texts(t) => t.len(),
            Inputs::Ids(i) => i.len(),
        }
    }
}

/// One input given as token ids.
fn token_ids(index: usize, value: &Value) -> Result<Vec<u64>, ApiError> {
    let items = value.as_array().ok_or_else(|| {
        bad(
            "input",
            format!("input {index} is not an array of token ids"),
        )
    })?;
    items
        .iter()
        .map(|v| {
            v.as_u64().ok_or_else(|| {
                bad(
                    "input",
                    format!("input {index} holds {v}, not a token id (a non-negative integer)"),
                )
            })
        })
        .collect()
}

/// The answer.
#[derive(Serialize, ToSchema)]
pub struct EmbeddingList {
    /// `list`.
    object: &'static str,
    data: Vec<EmbeddingObject>,
    model: String,
    usage: EmbeddingUsage,
}

/// One input's vector.
#[derive(Serialize, ToSchema)]
pub struct EmbeddingObject {
    /// `embedding`.
    object: &'static str,
    /// The input's position in the request.
    index: usize,
    /// Floats, or with `encoding_format: base64` their little-endian float32 bytes in base64.
    #[schema(value_type = Object)]
    embedding: Value,
}

/// Tokens read (and billed).
#[derive(Serialize, ToSchema)]
pub struct EmbeddingUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// `POST /v1/embeddings`.
#[utoipa::path(
    post,
    path = "/v1/embeddings",
    tag = "openai",
    operation_id = "createEmbedding",
    description = "Vectors for texts or token ids from an `[embedding.\"id\"]` model, billed per \
        input token at the model's price with the same holds as the other routes. An input \
        longer than the model reads is a 400 naming its index, unless `truncate_prompt_tokens` \
        asks to cut it.",
    request_body = EmbeddingRequestBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One vector per input, in order.", body = EmbeddingList),
        super::openai::CompletionErrors,
    )
)]
#[instrument(skip_all, fields(model, user))]
pub async fn create(
    State(cs): State<CompletionState>,
    headers: HeaderMap,
    OpenAiJson(body): OpenAiJson<Value>,
) -> Result<Json<EmbeddingList>, OpenAiError> {
    let session = super::openai::session(&cs, &headers).await?;
    let request = EmbeddingRequest::parse(&body)?;
    let base64 = request.base64;
    let Embedded {
        model,
        vectors,
        tokens,
    } = embed(&cs, &session.user_id, request).await?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingObject {
            object: "embedding",
            index,
            embedding: encode(v, base64),
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list",
        data,
        model,
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    }))
}

/// A checked request embedded for `user`: admitted, tokenized off the async workers, held,
/// encoded by the model's engine and settled. Every front end's embeddings end here.
pub(super) async fn embed(
    cs: &CompletionState,
    user: &str,
    request: EmbeddingRequest,
) -> Result<Embedded, ApiError> {
    Span::current().record("model", request.model.as_str());
    let models = &cs.core.embeddings;
    let entry = models.admit(&request.model, request.len(), "input", "inputs")?;
    // Held until the vectors are back: the model stays loaded meanwhile.
    let engine = models.lease(&entry).await?;
    if let Some(d) = request.dimensions {
        if !entry.shortens {
            return Err(bad(
                "dimensions",
                format!("model {} was not trained for shortened vectors", entry.id),
            ));
        }
        if d > engine.model().dimensions() {
            return Err(bad(
                "dimensions",
                format!(
                    "at most {} for model {}",
                    engine.model().dimensions(),
                    entry.id
                ),
            ));
        }
    }
    let _slot = cs
        .core
        .user_slots
        .take(user)
        .map_err(ApiError::rate_limited)?;
    let (truncate, tokenizing) = (request.truncate, (*engine).clone());
    let inputs = tokio::task::spawn_blocking(move || -> Result<Vec<Tokens>, ApiError> {
        let model = tokenizing.model();
        let tokens: hearth_embed::Result<Vec<Tokens>> = match request.inputs {
            Inputs::Texts(texts) => texts
                .iter()
                .enumerate()
                .map(|(i, t)| model.tokenize(i, t, truncate))
                .collect(),
            Inputs::Ids(ids) => ids
                .iter()
                .enumerate()
                .map(|(i, ids)| model.check_ids(i, ids, truncate))
                .collect(),
        };
        tokens.map_err(|e| refusal(e, "input"))
    })
    .await
    .map_err(ApiError::internal)??;
    let tokens: usize = inputs.iter().map(Tokens::len).sum();
    let vectors = charged(
        cs,
        user,
        &entry,
        tokens,
        "embeddings",
        "input",
        engine.encode(inputs),
    )
    .await?;
    let dimensions = request.dimensions;
    Ok(Embedded {
        model: entry.id.clone(),
        vectors: vectors
            .into_iter()
            .map(|v| shorten(v, dimensions))
            .collect(),
        tokens,
    })
}

/// The vector cut to `dimensions` and brought back to unit length.
fn shorten(mut v: Vec<f32>, dimensions: Option<usize>) -> Vec<f32> {
    if let Some(d) = dimensions {
        v.truncate(d);
        hearth_embed::normalize(&mut v);
    }
    v
}

/// Floats as JSON numbers, or their little-endian float32 bytes in base64.
fn encode(v: Vec<f32>, base64: bool) -> Value {
    if base64 {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
    } else {
        Value::from(v)
    }
}
