//! Quantized matrix kernels (scalar, AVX2, AVX-512) and the CPU thread pool behind Hearth's fast decode path.
