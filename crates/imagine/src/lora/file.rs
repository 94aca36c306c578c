//! Reading a LoRA safetensors file, within bounds, into modules of `down`, `up` and `alpha`.
//!
//! A key is a module name followed by one of the suffixes of [`SUFFIXES`]; the module name is
//! kept exactly as the file spells it and only resolved against the model when the file is
//! bound ([`super::Lora::bind`]). diffusers' adapter config, when the file carries it in its
//! `__metadata__` (`lora_adapter_metadata`, written by `save_lora_weights`), gives the alphas
//! of modules that have no `.alpha` tensor.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::error::{Error, LoraProblem, Result};

/// The largest LoRA file read (a rank-256 SDXL LoRA with every convolution is about 1.7 GB).
pub const MAX_LORA_FILE_BYTES: u64 = 2 << 30;
/// The most tensors a LoRA file may hold (a full SDXL LoCon has about 3,000).
pub const MAX_LORA_TENSORS: usize = 20_000;
/// The highest rank accepted (also never above the larger of a layer's fan-in and width).
pub const MAX_LORA_RANK: usize = 1024;
/// The largest safetensors header read (the JSON index of the tensors).
const MAX_HEADER_BYTES: u64 = 16 << 20;

/// Which half of a module a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Down,
    Up,
    Alpha,
}

/// Every key suffix read, with its partner's: peft's; diffusers' own (`convert_state_dict_to_
/// diffusers`, which its training scripts save: `lora.down` in the UNet, `lora_linear_layer.down`
/// in the text encoders); kohya's.
const SUFFIXES: [(&str, Part, &str); 9] = [
    (".lora_A.weight", Part::Down, ".lora_B.weight"),
    (".lora_B.weight", Part::Up, ".lora_A.weight"),
    (".lora.down.weight", Part::Down, ".lora.up.weight"),
    (".lora.up.weight", Part::Up, ".lora.down.weight"),
    (
        ".lora_linear_layer.down.weight",
        Part::Down,
        ".lora_linear_layer.up.weight",
    ),
    (
        ".lora_linear_layer.up.weight",
        Part::Up,
        ".lora_linear_layer.down.weight",
    ),
    (".lora_down.weight", Part::Down, ".lora_up.weight"),
    (".lora_up.weight", Part::Up, ".lora_down.weight"),
    (".alpha", Part::Alpha, ""),
];

/// A named tensor of the file.
#[derive(Debug, Clone)]
pub(crate) struct Keyed {
    pub(crate) key: String,
    pub(crate) tensor: Tensor,
}

/// One adapted module as the file gives it: rank-checked, finite.
#[derive(Debug, Clone)]
pub(crate) struct RawModule {
    pub(crate) down: Keyed,
    pub(crate) up: Keyed,
    pub(crate) rank: usize,
    /// From the module's `.alpha` tensor.
    pub(crate) alpha: Option<f64>,
}

/// diffusers' adapter config of one component (`unet`, `text_encoder`, `text_encoder_2`).
#[derive(Debug, Clone, Default)]
pub(crate) struct AdapterConfig {
    lora_alpha: Option<f64>,
    /// Module name (or a dotted suffix of one) -> alpha; the first match wins, as in peft.
    alpha_pattern: Vec<(String, f64)>,
    /// `alpha / sqrt(rank)` instead of `alpha / rank`.
    pub(crate) use_rslora: bool,
}

impl AdapterConfig {
    /// The alpha the config gives the module at `path` (relative to its component).
    pub(crate) fn alpha(&self, path: &str) -> Option<f64> {
        self.alpha_pattern
            .iter()
            .find(|(p, _)| path == p || path.ends_with(&format!(".{p}")))
            .map(|(_, a)| *a)
            .or(self.lora_alpha)
    }
}

/// A LoRA file read and checked on its own, not yet against a model.
#[derive(Debug, Clone)]
pub struct LoraFile {
    pub(crate) name: String,
    /// By module name as the file spells it.
    pub(crate) modules: BTreeMap<String, RawModule>,
    /// By component, from the file's metadata.
    pub(crate) configs: BTreeMap<String, AdapterConfig>,
}

fn problem(name: &str, problem: LoraProblem) -> Error {
    Error::Lora {
        file: name.to_string(),
        problem,
    }
}

impl LoraFile {
    /// Reads `path`, refusing a file over [`MAX_LORA_FILE_BYTES`] before reading it.
    pub fn read(path: &Path) -> Result<LoraFile> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let name = path.display().to_string();
        if meta.len() > MAX_LORA_FILE_BYTES {
            return Err(problem(
                &name,
                LoraProblem::TooLarge {
                    bytes: meta.len(),
                    max: MAX_LORA_FILE_BYTES,
                },
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&name, &bytes)
    }

    /// Parses a file's bytes; `name` names it in errors.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<LoraFile> {
        let fail = |p| problem(name, p);
        let bad = |m: String| fail(LoraProblem::NotSafetensors(m));
        if bytes.len() as u64 > MAX_LORA_FILE_BYTES {
            return Err(fail(LoraProblem::TooLarge {
                bytes: bytes.len() as u64,
                max: MAX_LORA_FILE_BYTES,
            }));
        }
        // The header: an 8-byte little-endian length, then that much JSON.
        let Some(len) = bytes.get(..8) else {
            return Err(bad(format!("{} bytes, shorter than a header", bytes.len())));
        };
        let len = u64::from_le_bytes(len.try_into().unwrap_or_default());
        if len > MAX_HEADER_BYTES || len > bytes.len() as u64 - 8 {
            return Err(bad(format!(
                "header of {len} bytes in a file of {}",
                bytes.len()
            )));
        }
        let header: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes[8..8 + len as usize])
                .map_err(|e| bad(format!("header: {e}")))?;
        let count = header.len() - usize::from(header.contains_key("__metadata__"));
        if count > MAX_LORA_TENSORS {
            return Err(fail(LoraProblem::TooManyTensors {
                count,
                max: MAX_LORA_TENSORS,
            }));
        }
        let configs = match header.get("__metadata__") {
            Some(meta) => adapter_configs(meta).map_err(fail)?,
            None => BTreeMap::new(),
        };
        let tensors = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)
            .map_err(|e| bad(e.to_string()))?;
        let modules = group(tensors).map_err(fail)?;
        if modules.is_empty() {
            return Err(fail(LoraProblem::Empty));
        }
        Ok(LoraFile {
            name: name.to_string(),
            modules,
            configs,
        })
    }

    /// The name errors give the file (its path when read from one).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many layers the file adapts.
    pub fn modules(&self) -> usize {
        self.modules.len()
    }
}

/// Groups the tensors by module, checking each module is whole, its rank consistent and in
/// bounds, its alpha finite and its weights float and finite.
fn group(
    tensors: std::collections::HashMap<String, Tensor>,
) -> std::result::Result<BTreeMap<String, RawModule>, LoraProblem> {
    type Halves = (Option<Keyed>, Option<Keyed>, Option<Keyed>);
    let mut halves: BTreeMap<String, Halves> = BTreeMap::new();
    // Sorted, so that the first problem reported does not depend on hashing.
    let sorted: BTreeMap<String, Tensor> = tensors.into_iter().collect();
    for (key, tensor) in sorted {
        let Some((module, part)) = SUFFIXES
            .iter()
            .find_map(|(s, part, _)| Some((key.strip_suffix(s)?, *part)))
            .filter(|(m, _)| !m.is_empty())
        else {
            return Err(LoraProblem::UnsupportedKey { key });
        };
        if !matches!(
            tensor.dtype(),
            DType::F16 | DType::BF16 | DType::F32 | DType::F64
        ) {
            return Err(LoraProblem::Dtype {
                key,
                dtype: format!("{:?}", tensor.dtype()),
            });
        }
        let entry = halves.entry(module.to_string()).or_default();
        let place = match part {
            Part::Down => &mut entry.0,
            Part::Up => &mut entry.1,
            Part::Alpha => &mut entry.2,
        };
        if let Some(first) = place {
            return Err(LoraProblem::DuplicateKey {
                key,
                other: first.key.clone(),
            });
        }
        *place = Some(Keyed { key, tensor });
    }
    let mut modules = BTreeMap::new();
    for (module, (down, up, alpha)) in halves {
        let (down, up) = match (down, up) {
            (Some(d), Some(u)) => (d, u),
            (Some(present), None) | (None, Some(present)) => {
                return Err(LoraProblem::MissingHalf {
                    key: partner(&module, &present.key),
                    present: present.key,
                });
            }
            (None, None) => {
                let present = alpha.map(|a| a.key).unwrap_or_default();
                return Err(LoraProblem::MissingHalf {
                    key: format!("{module}.lora_down.weight"),
                    present,
                });
            }
        };
        let rank = check_pair(&down, &up)?;
        let alpha = alpha.map(|a| scalar(&a)).transpose()?;
        for k in [&down, &up] {
            finite(k)?;
        }
        modules.insert(
            module,
            RawModule {
                down,
                up,
                rank,
                alpha,
            },
        );
    }
    Ok(modules)
}

/// The key that would complete `present`'s module.
fn partner(module: &str, present: &str) -> String {
    let suffix = &present[module.len()..];
    let other = SUFFIXES
        .iter()
        .find(|(s, _, _)| *s == suffix)
        .map_or("", |(_, _, p)| p);
    format!("{module}{other}")
}

/// The rank of a down/up pair: `down` is `(rank, in)` or `(rank, in, kh, kw)`, `up` is
/// `(out, rank)` or `(out, rank, 1, 1)`.
fn check_pair(down: &Keyed, up: &Keyed) -> std::result::Result<usize, LoraProblem> {
    for (k, want) in [
        (down, "(rank, in) or (rank, in, kh, kw)"),
        (up, "(out, rank) or (out, rank, 1, 1)"),
    ] {
        if !matches!(k.tensor.rank(), 2 | 4) {
            return Err(LoraProblem::Shape {
                key: k.key.clone(),
                got: k.tensor.dims().to_vec(),
                want: want.into(),
            });
        }
    }
    let rank = down.tensor.dims()[0];
    let up_rank = up.tensor.dims()[1];
    if rank == 0 {
        return Err(LoraProblem::Rank {
            key: down.key.clone(),
            rank,
            max: MAX_LORA_RANK,
        });
    }
    if rank != up_rank {
        return Err(LoraProblem::RankMismatch {
            key: down.key.clone(),
            rank,
            other: up.key.clone(),
            other_rank: up_rank,
        });
    }
    if rank > MAX_LORA_RANK {
        return Err(LoraProblem::Rank {
            key: down.key.clone(),
            rank,
            max: MAX_LORA_RANK,
        });
    }
    Ok(rank)
}

/// A one-element tensor's value, which must be finite.
fn scalar(k: &Keyed) -> std::result::Result<f64, LoraProblem> {
    let shape_error = || LoraProblem::Shape {
        key: k.key.clone(),
        got: k.tensor.dims().to_vec(),
        want: "a single number".into(),
    };
    if k.tensor.elem_count() != 1 {
        return Err(shape_error());
    }
    let value = k
        .tensor
        .to_dtype(DType::F64)
        .and_then(|t| t.flatten_all()?.to_vec1::<f64>())
        .map_err(|_| shape_error())?[0];
    if !value.is_finite() {
        return Err(LoraProblem::Alpha {
            key: k.key.clone(),
            value,
        });
    }
    Ok(value)
}

/// Refuses weights holding NaN or infinity (`0 * x` is 0 for every finite `x`, NaN else).
fn finite(k: &Keyed) -> std::result::Result<(), LoraProblem> {
    let nan = || LoraProblem::NonFinite { key: k.key.clone() };
    let sum = k
        .tensor
        .affine(0.0, 0.0)
        .and_then(|d| d.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>())
        .map_err(|_| nan())?;
    if sum == 0.0 {
        Ok(())
    } else {
        Err(nan())
    }
}

/// diffusers' per-component adapter configs from `__metadata__.lora_adapter_metadata` (JSON of
/// peft `LoraConfig` fields, each key prefixed by its component: `unet.lora_alpha`).
fn adapter_configs(
    meta: &Value,
) -> std::result::Result<BTreeMap<String, AdapterConfig>, LoraProblem> {
    let bad = |m: String| LoraProblem::Metadata(m);
    let Some(text) = meta.get("lora_adapter_metadata") else {
        return Ok(BTreeMap::new());
    };
    let text = text
        .as_str()
        .ok_or_else(|| bad("lora_adapter_metadata is not a string".into()))?;
    let fields: serde_json::Map<String, Value> =
        serde_json::from_str(text).map_err(|e| bad(format!("lora_adapter_metadata: {e}")))?;
    let mut configs: BTreeMap<String, AdapterConfig> = BTreeMap::new();
    for (key, value) in &fields {
        let Some((component, field)) = key.rsplit_once('.') else {
            continue;
        };
        let number = |v: &Value| {
            v.as_f64()
                .filter(|a| a.is_finite())
                .ok_or_else(|| LoraProblem::Alpha {
                    key: format!("__metadata__.lora_adapter_metadata.{key}"),
                    value: f64::NAN,
                })
        };
        let yes = value.as_bool() == Some(true);
        let config = configs.entry(component.to_string()).or_default();
        match field {
            "lora_alpha" => config.lora_alpha = Some(number(value)?),
            "alpha_pattern" => {
                let Some(map) = value.as_object() else {
                    return Err(bad(format!("{key} is not an object")));
                };
                for (pattern, alpha) in map {
                    config.alpha_pattern.push((pattern.clone(), number(alpha)?));
                }
            }
            "use_rslora" => config.use_rslora = yes,
            "use_dora" if yes => return Err(LoraProblem::Unsupported(format!("{key}: DoRA"))),
            "lora_bias" if yes => {
                return Err(LoraProblem::Unsupported(format!("{key}: a bias on lora_B")))
            }
            _ => {}
        }
    }
    Ok(configs)
}
