//! The kernels crate's typed errors.

use crate::formats::GgmlType;

/// Everything a kernel entry point can reject. Kernels never panic on bad input.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ggml type id {0} is not supported by the CPU kernels")]
    UnsupportedType(u32),
    #[error("{ty:?} rows must be a whole number of {block}-element blocks, got {cols} columns")]
    RowNotBlockAligned {
        ty: GgmlType,
        cols: usize,
        block: usize,
    },
    #[error("{what}: expected {expected}, got {got}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("kernel path {0:?} is not available on this CPU")]
    PathUnavailable(crate::KernelPath),
}
