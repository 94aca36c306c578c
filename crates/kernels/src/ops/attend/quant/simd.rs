//! The AVX-512 halves of the quantized caches' attention: the same arithmetic as the portable
//! bodies in `mod.rs`, lane for lane (`tests`). `Q4` picks q4_0 blocks, else q8_0.

use super::{QuantKind, QuantQuery, BLOCK, MAX_GROUP, MAX_QUANT_HEAD};
use crate::scores::transpose16x16;

/// [`super::key_scores`] for several query heads on AVX-512 (BW for the 16-bit products, F16C
/// for the scales), sixteen keys at a time, one key a lane: the same bits. Each tile of keys
/// is built once ([`KeyTile`]) for all the heads.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[allow(unsafe_code)]
pub(super) unsafe fn key_scores_512<const Q4: bool>(
    queries: &[QuantQuery<'_>],
    kq: &[u8],
    kd: &[half::f16],
    stride: usize,
    start: usize,
    scale: f32,
    w: &mut [f32],
) {
    use std::arch::x86_64::*;
    let blocks = queries[0].d.len();
    let n = w.len() / queries.len();
    let mut pairs = [0i32; MAX_GROUP * MAX_QUANT_HEAD / 2];
    for (h, qh) in queries.iter().enumerate() {
        query_pairs(qh.q, &mut pairs[h * MAX_QUANT_HEAD / 2..][..blocks * 16]);
    }
    let mut tile = KeyTile::new();
    let mut done = 0;
    while done < n {
        let count = (n - done).min(16);
        tile.load::<Q4>(kq, kd, stride, start + done, count, blocks);
        let mask = if count == 16 {
            0xFFFF
        } else {
            (1u16 << count) - 1
        };
        for (h, qh) in queries.iter().enumerate() {
            let out = tile.score(&pairs[h * MAX_QUANT_HEAD / 2..], qh.d, scale);
            _mm512_mask_storeu_ps(w.as_mut_ptr().add(h * n + done), mask, out);
        }
        done += count;
    }
}

/// A query head's quants (whole blocks) widened to 16 bits, as [`KeyTile::score`] broadcasts
/// them: i32 `16 b + l` holds quants `2l` and `2l + 1` of block `b`, the pair one `madd`
/// multiplies. `pairs` holds 16 per block.
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(unsafe_code)]
pub(super) unsafe fn query_pairs(q: &[i8], pairs: &mut [i32]) {
    use std::arch::x86_64::*;
    for (qb, pb) in q.chunks_exact(BLOCK).zip(pairs.chunks_exact_mut(16)) {
        let q16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(qb.as_ptr().cast()));
        _mm512_storeu_si512(pb.as_mut_ptr().cast(), q16);
    }
}

/// Sixteen keys as [`KeyTile::score`] reads them: per block, their quants widened to 16 bits
/// and transposed (lane `i` of vector `l` holds key `i`'s quants `2l` and `2l + 1`), and their
/// scales. Built once, then scored against any number of query heads.
pub(super) struct KeyTile {
    quants: [std::arch::x86_64::__m512i; MAX_QUANT_HEAD / 2],
    scales: [std::arch::x86_64::__m512; MAX_QUANT_HEAD / BLOCK],
}

impl KeyTile {
    #[target_feature(enable = "avx512f")]
    #[allow(unsafe_code)]
    pub(super) unsafe fn new() -> Self {
        use std::arch::x86_64::*;
        KeyTile {
            quants: [_mm512_setzero_si512(); MAX_QUANT_HEAD / 2],
            scales: [_mm512_setzero_ps(); MAX_QUANT_HEAD / BLOCK],
        }
    }

    /// Keys `first..first + count` (`count` at most 16; the lanes past it zero), each of
    /// `blocks` blocks, `stride` values apart. The caller checked every read lies in `kq`/`kd`.
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    #[allow(unsafe_code)]
    pub(super) unsafe fn load<const Q4: bool>(
        &mut self,
        kq: &[u8],
        kd: &[half::f16],
        stride: usize,
        first: usize,
        count: usize,
        blocks: usize,
    ) {
        use std::arch::x86_64::*;
        let (kp, dp) = (kq.as_ptr(), kd.as_ptr().cast::<u16>());
        for b in 0..blocks {
            let rows: [__m512; 16] = std::array::from_fn(|i| {
                if i >= count {
                    return _mm512_setzero_ps();
                }
                let block = (first + i) * stride / BLOCK + b;
                _mm512_castsi512_ps(_mm512_cvtepi8_epi16(block_quants::<Q4>(kp, block)))
            });
            for (l, v) in transpose16x16(&rows).into_iter().enumerate() {
                self.quants[16 * b + l] = _mm512_castps_si512(v);
            }
            let mut bits = [0u16; 16];
            for (i, x) in bits[..count].iter_mut().enumerate() {
                *x = *dp.add((first + i) * stride / BLOCK + b);
            }
            self.scales[b] = _mm512_cvtph_ps(_mm256_loadu_si256(bits.as_ptr().cast()));
        }
    }

    /// The sixteen keys' scaled scores against one query head (its [`query_pairs`] and widened
    /// scales, one a block): [`super::key_scores`]'s arithmetic lane for lane.
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    #[inline]
    #[allow(unsafe_code)]
    pub(super) unsafe fn score(
        &self,
        pairs: &[i32],
        d: &[f32],
        scale: f32,
    ) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let mut sum = _mm512_setzero_ps();
        for (b, &dq) in d.iter().enumerate() {
            let d = _mm512_mul_ps(self.scales[b], _mm512_set1_ps(dq));
            // The block's integer dot for all sixteen keys: exact, so in any order (two
            // chains, to keep the multiply unit busy).
            let mut dot = [_mm512_setzero_si512(); 2];
            for l in 0..16 {
                let q = _mm512_set1_epi32(*pairs.get_unchecked(16 * b + l));
                let p = _mm512_madd_epi16(self.quants[16 * b + l], q);
                dot[l % 2] = _mm512_add_epi32(dot[l % 2], p);
            }
            let dot = _mm512_add_epi32(dot[0], dot[1]);
            sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, sum);
        }
        _mm512_mul_ps(sum, _mm512_set1_ps(scale))
    }
}

/// Block `block`'s 32 signed quants (as [`super::block_quants`] unpacks them).
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
pub(super) unsafe fn block_quants<const Q4: bool>(
    q: *const u8,
    block: usize,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if Q4 {
        let x = _mm_loadu_si128(q.add(block * BLOCK / 2).cast());
        let low = _mm_set1_epi8(15);
        let (lo, hi) = (
            _mm_and_si128(x, low),
            _mm_and_si128(_mm_srli_epi16::<4>(x), low),
        );
        _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
    } else {
        _mm256_loadu_si256(q.add(block * BLOCK).cast())
    }
}

/// A block's 32 values widened, in two halves of sixteen: `q[i] * d` in f32, the one rounding
/// the portable bodies make.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
#[allow(unsafe_code)]
pub(super) unsafe fn widen_block(
    q: std::arch::x86_64::__m256i,
    d: std::arch::x86_64::__m512,
) -> [std::arch::x86_64::__m512; 2] {
    use std::arch::x86_64::*;
    let half = |x: __m128i| _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x)), d);
    [
        half(_mm256_castsi256_si128(q)),
        half(_mm256_extracti128_si256::<1>(q)),
    ]
}

/// Keys ahead whose quants are fetched into L1 while this one is summed: one head's rows are a
/// stride apart, and the hardware prefetcher followed them too late (as in `attend::prefetch`).
const PREFETCH_KEYS: usize = 8;

/// Hints the `len` bytes at `p` into L1 (a prefetch never faults).
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn prefetch(p: *const u8, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in (0..len).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.add(line).cast());
    }
}

/// One f16 scale (its bits) widened by F16C.
#[target_feature(enable = "f16c")]
#[inline]
#[allow(unsafe_code)]
pub(super) unsafe fn f16_512(bits: u16) -> f32 {
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// [`super::weighted`] on AVX-512, a block of 32 columns at a time for all `G` heads: the same
/// bits.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(super) unsafe fn weighted_512<const G: usize, const Q4: bool>(
    ws: &[f32],
    n: usize,
    vq: &[u8],
    vd: &[half::f16],
    stride: usize,
    start: usize,
    hd: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (vp, dp) = (vq.as_ptr(), vd.as_ptr().cast::<u16>());
    let block_bytes = QuantKind::of(Q4).block_bytes();
    let ahead = PREFETCH_KEYS * stride / BLOCK * block_bytes;
    for c0 in (0..hd).step_by(BLOCK) {
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        for idx in 0..n {
            let block = ((start + idx) * stride + c0) / BLOCK;
            let at = block * block_bytes;
            if at + ahead + block_bytes <= vq.len() {
                prefetch(vp.add(at + ahead), block_bytes);
            }
            let d = _mm512_set1_ps(f16_512(*dp.add(block)));
            let [x0, x1] = widen_block(block_quants::<Q4>(vp, block), d);
            for (g, acc_g) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*ws.get_unchecked(g * n + idx));
                acc_g[0] = _mm512_fmadd_ps(x0, w, acc_g[0]);
                acc_g[1] = _mm512_fmadd_ps(x1, w, acc_g[1]);
            }
        }
        for (g, acc_g) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(g * hd + c0);
            _mm512_storeu_ps(o, acc_g[0]);
            _mm512_storeu_ps(o.add(16), acc_g[1]);
        }
    }
}
