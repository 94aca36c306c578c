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

/// Which key of a 16-key block goes into which vector, so that the reduction's output lanes
/// come out in key order (the shuffles below leave the vector of slot `s` in lane `KEY_OF_SLOT[s]`).
#[cfg(target_arch = "x86_64")]
const KEY_OF_SLOT: [usize; 16] = [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15];

/// Writes `scores[i] = scale * q . k[(start + i) * stride..][..q.len()]` for every `i` in
/// `0..scores.len()` and returns true, when this CPU has AVX-512F and FMA and the head size is
/// a multiple of 16; otherwise writes nothing and returns false (the caller scores one key at a
/// time).
pub(crate) fn block_scores(
    q: &[f32],
    k: &[f32],
    stride: usize,
    start: usize,
    scale: f32,
    scores: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if fits(q.len(), k.len(), stride, start, scores.len()) {
        // SAFETY: `fits` detected the features and checked that every key read lies within
        // `k`; every query read is within `q`.
        unsafe {
            block_scores512::<false>(q, k.as_ptr() as *const u8, stride, start, scale, scores)
        };
        return true;
    }
    let _ = (q, k, stride, start, scale, scores);
    false
}

/// [`block_scores`] over an f16 cache: each key is widened to f32 as it is loaded, so every
/// score is bit-identical to the one over an f32 cache holding the same values.
pub(crate) fn block_scores_f16(
    q: &[f32],
    k: &[half::f16],
    stride: usize,
    start: usize,
    scale: f32,
    scores: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if fits(q.len(), k.len(), stride, start, scores.len()) {
        // SAFETY: as in `block_scores`.
        unsafe {
            block_scores512::<true>(q, k.as_ptr() as *const u8, stride, start, scale, scores)
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
            let done = block_scores_f16(&q, &k, stride, start, 0.3, &mut a);
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
