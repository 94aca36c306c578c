#!/usr/bin/env python3
"""GGML blocks and their values as the `gguf` Python package dequantizes them, for the kernels
crate's tests (crates/kernels/testdata/gguf_q5.bin, read by crates/kernels/src/tests.rs).

An independent reference for the 5-bit formats: gguf's numpy dequantizers are written apart from
llama.cpp's C and from Hearth's Rust. Q5_1 blocks are quantized by gguf from seeded normal
weights; Q5_K blocks (gguf cannot quantize K-quants) are seeded random bytes with finite,
positive f16 `d` and `dmin`, so that every bit of the scales, `qh` and `qs` fields takes both
values somewhere, plus one block of all-ones bits.

File layout, little-endian, one section per type:
  u32 ggml type id, u32 number of blocks n, n blocks as the file stores them,
  n * block_elems f32 values (gguf.quants.dequantize of those blocks).

Usage (the venv scripts/tiny-models.sh prepares has gguf 0.19.0 and numpy 2.4.6):
  .cache/tiny-models/venv/bin/python scripts/kernels-reference.py crates/kernels/testdata/gguf_q5.bin
"""
import struct
import sys

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants


def q5_1_blocks(rng):
    x = rng.standard_normal((2, 128)).astype(np.float32)
    x[1, :32] += 3.0  # a block whose values are all positive: the min is not just -amax
    return quants.quantize(x, T.Q5_1).reshape(-1, GGML_QUANT_SIZES[T.Q5_1][1])


def q5_k_blocks(rng):
    n = 4
    b = rng.integers(0, 256, size=(n, GGML_QUANT_SIZES[T.Q5_K][1]), dtype=np.uint8)
    b[n - 1, :] = 0xFF
    for i in range(n):
        d, dmin = rng.uniform(0.001, 0.05, size=2)
        b[i, 0:2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
        b[i, 2:4] = np.frombuffer(np.float16(dmin).tobytes(), dtype=np.uint8)
    return b


def main():
    rng = np.random.default_rng(18)
    out = bytearray()
    for ty, blocks in ((T.Q5_1, q5_1_blocks(rng)), (T.Q5_K, q5_k_blocks(rng))):
        values = quants.dequantize(blocks, ty).astype("<f4")
        out += struct.pack("<II", int(ty), blocks.shape[0])
        out += blocks.tobytes() + values.tobytes()
    with open(sys.argv[1], "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main()
