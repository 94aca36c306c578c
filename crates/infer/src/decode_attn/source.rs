//! The decode attention kernels' CUDA source, compiled by NVRTC at first use (`super::ptx`):
//! the register kernel for heads of 64 or 128 values, the first (tiled) kernel for every other
//! shape, and the merge of a row's splits.

/// The kernels' source (after [`hearth_gpu::kernels::PRELUDE`]).
pub(super) const SOURCE: &str = r#"
#define NONE 0xffffffffu
#define TILE 128u
#define MAX_GROUP 16
// Grid (n_kv, rows, splits), 256 threads. Block (kvh, r, s) attends row r's query heads
// kvh * group .. + group to the positions [s * chunk, (s + 1) * chunk) (within the row's length
// and window), TILE at a time: a thread per position for the scores (one K row read for all the
// group's heads), a warp per head for the online softmax, a thread per (head, dim) for the
// weighted V sum. One split writes `out`; several write their unnormalised sums, maxima and
// sums to `part_o`/`part_ml`, which `decode_attn_combine` merges.
// Shared: q scaled (group * hd), scores (group * TILE), each head's running max, sum and
// correction (3 * group), the tile's pool rows (TILE).
template <typename C>
__device__ void decode_attn(const typename C::T *q, const typename C::T *k,
                            const typename C::T *v, const unsigned int *meta,
                            typename C::T *out, float *part_o, float *part_ml, unsigned int nb,
                            unsigned int n_head, unsigned int group, unsigned int hd,
                            unsigned int kv_dim, unsigned int pool_rows, unsigned int window,
                            unsigned int chunk, float scale) {
    const unsigned int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const unsigned int rows = gridDim.y, splits = gridDim.z;
    const unsigned int tid = threadIdx.x, bd = blockDim.x, lane = tid % 32, warp = tid / 32;
    const unsigned int *blocks = meta + (size_t)r * nb;
    const unsigned int len = meta[(size_t)rows * nb + r];
    const unsigned int start = (window > 0 && len > window) ? len - window : 0;
    const unsigned int lo = max(start, s * chunk), hi = min(len, (s + 1) * chunk);
    const size_t head0 = (size_t)r * n_head + (size_t)kvh * group;
    const unsigned int kv_off = kvh * hd;
    const float neg_inf = __int_as_float(0xff800000);
    extern __shared__ float sh[];
    float *qs = sh;
    float *sc = qs + group * hd;
    float *run_m = sc + group * TILE;
    float *run_l = run_m + group;
    float *corr = run_l + group;
    unsigned int *at = (unsigned int *)(corr + group);
    for (unsigned int i = tid; i < group * hd; i += bd) qs[i] = C::load(q[head0 * hd + i]) * scale;
    for (unsigned int g = tid; g < group; g += bd) { run_m[g] = neg_inf; run_l[g] = 0.f; }
    // Each thread's (head, dim) pairs: j = tid + bd * t.
    float o[MAX_GROUP];
    #pragma unroll
    for (int t = 0; t < MAX_GROUP; ++t) o[t] = 0.f;
    const unsigned int pairs = group * hd;
    for (unsigned int t0 = lo; t0 < hi; t0 += TILE) {
        const unsigned int n = min(TILE, hi - t0);
        __syncthreads();  // the previous tile's readers are done (and qs is written)
        for (unsigned int i = tid; i < n; i += bd) {
            const unsigned int p = t0 + i, block = blocks[p / 16];
            // A bad id is never followed out of the pool: the position is left out.
            at[i] = block < pool_rows / 16 ? block * 16 + p % 16 : NONE;
        }
        __syncthreads();
        for (unsigned int i = tid; i < n; i += bd) {
            float acc[MAX_GROUP];
            #pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) acc[g] = 0.f;
            const unsigned int row = at[i];
            if (row != NONE) {
                const typename C::T *krow = k + (size_t)row * kv_dim + kv_off;
                // Unrolled so that a row's loads are in flight together (8 cover hd 64).
                #pragma unroll 8
                for (unsigned int d0 = 0; d0 < hd; d0 += 8) {
                    float kf[8];
                    C::load8(krow + d0, kf);
                    #pragma unroll
                    for (int g = 0; g < MAX_GROUP; ++g) {
                        if (g < (int)group) {
                            const float *qg = qs + g * hd + d0;
                            float x = 0.f;
                            #pragma unroll
                            for (int j = 0; j < 8; ++j) x += qg[j] * kf[j];
                            acc[g] += x;
                        }
                    }
                }
            }
            #pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g)
                if (g < (int)group) sc[g * TILE + i] = row != NONE ? acc[g] : neg_inf;
        }
        __syncthreads();
        for (unsigned int g = warp; g < group; g += bd / 32) {
            float *e = sc + g * TILE;
            float m = neg_inf;
            for (unsigned int i = lane; i < n; i += 32) m = fmaxf(m, e[i]);
            #pragma unroll
            for (int x = 16; x > 0; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
            const float m_new = fmaxf(run_m[g], m);
            float l = 0.f;
            for (unsigned int i = lane; i < n; i += 32) {
                const float ei = e[i] == neg_inf ? 0.f : __expf(e[i] - m_new);
                e[i] = ei;
                l += ei;
            }
            #pragma unroll
            for (int x = 16; x > 0; x >>= 1) l += __shfl_xor_sync(0xffffffffu, l, x);
            __syncwarp();
            if (lane == 0) {
                const float c = run_m[g] == neg_inf ? 0.f : __expf(run_m[g] - m_new);
                corr[g] = c;
                run_l[g] = run_l[g] * c + l;
                run_m[g] = m_new;
            }
        }
        __syncthreads();
        #pragma unroll
        for (int t = 0; t < MAX_GROUP; ++t) {
            const unsigned int j = tid + bd * t;
            if (j < pairs) {
                const unsigned int g = j / hd, d = j % hd;
                const float *e = sc + g * TILE;
                const typename C::T *vcol = v + kv_off + d;
                float x = o[t] * corr[g];
                // 16 positions' loads in flight at a time (a split of one block at once).
                #pragma unroll 16
                for (unsigned int i = 0; i < n; ++i) {
                    const unsigned int row = at[i];
                    if (row != NONE) x += e[i] * C::load(vcol[(size_t)row * kv_dim]);
                }
                o[t] = x;
            }
        }
    }
    __syncthreads();
    #pragma unroll
    for (int t = 0; t < MAX_GROUP; ++t) {
        const unsigned int j = tid + bd * t;
        if (j < pairs) {
            const unsigned int g = j / hd, d = j % hd;
            // An empty range (lo >= hi) leaves run_l at 0: the merge skips it.
            if (splits == 1) {
                const float l = run_l[g];
                out[(head0 + g) * hd + d] = C::store(l > 0.f ? o[t] / l : 0.f);
            } else {
                part_o[((head0 + g) * splits + s) * hd + d] = o[t];
            }
        }
    }
    if (splits > 1)
        for (unsigned int g = tid; g < group; g += bd) {
            part_ml[((head0 + g) * splits + s) * 2] = run_m[g];
            part_ml[((head0 + g) * splits + s) * 2 + 1] = run_l[g];
        }
}

// Grid (rows * n_head): merges one head's splits into `out`. Shared: each split's maximum and
// sum (2 * splits), read in parallel.
template <typename C>
__device__ void decode_attn_combine(const float *__restrict__ part_o,
                                    const float *__restrict__ part_ml,
                                    typename C::T *__restrict__ out, unsigned int splits,
                                    unsigned int hd) {
    const size_t head = blockIdx.x;
    const float *ml = part_ml + head * splits * 2;
    const float neg_inf = __int_as_float(0xff800000);
    extern __shared__ float sh[];
    float *sm = sh, *sl = sh + splits;
    for (unsigned int s = threadIdx.x; s < splits; s += blockDim.x) {
        sm[s] = ml[2 * s];
        sl[s] = ml[2 * s + 1];
    }
    __syncthreads();
    float mx = neg_inf;
    for (unsigned int s = 0; s < splits; ++s)
        if (sl[s] > 0.f) mx = fmaxf(mx, sm[s]);
    float total = 0.f;
    for (unsigned int s = 0; s < splits; ++s)
        if (sl[s] > 0.f) total += sl[s] * __expf(sm[s] - mx);
    for (unsigned int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        #pragma unroll 8
        for (unsigned int s = 0; s < splits; ++s)
            if (sl[s] > 0.f) o += part_o[(head * splits + s) * hd + d] * __expf(sm[s] - mx);
        out[head * hd + d] = C::store(total > 0.f ? o / total : 0.f);
    }
}

#define VEC_PIECE 64u
// The register kernel, for heads of 8 * L values (L = 8 or 16) and at most GMAX query heads a KV
// head. Grid (n_kv, rows, splits) as above, 256 threads: L lanes take a position, 8 of its
// dimensions each, so a pass covers 256 / L positions and a round R passes, whose K and V rows
// are all loaded at once (16-byte loads) before any is used. A position's score is its lanes'
// dot products summed by shuffles; each thread keeps the online softmax of its own positions
// (maximum, sum and 8 outputs for every query head) in registers; at the end the positions of a
// warp merge by shuffles and the warps through shared memory, and the block writes `out` (one
// split) or its partial sums (several), which the last of the row's splits to finish merges into
// `out` itself (no second kernel). The block table is staged in shared memory, VEC_PIECE blocks
// at a time, so that a round waits on one load, not two.
template <typename C, unsigned int L, unsigned int GMAX, unsigned int R>
__device__ void decode_attn_vec(const typename C::T *q, const typename C::T *k,
                                const typename C::T *v, unsigned int *meta,
                                typename C::T *out, float *part_o, float *part_ml,
                                unsigned int nb, unsigned int n_head, unsigned int group,
                                unsigned int kv_dim, unsigned int pool_rows,
                                unsigned int window, unsigned int chunk, float scale) {
    const unsigned int hd = 8 * L;
    const unsigned int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const unsigned int rows = gridDim.y, splits = gridDim.z;
    const unsigned int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const unsigned int warps = blockDim.x / 32, sub = tid % L, slot = tid / L;
    const unsigned int per_pass = blockDim.x / L;
    const unsigned int *blocks = meta + (size_t)r * nb;
    const unsigned int len = min(meta[(size_t)rows * nb + r], nb * 16);
    const unsigned int start = (window > 0 && len > window) ? len - window : 0;
    const unsigned int lo = max(start, s * chunk), hi = min(len, (s + 1) * chunk);
    const size_t head0 = (size_t)r * n_head + (size_t)kvh * group;
    const unsigned int off = kvh * hd + sub * 8;
    const float neg_inf = __int_as_float(0xff800000);
    extern __shared__ float sh[];
    float *sm_ml = sh;
    float *sm_o = sm_ml + 2 * warps * group;
    unsigned int *ids = (unsigned int *)(sm_o + warps * group * hd);
    float qf[GMAX][8], o[GMAX][8], m[GMAX], l[GMAX];
    #pragma unroll
    for (int g = 0; g < (int)GMAX; ++g) {
        m[g] = neg_inf;
        l[g] = 0.f;
        #pragma unroll
        for (int j = 0; j < 8; ++j) { o[g][j] = 0.f; qf[g][j] = 0.f; }
        if (g < (int)group) {
            C::load8(q + (head0 + g) * hd + sub * 8, qf[g]);
            #pragma unroll
            for (int j = 0; j < 8; ++j) qf[g][j] *= scale;
        }
    }
    // The split's first piece of the table is staged while the row's length is still on its
    // way (the split starts at a whole block, whatever the length), so that the K and V loads
    // wait on one round trip, not two. A window that starts later stages again.
    unsigned int staged = s * chunk / 16;
    for (unsigned int i = tid; i < VEC_PIECE && staged + i < nb; i += blockDim.x)
        ids[i] = blocks[staged + i];
    __syncthreads();
    for (unsigned int pb = lo / 16; pb * 16 < hi; pb += VEC_PIECE) {
        if (pb != staged) {
            __syncthreads();  // the previous piece's readers are done
            for (unsigned int i = tid; i < VEC_PIECE && pb + i < nb; i += blockDim.x)
                ids[i] = blocks[pb + i];
            __syncthreads();
            staged = pb;
        }
        const unsigned int plo = max(lo, pb * 16), phi = min(hi, (pb + VEC_PIECE) * 16);
        for (unsigned int p0 = plo; p0 < phi; p0 += R * per_pass) {
            float kf[R][8], vf[R][8];
            unsigned int row[R];
            #pragma unroll
            for (int t = 0; t < (int)R; ++t) {
                const unsigned int p = p0 + t * per_pass + slot;
                row[t] = NONE;
                if (p < phi) {
                    const unsigned int b = ids[p / 16 - pb];
                    // A bad id is never followed out of the pool: the position is left out.
                    if (b < pool_rows / 16) row[t] = b * 16 + p % 16;
                }
                if (row[t] != NONE) {
                    C::load8(k + (size_t)row[t] * kv_dim + off, kf[t]);
                    C::load8(v + (size_t)row[t] * kv_dim + off, vf[t]);
                } else {
                    #pragma unroll
                    for (int j = 0; j < 8; ++j) { kf[t][j] = 0.f; vf[t][j] = 0.f; }
                }
            }
            // Every score of the round first (independent chains, in flight together), then
            // each head's online softmax over the round's positions at once.
            float sc[R][GMAX];
            #pragma unroll
            for (int t = 0; t < (int)R; ++t) {
                #pragma unroll
                for (int g = 0; g < (int)GMAX; ++g) {
                    sc[t][g] = neg_inf;
                    if (g < (int)group) {
                        float x = 0.f;
                        #pragma unroll
                        for (int j = 0; j < 8; ++j) x += qf[g][j] * kf[t][j];
                        #pragma unroll
                        for (unsigned int sh2 = L / 2; sh2 > 0; sh2 >>= 1)
                            x += __shfl_xor_sync(0xffffffffu, x, sh2);
                        if (row[t] != NONE) sc[t][g] = x;
                    }
                }
            }
            #pragma unroll
            for (int g = 0; g < (int)GMAX; ++g) {
                if (g < (int)group) {
                    float mn = m[g];
                    #pragma unroll
                    for (int t = 0; t < (int)R; ++t) mn = fmaxf(mn, sc[t][g]);
                    if (mn != neg_inf) {
                        const float c = m[g] == neg_inf ? 0.f : __expf(m[g] - mn);
                        float pr[R];
                        float sum = l[g] * c;
                        #pragma unroll
                        for (int t = 0; t < (int)R; ++t) {
                            pr[t] = sc[t][g] == neg_inf ? 0.f : __expf(sc[t][g] - mn);
                            sum += pr[t];
                        }
                        l[g] = sum;
                        #pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            float a = o[g][j] * c;
                            #pragma unroll
                            for (int t = 0; t < (int)R; ++t) a += pr[t] * vf[t][j];
                            o[g][j] = a;
                        }
                        m[g] = mn;
                    }
                }
            }
        }
    }
    // The positions of a warp (lanes L, 2L, .. apart) merge into every lane.
    #pragma unroll
    for (unsigned int x = L; x < 32; x <<= 1) {
        #pragma unroll
        for (int g = 0; g < (int)GMAX; ++g) {
            if (g < (int)group) {
                const float m2 = __shfl_xor_sync(0xffffffffu, m[g], x);
                const float l2 = __shfl_xor_sync(0xffffffffu, l[g], x);
                float o2[8];
                #pragma unroll
                for (int j = 0; j < 8; ++j) o2[j] = __shfl_xor_sync(0xffffffffu, o[g][j], x);
                const float mn = fmaxf(m[g], m2);
                const float ca = m[g] == neg_inf ? 0.f : __expf(m[g] - mn);
                const float cb = m2 == neg_inf ? 0.f : __expf(m2 - mn);
                l[g] = l[g] * ca + l2 * cb;
                #pragma unroll
                for (int j = 0; j < 8; ++j) o[g][j] = o[g][j] * ca + o2[j] * cb;
                m[g] = mn;
            }
        }
    }
    if (lane < L) {
        #pragma unroll
        for (int g = 0; g < (int)GMAX; ++g) {
            if (g < (int)group) {
                float *so = sm_o + ((size_t)warp * group + g) * hd + sub * 8;
                #pragma unroll
                for (int j = 0; j < 8; ++j) so[j] = o[g][j];
                if (sub == 0) {
                    sm_ml[(warp * group + g) * 2] = m[g];
                    sm_ml[(warp * group + g) * 2 + 1] = l[g];
                }
            }
        }
    }
    __syncthreads();
    // The warps merge: a thread per (head, dimension).
    for (unsigned int j = tid; j < group * hd; j += blockDim.x) {
        const unsigned int g = j / hd, d = j % hd;
        float mx = neg_inf;
        for (unsigned int w = 0; w < warps; ++w) mx = fmaxf(mx, sm_ml[(w * group + g) * 2]);
        float total = 0.f, acc = 0.f;
        if (mx != neg_inf)
            for (unsigned int w = 0; w < warps; ++w) {
                const float mw = sm_ml[(w * group + g) * 2];
                if (mw != neg_inf) {
                    const float c = __expf(mw - mx);
                    total += sm_ml[(w * group + g) * 2 + 1] * c;
                    acc += sm_o[((size_t)w * group + g) * hd + d] * c;
                }
            }
        // An empty range (lo >= hi) leaves total at 0: the merge skips it.
        if (splits == 1) {
            out[(head0 + g) * hd + d] = C::store(total > 0.f ? acc / total : 0.f);
        } else {
            part_o[((head0 + g) * splits + s) * hd + d] = acc;
            if (d == 0) {
                part_ml[((head0 + g) * splits + s) * 2] = mx;
                part_ml[((head0 + g) * splits + s) * 2 + 1] = total;
            }
        }
    }
    if (splits == 1) return;
    // The last of the (row, KV head)'s splits to finish merges them all, in split order
    // (whichever block that is, the sums are the same). Its ticket is the row's counter after
    // the block table and the lengths; it puts the counter back to 0 for the next call.
    __shared__ unsigned int last;
    __threadfence();  // this block's partial sums are visible before its ticket is taken
    __syncthreads();
    unsigned int *count = meta + (size_t)rows * (nb + 1) + (size_t)r * gridDim.x + kvh;
    if (tid == 0) last = atomicAdd(count, 1u) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // A thread per (head, dimension): the splits' maxima, sums and partial outputs are loaded 8
    // splits at a time, all in flight together (one round trip for up to 8 splits), and merged
    // in split order with a running maximum.
    for (unsigned int j = tid; j < group * hd; j += blockDim.x) {
        const size_t head = head0 + j / hd;
        const unsigned int d = j % hd;
        const float *ml = part_ml + head * splits * 2;
        const float *po = part_o + head * splits * hd + d;
        float mx = neg_inf, total = 0.f, acc = 0.f;
        for (unsigned int t0 = 0; t0 < splits; t0 += 8) {
            float mv[8], lv[8], pv[8];
            #pragma unroll
            for (unsigned int u = 0; u < 8; ++u) {
                lv[u] = 0.f;
                if (t0 + u < splits) {
                    mv[u] = __ldcg(ml + 2 * (t0 + u));
                    lv[u] = __ldcg(ml + 2 * (t0 + u) + 1);
                    pv[u] = __ldcg(po + (size_t)(t0 + u) * hd);
                }
            }
            #pragma unroll
            for (unsigned int u = 0; u < 8; ++u) {
                // An empty split (sum 0) is skipped.
                if (lv[u] > 0.f) {
                    const float mn = fmaxf(mx, mv[u]);
                    const float ca = mx == neg_inf ? 0.f : __expf(mx - mn);
                    const float cb = __expf(mv[u] - mn);
                    total = total * ca + lv[u] * cb;
                    acc = acc * ca + pv[u] * cb;
                    mx = mn;
                }
            }
        }
        out[head * hd + d] = C::store(total > 0.f ? acc / total : 0.f);
    }
    if (tid == 0) *count = 0u;
}

#define DECODE_ATTN_VEC(NAME, C, L, G, R)                                                     \
extern "C" __global__ void __launch_bounds__(256) NAME(const C::T *q, const C::T *k,         \
    const C::T *v, unsigned int *meta, C::T *out, float *part_o, float *part_ml,              \
    unsigned int nb, unsigned int n_head, unsigned int group, unsigned int hd,                \
    unsigned int kv_dim, unsigned int pool_rows, unsigned int window, unsigned int chunk,     \
    float scale) {                                                                            \
    decode_attn_vec<C, L, G, R>(q, k, v, meta, out, part_o, part_ml, nb, n_head, group,       \
                                kv_dim, pool_rows, window, chunk, scale);                     \
}
#define DECODE_ATTN_VECS(NAME, C)                                                             \
DECODE_ATTN_VEC(NAME##_vec_l8_g4, C, 8, 4, 4)                                                 \
DECODE_ATTN_VEC(NAME##_vec_l8_g8, C, 8, 8, 2)                                                 \
DECODE_ATTN_VEC(NAME##_vec_l16_g4, C, 16, 4, 4)                                               \
DECODE_ATTN_VEC(NAME##_vec_l16_g8, C, 16, 8, 2)
DECODE_ATTN_VECS(decode_attn_f32, F32)
DECODE_ATTN_VECS(decode_attn_f16, F16)
DECODE_ATTN_VECS(decode_attn_bf16, BF16)

#define DECODE_ATTN(NAME, C)                                                                  \
extern "C" __global__ void NAME(const C::T *q, const C::T *k, const C::T *v,                 \
    const unsigned int *meta, C::T *out, float *part_o, float *part_ml, unsigned int nb,      \
    unsigned int n_head, unsigned int group, unsigned int hd, unsigned int kv_dim,            \
    unsigned int pool_rows, unsigned int window, unsigned int chunk, float scale) {           \
    decode_attn<C>(q, k, v, meta, out, part_o, part_ml, nb, n_head, group, hd, kv_dim,        \
                   pool_rows, window, chunk, scale);                                          \
}                                                                                             \
extern "C" __global__ void NAME##_combine(const float *part_o, const float *part_ml,         \
    C::T *out, unsigned int splits, unsigned int hd) {                                        \
    decode_attn_combine<C>(part_o, part_ml, out, splits, hd);                                 \
}
DECODE_ATTN(decode_attn_f32, F32)
DECODE_ATTN(decode_attn_f16, F16)
DECODE_ATTN(decode_attn_bf16, BF16)
"#;
