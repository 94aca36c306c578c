//! The orthonormal Walsh-Hadamard rotation llama.cpp applies around a quantized KV cache: Q and
//! K (and V, then the attention's output again) are rotated block by block before K and V are
//! quantized, which spreads a head's outlier values over its block and so shrinks the 8-bit
//! rounding error, while leaving Q·K and the attention's result unchanged in exact arithmetic
//! (the matrix is symmetric and its own inverse).
//!
//! Computed as ggml-cpu computes it (its fast transform for a product by a Hadamard matrix):
//! every value scaled by `1 / sqrt(n)` first, then the butterflies `(u + v, u - v)` at strides
//! 1, 2, 4, ... Each result is the same sums in the same order whatever the vector width, so
//! this gives ggml's bits.

/// Rotates each consecutive block of `n` values of `x` (a power of two; `x.len()` a multiple
/// of it) by the `n × n` Sylvester-Hadamard matrix over `sqrt(n)`.
pub fn hadamard(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "Hadamard blocks of {n} over {} values",
        x.len()
    );
    hadamard_mv(x, n)
}

multiversion! {
    fn hadamard_mv(x: &mut [f32], n: usize) => hadamard_body
}

#[inline(always)]
fn hadamard_body(x: &mut [f32], n: usize) {
    let scale = 1.0 / (n as f32).sqrt();
    for block in x.chunks_exact_mut(n) {
        block.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for pair in block.chunks_exact_mut(2 * len) {
                let (lo, hi) = pair.split_at_mut(len);
                for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (a, b) = (*u, *v);
                    *u = a + b;
                    *v = a - b;
                }
            }
            len *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the matrix itself, built as llama.cpp builds it (`H_2s = [[H, H], [H, -H]]`),
    /// and twice over is the identity.
    #[test]
    fn the_fast_transform_is_the_matrix_and_its_own_inverse() {
        for n in [64usize, 128, 256] {
            let mut h = vec![0f32; n * n];
            h[0] = 1.0 / (n as f32).sqrt();
            let mut s = 1;
            while s < n {
                for i in 0..s {
                    for j in 0..s {
                        let v = h[i * n + j];
                        h[(i + s) * n + j] = v;
                        h[i * n + j + s] = v;
                        h[(i + s) * n + j + s] = -v;
                    }
                }
                s *= 2;
            }
            let x: Vec<f32> = (0..2 * n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let mut fast = x.clone();
            hadamard(&mut fast, n);
            for (b, block) in x.chunks_exact(n).enumerate() {
                for i in 0..n {
                    let want: f64 = (0..n).map(|j| h[i * n + j] as f64 * block[j] as f64).sum();
                    let got = fast[b * n + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "n {n} [{b}][{i}]: {got} vs {want}"
                    );
                }
            }
            hadamard(&mut fast, n);
            for (a, b) in fast.iter().zip(&x) {
                assert!((a - b).abs() < 1e-4 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }
}
