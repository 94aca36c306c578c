//! AVX2 + FMA + F16C tiles: a 64-element chunk is processed as two 32-element halves, with
//! `pmaddubsw` + `pmaddwd` for the integer dots (no saturation: |u| <= 63 or the sign trick).

// Unsafe is needed here because SIMD intrinsics and raw-pointer loads are unsafe fns. Each tile
// is only reached through `matmul::run_tile`, which checked the CPU features and that every
// row/chunk index is inside the packed buffers.
#![allow(unsafe_code)]

use crate::acts::QActs;
use crate::pack::QMatrix;
use crate::{fifth_bit, stored_min, L_S8, L_U5, L_U6};
use std::arch::x86_64::*;

/// Half `h` (elements `32h..32h+32`) of chunk `base` as bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn unpack<const L: u8>(w: &QMatrix, base: usize, h: usize) -> __m256i {
    if L == L_S8 {
        return _mm256_loadu_si256(w.qs.as_ptr().add(base * 64 + 32 * h) as *const __m256i);
    }
    let v = _mm256_loadu_si256(w.qs.as_ptr().add(base * 32) as *const __m256i);
    let m4 = _mm256_set1_epi8(0x0F);
    let q = if h == 0 {
        _mm256_and_si256(v, m4)
    } else {
        _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)
    };
    if fifth_bit(L) {
        // The chunk's fifth-bit word in every 64-bit lane; lane `j` shifted so that bit 4 of
        // each byte is its element's fifth bit (`pack::hi5_bit`).
        let word = _mm256_set1_epi64x((w.hi.as_ptr().add(base * 8) as *const i64).read_unaligned());
        let at4 = if h == 0 {
            _mm256_srlv_epi64(word, _mm256_setr_epi64x(0, 1, 2, 3))
        } else {
            _mm256_sllv_epi64(word, _mm256_setr_epi64x(4, 3, 2, 1))
        };
        _mm256_or_si256(q, _mm256_and_si256(at4, _mm256_set1_epi8(0x10)))
    } else if L == L_U6 {
        let hb = _mm256_broadcastsi128_si256(_mm_loadu_si128(
            w.hi.as_ptr().add(base * 16) as *const __m128i
        ));
        let s0 = 4 * h as i32;
        let sh = _mm256_srlv_epi32(
            hb,
            _mm256_setr_epi32(s0, s0, s0, s0, s0 + 2, s0 + 2, s0 + 2, s0 + 2),
        );
        let h2 = _mm256_and_si256(sh, _mm256_set1_epi8(3));
        _mm256_or_si256(q, _mm256_slli_epi32(h2, 4))
    } else {
        q
    }
}

/// Per-lane f32 group values for half `h` of the chunk whose first group value is at `p`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn expand<const L: u8>(p: *const u16, h: usize) -> __m256 {
    if L == L_U6 {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(
            (p.add(2 * h) as *const i32).read_unaligned(),
        ));
        _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(v),
            _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        )
    } else {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(p.add(h).read_unaligned() as i32));
        _mm256_broadcastss_ps(v)
    }
}

/// Computes `res[i][j] = dot(w row r0+i, act row a0+j)` for `i < MR`, `j < NR`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; rows `r0..r0+MR` and `a0..a0+NR` must exist,
/// `w.layout` must be the layout `L` names and `a.kp == w.kp`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile<const L: u8, const MR: usize, const NR: usize>(
    w: &QMatrix,
    r0: usize,
    a: &QActs,
    a0: usize,
    res: &mut [[f32; 4]; 4],
) {
    let chunks = w.kp / 64;
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
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let aq = a.qs.as_ptr();
    for c in 0..chunks {
        for h in 0..2 {
            let mut av = [_mm256_setzero_si256(); NR];
            for (j, v) in av.iter_mut().enumerate() {
                *v =
                    _mm256_loadu_si256(aq.add((a0 + j) * a.kp + 64 * c + 32 * h) as *const __m256i);
            }
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let r = r0 + i;
                if h == 0 {
                    let cb = if L == L_S8 { 64 } else { 32 };
                    _mm_prefetch::<_MM_HINT_T0>(
                        w.qs.as_ptr()
                            .wrapping_add((r * chunks + c) * cb + crate::PREFETCH_BYTES)
                            as *const i8,
                    );
                }
                let wq = unpack::<L>(w, r * chunks + c, h);
                let ws = expand::<L>(w.scales.as_ptr().add(r * groups + c * gpc), h);
                let wm = if stored_min(L) {
                    expand::<L>(w.mins.as_ptr().add(r * groups + c * gpc), h)
                } else {
                    _mm256_mul_ps(ws, _mm256_set1_ps(zero))
                };
                let wu = if L == L_S8 { _mm256_abs_epi8(wq) } else { wq };
                for (j, acc_ij) in acc_i.iter_mut().enumerate() {
                    let lane = ((a0 + j) * a.kp + 64 * c + 32 * h) / 4;
                    let s = if L == L_S8 {
                        _mm256_sign_epi8(av[j], wq)
                    } else {
                        av[j]
                    };
                    let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, s), ones);
                    let t = _mm256_mul_ps(
                        _mm256_cvtepi32_ps(dot),
                        _mm256_loadu_ps(a.lane_scale.as_ptr().add(lane)),
                    );
                    *acc_ij = _mm256_fmadd_ps(t, ws, *acc_ij);
                    if L != L_S8 {
                        *acc_ij = _mm256_fmadd_ps(
                            wm,
                            _mm256_loadu_ps(a.lane_sum.as_ptr().add(lane)),
                            *acc_ij,
                        );
                    }
                }
            }
        }
    }
    for i in 0..MR {
        for j in 0..NR {
            let v = acc[i][j];
            let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
            res[i][j] = _mm_cvtss_f32(s1);
        }
    }
}
