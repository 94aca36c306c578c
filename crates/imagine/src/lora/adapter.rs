//! The runtime side of LoRA: the adapter-capable layers ([`AdaptedLinear`], [`AdaptedConv`]),
//! the [`Table`] of them each component (a text encoder, the UNet) keeps, and the low-rank
//! updates in effect on them for the generation that holds the table's turn.
//!
//! A layer computes `base(x)`, then adds `scale * up(down(x))` for each update in effect, in
//! the order the request lists its LoRAs (peft's order: `result = result + lora_B(lora_A(x)) *
//! scaling`, one adapter after the other). With none in effect it runs exactly its base path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};

use crate::layers::Conv2d;

/// The shape of an adapter-capable layer, which a LoRA's down and up weights must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Linear {
        fan_in: usize,
        out: usize,
    },
    Conv {
        c_in: usize,
        out: usize,
        kernel: (usize, usize),
        stride: usize,
        padding: usize,
    },
}

impl Shape {
    pub(crate) fn out(&self) -> usize {
        match *self {
            Shape::Linear { out, .. } | Shape::Conv { out, .. } => out,
        }
    }

    /// Inputs per output: a linear layer's width, a convolution's `c_in * kh * kw`.
    pub(crate) fn fan_in(&self) -> usize {
        match *self {
            Shape::Linear { fan_in, .. } => fan_in,
            Shape::Conv {
                c_in,
                kernel: (h, w),
                ..
            } => c_in * h * w,
        }
    }
}

/// One low-rank update in effect on one layer: `scale * up(down(x))`, `down` and `up` in the
/// layer's dtype and on its device (2D for a linear layer, 4D kernels for a convolution).
#[derive(Debug, Clone)]
pub(crate) struct Delta {
    pub(crate) down: Tensor,
    pub(crate) up: Tensor,
    pub(crate) scale: f64,
}

impl Delta {
    fn forward(&self, x: &Tensor, shape: &Shape) -> Result<Tensor> {
        let h = match *shape {
            Shape::Linear { .. } => x
                .apply(&Linear::new(self.down.clone(), None))?
                .apply(&Linear::new(self.up.clone(), None))?,
            Shape::Conv {
                stride, padding, ..
            } => x
                .conv2d(&self.down, padding, stride, 1, 1)?
                .conv2d(&self.up, 0, 1, 1, 1)?,
        };
        h * self.scale
    }
}

/// `y` plus every update in `deltas`, one after the other.
fn add_all(deltas: &[Delta], shape: &Shape, x: &Tensor, mut y: Tensor) -> Result<Tensor> {
    for d in deltas {
        y = (y + d.forward(x, shape)?)?;
    }
    Ok(y)
}

/// The updates in effect on one component's layers, and whose turn it is to set them.
#[derive(Debug, Default)]
pub(crate) struct Active {
    /// By slot id; empty while no generation has adapters in effect.
    deltas: RwLock<Vec<Vec<Delta>>>,
    /// Held by the generation whose updates are in effect (or that runs with none).
    turn: Mutex<()>,
}

impl Active {
    /// Waits for the turn; a generation that panicked while holding it has had its updates
    /// cleared by its guard, so a poisoned lock is taken as it is.
    pub(crate) fn turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `delta` in effect on slot `id` (after any already there). Only under the turn.
    pub(crate) fn push(&self, id: usize, slots: usize, delta: Delta) {
        let mut all = self.deltas.write().unwrap_or_else(PoisonError::into_inner);
        if all.len() < slots {
            all.resize_with(slots, Vec::new);
        }
        all[id].push(delta);
    }

    /// Takes every update out of effect.
    pub(crate) fn clear(&self) {
        self.deltas
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// An adapter-capable layer's place: its module path inside its component (diffusers'
/// spelling), its shape, and, once its component's table registered it, its id there.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    path: String,
    shape: Shape,
    dtype: DType,
    device: Device,
    link: Option<(usize, Arc<Active>)>,
}

impl Slot {
    fn new(vb: &VarBuilder, shape: Shape, weight: &Tensor) -> Slot {
        Slot {
            path: vb.prefix(),
            shape,
            dtype: weight.dtype(),
            device: weight.device().clone(),
            link: None,
        }
    }

    /// Runs `f` with the updates in effect on this layer, `None` when there are none.
    fn with<R>(&self, f: impl FnOnce(Option<&[Delta]>) -> R) -> R {
        let Some((id, active)) = &self.link else {
            return f(None);
        };
        let all = active.deltas.read().unwrap_or_else(PoisonError::into_inner);
        f(all.get(*id).filter(|d| !d.is_empty()).map(Vec::as_slice))
    }
}

/// A linear layer that takes low-rank updates.
#[derive(Debug, Clone)]
pub(crate) struct AdaptedLinear {
    base: Linear,
    pub(crate) slot: Slot,
}

impl AdaptedLinear {
    /// `base`, built from `vb`, whose prefix is the layer's module path.
    pub(crate) fn new(base: Linear, vb: &VarBuilder) -> Result<Self> {
        let (out, fan_in) = base.weight().dims2()?;
        let slot = Slot::new(vb, Shape::Linear { fan_in, out }, base.weight());
        Ok(AdaptedLinear { base, slot })
    }
}

impl Module for AdaptedLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.slot.with(|deltas| {
            let y = self.base.forward(x)?;
            match deltas {
                None => Ok(y),
                Some(d) => add_all(d, &self.slot.shape, x, y),
            }
        })
    }
}

/// A 2D convolution that takes low-rank updates (LoCon): `down` a convolution with the base's
/// kernel, stride and padding, `up` a 1x1 convolution.
#[derive(Debug, Clone)]
pub(crate) struct AdaptedConv {
    base: Conv2d,
    pub(crate) slot: Slot,
}

impl AdaptedConv {
    pub(crate) fn new(
        vb: VarBuilder,
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        let base = Conv2d::new(vb.clone(), c_in, c_out, kernel, stride, padding)?;
        let shape = Shape::Conv {
            c_in,
            out: c_out,
            kernel: (kernel, kernel),
            stride,
            padding,
        };
        let slot = Slot::new(&vb, shape, base.weight());
        Ok(AdaptedConv { base, slot })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_plus(x, None)
    }

    /// [`Conv2d::forward_plus`]; with updates in effect they are added to the convolution's
    /// output before `extra`, as diffusers adds the time embedding after `conv1`.
    pub(crate) fn forward_plus(&self, x: &Tensor, extra: Option<&Tensor>) -> Result<Tensor> {
        self.slot.with(|deltas| {
            let Some(d) = deltas else {
                return self.base.forward_plus(x, extra);
            };
            let y = add_all(d, &self.slot.shape, x, self.base.forward(x)?)?;
            match extra {
                Some(e) => y.broadcast_add(&e.unsqueeze(2)?.unsqueeze(3)?),
                None => Ok(y),
            }
        })
    }
}

/// What a LoRA binding needs to know of one registered layer.
#[derive(Debug, Clone)]
pub(crate) struct SlotInfo {
    pub(crate) path: String,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

/// The adapter-capable layers of one component, by id, with every name a LoRA file may give
/// each, and the updates in effect on them.
#[derive(Debug, Default)]
pub(crate) struct Table {
    pub(crate) component: &'static str,
    pub(crate) slots: Vec<SlotInfo>,
    names: HashMap<String, usize>,
    pub(crate) active: Arc<Active>,
}

impl Table {
    /// Registers every layer `visit` hands over, giving each the names `spellings` returns for
    /// its module path (each must be unique in the component).
    pub(crate) fn build(
        component: &'static str,
        spellings: &dyn Fn(&str) -> Vec<String>,
        visit: impl FnOnce(&mut dyn FnMut(&mut Slot)),
    ) -> Table {
        let active = Arc::new(Active::default());
        let mut slots = Vec::new();
        let mut names = HashMap::new();
        visit(&mut |slot: &mut Slot| {
            let id = slots.len();
            for name in spellings(&slot.path) {
                let previous = names.insert(name, id);
                debug_assert!(previous.is_none(), "two layers share a LoRA name");
            }
            slots.push(SlotInfo {
                path: slot.path.clone(),
                shape: slot.shape,
                dtype: slot.dtype,
                device: slot.device.clone(),
            });
            slot.link = Some((id, active.clone()));
        });
        Table {
            component,
            slots,
            names,
            active,
        }
    }

    /// The slot a LoRA module name (exactly as the file spells it) stands for.
    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        self.names.get(name).copied()
    }
}
