//! Attention scores sixteen keys at a time on AVX-512.
//!
//! One score is the dot product of a query head with a key, a few 16-lane FMAs followed by a
//! sum across the 16 lanes. Summed one key at a time, that horizontal sum (four dependent
//! shuffle-and-add levels) costs more than the FMAs for head sizes of 64 to 128, and it
//! dominated attention over long contexts. Here sixteen keys' lane vectors are reduced together:
//! each level pairs vectors instead of lanes, so sixteen sums take 30 shuffles and 15 adds
//! instead of 16 x 8 instructions, and the result is one vector holding sixteen scores.
//!
//! Every score is summed in exactly the tree [`crate::ops::dot`] uses (lanes `l` and `l + 8`,
//! then `+ 4`, `+ 2`, `+ 1`), so it is bit-identical to the one-key-at-a-time score: attention
//! output does not change, and a row's result never depends on which keys share its block.

#![allow(unsafe_code)]

use crate::ops::KvValue;

/// Which key of a 16-key block goes into which vector, so that the reduction's output lanes
/// come out in key order (the shuffles below leave the vector of slot `s` in lane `KEY_OF_SLOT[s]`).
#[cfg(target_arch = "x86_64")]
const KEY_OF_SLOT: [usize; 16] = [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15];

/// Writes `scores[i] = scale * q . k[(start + i) * stride..][..q.len()]` for every `i` in
/// `0..scores.len()` and returns true, when this CPU has AVX-512F and FMA and the head size is
/// a multiple of 16; otherwise writes nothing and returns false (the caller scores one key at a
/// time). f16 keys are widened to f32 as they are loaded, so every score is bit-identical to the
/// one over f32 keys holding the same values.
pub(crate) fn block_scores<T: KvValue>(
    q: &[f32],
    k: &[T],
    stride: usize,
    start: usize,
    scale: f32,
    scores: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if fits(q.len(), k.len(), stride, start, scores.len()) {
        let kp = k.as_ptr() as *const u8;
        // SAFETY: `fits` detected the features and checked that every key read lies within
        // `k`; every query read is within `q`.
        unsafe {
            if T::F16 {
                block_scores512::<true>(q, kp, stride, start, scale, scores)
            } else {
                block_scores512::<false>(q, kp, stride, start, scale, scores)
            }
        };
        return true;
    }
    let _ = (q, k, stride, start, scale, scores);
    false
}

/// Whether the AVX-512 kernel runs: the CPU has it, the head size is a multiple of 16 and the
/// last key lies inside the cache.
#[cfg(target_arch = "x86_64")]
fn fits(hd: usize, k_len: usize, stride: usize, start: usize, n: usize) -> bool {
    let end = start + n;
    hd.is_multiple_of(16)
        && hd > 0
        && (end == start || (end - 1) * stride + hd <= k_len)
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("fma")
}

/// The kernel; `k` points at f32 keys, or f16 ones with `F16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn block_scores512<const F16: bool>(
    q: &[f32],
    k: *const u8,
    stride: usize,
    start: usize,
    scale: f32,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let n = scores.len();
    let scale_v = _mm512_set1_ps(scale);
    let mut done = 0;
    while done < n {
        let keys = (n - done).min(16);
        score_keys::<F16>(
            q,
            k,
            stride,
            start + done,
            keys,
            scale_v,
            scores.as_mut_ptr().add(done),
        );
        done += keys;
    }
}

/// Writes `dst[i] = scale * q . key(first + i)` for `i` in `0..keys` (at most 16), key `j` at
/// `k + j * stride` elements (f32, or f16 widened as loaded with `F16`): one block of
/// [`block_scores`]. The caller guarantees AVX-512F and FMA, that every key read lies inside
/// its cache, that `q.len()` is a multiple of 16 and that `dst` holds `keys` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn score_keys<const F16: bool>(
    q: &[f32],
    k: *const u8,
    stride: usize,
    first: usize,
    keys: usize,
    scale_v: std::arch::x86_64::__m512,
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    let elem = if F16 { 2 } else { 4 };
    let load = |p: *const u8| {
        if F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
        } else {
            _mm512_loadu_ps(p as *const f32)
        }
    };
    let hd = q.len();
    // Lane vectors of each key's products. The sixteen keys' chains run side by side, one
    // query vector loaded per step for all of them (each key's chain still adds its products
    // in column order). Absent keys (a short block's) read the last present key and are
    // zeroed after.
    let mut v = [_mm512_setzero_ps(); 16];
    let kps: [*const u8; 16] = std::array::from_fn(|slot| {
        k.add((first + KEY_OF_SLOT[slot].min(keys - 1)) * stride * elem)
    });
    let mut d = 0;
    while d < hd {
        let qd = _mm512_loadu_ps(q.as_ptr().add(d));
        for (acc, kp) in v.iter_mut().zip(&kps) {
            *acc = _mm512_fmadd_ps(qd, load(kp.add(d * elem)), *acc);
        }
        d += 16;
    }
    if keys < 16 {
        for (slot, acc) in v.iter_mut().enumerate() {
            if KEY_OF_SLOT[slot] >= keys {
                *acc = _mm512_setzero_ps();
            }
        }
    }
    // Level 1: 256-bit halves, (q0 + q2, q1 + q3) of vectors i and i + 8 in one vector.
    let mut b = [_mm512_setzero_ps(); 8];
    for (i, bi) in b.iter_mut().enumerate() {
        let x = _mm512_shuffle_f32x4::<0x44>(v[i], v[i + 8]);
        let y = _mm512_shuffle_f32x4::<0xEE>(v[i], v[i + 8]);
        *bi = _mm512_add_ps(x, y);
    }
    // Level 2: 128-bit quarters, one per vector: i, i + 8, i + 4, i + 12.
    let mut c = [_mm512_setzero_ps(); 4];
    for (i, ci) in c.iter_mut().enumerate() {
        let x = _mm512_shuffle_f32x4::<0x88>(b[i], b[i + 4]);
        let y = _mm512_shuffle_f32x4::<0xDD>(b[i], b[i + 4]);
        *ci = _mm512_add_ps(x, y);
    }
    // Level 3: lanes 0 + 2 and 1 + 3 within each quarter.
    let mut d = [_mm512_setzero_ps(); 2];
    for (i, di) in d.iter_mut().enumerate() {
        let x = _mm512_shuffle_ps::<0x44>(c[i], c[i + 2]);
        let y = _mm512_shuffle_ps::<0xEE>(c[i], c[i + 2]);
        *di = _mm512_add_ps(x, y);
    }
    // Level 4: (0 + 2) + (1 + 3): one sum per lane, in key order thanks to KEY_OF_SLOT.
    let x = _mm512_shuffle_ps::<0x88>(d[0], d[1]);
    let y = _mm512_shuffle_ps::<0xDD>(d[0], d[1]);
    let sums = _mm512_mul_ps(_mm512_add_ps(x, y), scale_v);
    let mask: __mmask16 = if keys == 16 {
        0xFFFF
    } else {
        (1u16 << keys) - 1
    };
    _mm512_mask_storeu_ps(dst, mask, sums);
}

/// Keys `first..first + count` (at most 16; key `j` at `k + j * stride` elements, f32 or, with
/// `F16`, f16 widened) transposed into `kt`: `kt[d * 16 + i]` is value `d` of key `first + i`,
/// zero for `i >= count`. `hd` is a multiple of 16 and `kt` holds `16 * hd` values; every key
/// read lies inside its cache (the caller's guarantees, with AVX-512F).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[inline]
pub(crate) unsafe fn transpose16<const F16: bool>(
    k: *const u8,
    stride: usize,
    first: usize,
    count: usize,
    hd: usize,
    kt: *mut f32,
) {
    use std::arch::x86_64::*;
    let elem = if F16 { 2 } else { 4 };
    let mut d0 = 0;
    while d0 < hd {
        // Sixteen keys' values d0..d0 + 16, one key a vector, then a 16 x 16 transpose.
        let r: [__m512; 16] = std::array::from_fn(|i| {
            if i >= count {
                return _mm512_setzero_ps();
            }
            let p = k.add(((first + i) * stride + d0) * elem);
            if F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
            } else {
                _mm512_loadu_ps(p as *const f32)
            }
        });
        for (c, col) in transpose16x16(&r).into_iter().enumerate() {
            _mm512_storeu_ps(kt.add((d0 + c) * 16), col);
        }
        d0 += 16;
    }
}

/// Sixteen vectors of sixteen 32-bit lanes transposed: lane `i` of result `c` is lane `c` of
/// row `i` (bits moved, never computed on).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(unsafe_code)]
pub(crate) unsafe fn transpose16x16(
    r: &[std::arch::x86_64::__m512; 16],
) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then quads: `u[4 g + j]` holds, in 128-bit lane `k`, element
    // `4 k + j` of rows `4 g..4 g + 4`.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (g, j) = (i / 4, i % 4);
        let (a, b) = (
            _mm512_castps_pd(t[4 * g + j / 2]),
            _mm512_castps_pd(t[4 * g + j / 2 + 2]),
        );
        _mm512_castpd_ps(if j % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let (h, sel, j) = (i / 8, (i / 4) % 2, i % 4);
        let (a, b) = (u[8 * h + j], u[8 * h + 4 + j]);
        if sel == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    std::array::from_fn(|c| {
        let (hi, s4, j) = (c / 8, (c / 4) % 2, c % 4);
        let (a, b) = (v[4 * s4 + j], v[8 + 4 * s4 + j]);
        if hi == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    })
}

/// Scores of `N` query heads against a transposed block of sixteen keys ([`transpose16`]):
/// `dst[n][i] = scale * q[n] . key i` for the keys whose bit is set in `mask[n]` (others are
/// not written). Bit-identical to [`score_keys`]: key `i`'s lane-`l` partial sum over the
/// head's 16-value pieces is vector `l`'s lane `i` here, built by the same fused multiply-adds
/// in the same order, and the sixteen partial sums are added in the same tree (`l` and
/// `l + 8`, then `+ 4`, `+ 2`, `+ 1`), only with whole vectors instead of shuffled lanes. Each
/// value of `kt` is loaded once for all `N` heads, and no shuffles are needed. Pointers as in
/// [`score_keys`]; a masked-out lane of `dst` is never touched.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[inline]
pub(crate) unsafe fn score_transposed<const N: usize, const U: usize>(
    q: [*const f32; N],
    hd: usize,
    kt: *const f32,
    scale_v: std::arch::x86_64::__m512,
    dst: [*mut f32; N],
    mask: [u16; N],
) {
    use std::arch::x86_64::*;
    // The head's 16-value pieces: `U` when known at compile time (the loops unroll), else
    // counted from `hd`.
    let pieces = if U > 0 { U } else { hd / 16 };
    // Lane sums `l` and `l + 8` of every key, added: the tree's first level.
    let level1 = |l: usize| -> [__m512; N] {
        let mut x = [_mm512_setzero_ps(); N];
        let mut y = [_mm512_setzero_ps(); N];
        for u in 0..pieces {
            let d = 16 * u + l;
            let kx = _mm512_loadu_ps(kt.add(d * 16));
            let ky = _mm512_loadu_ps(kt.add((d + 8) * 16));
            for n in 0..N {
                x[n] = _mm512_fmadd_ps(_mm512_set1_ps(*q[n].add(d)), kx, x[n]);
                y[n] = _mm512_fmadd_ps(_mm512_set1_ps(*q[n].add(d + 8)), ky, y[n]);
            }
        }
        std::array::from_fn(|n| _mm512_add_ps(x[n], y[n]))
    };
    let add = |a: [__m512; N], b: [__m512; N]| -> [__m512; N] {
        std::array::from_fn(|n| _mm512_add_ps(a[n], b[n]))
    };
    let level2 = |l: usize| add(level1(l), level1(l + 4));
    let d0 = add(level2(0), level2(2));
    let d1 = add(level2(1), level2(3));
    let sums = add(d0, d1);
    for n in 0..N {
        _mm512_mask_storeu_ps(dst[n], mask[n], _mm512_mul_ps(sums[n], scale_v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_scores_are_bit_identical_to_one_key_at_a_time() {
        let stride = 192;
        let keys = 70;
        let k: Vec<f32> = (0..keys * stride)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        for hd in [16, 64, 128] {
            let q: Vec<f32> = (0..hd)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021)
                .collect();
            // Every block length 0..=16 and more, at several starting keys.
            for start in [0, 1, 5, 16] {
                for n in (0..=(keys - start).min(40)).chain([keys - start]) {
                    let mut fast = vec![f32::NAN; n];
                    if !block_scores(&q, &k, stride, start, 0.125, &mut fast) {
                        return; // no AVX-512 here: the caller's path is the only one
                    }
                    for (i, s) in fast.iter().enumerate() {
                        let j = start + i;
                        let one = crate::ops::dot(&q, &k[j * stride..j * stride + hd]) * 0.125;
                        assert_eq!(
                            s.to_bits(),
                            one.to_bits(),
                            "hd {hd} start {start} n {n} key {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn transposed_blocks_score_bit_identically_to_one_key_at_a_time() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")) {
            return; // no AVX-512 here: the tiles run row by row
        }
        let stride = 300;
        let keys = 40;
        let k: Vec<f32> = (0..keys * stride)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let k16: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
        let wide: Vec<f32> = k16.iter().map(|x| x.to_f32()).collect();
        for hd in [16, 64, 128, 256] {
            let q: Vec<f32> = (0..4 * hd)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021)
                .collect();
            for (first, count) in [(0, 16), (3, 16), (17, 5), (39, 1), (24, 16)] {
                let mut kt = vec![f32::NAN; 16 * hd];
                let mut kt16 = kt.clone();
                let mut want = [[0f32; 16]; 4];
                let mut want16 = want;
                let mut got = [[f32::NAN; 16]; 4];
                let mut got16 = got;
                // SAFETY: AVX-512F was detected; every key read lies in `k` (first + count <= 40,
                // hd <= stride), `kt` holds 16 * hd values, `q` holds four heads.
                unsafe {
                    use std::arch::x86_64::_mm512_set1_ps;
                    transpose16::<false>(
                        k.as_ptr() as *const u8,
                        stride,
                        first,
                        count,
                        hd,
                        kt.as_mut_ptr(),
                    );
                    transpose16::<true>(
                        k16.as_ptr() as *const u8,
                        stride,
                        first,
                        count,
                        hd,
                        kt16.as_mut_ptr(),
                    );
                    for n in 0..4 {
                        let qn = &q[n * hd..(n + 1) * hd];
                        let s = _mm512_set1_ps(0.3);
                        let pairs = [(&k, want[n].as_mut_ptr()), (&wide, want16[n].as_mut_ptr())];
                        for (keys, dst) in pairs {
                            let kp = keys.as_ptr() as *const u8;
                            score_keys::<false>(qn, kp, stride, first, count, s, dst);
                        }
                    }
                    // Heads one, two, three and four at a time, each its own mask.
                    let qp: [*const f32; 4] = std::array::from_fn(|n| q[n * hd..].as_ptr());
                    let mask = if count == 16 {
                        0xFFFF
                    } else {
                        (1u16 << count) - 1
                    };
                    let s = _mm512_set1_ps(0.3);
                    score_transposed::<1, 0>(
                        [qp[0]],
                        hd,
                        kt.as_ptr(),
                        s,
                        [got[0].as_mut_ptr()],
                        [mask],
                    );
                    score_transposed::<3, 0>(
                        [qp[1], qp[2], qp[3]],
                        hd,
                        kt.as_ptr(),
                        s,
                        [
                            got[1].as_mut_ptr(),
                            got[2].as_mut_ptr(),
                            got[3].as_mut_ptr(),
                        ],
                        [mask; 3],
                    );
                    let d16: [*mut f32; 4] = std::array::from_fn(|n| got16[n].as_mut_ptr());
                    score_transposed::<4, 0>(qp, hd, kt16.as_ptr(), s, d16, [mask; 4]);
                }
                for n in 0..4 {
                    for i in 0..count {
                        assert_eq!(
                            got[n][i].to_bits(),
                            want[n][i].to_bits(),
                            "hd {hd} key {} head {n}",
                            first + i
                        );
                        assert_eq!(
                            got16[n][i].to_bits(),
                            want16[n][i].to_bits(),
                            "f16 hd {hd} key {} head {n}",
                            first + i
                        );
                    }
                    assert!(
                        got[n][count..].iter().all(|x| x.is_nan()),
                        "wrote past the mask"
                    );
                }
            }
        }
    }

    #[test]
    fn f16_keys_score_as_the_same_values_in_f32() {
        let stride = 80;
        let keys = 40;
        let k: Vec<half::f16> = (0..keys * stride)
            .map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) * 0.013))
            .collect();
        let wide: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
        let q: Vec<f32> = (0..64)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021)
            .collect();
        for (start, n) in [(0, 40), (3, 17), (39, 1)] {
            let (mut a, mut b) = (vec![f32::NAN; n], vec![f32::NAN; n]);
            let done = block_scores(&q, &k, stride, start, 0.3, &mut a);
            assert_eq!(done, block_scores(&q, &wide, stride, start, 0.3, &mut b));
            if done {
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "start {start} n {n}");
            }
        }
    }

    #[test]
    fn a_head_size_off_the_vector_width_or_keys_past_the_cache_are_left_to_the_caller() {
        let k = vec![1.0f32; 4 * 24];
        let mut out = vec![0.0f32; 4];
        assert!(!block_scores(&[1.0; 24], &k, 24, 0, 1.0, &mut out));
        // 16-wide head, but the last key would read past the slice.
        assert!(!block_scores(&[1.0; 16], &k[..60], 16, 0, 1.0, &mut out));
        assert_eq!(out, vec![0.0; 4]);
    }
}
