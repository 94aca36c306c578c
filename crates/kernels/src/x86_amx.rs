//! Intel AMX (TMUL) for batches: 16 activation rows x 16 weight rows of an interleaved matrix
//! per tile multiply.
//!
//! The interleaved arrangement (`pack`) already is the layout `tdpbsud` wants for its second
//! operand: a 64-byte row holds 4 consecutive quants of each of 16 weight rows, so a block of 32
//! elements is a tile of 8 such rows (unpacked from nibbles first for the 4- and 5-bit layouts,
//! read in place for 8-bit), and the activation rows' quants, row after row, are the first
//! operand as they lie. One `tdpbsud` per block gives the same exact i32 dots as the VNNI tile's
//! eight `vpdpbusd`; the same float steps follow in the same order (scale, then min, block by
//! block), so the results are bit-identical to the VNNI path (`tests::amx_*`). What AMX saves is
//! the integer work and the weight unpacking per activation row; the float epilogue per
//! (activation row, block) stays, and bounds it.
//!
//! Linux grants the tile state per process on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`);
//! [`available`] asks once. Each pool job loads the tile configuration, and releases the tiles
//! when it ends, so no thread holds tile state between jobs.

// Unsafe is needed for the AMX instructions (inline assembly: the intrinsics are not stable),
// the AVX-512 intrinsics of the epilogue and raw-pointer loads. The kernel is reached only
// through `matmul::matmul_il` after `KernelPath::Amx` was checked available and the shapes
// were checked.
#![allow(unsafe_code)]

use crate::acts::QActs;
use crate::lines::Lines;
use crate::pack::{Layout, QMatrix};
use crate::{L_S8, L_U6};
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Activation rows per tile multiply (the tile's row count).
pub(crate) const ROWS: usize = 16;

/// Whether the CPU has AMX-TILE and AMX-INT8, the OS enabled their state, and this process was
/// granted it.
pub(crate) fn available() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        if !is_x86_feature_detected!("xsave") {
            return false;
        }
        // SAFETY: CPUID is present on every x86_64 CPU; xgetbv only after OSXSAVE is confirmed
        // (the xsave feature check above reads it).
        unsafe {
            let leaf7 = __cpuid_count(7, 0);
            let (tile, int8) = (1 << 24, 1 << 25);
            if leaf7.edx & (tile | int8) != tile | int8 {
                return false;
            }
            let (cfg, data) = (1u64 << 17, 1u64 << 18);
            if xcr0() & (cfg | data) != cfg | data {
                return false;
            }
        }
        request_tile_state()
    })
}

#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    _xgetbv(0)
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted xsave
    // features; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false // other systems: not tried here, so not used
}

/// The tile configuration (palette 1): `tmm0..tmm3` accumulators (16 rows of 16 i32),
/// `tmm4`/`tmm5` activation quants (16 rows of 32 bytes: one block), `tmm6`/`tmm7` weight
/// quants (8 rows of 64 bytes: one block of 16 interleaved rows); for Q6_K half of that.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// `six`: Q6_K, whose scales change every 16 elements: a multiply covers half a block
    /// (activation tiles of 16 bytes a row, weight tiles of 4 rows).
    fn new(six: bool) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let (a_cols, b_rows) = if six { (16, 4) } else { (32, 8) };
        let shapes: [(u16, u8); 8] = [
            (64, 16),
            (64, 16),
            (64, 16),
            (64, 16),
            (a_cols, 16),
            (a_cols, 16),
            (64, b_rows),
            (64, b_rows),
        ];
        for (t, (colsb, rows)) in shapes.into_iter().enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        }
        TileConfig(c)
    }
}

/// The tiles of one pool job: configured when made, released when dropped (so a thread never
/// keeps tile state, or a stale configuration, past the job that loaded it).
pub(crate) struct Tiles {
    /// The weight blocks of one 16-row group, unpacked to bytes (4- and 5-bit layouts), on
    /// cache lines (a tile row straddling two lines costs a second access).
    unpacked: Lines<u8>,
    /// The group's scales and mins as f32, 16 per block each.
    scales: Vec<f32>,
    mins: Vec<f32>,
    /// Two pairs of blocks' dots as stored from the accumulator tiles: `[pair % 2][block of
    /// the pair][row][16]`.
    dots: Box<Dots>,
}

#[repr(C, align(64))]
struct Dots([i32; 4 * 256]);

impl Tiles {
    /// Tiles for matrices of layout `layout`.
    ///
    /// # Safety
    /// [`available`] must have returned true.
    pub(crate) unsafe fn new(layout: Layout) -> Tiles {
        let cfg = TileConfig::new(layout == Layout::U6);
        asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        Tiles {
            unpacked: Lines::default(),
            scales: Vec::new(),
            mins: Vec::new(),
            dots: Box::new(Dots([0; 4 * 256])),
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `new` on this thread (a `Tiles` is never sent).
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Two multiplies into accumulator tiles `$c0`/`$c1` (two blocks; the two halves of a Q6_K
/// block), stored to `c` and `c + 256` i32; the second reads the activations `$as` bytes and
/// the weights `$bs` bytes after the first.
macro_rules! pair {
    ($c0:literal, $c1:literal, $a:expr, $sa:expr, $b:expr, $c:expr, $as:expr, $bs:expr) => {
        asm!(
            concat!("tilezero ", $c0),
            concat!("tilezero ", $c1),
            "tileloadd tmm4, [{a} + {sa}*1]",
            "tileloadd tmm6, [{b} + {sb}*1]",
            concat!("tdpbsud ", $c0, ", tmm4, tmm6"),
            "tileloadd tmm5, [{a2} + {sa}*1]",
            "tileloadd tmm7, [{b2} + {sb}*1]",
            concat!("tdpbsud ", $c1, ", tmm5, tmm7"),
            concat!("tilestored [{c} + {sb}*1], ", $c0),
            concat!("tilestored [{c2} + {sb}*1], ", $c1),
            a = in(reg) $a,
            a2 = in(reg) $a.add($as),
            sa = in(reg) $sa,
            b = in(reg) $b,
            b2 = in(reg) $b.add($bs),
            sb = in(reg) 64usize,
            c = in(reg) $c,
            c2 = in(reg) $c.add(256),
            options(nostack),
        )
    };
}

/// Rows of a chunk scaled together in the epilogue (independent chains of fused multiply-adds,
/// enough to cover their latency).
const EPI_ROWS: usize = 16;

/// `out[(16 c + j) * m + 16 g16 + i]` for weight rows `16 g16 + i` and the first
/// `16 * chunks` activation rows.
///
/// # Safety
/// `tiles` was made on this thread; the CPU has AVX-512 F/BW/VL, VNNI, F16C and FMA; `w` is
/// interleaved with layout `L` (any but `L_U6`); `g16 < w.rows / 16`; `a` has at least
/// `16 * chunks` rows and `a.kp == w.kp`; `out` holds `a.rows * m` floats with `m == w.rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
pub(crate) unsafe fn group<const L: u8>(
    tiles: &mut Tiles,
    w: &QMatrix,
    g16: usize,
    a: &QActs,
    chunks: usize,
    out: *mut f32,
    m: usize,
) {
    let blocks = w.kp / 32;
    let base = g16 * blocks;
    let wq: *const u8 = if L == L_S8 || L == L_U6 {
        w.qs.as_ptr().add(base * 512)
    } else {
        unpack::<L>(w, base, blocks, &mut tiles.unpacked);
        tiles.unpacked.as_ptr()
    };
    group_scales::<L>(w, base, blocks, tiles);
    // A unit is two blocks (kp is a multiple of 64), or one Q6_K block's two halves. Two units'
    // dots (4 KiB, so they stay in L1 with the weights): unit u + 1's multiplies are issued
    // before unit u's epilogue, so that the tile unit works while the vector units scale.
    let dots = tiles.dots.0.as_mut_ptr();
    let six = L == L_U6;
    let (units, unit_a, unit_b) = if six {
        (blocks, 32, 512)
    } else {
        (blocks / 2, 64, 1024)
    };
    for c in 0..chunks {
        let a0 = ROWS * c;
        let issue = |u: usize| {
            let ap = a.qs.as_ptr().add(a0 * a.kp + unit_a * u);
            let (bp, cp) = (wq.add(unit_b * u), dots.add(512 * (u % 2)));
            // Alternate accumulator tiles, so that a unit's multiplies need not wait for the
            // previous unit's stores.
            match (u.is_multiple_of(2), six) {
                (true, false) => pair!("tmm0", "tmm1", ap, a.kp, bp, cp, 32, 512),
                (false, false) => pair!("tmm2", "tmm3", ap, a.kp, bp, cp, 32, 512),
                (true, true) => pair!("tmm0", "tmm1", ap, a.kp, bp, cp, 16, 256),
                (false, true) => pair!("tmm2", "tmm3", ap, a.kp, bp, cp, 16, 256),
            }
        };
        let mut facc = [[_mm512_setzero_ps(); EPI_ROWS]; ROWS / EPI_ROWS];
        issue(0);
        for u in 0..units {
            if u + 1 < units {
                issue(u + 1);
            }
            let cp = dots.add(512 * (u % 2));
            for (h, fh) in facc.iter_mut().enumerate() {
                let (r0, d0) = (a0 + EPI_ROWS * h, cp.add(16 * EPI_ROWS * h));
                if six {
                    epilogue::<L>(tiles, u, a, r0, d0, fh);
                } else {
                    for k in 0..2 {
                        epilogue::<L>(tiles, 2 * u + k, a, r0, d0.add(256 * k), fh);
                    }
                }
            }
        }
        for (h, fh) in facc.iter().enumerate() {
            for (j, fj) in fh.iter().enumerate() {
                _mm512_storeu_ps(out.add((a0 + EPI_ROWS * h + j) * m + 16 * g16), *fj);
            }
        }
    }
}

/// The group's per-block weight scales and mins as f32 vectors (one lane per weight row).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn group_scales<const L: u8>(w: &QMatrix, base: usize, blocks: usize, t: &mut Tiles) {
    if L == L_U6 {
        // Two scales a block, consecutive groups (`pack`); the min is derived.
        t.scales.resize(32 * blocks, 0.0);
        for g in 0..2 * blocks {
            let wd = _mm512_cvtph_ps(_mm256_loadu_si256(
                w.scales.as_ptr().add((2 * base + g) * 16) as *const __m256i,
            ));
            _mm512_storeu_ps(t.scales.as_mut_ptr().add(16 * g), wd);
        }
        return;
    }
    t.scales.resize(16 * blocks, 0.0);
    t.mins.resize(16 * blocks, 0.0);
    for b in 0..blocks {
        let (wd, wm) = crate::x86_avx512::il_scales::<L>(w, base + b);
        _mm512_storeu_ps(t.scales.as_mut_ptr().add(16 * b), wd);
        _mm512_storeu_ps(t.mins.as_mut_ptr().add(16 * b), wm);
    }
}

/// Block `b`'s contribution to activation rows `a0..a0 + EPI_ROWS`: the VNNI tile's float
/// steps (scale, then min) from the stored dots (`dots[j * 16 + i]` for row `a0 + j`). For
/// Q6_K (`x86_avx512::six_block`), per half: the dot less `32 * sum`, scaled by that half's
/// scale (the halves' dots 256 apart).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
#[inline]
unsafe fn epilogue<const L: u8>(
    t: &Tiles,
    b: usize,
    a: &QActs,
    a0: usize,
    dots: *const i32,
    facc: &mut [__m512; EPI_ROWS],
) {
    if L == L_U6 {
        let blocks = a.kp / 32;
        let at = ((a0 / ROWS) * blocks + b) * ROWS + a0 % ROWS;
        let sc = a.t_scale.as_ptr().add(at);
        let hat = ((a0 / ROWS) * blocks + b) * 2 * ROWS + a0 % ROWS;
        let wd = [
            _mm512_loadu_ps(t.scales.as_ptr().add(32 * b)),
            _mm512_loadu_ps(t.scales.as_ptr().add(32 * b + 16)),
        ];
        for (j, fj) in facc.iter_mut().enumerate() {
            let da = _mm512_set1_ps(*sc.add(j));
            for (h, wd_h) in wd.iter().enumerate() {
                let zero = 32 * *a.t_hsum.as_ptr().add(hat + ROWS * h + j);
                let dot = _mm512_sub_epi32(
                    _mm512_loadu_si512(dots.add(256 * h + 16 * j) as *const _),
                    _mm512_set1_epi32(zero),
                );
                *fj = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(*wd_h, da), *fj);
            }
        }
        return;
    }
    let at = ((a0 / ROWS) * (a.kp / 32) + b) * ROWS + a0 % ROWS;
    let (sc, bs, is) = (
        a.t_scale.as_ptr().add(at),
        a.t_bsum.as_ptr().add(at),
        a.t_isum.as_ptr().add(at),
    );
    let wd = _mm512_loadu_ps(t.scales.as_ptr().add(16 * b));
    let wm = _mm512_loadu_ps(t.mins.as_ptr().add(16 * b));
    for (j, fj) in facc.iter_mut().enumerate() {
        let mut dot = _mm512_loadu_si512(dots.add(16 * j) as *const _);
        if L == L_S8 {
            dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * *is.add(j)));
        }
        *fj = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(dot),
            _mm512_mul_ps(wd, _mm512_set1_ps(*sc.add(j))),
            *fj,
        );
        if L != L_S8 {
            *fj = _mm512_fmadd_ps(wm, _mm512_set1_ps(*bs.add(j)), *fj);
        }
    }
}

/// The 16-row group's blocks as bytes, 512 per block: 8 rows of 64 (the VNNI tile's `wv`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn unpack<const L: u8>(w: &QMatrix, base: usize, blocks: usize, dst: &mut Lines<u8>) {
    dst.set_len(blocks * 512);
    let dst = dst.as_mut_ptr();
    for b in 0..blocks {
        let wv = crate::x86_avx512::il_block::<L>(w, base + b);
        for (k, v) in wv.iter().enumerate() {
            _mm512_store_si512(dst.add(512 * b + 64 * k) as *mut _, *v);
        }
    }
}
