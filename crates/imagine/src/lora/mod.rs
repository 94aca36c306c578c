//! SDXL LoRA as runtime adapters: a LoRA file is read ([`LoraFile`]), bound to a loaded
//! pipeline ([`Lora::bind`]: every module must name one of its adapter-capable layers, with
//! shapes that fit), and put in effect for one generation by the guard
//! [`SdxlPipeline::apply_loras`] returns, which `sample_observed` takes from
//! [`crate::ImageParams::loras`]. The base weights are never merged into or reloaded: each
//! adapter-capable layer adds `scale * alpha / rank * up(down(x))` per LoRA in effect, and
//! with none runs exactly as it did without LoRA support.
//!
//! Adapter-capable: the UNet's attention projections (`to_q`, `to_k`, `to_v`, `to_out.0`),
//! `proj_in`, `proj_out`, `ff.net.0.proj`, `ff.net.2`, the resnets' `time_emb_proj`, `conv1`,
//! `conv2`, `conv_shortcut`, the down- and upsamplers' convolutions, `conv_in` and `conv_out`;
//! and the text encoders' `q_proj`, `k_proj`, `v_proj`, `out_proj`, `fc1`, `fc2`. The key
//! layouts read are described in `lora/names.rs` and `lora/file.rs`.

mod adapter;
mod file;
mod names;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, MutexGuard, Weak};

use candle_core::Tensor;

use adapter::{Active, Delta, Shape};
pub(crate) use adapter::{AdaptedConv, AdaptedLinear, Slot, Table};
use file::{Keyed, RawModule};
pub use file::{LoraFile, MAX_LORA_FILE_BYTES, MAX_LORA_RANK, MAX_LORA_TENSORS};
pub(crate) use names::{text_encoder as text_encoder_names, UNetNames};

use crate::error::{Error, LoraProblem, Result};
use crate::pipeline::SdxlPipeline;

/// The most LoRAs one generation may use at once.
pub const MAX_ACTIVE_LORAS: usize = 8;
/// The largest magnitude of a LoRA's scale in a request.
pub const MAX_LORA_SCALE: f64 = 10.0;

/// One module of a bound LoRA: its layer, and `down`/`up` in that layer's dtype and device.
#[derive(Debug)]
struct Part {
    table: usize,
    slot: usize,
    down: Tensor,
    up: Tensor,
    /// `alpha / rank` (`alpha / sqrt(rank)` for rsLoRA).
    factor: f64,
}

/// A LoRA bound to one pipeline: ready to be put in effect, by [`ActiveLora`], on the layers
/// of that pipeline only.
pub struct Lora {
    name: String,
    /// The tables of the pipeline it was bound to (text encoder, text encoder 2, UNet).
    owners: Vec<Weak<Active>>,
    parts: Vec<Part>,
}

impl std::fmt::Debug for Lora {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lora")
            .field("name", &self.name)
            .field("layers", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl Lora {
    /// Reads the file at `path` and binds it to `pipeline`.
    pub fn load(path: &Path, pipeline: &SdxlPipeline) -> Result<Lora> {
        Self::bind(&LoraFile::read(path)?, pipeline)
    }

    /// Binds a read file to `pipeline`: every module must name one of its adapter-capable
    /// layers (one module per layer) with down and up weights of that layer's shape.
    pub fn bind(file: &LoraFile, pipeline: &SdxlPipeline) -> Result<Lora> {
        bind(file, pipeline.lora_tables())
    }

    /// The name errors give it (the file's path when loaded from one).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many layers it adapts.
    pub fn layers(&self) -> usize {
        self.parts.len()
    }
}

/// A LoRA and the scale a generation uses it at (diffusers' `adapter_weights`): each layer
/// adds `scale * alpha / rank * up(down(x))`.
#[derive(Debug, Clone)]
pub struct ActiveLora {
    pub lora: Arc<Lora>,
    pub scale: f64,
}

impl ActiveLora {
    pub fn new(lora: Arc<Lora>, scale: f64) -> Self {
        ActiveLora { lora, scale }
    }
}

impl PartialEq for ActiveLora {
    /// The same bound LoRA at the same scale.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.lora, &other.lora) && self.scale == other.scale
    }
}

/// LoRAs in effect on one pipeline until it drops, which takes them all out of effect (on
/// success, error, cancellation or panic alike). While it lives, no other generation of the
/// pipeline runs: a second [`SdxlPipeline::apply_loras`] waits for it (so never take two in
/// one thread).
pub struct LoraGuard<'a> {
    tables: [&'a Table; 3],
    _turns: Vec<MutexGuard<'a, ()>>,
}

impl std::fmt::Debug for LoraGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraGuard").finish_non_exhaustive()
    }
}

impl Drop for LoraGuard<'_> {
    fn drop(&mut self) {
        for t in self.tables {
            t.active.clear();
        }
    }
}

impl SdxlPipeline {
    /// Puts `loras` in effect, in order, until the guard drops; with none, the guard only
    /// holds the pipeline's turn. A scale of 0 leaves its LoRA out. Refuses more than
    /// [`MAX_ACTIVE_LORAS`], a scale that is not finite or above [`MAX_LORA_SCALE`] in
    /// magnitude, and a LoRA bound to another pipeline.
    pub fn apply_loras(&self, loras: &[ActiveLora]) -> Result<LoraGuard<'_>> {
        apply(self.lora_tables(), loras)
    }
}

fn apply<'a>(tables: [&'a Table; 3], loras: &[ActiveLora]) -> Result<LoraGuard<'a>> {
    if loras.len() > MAX_ACTIVE_LORAS {
        return Err(Error::InvalidParams {
            field: "loras",
            message: format!("{} LoRAs, at most {MAX_ACTIVE_LORAS} at once", loras.len()),
        });
    }
    for l in loras {
        if !(l.scale.is_finite() && l.scale.abs() <= MAX_LORA_SCALE) {
            return Err(Error::InvalidParams {
                field: "loras",
                message: format!(
                    "{}: scale {} is outside -{MAX_LORA_SCALE}..={MAX_LORA_SCALE}",
                    l.lora.name, l.scale
                ),
            });
        }
        let ours = l.lora.owners.len() == tables.len()
            && l.lora
                .owners
                .iter()
                .zip(tables)
                .all(|(w, t)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&t.active)));
        if !ours {
            return Err(Error::Lora {
                file: l.lora.name.clone(),
                problem: LoraProblem::OtherModel,
            });
        }
    }
    let guard = LoraGuard {
        tables,
        _turns: tables.into_iter().map(|t| t.active.turn()).collect(),
    };
    for l in loras.iter().filter(|l| l.scale != 0.0) {
        for p in &l.lora.parts {
            let table = tables[p.table];
            let delta = Delta {
                down: p.down.clone(),
                up: p.up.clone(),
                scale: l.scale * p.factor,
            };
            table.active.push(p.slot, table.slots.len(), delta);
        }
    }
    Ok(guard)
}

fn bind(file: &LoraFile, tables: [&Table; 3]) -> Result<Lora> {
    let fail = |problem| Error::Lora {
        file: file.name.clone(),
        problem,
    };
    let mut taken: HashMap<(usize, usize), &str> = HashMap::new();
    let mut parts = Vec::with_capacity(file.modules.len());
    for (module, raw) in &file.modules {
        let key = &raw.down.key;
        let Some((t, id)) = tables
            .iter()
            .enumerate()
            .find_map(|(t, table)| Some((t, table.find(module)?)))
        else {
            return Err(fail(LoraProblem::UnknownModule { key: key.clone() }));
        };
        let table = tables[t];
        let slot = &table.slots[id];
        let layer = format!("{}.{}", table.component, slot.path);
        if let Some(other) = taken.insert((t, id), key) {
            return Err(fail(LoraProblem::SameLayer {
                key: key.clone(),
                other: other.to_string(),
                layer,
            }));
        }
        let (down, up) = fit(raw, &slot.shape, &layer).map_err(fail)?;
        let load = |x: Tensor| x.to_dtype(slot.dtype)?.to_device(&slot.device);
        let config = file.configs.get(table.component);
        // kohya's trainer reads an alpha of 0 as "none"; diffusers and peft never write one.
        let kohya = module.starts_with("lora_");
        let rank = raw.rank as f64;
        let alpha = raw
            .alpha
            .filter(|&a| !(kohya && a == 0.0))
            .or_else(|| config.and_then(|c| c.alpha(&slot.path)))
            .unwrap_or(rank);
        let factor = if config.is_some_and(|c| c.use_rslora) {
            alpha / rank.sqrt()
        } else {
            alpha / rank
        };
        parts.push(Part {
            table: t,
            slot: id,
            down: load(down)?,
            up: load(up)?,
            factor,
        });
    }
    Ok(Lora {
        name: file.name.clone(),
        owners: tables.iter().map(|t| Arc::downgrade(&t.active)).collect(),
        parts,
    })
}

/// `down` and `up` in the form the layer runs them, checked against its shape: 2D for a
/// linear layer (a 1x1 kernel accepted), 4D for a convolution (a 2D down accepted for 1x1).
fn fit(
    raw: &RawModule,
    shape: &Shape,
    layer: &str,
) -> std::result::Result<(Tensor, Tensor), LoraProblem> {
    let r = raw.rank;
    let max = MAX_LORA_RANK.min(shape.fan_in().max(shape.out()));
    if r > max {
        return Err(LoraProblem::Rank {
            key: raw.down.key.clone(),
            rank: r,
            max,
        });
    }
    let wrong = |k: &Keyed, want: String| LoraProblem::Shape {
        key: k.key.clone(),
        got: k.tensor.dims().to_vec(),
        want: format!("{want} to fit {layer}"),
    };
    let (d, u) = (&raw.down.tensor, &raw.up.tensor);
    let out = shape.out();
    let up_fits = u.dims() == [out, r] || u.dims() == [out, r, 1, 1];
    let reshaped = match *shape {
        Shape::Linear { fan_in, .. } => {
            if !(d.dims() == [r, fan_in] || d.dims() == [r, fan_in, 1, 1]) {
                return Err(wrong(&raw.down, format!("({r}, {fan_in})")));
            }
            if !up_fits {
                return Err(wrong(&raw.up, format!("({out}, {r})")));
            }
            d.reshape((r, fan_in))
                .and_then(|d| Ok((d, u.reshape((out, r))?)))
        }
        Shape::Conv {
            c_in,
            kernel: (kh, kw),
            ..
        } => {
            let one = kh == 1 && kw == 1;
            if !(d.dims() == [r, c_in, kh, kw] || (one && d.dims() == [r, c_in])) {
                return Err(wrong(&raw.down, format!("({r}, {c_in}, {kh}, {kw})")));
            }
            if !up_fits {
                return Err(wrong(&raw.up, format!("({out}, {r}, 1, 1)")));
            }
            d.reshape((r, c_in, kh, kw))
                .and_then(|d| Ok((d, u.reshape((out, r, 1, 1))?)))
        }
    };
    reshaped.map_err(|e| LoraProblem::Shape {
        key: raw.down.key.clone(),
        got: d.dims().to_vec(),
        want: e.to_string(),
    })
}
