//! AVX-512 tiles (F/BW/VL + F16C + FMA), with and without VNNI `vpdpbusd`.
//!
//! One 512-bit register holds a whole 64-element chunk. A tile computes `MR` weight rows x `NR`
//! activation rows: each weight chunk is unpacked once and used for every activation row, each
//! activation chunk is loaded once and used for every weight row. Integer dots are exact in
//! i32; per-lane scales come from the weight groups (expanded with one permute) and from the
//! activation lanes (see `acts`).

// Unsafe is needed here because SIMD intrinsics and raw-pointer loads are unsafe fns. Each tile
// is only reached through `matmul::run_tile`, which checked the CPU features and that every
// row/chunk index is inside the packed buffers.
#![allow(unsafe_code)]

use crate::acts::QActs;
use crate::pack::QMatrix;
use crate::{fifth_bit, stored_min, L_S8, L_U5, L_U6};
use std::arch::x86_64::*;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
#[inline]
unsafe fn unpack<const L: u8>(w: &QMatrix, base: usize) -> __m512i {
    if L == L_S8 {
        return _mm512_loadu_si512(w.qs.as_ptr().add(base * 64) as *const _);
    }
    // Low nibbles in the lower half, high nibbles in the upper: one broadcast load, a shift of
    // the upper half only, one mask.
    let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(
        w.qs.as_ptr().add(base * 32) as *const __m256i
    ));
    let q = _mm512_and_si512(
        _mm512_mask_srli_epi16::<4>(v, 0xFFFF_0000, v),
        _mm512_set1_epi8(0x0F),
    );
    if fifth_bit(L) {
        // The chunk's fifth-bit word in every 64-bit lane, rotated so that bit 4 of each byte
        // is its element's fifth bit (`pack::hi5_bit`): lanes 0-3 (half 0) right by the lane
        // index, lanes 4-7 (half 1) left by 4 minus it.
        let word = _mm512_set1_epi64((w.hi.as_ptr().add(base * 8) as *const i64).read_unaligned());
        let at4 = _mm512_rolv_epi64(word, _mm512_setr_epi64(0, 63, 62, 61, 4, 3, 2, 1));
        _mm512_or_si512(q, _mm512_and_si512(at4, _mm512_set1_epi8(0x10)))
    } else if L == L_U6 {
        let h = _mm512_broadcast_i32x4(_mm_loadu_si128(
            w.hi.as_ptr().add(base * 16) as *const __m128i
        ));
        let sh = _mm512_srlv_epi32(
            h,
            _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0),
        );
        let h2 = _mm512_and_si512(sh, _mm512_set1_epi8(3));
        _mm512_or_si512(q, _mm512_slli_epi32(h2, 4))
    } else {
        q
    }
}

/// Per-lane f32 values of the f16 group values at `p` for one chunk (2 groups of 32 or 4 of 16).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
#[inline]
unsafe fn expand<const L: u8>(p: *const u16) -> __m512 {
    if L == L_U6 {
        let v = _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i));
        _mm512_permutexvar_ps(
            _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
            _mm512_castps128_ps512(v),
        )
    } else {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
        _mm512_permutexvar_ps(
            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm512_castps128_ps512(v),
        )
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn dot_bw(u: __m512i, s: __m512i) -> __m512i {
    _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dot_vnni(u: __m512i, s: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s)
}

macro_rules! avx512_tile {
    ($name:ident, $feat:literal, $dot:ident) => {
        /// Computes `res[i][j] = dot(w row r0+i, act row a0+j)` for `i < MR`, `j < NR`.
        ///
        /// # Safety
        /// The CPU must have the enabled features; rows `r0..r0+MR` and `a0..a0+NR` must exist,
        /// `w.layout` must be the layout `L` names and `a.kp == w.kp`.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $name<const L: u8, const MR: usize, const NR: usize>(
            w: &QMatrix,
            r0: usize,
            a: &QActs,
            a0: usize,
            res: &mut [[f32; 4]; 4],
        ) {
            let chunks = w.kp / 64;
            let cb = if L == L_S8 { 64 } else { 32 };
            let g = if L == L_U6 { 16 } else { 32 };
            let gpc = 64 / g;
            let groups = w.kp / g;
            let zero = if L == L_U5 {
                -16.0
            } else if L == L_U6 {
                -32.0
            } else {
                0.0
            };
            let mut acc = [[_mm512_setzero_ps(); NR]; MR];
            let aq = a.qs.as_ptr();
            for c in 0..chunks {
                let mut av = [_mm512_setzero_si512(); NR];
                for (j, v) in av.iter_mut().enumerate() {
                    let off = (a0 + j) * a.kp + 64 * c;
                    *v = _mm512_loadu_si512(aq.add(off) as *const _);
                }
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let r = r0 + i;
                    _mm_prefetch::<_MM_HINT_T0>(
                        w.qs.as_ptr()
                            .wrapping_add((r * chunks + c) * cb + crate::PREFETCH_BYTES)
                            as *const i8,
                    );
                    let wq = unpack::<L>(w, r * chunks + c);
                    let ws = expand::<L>(w.scales.as_ptr().add(r * groups + c * gpc));
                    // Signed 8-bit weights: |w| on the unsigned side, the sign moved onto the
                    // activations (exact integers).
                    let (wu, neg) = if L == L_S8 {
                        (_mm512_abs_epi8(wq), _mm512_movepi8_mask(wq))
                    } else {
                        (wq, 0)
                    };
                    for (j, acc_ij) in acc_i.iter_mut().enumerate() {
                        let lane = ((a0 + j) * a.kp + 64 * c) / 4;
                        let dot = if L == L_S8 {
                            let s = _mm512_mask_sub_epi8(av[j], neg, _mm512_setzero_si512(), av[j]);
                            $dot(wu, s)
                        } else {
                            $dot(wu, av[j])
                        };
                        let t = _mm512_mul_ps(
                            _mm512_cvtepi32_ps(dot),
                            _mm512_loadu_ps(a.lane_scale.as_ptr().add(lane)),
                        );
                        *acc_ij = _mm512_fmadd_ps(t, ws, *acc_ij);
                        if L == L_U6 {
                            // Zero points per group of 16: per lane.
                            *acc_ij = _mm512_fmadd_ps(
                                _mm512_mul_ps(ws, _mm512_set1_ps(zero)),
                                _mm512_loadu_ps(a.lane_sum.as_ptr().add(lane)),
                                *acc_ij,
                            );
                        }
                    }
                }
            }
            // Groups of 32 with an offset (stored mins, Q5_0's -16 zero point): the offset
            // times the activation block's sum, once per group (as llama.cpp adds `m * s`).
            if L != L_U6 && L != L_S8 {
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let r = r0 + i;
                    let src = if stored_min(L) { &w.mins } else { &w.scales };
                    let wo = src.as_ptr().add(r * groups);
                    for (j, acc_ij) in acc_i.iter_mut().enumerate() {
                        let bs = a.block_sum.as_ptr().add((a0 + j) * groups);
                        let mut off = _mm512_setzero_ps();
                        let mut gi = 0;
                        while gi < groups {
                            let left = groups - gi;
                            let m: u16 = if left >= 16 {
                                0xFFFF
                            } else {
                                (1u16 << left) - 1
                            };
                            let o = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                m,
                                wo.add(gi) as *const i16,
                            ));
                            let b = _mm512_maskz_loadu_ps(m, bs.add(gi));
                            off = _mm512_fmadd_ps(o, b, off);
                            gi += 16;
                        }
                        let off = if L == L_U5 {
                            _mm512_mul_ps(off, _mm512_set1_ps(zero))
                        } else {
                            off
                        };
                        *acc_ij = _mm512_add_ps(*acc_ij, off);
                    }
                }
            }
            for i in 0..MR {
                for j in 0..NR {
                    res[i][j] = _mm512_reduce_add_ps(acc[i][j]);
                }
            }
        }
    };
}

avx512_tile!(tile_bw, "avx512f,avx512bw,avx512vl,f16c,fma", dot_bw);
avx512_tile!(
    tile_vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma",
    dot_vnni
);

/// Interleaved block `blk` (of the whole matrix) as the 8 vectors of bytes a tile multiplies:
/// vector `k` holds quants `4k..4k + 4` of each of the 16 rows (nibbles split and fifth bits
/// added for the 4- and 5-bit layouts; read as stored for the 8-bit and 6-bit ones).
///
/// # Safety
/// As for [`tile_il`]; `blk` is inside `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
#[inline]
pub(crate) unsafe fn il_block<const L: u8>(w: &QMatrix, blk: usize) -> [__m512i; 8] {
    let mut wv = [_mm512_setzero_si512(); 8];
    if L == L_S8 || L == L_U6 {
        let p = w.qs.as_ptr().add(blk * 512);
        for (k, v) in wv.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(p.add(64 * k) as *const _);
        }
        return wv;
    }
    let p = w.qs.as_ptr().add(blk * 256);
    let low = _mm512_set1_epi8(0x0F);
    for h in 0..4 {
        let v = _mm512_loadu_si512(p.add(64 * h) as *const _);
        wv[2 * h] = _mm512_and_si512(v, low);
        wv[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
    }
    if fifth_bit(L) {
        let hp = w.hi.as_ptr().add(blk * 64) as *const u64;
        for (k, v) in wv.iter_mut().enumerate() {
            let bits = hp.add(k).read_unaligned();
            *v = _mm512_or_si512(*v, _mm512_maskz_set1_epi8(bits, 0x10));
        }
    }
    wv
}

/// The 16 rows' scale and min of interleaved block `blk` (layouts with one group a block; the
/// min derived for Q5_0, zero for 8-bit).
///
/// # Safety
/// As for [`il_block`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
#[inline]
pub(crate) unsafe fn il_scales<const L: u8>(w: &QMatrix, blk: usize) -> (__m512, __m512) {
    let si = blk * 16;
    let wd = _mm512_cvtph_ps(_mm256_loadu_si256(
        w.scales.as_ptr().add(si) as *const __m256i
    ));
    let wm = if stored_min(L) {
        _mm512_cvtph_ps(_mm256_loadu_si256(w.mins.as_ptr().add(si) as *const __m256i))
    } else if L == L_U5 {
        _mm512_mul_ps(wd, _mm512_set1_ps(-16.0))
    } else {
        _mm512_setzero_ps()
    };
    (wd, wm)
}

/// Sixteen weight rows of an interleaved matrix (see `pack`) times activation rows
/// `a0..a0 + NR`, written to `out[(a0 + j) * m + 16 * g16 ..][..16]`.
///
/// Each 512-bit weight register holds 4 consecutive quants of 16 rows (lane = row); the 4
/// activation bytes they meet are broadcast. A lane sums its row's whole 32-element block in
/// i32 (two chains of four `vpdpbusd`), then the block is scaled once: `d_w * d_a * dot`, plus
/// `min * d_a * sum(q_a)` for the 4-bit and 5-bit layouts (Q5_0's min is `-16 d_w`), or minus
/// `128 * sum(q_a)` before scaling for 8-bit weights stored as `q + 128`.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, VNNI, F16C and FMA; `w` must be interleaved with layout
/// `L`, `g16 < w.rows / 16`, rows `a0..a0 + NR` must exist in `a` with
/// `a.kp == w.kp`, and `out` must hold `(a0 + NR) * m` floats with `m == w.rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
pub(crate) unsafe fn tile_il<const L: u8, const NR: usize>(
    w: &QMatrix,
    g16: usize,
    a: &QActs,
    a0: usize,
    out: *mut f32,
    m: usize,
) {
    let blocks = w.kp / 32;
    let base = g16 * blocks;
    let bpb = if L == L_S8 || L == L_U6 { 512 } else { 256 };
    let mut facc = [_mm512_setzero_ps(); NR];
    for b in 0..blocks {
        let p = w.qs.as_ptr().add((base + b) * bpb);
        for k in 0..bpb / 64 {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * k + crate::PREFETCH_BYTES) as *const i8);
        }
        let wv = il_block::<L>(w, base + b);
        if L == L_U6 {
            six_block::<NR>(&wv, w, base + b, a, a0, b, &mut facc);
            continue;
        }
        let (wd, wm) = il_scales::<L>(w, base + b);
        for (j, fj) in facc.iter_mut().enumerate() {
            let row = a0 + j;
            let ap = a.qs.as_ptr().add(row * w.kp + 32 * b) as *const i32;
            let mut c0 = _mm512_setzero_si512();
            let mut c1 = _mm512_setzero_si512();
            for k in (0..8).step_by(2) {
                c0 = _mm512_dpbusd_epi32(c0, wv[k], _mm512_set1_epi32(ap.add(k).read_unaligned()));
                c1 = _mm512_dpbusd_epi32(
                    c1,
                    wv[k + 1],
                    _mm512_set1_epi32(ap.add(k + 1).read_unaligned()),
                );
            }
            let mut dot = _mm512_add_epi32(c0, c1);
            if L == L_S8 {
                dot = _mm512_sub_epi32(
                    dot,
                    _mm512_set1_epi32(128 * *a.block_isum.get_unchecked(row * blocks + b)),
                );
            }
            let da = *a.lane_scale.get_unchecked((row * w.kp + 32 * b) / 4);
            *fj = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(dot),
                _mm512_mul_ps(wd, _mm512_set1_ps(da)),
                *fj,
            );
            if L != L_S8 {
                *fj = _mm512_fmadd_ps(
                    wm,
                    _mm512_set1_ps(*a.block_sum.get_unchecked(row * blocks + b)),
                    *fj,
                );
            }
        }
    }
    for (j, fj) in facc.iter().enumerate() {
        _mm512_storeu_ps(out.add((a0 + j) * m + 16 * g16), *fj);
    }
}

/// One Q6_K block of 16 interleaved rows (`wv`, one quant per byte) against activation rows
/// `a0..a0 + NR`: each 16-element half is an exact integer dot less its zero point `32 * sum`,
/// then scaled by its own scale (low half first).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
#[inline]
unsafe fn six_block<const NR: usize>(
    wv: &[__m512i; 8],
    w: &QMatrix,
    blk: usize,
    a: &QActs,
    a0: usize,
    b: usize,
    facc: &mut [__m512; NR],
) {
    let blocks = w.kp / 32;
    let si = 2 * blk * 16;
    let wd = [
        _mm512_cvtph_ps(_mm256_loadu_si256(
            w.scales.as_ptr().add(si) as *const __m256i
        )),
        _mm512_cvtph_ps(_mm256_loadu_si256(
            w.scales.as_ptr().add(si + 16) as *const __m256i
        )),
    ];
    for (j, fj) in facc.iter_mut().enumerate() {
        let row = a0 + j;
        let ap = a.qs.as_ptr().add(row * w.kp + 32 * b) as *const i32;
        let da = *a.lane_scale.get_unchecked((row * w.kp + 32 * b) / 4);
        for (h, wd_h) in wd.iter().enumerate() {
            let mut c0 = _mm512_setzero_si512();
            let mut c1 = _mm512_setzero_si512();
            for k in (4 * h..4 * h + 4).step_by(2) {
                c0 = _mm512_dpbusd_epi32(c0, wv[k], _mm512_set1_epi32(ap.add(k).read_unaligned()));
                c1 = _mm512_dpbusd_epi32(
                    c1,
                    wv[k + 1],
                    _mm512_set1_epi32(ap.add(k + 1).read_unaligned()),
                );
            }
            let zero = 32 * *a.half_isum.get_unchecked(row * 2 * blocks + 2 * b + h);
            let dot = _mm512_sub_epi32(_mm512_add_epi32(c0, c1), _mm512_set1_epi32(zero));
            *fj = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(dot),
                _mm512_mul_ps(*wd_h, _mm512_set1_ps(da)),
                *fj,
            );
        }
    }
}
