//! Run-time path selection and the multi-threaded matrix x activation-rows product.

// Unsafe is needed here for two things: calling the `#[target_feature]` tiles (only after
// `KernelPath::is_available` confirmed the CPU has the features, and after the shapes were
// checked), and writing disjoint output elements from several pool threads through one raw
// pointer (each output element belongs to exactly one chunk of weight rows).
#![allow(unsafe_code)]

use crate::acts::QActs;
use crate::pack::{Layout, QMatrix};
use crate::pool::ThreadPool;
use crate::Error;
#[cfg(target_arch = "x86_64")]
use crate::{L_S8, L_U4, L_U5, L_U5M, L_U6};

/// Which implementation runs the products. [`KernelPath::detect`] picks the best the CPU has;
/// tests and benchmarks force each one ([`KernelPath::chosen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelPath {
    Scalar,
    Avx2,
    Avx512,
    Avx512Vnni,
    /// AVX-512 VNNI, with Intel AMX tile multiplies for 16 activation rows at a time (batches
    /// and prompts; fewer rows take the VNNI tiles).
    Amx,
}

impl KernelPath {
    pub const ALL: [KernelPath; 5] = [
        KernelPath::Scalar,
        KernelPath::Avx2,
        KernelPath::Avx512,
        KernelPath::Avx512Vnni,
        KernelPath::Amx,
    ];

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        match self {
            KernelPath::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => {
                KernelPath::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512Vnni => {
                KernelPath::Avx512.is_available() && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Amx => KernelPath::Avx512Vnni.is_available() && crate::x86_amx::available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest path this CPU has.
    pub fn detect() -> KernelPath {
        [
            KernelPath::Amx,
            KernelPath::Avx512Vnni,
            KernelPath::Avx512,
            KernelPath::Avx2,
        ]
        .into_iter()
        .find(|p| p.is_available())
        .unwrap_or(KernelPath::Scalar)
    }

    /// `wanted` where this CPU has it, else [`KernelPath::detect`]: the path a caller asked for
    /// to compare paths on one machine (`HEARTH_KERNEL=avx512vnni`, which the entry points read:
    /// this crate never reads the environment).
    pub fn chosen(wanted: Option<KernelPath>) -> KernelPath {
        wanted
            .filter(|p| p.is_available())
            .unwrap_or_else(KernelPath::detect)
    }

    /// Every path this CPU can run, slowest first.
    pub fn available() -> Vec<KernelPath> {
        KernelPath::ALL
            .into_iter()
            .filter(|p| p.is_available())
            .collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Avx2 => "avx2",
            KernelPath::Avx512 => "avx512",
            KernelPath::Avx512Vnni => "avx512vnni",
            KernelPath::Amx => "amx",
        }
    }

    /// Parses [`KernelPath::name`] back.
    pub fn from_name(s: &str) -> Option<KernelPath> {
        KernelPath::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether the path reads the interleaved arrangement (see [`QMatrix::for_ggml_on`]).
    pub(crate) fn interleaves(self) -> bool {
        matches!(
            self,
            KernelPath::Avx2 | KernelPath::Avx512Vnni | KernelPath::Amx
        )
    }

    /// Activation rows per tile.
    fn max_nr(self) -> usize {
        match self {
            KernelPath::Avx2 => 2,
            _ => 4,
        }
    }
}

#[cfg(target_arch = "x86_64")]
type TileFn = unsafe fn(&QMatrix, usize, &QActs, usize, &mut [[f32; 4]; 4]);

#[cfg(target_arch = "x86_64")]
macro_rules! pick_nr {
    ($f:path, $l:ident, $mr:literal, $nr:expr) => {{
        use $f as tile;
        match $nr {
            1 => tile::<{ $l }, $mr, 1> as TileFn,
            2 => tile::<{ $l }, $mr, 2> as TileFn,
            3 => tile::<{ $l }, $mr, 3> as TileFn,
            _ => tile::<{ $l }, $mr, 4> as TileFn,
        }
    }};
}

#[cfg(target_arch = "x86_64")]
macro_rules! pick {
    ($f:path, $layout:expr, $mr:expr, $nr:expr) => {{
        match ($layout, $mr == 4) {
            (Layout::U4Min, true) => pick_nr!($f, L_U4, 4, $nr),
            (Layout::U4Min, false) => pick_nr!($f, L_U4, 1, $nr),
            (Layout::U5, true) => pick_nr!($f, L_U5, 4, $nr),
            (Layout::U5, false) => pick_nr!($f, L_U5, 1, $nr),
            (Layout::U5Min, true) => pick_nr!($f, L_U5M, 4, $nr),
            (Layout::U5Min, false) => pick_nr!($f, L_U5M, 1, $nr),
            (Layout::U6, true) => pick_nr!($f, L_U6, 4, $nr),
            (Layout::U6, false) => pick_nr!($f, L_U6, 1, $nr),
            (Layout::S8, true) => pick_nr!($f, L_S8, 4, $nr),
            (Layout::S8, false) => pick_nr!($f, L_S8, 1, $nr),
        }
    }};
}

/// One tile; `mr` is 4 or 1 and `nr` in 1..=4. Shapes and path availability are checked by
/// the caller.
#[allow(clippy::too_many_arguments)]
fn run_tile(
    path: KernelPath,
    w: &QMatrix,
    r0: usize,
    mr: usize,
    a: &QActs,
    a0: usize,
    nr: usize,
    res: &mut [[f32; 4]; 4],
) {
    match path {
        KernelPath::Scalar => crate::scalar::tile(w, r0, mr, a, a0, nr, res),
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => {
            let f = pick!(crate::x86_avx2::tile, w.layout, mr, nr);
            // SAFETY: the path was checked available and the tile indices are in range.
            unsafe { f(w, r0, a, a0, res) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            let f = pick!(crate::x86_avx512::tile_bw, w.layout, mr, nr);
            // SAFETY: as above.
            unsafe { f(w, r0, a, a0, res) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni | KernelPath::Amx => {
            let f = pick!(crate::x86_avx512::tile_vnni, w.layout, mr, nr);
            // SAFETY: as above.
            unsafe { f(w, r0, a, a0, res) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => crate::scalar::tile(w, r0, mr, a, a0, nr, res),
    }
}

struct OutPtr(*mut f32);
// SAFETY: chunks write disjoint elements (see the module comment).
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

/// `out[j * w.rows() + i] = sum_k w[i][k] * a[j][k]` for every activation row `j` and weight
/// row `i` (`out` is row-major `[a.rows() x w.rows()]`). Each weight block loaded is used for
/// up to 4 activation rows at once; weight rows are split into chunks over the pool.
pub fn matmul(
    path: KernelPath,
    w: &QMatrix,
    a: &QActs,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), Error> {
    if !path.is_available() {
        return Err(Error::PathUnavailable(path));
    }
    if a.cols != w.cols || a.kp != w.kp {
        return Err(Error::ShapeMismatch {
            what: "matmul activation columns",
            expected: w.cols,
            got: a.cols,
        });
    }
    let (n, m) = (a.rows, w.rows);
    if out.len() != n * m {
        return Err(Error::ShapeMismatch {
            what: "matmul output length",
            expected: n * m,
            got: out.len(),
        });
    }
    if n == 0 || m == 0 {
        return Ok(());
    }
    // Interleaved Q6_K has tiles on the VNNI and AMX paths only; others read it portably.
    let six_il = w.il && w.layout == Layout::U6;
    #[cfg(target_arch = "x86_64")]
    if w.il
        && path != KernelPath::Scalar
        && (!six_il || matches!(path, KernelPath::Avx512Vnni | KernelPath::Amx))
    {
        matmul_il(path, w, a, out, pool);
        return Ok(());
    }
    // An interleaved matrix on the scalar path: the portable code reads any arrangement.
    let path = if w.il { KernelPath::Scalar } else { path };
    // About eight chunks per thread (of at least 16 rows) so that a slow (descheduled) thread
    // costs little and the last chunk leaves little idle time.
    let per = m.div_ceil(pool.threads() * 8).max(16).div_ceil(4) * 4;
    let n_chunks = m.div_ceil(per);
    let nr_max = path.max_nr();
    let outp = OutPtr(out.as_mut_ptr());
    let job = |ci: usize| {
        let outp = &outp;
        let (start, end) = (ci * per, ((ci + 1) * per).min(m));
        let mut r = start;
        while r < end {
            let mr = if end - r >= 4 { 4 } else { 1 };
            let mut a0 = 0;
            while a0 < n {
                let nr = nr_max.min(n - a0);
                let mut res = [[0f32; 4]; 4];
                run_tile(path, w, r, mr, a, a0, nr, &mut res);
                for (i, res_i) in res.iter().enumerate().take(mr) {
                    for (j, &v) in res_i.iter().enumerate().take(nr) {
                        // SAFETY: (a0 + j) < n and (r + i) < m, so the index is inside `out`;
                        // weight row r + i belongs to this chunk only.
                        unsafe { *outp.0.add((a0 + j) * m + r + i) = v };
                    }
                }
                a0 += nr;
            }
            r += mr;
        }
    };
    pool.run(n_chunks, &job);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
type IlTileFn = unsafe fn(&QMatrix, usize, &QActs, usize, *mut f32, usize);

#[cfg(target_arch = "x86_64")]
macro_rules! pick_il {
    ($t:path, $layout:expr, $nr:expr, [$($n:literal),*]) => {{
        use $t as t;
        match ($layout, $nr) {
            $(
                (Layout::S8, $n) => t::<L_S8, $n> as IlTileFn,
                (Layout::U5, $n) => t::<L_U5, $n> as IlTileFn,
                (Layout::U5Min, $n) => t::<L_U5M, $n> as IlTileFn,
                (Layout::U6, $n) => t::<L_U6, $n> as IlTileFn,
                (_, $n) => t::<L_U4, $n> as IlTileFn,
            )*
            _ => unreachable!("at most the path's activation rows per interleaved tile"),
        }
    }};
}

/// An interleaved matrix on a SIMD path: chunks of 16-row groups over the pool, each group
/// meeting the activation rows 8 at a time (on AMX, 16 at a time and the remainder 8 at a time);
/// the AVX-512 BW path runs the AVX2 tile. Shapes and the path were checked by [`matmul`].
#[cfg(target_arch = "x86_64")]
fn matmul_il(path: KernelPath, w: &QMatrix, a: &QActs, out: &mut [f32], pool: &ThreadPool) {
    let (n, m) = (a.rows, w.rows);
    let groups = m / 16;
    let per = groups.div_ceil(pool.threads() * 8).max(1);
    let n_chunks = groups.div_ceil(per);
    let vnni = matches!(path, KernelPath::Avx512Vnni | KernelPath::Amx);
    let amx_chunks = if path == KernelPath::Amx {
        n / crate::x86_amx::ROWS
    } else {
        0
    };
    let nr_max = if vnni { 8 } else { crate::x86_avx2_il::NR_MAX };
    let layout = w.layout;
    let outp = OutPtr(out.as_mut_ptr());
    let job = |ci: usize| {
        let outp = &outp;
        // SAFETY: `matmul` checked that the AMX path is available.
        let mut tiles = (amx_chunks > 0).then(|| unsafe { crate::x86_amx::Tiles::new(layout) });
        for g in ci * per..((ci + 1) * per).min(groups) {
            if let Some(tiles) = tiles.as_mut() {
                let f = match layout {
                    Layout::S8 => crate::x86_amx::group::<L_S8>,
                    Layout::U5 => crate::x86_amx::group::<L_U5>,
                    Layout::U5Min => crate::x86_amx::group::<L_U5M>,
                    Layout::U6 => crate::x86_amx::group::<L_U6>,
                    Layout::U4Min => crate::x86_amx::group::<L_U4>,
                };
                // SAFETY: as for the tiles below; `tiles` was made on this thread, and the
                // first 16 * amx_chunks <= n activation rows exist.
                unsafe { f(tiles, w, g, a, amx_chunks, outp.0, m) };
            }
            let mut a0 = amx_chunks * crate::x86_amx::ROWS;
            while a0 < n {
                let nr = (n - a0).min(nr_max);
                let f = if vnni {
                    pick_il!(
                        crate::x86_avx512::tile_il,
                        layout,
                        nr,
                        [1, 2, 3, 4, 5, 6, 7, 8]
                    )
                } else {
                    pick_il!(
                        crate::x86_avx2_il::tile_il,
                        layout,
                        nr,
                        [1, 2, 3, 4, 5, 6, 7, 8]
                    )
                };
                // SAFETY: `matmul` checked the path is available (AVX-512 implies AVX2) and
                // the shapes (w is interleaved, so its layout is not U6 and its rows are a
                // multiple of 16); g < m / 16, nr is at most the tile's, a0 + nr <= n, `out`
                // holds n * m floats, and the 16 outputs of group g in each activation row
                // belong to this chunk only.
                unsafe { f(w, g, a, a0, outp.0, m) };
                a0 += nr;
            }
        }
    };
    pool.run(n_chunks, &job);
}

/// Quantizes `x` (`n` rows of `w.cols()`) into `scratch`, then runs [`matmul`].
pub fn matmul_f32(
    path: KernelPath,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut QActs,
    pool: &ThreadPool,
) -> Result<(), Error> {
    scratch.quantize(x, n, w.cols)?;
    matmul(path, w, scratch, out, pool)
}
