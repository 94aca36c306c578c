//! Starting a generation, as a pipeline of named steps: credentials, validation, the user's
//! slot, the model's engine, the prompt's tokens, the grammar, the price, the hold, admission. Each step
//! either hands the next what it needs or answers the request's error; what a step took (the
//! slot, the hold) is an owned value that gives itself back when a later step fails.

use hearth_billing::{HeldFunds, Margin};
use hearth_scheduler::{Generation, Request, SchedulerHandle};
use hearth_store::LedgerMeta;
use rust_decimal::Decimal;
use tracing::{instrument, warn, Span};

use super::validate::{self, Prompt, RawCompletionRequest, ValidRequest};
use super::{CompletionState, TextModelSpec};
use crate::error::{ApiError, ErrorKind};
use crate::state::Session;
use crate::user_slots::UserSlot;
use hearth_infer::{SamplingParams, TokenConstraint};

/// A validated, paid-for (held), admitted generation. Its hold and its user slot are owned
/// values: whatever ends the generation, dropping them releases both.
pub struct Started {
    pub generation: Generation,
    pub hold: HeldFunds,
    pub slot: UserSlot,
    pub model: String,
    pub spec: TextModelSpec,
    pub margin: Margin,
    pub input_cost: Decimal,
    /// The prompt's tokens, template included.
    pub prompt_tokens: usize,
}

/// `POST /` and `POST /stream`: the spec's request, credentials in its body.
#[instrument(skip_all, fields(model, user))]
pub async fn start(cs: &CompletionState, raw: RawCompletionRequest) -> Result<Started, ApiError> {
    let token = crate::validate::service_token_field(&raw.service_token)?;
    let session = authenticate(cs, token).await?;
    let valid = validate::validate(&raw, &cs.core.catalog.now())?;
    Span::current().record("model", valid.model.as_str());
    start_valid(cs, session, valid).await
}

/// From a validated request on: the user's slot, the model's engine, the prompt's tokens, the
/// grammar, the price, the hold, admission. Both front ends end here.
pub async fn start_valid(
    cs: &CompletionState,
    session: Session,
    valid: ValidRequest,
) -> Result<Started, ApiError> {
    let spec = cs
        .core
        .catalog
        .now()
        .get(&valid.model)
        .cloned()
        .ok_or_else(|| {
            ApiError::internal(format!("validated model {} left the catalog", valid.model))
        })?;
    let slot = cs
        .core
        .user_slots
        .take(&session.user_id)
        .map_err(ApiError::rate_limited)?;
    let engine = cs.core.engines.get(&valid.model).await?;
    // From here until the submit, an idle engine gathering a burst waits for this request.
    let announced = engine.announce();
    let prompt_ids = tokenize(&engine, &valid, &spec).await?;
    let constraint = match &valid.decode.grammar {
        Some(grammar) => Some(
            cs.core
                .grammars
                .compile(&valid.model, &engine, grammar)
                .await?,
        ),
        None => None,
    };
    let margin = cs.app.billing.margin(valid.margin);
    let prompt_tokens = prompt_ids.len();
    let (input_cost, worst_case) = price(&spec, &valid, prompt_tokens, margin)?;
    let hold = hold(cs, &session, &valid, worst_case).await?;
    drop(announced);
    let generation = admit(&engine, &valid, prompt_ids, constraint, hold).await?;
    Ok(Started {
        generation: generation.0,
        hold: generation.1,
        slot,
        model: valid.model,
        spec,
        margin,
        input_cost,
        prompt_tokens,
    })
}

/// How many tokens `valid`'s prompt is as its model reads it (template and tools included),
/// with nothing held or generated: Anthropic's `count_tokens`. Loads the model if it is not.
pub async fn count_prompt_tokens(
    cs: &CompletionState,
    valid: &ValidRequest,
) -> Result<usize, ApiError> {
    let engine = cs.core.engines.get(&valid.model).await?;
    Ok(encode(&engine, valid).await?.len())
}

/// The service token's session. The completion service's error types (spec section 7) have no
/// `SessionExpired`: an expired token is `InvalidCredentials` here, with the reason in the
/// message.
pub async fn authenticate(cs: &CompletionState, token: &str) -> Result<Session, ApiError> {
    let session = cs.app.authenticate(token).await.map_err(|e| match e.kind {
        ErrorKind::SessionExpired => ApiError::invalid_credentials("the service token has expired"),
        _ => e,
    })?;
    Span::current().record("user", session.user_id.as_str());
    Ok(session)
}

/// The chat template rendered and tokenized (off the async workers), and the prompt's length
/// checked against the model's context.
async fn tokenize(
    engine: &SchedulerHandle,
    valid: &ValidRequest,
    spec: &TextModelSpec,
) -> Result<Vec<u32>, ApiError> {
    let prompt_ids = encode(engine, valid).await?;
    let context = spec
        .context_length
        .map_or(engine.context_length(), |c| c.min(engine.context_length()));
    validate::check_prompt_length(prompt_ids.len(), valid.max_output_tokens, spec, context)?;
    Ok(prompt_ids)
}

/// The chat template rendered and tokenized, off the async workers.
async fn encode(engine: &SchedulerHandle, valid: &ValidRequest) -> Result<Vec<u32>, ApiError> {
    let tokenizer = engine.tokenizer();
    let prompt = valid.prompt.clone();
    let prompt_ids = tokio::task::spawn_blocking(move || {
        let text = match &prompt {
            Prompt::Chat(messages) => tokenizer.apply_chat_template(messages)?,
            Prompt::ChatWithTools { messages, tools } => {
                tokenizer.apply_chat_template_with_tools(messages, tools)?
            }
            Prompt::Text(text) => text.clone(),
        };
        tokenizer.encode(&text)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| {
        let field = match valid.prompt {
            Prompt::Text(_) => "prompt",
            _ => "messages",
        };
        ApiError::invalid_request(field, e)
    })?;
    Ok(prompt_ids)
}

/// The prompt's cost and the worst case (the prompt plus `maxOutputTokens` of output).
fn price(
    spec: &TextModelSpec,
    valid: &ValidRequest,
    prompt_tokens: usize,
    margin: Margin,
) -> Result<(Decimal, Decimal), ApiError> {
    let input_cost = spec
        .input_price_per_million
        .cost(prompt_tokens as u64, margin)?;
    let worst_output = spec
        .output_price_per_million
        .cost(valid.max_output_tokens as u64, margin)?;
    Ok((input_cost, input_cost + worst_output))
}

/// The worst case held on the user's balance (`InsufficientFunds` when it cannot be).
async fn hold(
    cs: &CompletionState,
    session: &Session,
    valid: &ValidRequest,
    amount: Decimal,
) -> Result<HeldFunds, ApiError> {
    let meta = LedgerMeta {
        reason: format!("completion {}", valid.model),
        developer_id: valid.developer_id.clone(),
        application_id: valid.application_id.clone(),
    };
    Ok(cs.app.billing.hold(&session.user_id, amount, meta).await?)
}

/// The request queued on the engine until it is admitted; a refusal releases the hold before
/// it answers.
async fn admit(
    engine: &SchedulerHandle,
    valid: &ValidRequest,
    prompt_ids: Vec<u32>,
    constraint: Option<Box<dyn TokenConstraint>>,
    hold: HeldFunds,
) -> Result<(Generation, HeldFunds), ApiError> {
    let stream_id = uuid::Uuid::new_v4();
    let decode = &valid.decode;
    let params = SamplingParams {
        temperature: valid.temperature,
        top_p: decode.top_p,
        top_k: decode.top_k,
        presence_penalty: decode.presence_penalty,
        frequency_penalty: decode.frequency_penalty,
        logprobs: decode.logprobs,
        stop: decode.stop.clone(),
        max_tokens: valid.max_output_tokens,
        seed: decode.seed.unwrap_or(stream_id.as_u64_pair().0),
        ..SamplingParams::default()
    };
    let request = Request {
        prompt_ids,
        params,
        stream_id: stream_id.to_string(),
        span: Span::current(),
        ignore_eos: decode.ignore_eos,
        constraint,
    };
    match engine.submit(request).await {
        Ok(generation) => Ok((generation, hold)),
        Err(e) => {
            if let Err(release) = hold.release().await {
                warn!(error = %release, "releasing the hold of a refused request failed");
            }
            Err(e.into())
        }
    }
}
