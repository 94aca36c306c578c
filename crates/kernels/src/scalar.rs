//! The portable scalar path over the packed layout: the same arithmetic as the SIMD tiles
//! (exact integer dot per 4-element lane, then per-lane scales), one lane at a time.

use crate::acts::QActs;
use crate::pack::{Layout, QMatrix};

/// Computes `res[i][j] = dot(w row r0+i, act row a0+j)` for `i < mr`, `j < nr`.
/// Callers guarantee the rows exist and `a.kp == w.kp`.
pub(crate) fn tile(
    w: &QMatrix,
    r0: usize,
    mr: usize,
    a: &QActs,
    a0: usize,
    nr: usize,
    res: &mut [[f32; 4]; 4],
) {
    let has_min = w.layout != Layout::S8;
    let mut q = vec![0i32; w.kp];
    for (i, res_i) in res.iter_mut().enumerate().take(mr) {
        let r = r0 + i;
        for (e, qe) in q.iter_mut().enumerate() {
            *qe = w.q_at(r, e);
        }
        for (j, out) in res_i.iter_mut().enumerate().take(nr) {
            let row = a0 + j;
            let aq = &a.qs[row * a.kp..(row + 1) * a.kp];
            let mut lanes = [0f32; 16];
            for lane in 0..w.kp / 4 {
                let e = 4 * lane;
                let dot: i32 = (0..4).map(|k| q[e + k] * aq[e + k] as i32).sum();
                let (s, m) = w.scale_min_at(r, e);
                let al = (row * a.kp) / 4 + lane;
                let acc = &mut lanes[lane % 16];
                *acc += dot as f32 * a.lane_scale[al] * s;
                if has_min {
                    *acc += m * a.lane_sum[al];
                }
            }
            *out = lanes.iter().sum();
        }
    }
}
