//! Parse, don't validate: the wire image request (spec 2.6, every field raw JSON) becomes a
//! [`ValidImageRequest`] or a [`FieldError`] naming the field; the fields every service shares
//! take their rules from `crate::validate`.
//!
//! Bounds (docs/decisions.md "Image generation"): `prompt` a non-empty string of at most 4,000 characters (CLIP reads
//! the first 75 tokens); `negativePrompt` a string of at most 4,000 characters; `seed` an integer
//! 0..=4294967295, random when absent; `steps` an integer 1..=max_steps (8), default 4; `width`
//! and `height` multiples of 64 from 256 to 2048, default 1024, with width x height at most
//! 1,048,576 pixels; `overrideGrossMarginPercent` 0..=99. An edit (Hearth's fields beside the
//! spec's) adds `image` and `mask` (data URLs or base64, at most `[imagine] max_upload_bytes`
//! each) and `strength` (0 < s <= 1, leaving at least one step), checked and decoded by `edit`.

use hearth_billing::Margin;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::catalog::{Limits, SIZE_MULTIPLE};
use super::edit::{self, EditBytes};
use crate::validate::{self as fields, FieldError, MAX_PROMPT_CHARS};
use hearth_imagine::lora::{MAX_ACTIVE_LORAS, MAX_LORA_SCALE};
use hearth_imagine::InitImage;

pub const MAX_SEED: u64 = u32::MAX as u64;

/// The request as it arrives: every field raw JSON, so that each bad value is an error naming
/// its field. Its schema says what each field must hold.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(
    as = ImageRequest,
    description = "Image request (spec 2.6). A bad field is a 400 `InvalidRequest` naming it in \
        `details.field`; a missing or bad `serviceToken` is a 401 `InvalidCredentials`. The \
        size and step bounds are the model's (`models.toml`; defaults shown)."
)]
pub struct RawImageRequest {
    /// What to draw (CLIP reads about the first 75 tokens).
    #[schema(value_type = String, required = true, min_length = 1, max_length = 4000)]
    pub prompt: Option<Value>,
    /// The service token (`POST /token` on the auth listener): the credential of this route.
    #[schema(value_type = String, required = true)]
    pub service_token: Option<Value>,
    /// Recorded in the ledger.
    #[schema(value_type = Option<String>, max_length = 256)]
    pub developer_id: Option<Value>,
    /// Recorded in the ledger.
    #[schema(value_type = Option<String>, max_length = 256)]
    pub application_id: Option<Value>,
    /// Things to avoid.
    #[schema(value_type = Option<String>, max_length = 4000)]
    pub negative_prompt: Option<Value>,
    /// For reproducible output; random when absent.
    #[schema(value_type = Option<u32>)]
    pub seed: Option<Value>,
    /// Denoising steps, 1 to the model's maximum (default 8); the model's default (4) when
    /// absent. The price scales with them.
    #[schema(value_type = Option<u32>, minimum = 1)]
    pub steps: Option<Value>,
    /// Pixels, a multiple of 64 within the model's bounds (default 256 to 2048, and width x
    /// height at most 1,048,576); the model's default (1024) when absent.
    #[schema(value_type = Option<u32>, multiple_of = 64)]
    pub width: Option<Value>,
    /// As `width`.
    #[schema(value_type = Option<u32>, multiple_of = 64)]
    pub height: Option<Value>,
    /// The gross margin of this request's price, instead of the configured one.
    #[schema(value_type = Option<f64>, minimum = 0.0, maximum = 99.0)]
    pub override_gross_margin_percent: Option<Value>,
    /// Not in the spec's request; accepted when it names the served model.
    #[schema(value_type = Option<String>)]
    pub model: Option<Value>,
    /// Not in the spec's request: a picture to change (image-to-image), PNG, JPEG or WebP as a
    /// data URL or base64. Without `width`/`height` the output keeps its aspect, scaled into
    /// the model's bounds.
    #[schema(value_type = Option<String>)]
    pub image: Option<Value>,
    /// Not in the spec's request: with `image`, where to repaint (inpainting): white repaints,
    /// black keeps; the image's own size.
    #[schema(value_type = Option<String>)]
    pub mask: Option<Value>,
    /// Not in the spec's request: with `image`, how much of the schedule runs (0 < s <= 1;
    /// 0.75 by default, 1 with a mask); the price counts the steps that run.
    #[schema(value_type = Option<f64>, minimum = 0.0, maximum = 1.0)]
    pub strength: Option<Value>,
    /// Not in the spec's request: LoRAs to apply, `[{name, scale}]`, at most 8, each a name the
    /// model declares (`loras` in `models.toml`) and a scale from -10 to 10 (default 1).
    #[schema(value_type = Option<Vec<LoraChoice>>)]
    pub loras: Option<Value>,
}

/// One LoRA of a request.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // The schema of an item of `loras`, read from raw JSON.
pub struct LoraChoice {
    /// A name the model declares.
    name: String,
    /// The LoRA's weight, -10 to 10; 1 when absent.
    scale: Option<f64>,
}

/// A request every later stage can trust.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidImageRequest {
    pub prompt: String,
    pub negative_prompt: String,
    /// `None`: pick one at random.
    pub seed: Option<u64>,
    pub steps: usize,
    pub width: usize,
    pub height: usize,
    /// `None`: the configured default margin applies.
    pub margin: Option<Margin>,
    pub developer_id: Option<String>,
    pub application_id: Option<String>,
    /// An edit's starting picture, at `width` x `height`.
    pub init: Option<InitImage>,
    /// LoRA names (declared by the model, each once) and scales, in the request's order.
    pub loras: Vec<(String, f64)>,
}

impl ValidImageRequest {
    /// The denoising steps that run (an edit runs its strength's share), which the price counts.
    pub fn steps_to_run(&self) -> usize {
        self.init.as_ref().map_or(self.steps, |init| {
            // `validate` checked the strength leaves a step.
            hearth_imagine::edit::steps_to_run(self.steps, init.strength).unwrap_or(self.steps)
        })
    }
}

/// Checks every field against `limits`; `model_id` is the served model's id; an edit's pictures
/// are at most `max_upload_bytes` each. Decodes an edit's pictures: CPU work, so call it off the
/// async threads.
pub fn validate(
    raw: &RawImageRequest,
    limits: &Limits,
    model_id: &str,
    max_upload_bytes: usize,
) -> Result<ValidImageRequest, FieldError> {
    let edit = edit::from_json(&raw.image, &raw.mask, &raw.strength, max_upload_bytes)?;
    validate_with(raw, edit.as_ref(), limits, model_id)
}

/// [`validate`] with the edit's pictures already read (a multipart route's files).
pub fn validate_with(
    raw: &RawImageRequest,
    edit: Option<&EditBytes>,
    limits: &Limits,
    model_id: &str,
) -> Result<ValidImageRequest, FieldError> {
    let prompt = fields::prompt("prompt", &raw.prompt, MAX_PROMPT_CHARS)?;
    match &raw.model {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == model_id => {}
        Some(_) => {
            return Err(FieldError::new("model", format!("must be {model_id:?}"))
                .with("allowed", json!([model_id])))
        }
    }
    let negative_prompt =
        fields::optional_text("negativePrompt", &raw.negative_prompt, MAX_PROMPT_CHARS)?
            .unwrap_or_default();
    let developer_id = fields::optional_id("developerId", &raw.developer_id)?;
    let application_id = fields::optional_id("applicationId", &raw.application_id)?;
    let seed = fields::integer("seed", &raw.seed, 0, MAX_SEED)?;
    let steps = fields::integer("steps", &raw.steps, 1, limits.max_steps as u64)?
        .map_or(limits.default_steps, |s| s as usize);
    let size = |field: &str, v: &Option<Value>| -> Result<usize, FieldError> {
        let s = fields::integer(field, v, limits.min_size as u64, limits.max_size as u64)?
            .map_or(limits.default_size, |s| s as usize);
        if !s.is_multiple_of(SIZE_MULTIPLE) {
            return Err(FieldError::new(
                field,
                format!("must be a multiple of {SIZE_MULTIPLE}, got {s}"),
            )
            .with("multipleOf", json!(SIZE_MULTIPLE)));
        }
        Ok(s)
    };
    let mut width = size("width", &raw.width)?;
    let mut height = size("height", &raw.height)?;
    let named = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    let init = match edit {
        None => None,
        Some(edit) => {
            let asked = (named(&raw.width) || named(&raw.height)).then_some((width, height));
            let sized = edit::resolve(edit, asked, steps, limits)?;
            (width, height) = (sized.width, sized.height);
            Some(sized.init)
        }
    };
    if width * height > limits.max_pixels {
        let field = if raw.height.is_some() {
            "height"
        } else {
            "width"
        };
        return Err(FieldError::new(
            field,
            format!(
                "width x height is {} pixels, at most {} are allowed",
                width * height,
                limits.max_pixels
            ),
        )
        .with("maxPixels", json!(limits.max_pixels)));
    }
    let margin = fields::margin(&raw.override_gross_margin_percent)?;
    let loras = loras(&raw.loras, &limits.loras)?;
    Ok(ValidImageRequest {
        prompt,
        negative_prompt,
        seed,
        steps,
        width,
        height,
        margin,
        developer_id,
        application_id,
        init,
        loras,
    })
}

/// `loras`: an array of at most [`MAX_ACTIVE_LORAS`] objects `{name, scale?}`, each name one of
/// `declared` and used once, each scale finite within [`MAX_LORA_SCALE`] (default 1).
fn loras(value: &Option<Value>, declared: &[String]) -> Result<Vec<(String, f64)>, FieldError> {
    const FIELD: &str = "loras";
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(FieldError::new(FIELD, "must be an array of {name, scale}")),
    };
    if items.len() > MAX_ACTIVE_LORAS {
        return Err(FieldError::new(
            FIELD,
            format!(
                "at most {MAX_ACTIVE_LORAS} LoRAs at once, got {}",
                items.len()
            ),
        )
        .with("max", json!(MAX_ACTIVE_LORAS)));
    }
    let mut out: Vec<(String, f64)> = Vec::with_capacity(items.len());
    for item in items {
        let Some(name) = item.get("name").and_then(Value::as_str) else {
            return Err(FieldError::new(FIELD, "each item needs a string `name`"));
        };
        if !declared.iter().any(|d| d == name) {
            let shown: String = name.chars().take(64).collect();
            return Err(
                FieldError::new(FIELD, format!("{shown:?} is not a LoRA of this model"))
                    .with("allowed", json!(declared)),
            );
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(FieldError::new(FIELD, format!("{name:?} is named twice")));
        }
        let scale = match item.get("scale") {
            None | Some(Value::Null) => 1.0,
            Some(v) => match v.as_f64() {
                Some(s) if s.is_finite() && s.abs() <= MAX_LORA_SCALE => s,
                _ => {
                    return Err(FieldError::new(
                        FIELD,
                        format!("the scale of {name:?} must be a number from -{MAX_LORA_SCALE} to {MAX_LORA_SCALE}"),
                    ))
                }
            },
        };
        out.push((name.to_string(), scale));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::for_tests()
    }

    fn raw(v: Value) -> RawImageRequest {
        serde_json::from_value(v).unwrap()
    }

    fn field_of(v: Value) -> String {
        let err = validate(&raw(v), &limits(), "xl-lightning", 1024).unwrap_err();
        err.field
    }

    #[test]
    fn defaults_fill_everything_but_the_prompt() {
        let v = validate(
            &raw(json!({"prompt": "a cat"})),
            &limits(),
            "xl-lightning",
            1024,
        )
        .unwrap();
        assert_eq!((v.steps, v.width, v.height, v.seed), (4, 1024, 1024, None));
        assert_eq!(v.negative_prompt, "");
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(field_of(json!({})), "prompt");
        assert_eq!(field_of(json!({"prompt": "  "})), "prompt");
        assert_eq!(field_of(json!({"prompt": 3})), "prompt");
        assert_eq!(field_of(json!({"prompt": "a", "steps": 0})), "steps");
        assert_eq!(field_of(json!({"prompt": "a", "steps": 9})), "steps");
        assert_eq!(field_of(json!({"prompt": "a", "steps": 2.5})), "steps");
        assert_eq!(field_of(json!({"prompt": "a", "width": 300})), "width");
        assert_eq!(field_of(json!({"prompt": "a", "width": 128})), "width");
        assert_eq!(field_of(json!({"prompt": "a", "height": "512"})), "height");
        assert_eq!(
            field_of(json!({"prompt": "a", "width": 2048, "height": 1024})),
            "height"
        );
        assert_eq!(field_of(json!({"prompt": "a", "seed": -1})), "seed");
        assert_eq!(
            field_of(json!({"prompt": "a", "seed": 4294967296u64})),
            "seed"
        );
        assert_eq!(
            field_of(json!({"prompt": "a", "negativePrompt": 1})),
            "negativePrompt"
        );
        assert_eq!(field_of(json!({"prompt": "a", "model": "other"})), "model");
        assert_eq!(
            field_of(json!({"prompt": "a", "overrideGrossMarginPercent": "5"})),
            "overrideGrossMarginPercent"
        );
    }

    #[test]
    fn loras_are_declared_names_used_once_at_bounded_scales() {
        let ok = validate(
            &raw(
                json!({"prompt": "a", "loras": [{"name": "ink", "scale": 0.5}, {"name": "pixel"}]}),
            ),
            &limits(),
            "xl-lightning",
            1024,
        )
        .unwrap();
        assert_eq!(
            ok.loras,
            [("ink".to_string(), 0.5), ("pixel".to_string(), 1.0)]
        );
        let many: Vec<Value> = (0..100).map(|_| json!({"name": "ink"})).collect();
        for bad in [
            json!("ink"),
            json!([{"scale": 1}]),
            json!([{"name": "watercolor"}]),
            json!([{"name": "ink"}, {"name": "ink"}]),
            json!([{"name": "ink", "scale": 11}]),
            json!([{"name": "ink", "scale": "1"}]),
            Value::Array(many),
        ] {
            assert_eq!(field_of(json!({"prompt": "a", "loras": bad})), "loras");
        }
    }

    #[test]
    fn wide_sizes_within_the_pixel_budget_pass() {
        let v = validate(
            &raw(json!({"prompt": "a", "width": 2048, "height": 512, "seed": 7, "steps": 1.0})),
            &limits(),
            "xl-lightning",
            1024,
        )
        .unwrap();
        assert_eq!(
            (v.width, v.height, v.seed, v.steps),
            (2048, 512, Some(7), 1)
        );
    }
}
