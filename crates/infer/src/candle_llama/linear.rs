//! The weight matrices of a layer: [`Linear`] (one matrix, and which kernel multiplies by it),
//! the Q/K/V and gate/up groups ([`Qkv`], [`GateUp`]: separate, or one fused matrix), and
//! [`stacked`], which fuses a group at load on a GPU.

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Module, Tensor};

use crate::fused::{Glu, GluAct, RopeKv};
use crate::gemv::{Gemv, GemvQ8};
use crate::gemv_rope::GemvRope;
use crate::Error;

/// A weight matrix: quantized (candle's quantized matmul, which takes f32 rows) or dense in the
/// model's activation dtype; on a GPU, one row goes through [`crate::gemv`]'s kernels (dense or
/// Q8_0) unless `rows` says cuBLAS.
pub(crate) struct Linear {
    pub w: QMatMul,
    pub(super) rows: RowProduct,
}

/// What multiplies one row by a matrix on a GPU (set from [`crate::GpuTuning`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum RowProduct {
    /// The one-row kernels, a round of loads at a time.
    #[default]
    Rounds,
    /// The one-row kernels, with the dense kernel's first loop (a load and its use at a time).
    FirstLoop,
    /// cuBLAS, or candle's quantized product.
    Cublas,
}

impl RowProduct {
    pub(super) fn of(gpu: &crate::GpuTuning) -> RowProduct {
        if gpu.cublas_rows {
            RowProduct::Cublas
        } else if gpu.first_kernels {
            RowProduct::FirstLoop
        } else {
            RowProduct::Rounds
        }
    }
}

impl Linear {
    pub(crate) fn new(w: QMatMul) -> Linear {
        Linear {
            w,
            rows: RowProduct::default(),
        }
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        if let Some(y) = self.one_row(x, None)? {
            return Ok(y);
        }
        Ok(match &self.w {
            QMatMul::QTensor(_) if x.dtype() != DType::F32 => self
                .w
                .forward(&x.to_dtype(DType::F32)?)?
                .to_dtype(x.dtype())?,
            w => w.forward(x)?,
        })
    }

    /// `act(gate) * up` of `x` through this fused `[gate; up]` matrix: in the one-row kernel's
    /// last step where that kernel takes `x` and `in_product` allows, else the product and then
    /// [`Glu`]'s kernel.
    pub(super) fn forward_glu(
        &self,
        x: &Tensor,
        act: GluAct,
        in_product: bool,
    ) -> Result<Tensor, Error> {
        if in_product {
            if let Some(y) = self.one_row(x, Some(act))? {
                return Ok(y);
            }
        }
        Glu { act }.run(&self.forward(x)?)
    }

    /// `x @ w.T` (ending in the activation `glu`) through the one-row kernels, dense or Q8_0,
    /// where they take `x` and `rows` does not say cuBLAS; `None` otherwise.
    fn one_row(&self, x: &Tensor, glu: Option<GluAct>) -> Result<Option<Tensor>, Error> {
        let rounds = match self.rows {
            RowProduct::Cublas => return Ok(None),
            rows => rows == RowProduct::Rounds,
        };
        Ok(match &self.w {
            QMatMul::Tensor(w) if Gemv::fits(x, w) => Some(Gemv { rounds, glu }.run(x, w)?),
            QMatMul::QTensor(w) if GemvQ8::fits(x, w) => Some(GemvQ8 { w, glu }.run(x)?),
            _ => None,
        })
    }

    /// Rotated Q of `x` through this fused `[q; k; v]` matrix, with `rope`'s rotation and KV
    /// write: in the one-row kernel's last step where that kernel takes `x` and `in_product`
    /// allows, else the product and then [`RopeKv`]'s kernel.
    pub(super) fn forward_rope(
        &self,
        x: &Tensor,
        rope: &RopeKv<'_>,
        in_product: bool,
    ) -> Result<Tensor, Error> {
        let rounds = self.rows == RowProduct::Rounds;
        let op = GemvRope { rounds, rope };
        match &self.w {
            QMatMul::Tensor(w)
                if in_product && self.rows != RowProduct::Cublas && op.fits(x, w) =>
            {
                op.run(x, w)
            }
            _ => rope.run(&self.forward(x)?),
        }
    }

    pub(super) fn convert(&mut self, dtype: DType, rows: RowProduct) -> Result<(), Error> {
        if let QMatMul::Tensor(w) | QMatMul::TensorF16(w) = &self.w {
            self.w = QMatMul::Tensor(w.to_dtype(dtype)?);
        }
        self.rows = rows;
        Ok(())
    }
}

/// The Q, K and V projections: three matrices, or Phi-3's one fused `[q; k; v]`.
pub(crate) enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

impl Qkv {
    /// Q, K and V of `h`'s rows (`qd`, `kvd`, `kvd` wide).
    pub(super) fn project(
        &self,
        h: &Tensor,
        qd: usize,
        kvd: usize,
    ) -> Result<(Tensor, Tensor, Tensor), Error> {
        Ok(match self {
            Qkv::Separate { q, k, v } => (q.forward(h)?, k.forward(h)?, v.forward(h)?),
            Qkv::Fused(w) => {
                let all = w.forward(h)?;
                (
                    all.narrow(1, 0, qd)?.contiguous()?,
                    all.narrow(1, qd, kvd)?.contiguous()?,
                    all.narrow(1, qd + kvd, kvd)?.contiguous()?,
                )
            }
        })
    }

    pub(super) fn linears(&mut self) -> Vec<&mut Linear> {
        match self {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Fused(w) => vec![w],
        }
    }
}

/// The MLP's gate and up projections: two matrices, or Phi-3's one fused `[gate; up]`.
pub(crate) enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

impl GateUp {
    pub(super) fn forward(&self, h: &Tensor) -> Result<(Tensor, Tensor), Error> {
        Ok(match self {
            GateUp::Separate { gate, up } => (gate.forward(h)?, up.forward(h)?),
            GateUp::Fused(w) => {
                let both = w.forward(h)?;
                let ff = both.dim(1)? / 2;
                (
                    both.narrow(1, 0, ff)?.contiguous()?,
                    both.narrow(1, ff, ff)?.contiguous()?,
                )
            }
        })
    }

    pub(super) fn linears(&mut self) -> Vec<&mut Linear> {
        match self {
            GateUp::Separate { gate, up } => vec![gate, up],
            GateUp::Fused(w) => vec![w],
        }
    }
}

/// `ls`' matrices stacked by rows into one (the first one's settings), when all are dense or all
/// Q8_0 with one width; `None` otherwise.
pub(super) fn stacked(ls: &[&Linear]) -> Result<Option<Linear>, Error> {
    let dense: Option<Vec<Tensor>> = ls
        .iter()
        .map(|l| match &l.w {
            QMatMul::Tensor(w) => Some(w.clone()),
            _ => None,
        })
        .collect();
    let q8: Option<Vec<&QTensor>> = ls
        .iter()
        .map(|l| match &l.w {
            QMatMul::QTensor(w) if w.dtype() == GgmlDType::Q8_0 => Some(w.as_ref()),
            _ => None,
        })
        .collect();
    let w = if let Some(ws) = dense {
        QMatMul::Tensor(Tensor::cat(&ws, 0)?)
    } else if let Some(ws) = q8 {
        let width = ws[0].shape().dims2()?.1;
        let mut rows = 0;
        let mut bytes = Vec::new();
        for w in &ws {
            let (n, k) = w.shape().dims2()?;
            if k != width {
                return Ok(None);
            }
            rows += n;
            // The storage may be padded past its blocks; only the blocks are stacked.
            bytes.extend_from_slice(&w.data()?[..n * k / 32 * 34]);
        }
        let storage = QStorage::from_data(
            std::borrow::Cow::Owned(bytes),
            &ws[0].device(),
            GgmlDType::Q8_0,
        )?;
        QMatMul::QTensor(std::sync::Arc::new(QTensor::new(storage, (rows, width))?))
    } else {
        return Ok(None);
    };
    Ok(Some(Linear {
        w,
        rows: ls[0].rows,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn one_row_products_take_the_round_kernel_unless_a_variable_asks_otherwise() {
        let tuning = |cublas_rows, first_kernels| crate::GpuTuning {
            cublas_rows,
            first_kernels,
            ..Default::default()
        };
        assert_eq!(RowProduct::of(&tuning(false, false)), RowProduct::Rounds);
        assert_eq!(RowProduct::of(&tuning(false, true)), RowProduct::FirstLoop);
        // cuBLAS wins: the first kernels are Hearth's, and `HEARTH_GEMV=off` turns them all off.
        assert_eq!(RowProduct::of(&tuning(true, true)), RowProduct::Cublas);
        assert_eq!(
            Linear::new(QMatMul::Tensor(
                Tensor::zeros((2, 8), DType::F32, &Device::Cpu).unwrap()
            ))
            .rows,
            RowProduct::Rounds
        );
    }

    fn q8(rows: usize, cols: usize, seed: u64) -> Linear {
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| (((i as u64 * 2654435761 + seed) % 1000) as f32 - 500.0) / 250.0)
            .collect();
        let t = Tensor::from_vec(vals, (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        Linear::new(QMatMul::QTensor(std::sync::Arc::new(q)))
    }

    #[test]
    fn stacked_q8_0_matrices_multiply_as_their_parts_side_by_side() {
        let (q, k, v) = (q8(8, 64, 1), q8(4, 64, 2), q8(4, 64, 3));
        let fused = stacked(&[&q, &k, &v])
            .unwrap()
            .expect("Q8_0 of one width stacks");
        let x = Tensor::from_vec(
            (0..2 * 64).map(|i| (i as f32 * 0.37).sin()).collect(),
            (2, 64),
            &Device::Cpu,
        )
        .unwrap();
        let parts = Tensor::cat(
            &[
                q.forward(&x).unwrap(),
                k.forward(&x).unwrap(),
                v.forward(&x).unwrap(),
            ],
            1,
        )
        .unwrap();
        let whole = fused.forward(&x).unwrap();
        assert_eq!(whole.dims(), &[2, 16]);
        let diff = (whole - parts).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
    }

    #[test]
    fn matrices_of_other_widths_or_types_are_not_stacked() {
        let other = q8(4, 96, 4);
        assert!(stacked(&[&q8(8, 64, 1), &other]).unwrap().is_none());
        let dense = Linear::new(QMatMul::Tensor(
            Tensor::zeros((4, 64), DType::F32, &Device::Cpu).unwrap(),
        ));
        assert!(stacked(&[&q8(8, 64, 1), &dense]).unwrap().is_none());
    }
}
