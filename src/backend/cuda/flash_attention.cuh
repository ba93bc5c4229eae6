/* Causal attention on tensor cores, register-resident (FlashAttention-2 on mma.sync):
 * bf16 operands, fp32 accumulation, head size 32 or 64. A block of 4 warps takes 64
 * query rows (forward, dQ) or 64 keys (dK/dV) of one (batch, head); each warp owns 16 of
 * them and keeps its scores, probabilities and output in registers: the score tile
 * S = Q·Kᵀ comes out of the mma in the C layout, which is, pair by pair, the A layout of
 * the next product P·V (the FlashAttention-2 trick), so nothing goes through shared
 * memory but the K/V (Q/dO) tiles the block shares. The forward keeps each row's running
 * max and sum and stores the log-sum-exp; the backward recomputes P from it in two
 * kernels (dK/dV per key tile, dQ per query tile), each summing in a fixed order, so the
 * results repeat bit for bit (no atomics). Scores are handled in log2 units (exp2).
 *
 * Written against warp_mma.cuh's primitives only, so tests/test_flash_sim.cpp runs these
 * very kernels on host threads (tests/warp_sim.h) against a double-precision reference.
 * qkv is [B, T, 3C] (q | k | v, head h at columns h·HS), out and dout [B, T, C], lse and
 * D (= rowsum(dO∘O)) [B·NH, T]; C % 8 == 0. The grid is (B·NH, T/64 tiles): blocks start
 * in order of x fastest, so every head's longest tiles (most keys or queries to visit)
 * run first and the short ones fill the tail.
 * Documents: seg [B, T] (NULL: none) gives each query its first visible key, row-relative
 * and non-decreasing along the row (ops.h). Key tiles before a block's first document
 * start are neither loaded nor multiplied, a warp skips the tiles none of its rows sees,
 * the dK/dV kernel stops at the first query tile whose documents all start after its
 * keys, and inside a tile the earlier documents' keys are masked like the future ones. */
#ifndef DT_FLASH_ATTENTION_CUH
#define DT_FLASH_ATTENTION_CUH
#include "warp_mma.cuh"

namespace dt_fa {

enum { BR = 64, BC = 64, WARPS = 4, THREADS = 128, NT = BC / 8 /* score n-tiles */ };
static const float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

template <int HS> struct shape {
    enum { LH = HS + 8, /* smem row stride: 16 bytes of padding keep ldmatrix's 8 rows in distinct banks */
           KS = HS / 16, /* k-steps over the head */
           OT = HS / 8 /* output n-tiles */ };
};

/* Starts copying rows [r0, r0+64) (HS columns, row stride `stride`) into shared
 * [64][LH] (cp.async; the caller commits and waits); rows at or past T become zero. */
template <int HS>
static __device__ __forceinline__ void load_tile(bf16 *dst, const bf16 *src, int r0, int T, int stride) {
    enum { PER_ROW = HS / 8, LH = shape<HS>::LH };
    for (int e = threadIdx.x; e < 64 * PER_ROW; e += THREADS) {
        int r = e / PER_ROW, v = e % PER_ROW, valid = r0 + r < T;
        dt_cp_async16(dst + r * LH + v * 8, src + (size_t)(valid ? r0 + r : 0) * stride + v * 8, valid);
    }
}

/* K/V tiles (double-buffered, [K | V] per buffer): kbase is the head's K column in row
 * 0, V lies C columns after it. load_kv starts key tile `tile`'s copy into its buffer;
 * kv_wait starts the next tile's (if any) and waits until tile `tile` is in shared memory
 * for every thread, returning its buffer. */
template <int HS>
static __device__ __forceinline__ void load_kv(bf16 *KV, const bf16 *kbase, int tile, int T, int C, int C3) {
    enum { LH = shape<HS>::LH };
    bf16 *buf = KV + (tile & 1) * 2 * BC * LH;
    load_tile<HS>(buf, kbase, tile * BC, T, C3);
    load_tile<HS>(buf + BC * LH, kbase + C, tile * BC, T, C3);
}
template <int HS>
static __device__ __forceinline__ const bf16 *kv_wait(bf16 *KV, const bf16 *kbase, int tile, int ntiles, int T, int C,
                                                      int C3) {
    if (tile + 1 < ntiles) { /* the next tile's copy runs during this one's work */
        load_kv<HS>(KV, kbase, tile + 1, T, C, C3);
        dt_cp_async_commit();
        dt_cp_async_wait<1>();
    } else {
        dt_cp_async_wait<0>();
    }
    dt_syncthreads();
    return KV + (tile & 1) * 2 * BC * shape<HS>::LH;
}

/* out[mt] += A[mt]·B for MT 16-row tiles of A given as fragments (a[mt][k]: k-step k), over
 * K k-steps and N pairs of 8-column n-tiles (out[mt][2n], out[mt][2n + 1]); B in shared
 * memory with row stride LH, read as Bᵀ when BT (stored [n][k]: S = Q·Kᵀ), else as stored
 * ([k][n]: P·V). Each B fragment loaded serves all MT tiles. */
template <int LH, int MT, int K, int N, bool BT, int AK, int ON>
static __device__ __forceinline__ void mma_tiles(float (*out)[ON][4], const uint32_t (*a)[AK][4], const bf16 *B,
                                                 int lane) {
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int n = 0; n < N; n++) {
            uint32_t b[4];
            if (BT) dt_frag_b_nk<LH>(b, B + n * 16 * LH + k * 16, lane);
            else dt_frag_b_kn<LH>(b, B + k * 16 * LH + n * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                dt_mma_bf16(out[mt][2 * n], a[mt][k], b[0], b[1]);
                dt_mma_bf16(out[mt][2 * n + 1], a[mt][k], b[2], b[3]);
            }
        }
}

/* s[mt][16][64] = A[mt]·Bᵀ (mt < MT; s and a point at MT tiles) for MT 16-row tiles of A (fragments over the head), B 64 rows
 * of [.][LH] */
template <int HS, int MT>
static __device__ __forceinline__ void scores_mt(float (*s)[NT][4], const uint32_t (*a)[HS / 16][4], const bf16 *B,
                                                 int lane) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
    mma_tiles<shape<HS>::LH, MT, HS / 16, NT / 2, true>(s, a, B, lane);
}
template <int HS>
static __device__ __forceinline__ void scores(float (&s)[NT][4], const uint32_t (&a)[HS / 16][4], const bf16 *B,
                                              int lane) {
    scores_mt<HS, 1>(&s, &a, B, lane);
}

/* acc[mt][16][HS] += P[mt]·B: P the MT 16×64 tiles as A fragments (pa[mt][kk] covers
 * columns 16kk..16kk+15), B 64 rows of [.][LH] (rows = P's columns) */
template <int HS, int MT>
static __device__ __forceinline__ void acc_pb_mt(float (*acc)[HS / 8][4], const uint32_t (*pa)[BC / 16][4],
                                                 const bf16 *B, int lane) {
    mma_tiles<shape<HS>::LH, MT, BC / 16, HS / 16, false>(acc, pa, B, lane);
}
template <int HS>
static __device__ __forceinline__ void acc_pb(float (&acc)[HS / 8][4], const uint32_t (&pa)[BC / 16][4], const bf16 *B,
                                              int lane) {
    acc_pb_mt<HS, 1>(&acc, &pa, B, lane);
}

/* the A-fragment slot of score tile j's half h (rows g or g+8): C layout -> A layout */
#define DT_FA_SLOT(pa, j, h) pa[(j) / 2][((j)&1) * 2 + (h)]

/* the warp's 16 rows, 4 bf16 per lane per n-tile: rows g and g+8, columns 2t, 2t+1 */
template <int HS>
static __device__ __forceinline__ void store_rows(bf16 *dst, size_t row_stride, int row0, int T,
                                                  const float (&acc)[HS / 8][4], const float scale[2], int lane) {
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = row0 + g + 8 * h;
        if (row >= T) continue;
        bf16 *d = dst + (size_t)row * row_stride + 2 * t;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            *(uint32_t *)(d + 8 * n) = dt_pack_bf16(acc[n][2 * h] * scale[h], acc[n][2 * h + 1] * scale[h]);
    }
}

/* Forward: a block takes 64·MT query rows, each warp 16·MT of them (MT 16-row tiles that
 * share every K and V fragment it loads: MT 2 halves the shared-memory reads per product,
 * as FlashAttention-2's 32-row warps do, for more registers). */
template <int HS, int MT>
__global__ void __launch_bounds__(THREADS) fwd_k(bf16 *out, float *lse, const bf16 *qkv, const int *seg, int T, int C,
                                                 int NH, float scale) {
    enum { LH = shape<HS>::LH, KS = shape<HS>::KS, OT = shape<HS>::OT, ROWS = BR * MT };
    DT_DYN_SMEM(smem);
    bf16 *Qs = (bf16 *)smem, *KV = Qs + ROWS * LH; /* two K/V buffers: [K | V] each */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x, b = bh / NH, head = bh % NH, C3 = 3 * C;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ROWS, qw = q0 + warp * 16 * MT; /* longest first */
    const bf16 *base = qkv + (size_t)b * T * C3 + head * HS;
    const float sl2 = scale * LOG2E;
    const int *sg = seg ? seg + (size_t)b * T : NULL;
    const int tile0 = sg ? sg[q0] / BC : 0, wfirst = sg && qw < T ? sg[qw] : 0; /* the block's, the warp's first key */
    int rs[MT][2]; /* rows g and g+8 of each tile: their first key */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = qw + 16 * mt + g + 8 * h;
            rs[mt][h] = sg && row < T ? sg[row] : 0;
        }
#pragma unroll
    for (int i = 0; i < MT; i++) load_tile<HS>(Qs + i * BR * LH, base, q0 + i * BR, T, C3);
    load_kv<HS>(KV, base + C, tile0, T, C, C3);
    dt_cp_async_commit();
    uint32_t qf[MT][KS][4];
    float o[MT][OT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < OT; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    /* rows g and g+8 of each tile: running max (log2 units) and sum */
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
    const int ntiles = (min(T, q0 + ROWS) + BC - 1) / BC;
    for (int tile = tile0; tile < ntiles; tile++) {
        const int k0 = tile * BC;
        const bf16 *Ks = kv_wait<HS>(KV, base + C, tile, ntiles, T, C, C3), *Vs = Ks + BC * LH;
        if (tile == tile0)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int k = 0; k < KS; k++) dt_frag_a<LH>(qf[mt][k], Qs + (warp * MT + mt) * 16 * LH + k * 16, lane);
        if (k0 <= qw + 16 * MT - 1 && k0 + BC > wfirst) { /* (warp-uniform) the warp's rows see some key of it */
            float s[MT][NT][4];
            scores_mt<HS, MT>(s, qf, Ks, lane);
            uint32_t pa[MT][BC / 16][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int r0 = qw + 16 * mt;
                const bool mask = sg || k0 + BC - 1 > r0 || k0 + BC > T; /* documents, the diagonal, keys past T */
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int row = r0 + g + (e >> 1) * 8, key = k0 + j * 8 + 2 * t + (e & 1);
                        float x = s[mt][j][e] * sl2;
                        if (mask && (key > row || key >= T || key < rs[mt][e >> 1])) x = -INFINITY;
                        s[mt][j][e] = x;
                        mx[e >> 1] = fmaxf(mx[e >> 1], x);
                    }
                float corr[2], mb[2];
#pragma unroll
                for (int h = 0; h < 2; h++) { /* the row's max over its quad */
                    mx[h] = fmaxf(mx[h], dt_shfl_xor(mx[h], 1));
                    mx[h] = fmaxf(mx[h], dt_shfl_xor(mx[h], 2));
                    float mn = fmaxf(m[mt][h], mx[h]);
                    /* 0 on the row's first key (m = -inf); a row that has seen no key yet stays */
                    corr[h] = mn == -INFINITY ? 1.0f : dt_exp2(m[mt][h] - mn);
                    mb[h] = mn == -INFINITY ? 0.0f : mn;
                    m[mt][h] = mn;
                }
                float ls[2] = {0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        uint32_t u = dt_pack_bf16(dt_exp2(s[mt][j][2 * h] - mb[h]), dt_exp2(s[mt][j][2 * h + 1] - mb[h]));
                        ls[h] += dt_bf16_lo(u) + dt_bf16_hi(u); /* the normaliser sums what P·V multiplies */
                        DT_FA_SLOT(pa[mt], j, h) = u;
                    }
#pragma unroll
                for (int h = 0; h < 2; h++) l[mt][h] = l[mt][h] * corr[h] + ls[h];
#pragma unroll
                for (int n = 0; n < OT; n++) {
                    o[mt][n][0] *= corr[0], o[mt][n][1] *= corr[0];
                    o[mt][n][2] *= corr[1], o[mt][n][3] *= corr[1];
                }
            }
            acc_pb_mt<HS, MT>(o, pa, Vs, lane);
        }
        dt_syncthreads(); /* every warp is done with this buffer before it is refilled */
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float inv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            l[mt][h] += dt_shfl_xor(l[mt][h], 1);
            l[mt][h] += dt_shfl_xor(l[mt][h], 2);
            inv[h] = 1.0f / l[mt][h];
        }
        const int r0 = qw + 16 * mt;
        store_rows<HS>(out + (size_t)b * T * C + head * HS, C, r0, T, o[mt], inv, lane);
        if (t == 0)
            for (int h = 0; h < 2; h++) {
                int row = r0 + g + 8 * h;
                if (row < T) lse[(size_t)bh * T + row] = m[mt][h] * LN2 + logf(l[mt][h]);
            }
    }
}

/* dK, dV for 64 keys: over the query tiles at or after them */
template <int HS>
__global__ void __launch_bounds__(THREADS, 3) bwd_kv_k(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                                                    const float *D, const int *seg, int T, int C, int NH,
                                                    float scale) {
    enum { LH = shape<HS>::LH, KS = shape<HS>::KS, OT = shape<HS>::OT };
    DT_DYN_SMEM(smem);
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + BC * LH, *QD = Vs + BC * LH; /* two Q/dO buffers: [Q | dO] each */
    float *LD = (float *)(QD + 4 * BR * LH);                            /* two [lse | D] buffers */
    int *SG = (int *)(LD + 4 * BR);                                     /* two buffers of the rows' first keys */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x, b = bh / NH, head = bh % NH, C3 = 3 * C;
    const int k0 = blockIdx.y * BC, kw = k0 + warp * 16; /* tile 0 has the most query tiles */
    const bf16 *base = qkv + (size_t)b * T * C3 + head * HS, *dbase = dout + (size_t)b * T * C + head * HS;
    const float sl2 = scale * LOG2E;
    const int *sg = seg ? seg + (size_t)b * T : NULL, klast = min(T, k0 + BC) - 1;
    /* (block-uniform) a query tile from q0 on sees some key of the block: seg never decreases */
    auto needed = [&](int q0) { return q0 < T && (!sg || sg[q0] <= klast); };
    /* a query tile's Q, dO (copies) and its rows' lse (log2 units), D and first keys into buffer i */
    auto load_q = [&](int q0, int i) {
        load_tile<HS>(QD + i * 2 * BR * LH, base, q0, T, C3);
        load_tile<HS>(QD + i * 2 * BR * LH + BR * LH, dbase, q0, T, C);
        for (int r = threadIdx.x; r < BR; r += THREADS) {
            LD[i * 2 * BR + r] = q0 + r < T ? lse[(size_t)bh * T + q0 + r] * LOG2E : 0.0f;
            LD[i * 2 * BR + BR + r] = q0 + r < T ? D[(size_t)bh * T + q0 + r] : 0.0f;
            SG[i * BR + r] = sg && q0 + r < T ? sg[q0 + r] : 0;
        }
    };
    load_tile<HS>(Ks, base + C, k0, T, C3);
    load_tile<HS>(Vs, base + 2 * C, k0, T, C3);
    load_q(k0, 0);
    dt_cp_async_commit();
    float dk[OT][4], dv[OT][4];
#pragma unroll
    for (int n = 0; n < OT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    for (int q0 = k0, i = 0; needed(q0); q0 += BR, i ^= 1) {
        const bf16 *Qs = QD + i * 2 * BR * LH, *dOs = Qs + BR * LH;
        const float *Ls = LD + i * 2 * BR, *Ds = Ls + BR;
        const int *Sq = SG + i * BR;
        if (needed(q0 + BR)) {
            load_q(q0 + BR, i ^ 1);
            dt_cp_async_commit();
            dt_cp_async_wait<1>();
        } else {
            dt_cp_async_wait<0>();
        }
        dt_syncthreads();
        if (Sq[0] > kw + 15) { /* (warp-uniform) no query of the tile sees the warp's keys */
            dt_syncthreads();
            continue;
        }
        float st[NT][4], dpt[NT][4]; /* Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: rows keys, columns queries */
        {
            uint32_t af[KS][4];
#pragma unroll
            for (int k = 0; k < KS; k++) dt_frag_a<LH>(af[k], Ks + warp * 16 * LH + k * 16, lane);
            scores<HS>(st, af, Qs, lane);
#pragma unroll
            for (int k = 0; k < KS; k++) dt_frag_a<LH>(af[k], Vs + warp * 16 * LH + k * 16, lane);
            scores<HS>(dpt, af, dOs, lane);
        }
        const bool mask = sg || q0 < kw + 15 || q0 + BR > T;
        uint32_t pa[BC / 16][4], sa[BC / 16][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float p[2], ds[2];
                int key = kw + g + 8 * h;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int col = j * 8 + 2 * t + e, q = q0 + col;
                    p[e] = dt_exp2(st[j][2 * h + e] * sl2 - Ls[col]);
                    if (mask && (q < key || q >= T || Sq[col] > key)) p[e] = 0.0f;
                    ds[e] = p[e] * (dpt[j][2 * h + e] - Ds[col]) * scale;
                }
                DT_FA_SLOT(pa, j, h) = dt_pack_bf16(p[0], p[1]);
                DT_FA_SLOT(sa, j, h) = dt_pack_bf16(ds[0], ds[1]);
            }
        acc_pb<HS>(dv, pa, dOs, lane); /* dV += Pᵀ·dO */
        acc_pb<HS>(dk, sa, Qs, lane);  /* dK += dSᵀ·Q */
        dt_syncthreads();
    }
    const float one[2] = {1.0f, 1.0f};
    bf16 *g0 = dqkv + (size_t)b * T * C3 + head * HS;
    store_rows<HS>(g0 + C, C3, kw, T, dk, one, lane);
    store_rows<HS>(g0 + 2 * C, C3, kw, T, dv, one, lane);
}

/* dQ for 64 queries: over the key tiles up to them */
template <int HS>
__global__ void __launch_bounds__(THREADS, 3) bwd_q_k(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                                                   const float *D, const int *seg, int T, int C, int NH,
                                                   float scale) {
    enum { LH = shape<HS>::LH, KS = shape<HS>::KS, OT = shape<HS>::OT };
    DT_DYN_SMEM(smem);
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + BR * LH, *KV = dOs + BR * LH; /* two K/V buffers: [K | V] each */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x, b = bh / NH, head = bh % NH, C3 = 3 * C;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BR, qw = q0 + warp * 16;
    const bf16 *base = qkv + (size_t)b * T * C3 + head * HS, *dbase = dout + (size_t)b * T * C + head * HS;
    const float sl2 = scale * LOG2E;
    const int *sg = seg ? seg + (size_t)b * T : NULL;
    const int tile0 = sg ? sg[q0] / BC : 0, wfirst = sg && qw < T ? sg[qw] : 0; /* the block's, the warp's first key */
    load_tile<HS>(Qs, base, q0, T, C3);
    load_tile<HS>(dOs, dbase, q0, T, C);
    load_kv<HS>(KV, base + C, tile0, T, C, C3);
    dt_cp_async_commit();
    float lq[2], Dq[2];
    int rs[2]; /* rows g and g+8: their first key */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = qw + g + 8 * h;
        lq[h] = row < T ? lse[(size_t)bh * T + row] * LOG2E : 0.0f;
        Dq[h] = row < T ? D[(size_t)bh * T + row] : 0.0f;
        rs[h] = sg && row < T ? sg[row] : 0;
    }
    float dq[OT][4];
#pragma unroll
    for (int n = 0; n < OT; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    const int ntiles = (min(T, q0 + BR) + BC - 1) / BC;
    for (int tile = tile0; tile < ntiles; tile++) {
        const int k0 = tile * BC;
        const bf16 *Ks = kv_wait<HS>(KV, base + C, tile, ntiles, T, C, C3), *Vs = Ks + BC * LH;
        if (k0 + BC <= wfirst) { /* (warp-uniform) before every document of the warp's rows */
            dt_syncthreads();
            continue;
        }
        uint32_t qf[KS][4], of[KS][4]; /* from shared memory each tile: fewer registers held */
#pragma unroll
        for (int k = 0; k < KS; k++) {
            dt_frag_a<LH>(qf[k], Qs + warp * 16 * LH + k * 16, lane);
            dt_frag_a<LH>(of[k], dOs + warp * 16 * LH + k * 16, lane);
        }
        float s[NT][4], dp[NT][4];
        scores<HS>(s, qf, Ks, lane); /* S = Q·Kᵀ */
        scores<HS>(dp, of, Vs, lane); /* dP = dO·Vᵀ */
        const bool mask = sg || k0 + BC - 1 > qw || k0 + BC > T;
        uint32_t sa[BC / 16][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float ds[2];
                int row = qw + g + 8 * h;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int key = k0 + j * 8 + 2 * t + e;
                    float p = dt_exp2(s[j][2 * h + e] * sl2 - lq[h]);
                    if (mask && (key > row || key >= T || key < rs[h])) p = 0.0f;
                    ds[e] = p * (dp[j][2 * h + e] - Dq[h]) * scale;
                }
                DT_FA_SLOT(sa, j, h) = dt_pack_bf16(ds[0], ds[1]);
            }
        acc_pb<HS>(dq, sa, Ks, lane); /* dQ += dS·K */
        dt_syncthreads();
    }
    const float one[2] = {1.0f, 1.0f};
    store_rows<HS>(dqkv + (size_t)b * T * C3 + head * HS, C3, qw, T, dq, one, lane);
}

/* dynamic shared memory of each kernel (double-buffered tiles) */
template <int HS, int MT> static size_t fwd_smem(void) { return (size_t)(MT * BR + 4 * BC) * shape<HS>::LH * 2; }
template <int HS> static size_t bwd_kv_smem(void) {
    return (size_t)(4 * BR + 2 * BC) * shape<HS>::LH * 2 + 4 * BR * 4 + 2 * BR * 4;
}
template <int HS> static size_t bwd_q_smem(void) { return (size_t)(2 * BR + 4 * BC) * shape<HS>::LH * 2; }

} /* namespace dt_fa */
#endif
