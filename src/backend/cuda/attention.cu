/* Causal attention in fp32 without the T×T matrix (FlashAttention's recurrence):
 * forward keeps a running max and sum per query row over key tiles in shared memory
 * and stores only the log-sum-exp; backward recomputes probabilities from it, one
 * kernel for dK/dV (a thread per key) and one for dQ (a thread per query).
 * This is the exact-arithmetic reference path (one thread per row, CUDA cores); the
 * bf16 path uses tensor cores. Head sizes 8..128 (powers of two) are compiled.
 * Documents: seg[B, T] (device memory, NULL: none) is each query's first visible key,
 * row-relative and non-decreasing along the row (ops.h); the key tiles before a block's
 * first document start are never loaded, and a thread's loop starts at its own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

enum { TILE = 64 }; /* query rows (threads) per block */
/* key (or query, in dK/dV) rows per shared-memory tile: two tiles fit the 48 KB of static shared memory */
template <int HS> struct kt { enum { N = HS <= 64 ? 64 : 32 }; };

/* The block's threads load keys k0 .. k0 + KT - 1 of the head at base (zeros past T) into
 * the shared K and V tiles (KT x HS), then wait for each other (forward and the dQ kernel). */
template <int HS, typename E>
static __device__ __forceinline__ void load_kv_tile(float (*Ks)[HS], float (*Vs)[HS], const E *base, int k0, int T,
                                                    int C, int C3) {
    enum { KT = kt<HS>::N };
    for (int e = threadIdx.x; e < KT * HS; e += TILE) {
        int r = e / HS, d = e % HS, key = k0 + r;
        Ks[r][d] = key < T ? ld(base[(size_t)key * C3 + C + d]) : 0.0f;
        Vs[r][d] = key < T ? ld(base[(size_t)key * C3 + 2 * C + d]) : 0.0f;
    }
    __syncthreads();
}

template <int HS, typename E>
__global__ void __launch_bounds__(TILE) attn_fwd_k(E *out, float *lse, const E *qkv, const int *seg, int T, int C,
                                                   int NH, float scale) {
    enum { KT = kt<HS>::N };
    __shared__ float Ks[KT][HS], Vs[KT][HS];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int t = blockIdx.x * TILE + threadIdx.x;
    const E *base = qkv + (size_t)b * T * C3 + h * HS;
    bool valid = t < T;
    float q[HS], acc[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = valid ? ld(base[(size_t)t * C3 + d]) : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int last = min(T, (int)(blockIdx.x + 1) * TILE) - 1;
    const int *sg = seg ? seg + (size_t)b * T : NULL;
    int first = sg ? sg[blockIdx.x * TILE] : 0, mine = sg && valid ? sg[t] : 0;
    for (int k0 = first / KT * KT; k0 <= last; k0 += KT) {
        load_kv_tile<HS>(Ks, Vs, base, k0, T, C, C3);
        int kbeg = max(0, mine - k0), kend = valid ? min((int)KT, t - k0 + 1) : 0; /* keys seg .. t */
        if (kend > kbeg) {
            /* Two passes over the tile's keys, the score recomputed in the second (the same
             * operations in the same order, so the same bits): a score array indexed by key
             * would need the key loop unrolled, KT x HS products per instantiation, which
             * took nvcc minutes to compile. Keys past kend add nothing. */
            float mt = m;
            for (int j = kbeg; j < kend; j++) {
                float dot = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++) dot += q[d] * Ks[j][d];
                mt = fmaxf(mt, __fmul_rn(dot, scale)); /* _rn: never fused into the subtraction below */
            }
            float corr = expf(m - mt);
            l *= corr;
#pragma unroll
            for (int d = 0; d < HS; d++) acc[d] *= corr;
            for (int j = kbeg; j < kend; j++) {
                float dot = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++) dot += q[d] * Ks[j][d];
                float p = expf(__fmul_rn(dot, scale) - mt);
                l += p;
#pragma unroll
                for (int d = 0; d < HS; d++) acc[d] += p * Vs[j][d];
            }
            m = mt;
        }
        __syncthreads();
    }
    if (!valid) return;
    E *o = out + ((size_t)b * T + t) * C + h * HS;
    float inv = 1.0f / l;
#pragma unroll
    for (int d = 0; d < HS; d++) o[d] = st<E>(acc[d] * inv);
    lse[(size_t)bh * T + t] = m + logf(l);
}

/* D[bh][t] = dO[t]·O[t] (the softmax backward's row term) */
template <typename E>
__global__ void attn_rowdot_k(float *D, const E *dout, const E *out, int B, int T, int C, int NH) {
    int HS = C / NH;
    size_t n = (size_t)B * NH * T;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bh = i / T, t = i % T, b = bh / NH, h = bh % NH;
        const E *o = out + (b * T + t) * C + h * HS, *d = dout + (b * T + t) * C + h * HS;
        float s = 0.0f;
        for (int k = 0; k < HS; k++) s += ld(o[k]) * ld(d[k]);
        D[i] = s;
    }
}

/* dK, dV: a thread per key j, over the query tiles that can see it (with documents, up
 * to the first query whose document starts after the block's last key) */
template <int HS, typename E>
__global__ void __launch_bounds__(TILE) attn_bwd_kv_k(E *dqkv, const E *dout, const E *qkv, const float *lse,
                                                      const float *D, const int *seg, int T, int C, int NH,
                                                      float scale) {
    enum { KT = kt<HS>::N };
    __shared__ float Qs[KT][HS], dOs[KT][HS], Ls[KT], Ds[KT];
    __shared__ int Ss[KT];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int j = blockIdx.x * TILE + threadIdx.x;
    bool valid = j < T;
    const E *base = qkv + (size_t)b * T * C3 + h * HS;
    const E *dbase = dout + (size_t)b * T * C + h * HS;
    float k[HS], v[HS], dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        k[d] = valid ? ld(base[(size_t)j * C3 + C + d]) : 0.0f;
        v[d] = valid ? ld(base[(size_t)j * C3 + 2 * C + d]) : 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    const int *sg = seg ? seg + (size_t)b * T : NULL;
    int jlast = min(T, (int)(blockIdx.x + 1) * TILE) - 1;
    for (int i0 = blockIdx.x * TILE; i0 < T && (!sg || sg[i0] <= jlast); i0 += KT) {
        for (int e = threadIdx.x; e < KT * HS; e += TILE) {
            int r = e / HS, d = e % HS, qi = i0 + r;
            Qs[r][d] = qi < T ? ld(base[(size_t)qi * C3 + d]) : 0.0f;
            dOs[r][d] = qi < T ? ld(dbase[(size_t)qi * C + d]) : 0.0f;
        }
        if ((int)threadIdx.x < KT && i0 + (int)threadIdx.x < T) {
            Ls[threadIdx.x] = lse[(size_t)bh * T + i0 + threadIdx.x];
            Ds[threadIdx.x] = D[(size_t)bh * T + i0 + threadIdx.x];
            Ss[threadIdx.x] = sg ? sg[i0 + threadIdx.x] : 0;
        }
        __syncthreads();
        if (valid)
            for (int r = 0; r < KT; r++) {
                int qi = i0 + r;
                if (qi >= T || Ss[r] > j) break; /* seg does not decrease: no later query sees j */
                if (qi < j) continue;
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    s += Qs[r][d] * k[d];
                    dp += dOs[r][d] * v[d];
                }
                float p = expf(s * scale - Ls[r]);
                float ds = p * (dp - Ds[r]) * scale;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    dv[d] += p * dOs[r][d];
                    dk[d] += ds * Qs[r][d];
                }
            }
        __syncthreads();
    }
    if (!valid) return;
    E *g = dqkv + ((size_t)b * T + j) * C3 + h * HS;
#pragma unroll
    for (int d = 0; d < HS; d++) {
        g[C + d] = st<E>(dk[d]);
        g[2 * C + d] = st<E>(dv[d]);
    }
}

/* dQ: a thread per query i, over the key tiles it sees */
template <int HS, typename E>
__global__ void __launch_bounds__(TILE) attn_bwd_q_k(E *dqkv, const E *dout, const E *qkv, const float *lse,
                                                     const float *D, const int *seg, int T, int C, int NH,
                                                     float scale) {
    enum { KT = kt<HS>::N };
    __shared__ float Ks[KT][HS], Vs[KT][HS];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int i = blockIdx.x * TILE + threadIdx.x;
    bool valid = i < T;
    const E *base = qkv + (size_t)b * T * C3 + h * HS;
    float q[HS], dO[HS], dq[HS];
    const E *dsrc = dout + ((size_t)b * T + (valid ? i : 0)) * C + h * HS;
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = valid ? ld(base[(size_t)i * C3 + d]) : 0.0f;
        dO[d] = valid ? ld(dsrc[d]) : 0.0f;
        dq[d] = 0.0f;
    }
    float li = valid ? lse[(size_t)bh * T + i] : 0.0f, Di = valid ? D[(size_t)bh * T + i] : 0.0f;
    int last = min(T, (int)(blockIdx.x + 1) * TILE) - 1;
    const int *sg = seg ? seg + (size_t)b * T : NULL;
    int first = sg ? sg[blockIdx.x * TILE] : 0, mine = sg && valid ? sg[i] : 0;
    for (int k0 = first / KT * KT; k0 <= last; k0 += KT) {
        load_kv_tile<HS>(Ks, Vs, base, k0, T, C, C3);
        int kend = valid ? min((int)KT, i - k0 + 1) : 0;
        for (int r = max(0, mine - k0); r < kend; r++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HS; d++) {
                s += q[d] * Ks[r][d];
                dp += dO[d] * Vs[r][d];
            }
            float p = expf(s * scale - li);
            float ds = p * (dp - Di) * scale;
#pragma unroll
            for (int d = 0; d < HS; d++) dq[d] += ds * Ks[r][d];
        }
        __syncthreads();
    }
    if (!valid) return;
    E *g = dqkv + ((size_t)b * T + i) * C3 + h * HS;
#pragma unroll
    for (int d = 0; d < HS; d++) g[d] = st<E>(dq[d]);
}

static int head_size_ok(int HS) {
    if (HS == 8 || HS == 16 || HS == 32 || HS == 64 || HS == 128) return 1;
    char msg[96];
    snprintf(msg, sizeof msg, "head size %d is not supported (8, 16, 32, 64 or 128)", HS);
    dt_cuda_record("attention", msg);
    return 0;
}

#define HS_SWITCH(HS, CALL)          \
    switch (HS) {                    \
    case 8: { enum { H = 8 }; CALL; } break;     \
    case 16: { enum { H = 16 }; CALL; } break;   \
    case 32: { enum { H = 32 }; CALL; } break;   \
    case 64: { enum { H = 64 }; CALL; } break;   \
    case 128: { enum { H = 128 }; CALL; } break; \
    }

/* Which bf16 attention runs: the register-resident mma.sync kernels where the head size
 * allows, else the WMMA ones, else the CUDA-core ones. DT_CUDA_ATTENTION=wmma or simt
 * forces an older path (to compare them, or to fall back). */
enum { ATT_SIMT, ATT_WMMA, ATT_MMA };
static int bf16_path(int C, int NH, const int *seg) {
    static int forced = -1;
    if (forced < 0) {
        const char *e = getenv("DT_CUDA_ATTENTION");
        forced = !e ? ATT_MMA : !strcmp(e, "simt") ? ATT_SIMT : !strcmp(e, "wmma") ? ATT_WMMA : ATT_MMA;
    }
    if (forced >= ATT_MMA && dt_cuda_attention_mma_ok(C, NH)) return ATT_MMA;
    if (forced >= ATT_WMMA && dt_cuda_attention_tc_ok(C, NH) && !seg) return ATT_WMMA; /* no documents there */
    return ATT_SIMT;
}

template <typename E>
void cuda_attention_fwd(E *out, float *lse, const E *qkv, const int *seg, int B, int T, int C, int NH) {
    if constexpr (sizeof(E) == 2) {
        int path = bf16_path(C, NH, seg);
        if (path == ATT_MMA) return dt_cuda_attention_mma_fwd(out, lse, qkv, seg, B, T, C, NH);
        if (path == ATT_WMMA) return dt_cuda_attention_tc_fwd(out, lse, qkv, B, T, C, NH);
    }
    int HS = C / NH;
    if (!head_size_ok(HS)) return;
    dim3 grid((T + TILE - 1) / TILE, B * NH);
    float scale = 1.0f / sqrtf((float)HS);
    HS_SWITCH(HS, (attn_fwd_k<H, E><<<grid, TILE, 0, dt_cuda_stream()>>>(out, lse, qkv, seg, T, C, NH, scale)));
    DT_CUDA_LAUNCHED("attention_fwd");
}

template <typename E>
void cuda_attention_bwd(E *dqkv, const E *dout, const E *qkv, const E *out, const float *lse, const int *seg, int B,
                        int T, int C, int NH) {
    int HS = C / NH;
    if (!head_size_ok(HS)) return;
    float *D = (float *)dt_cuda_scratch((size_t)B * NH * T * sizeof(float));
    if (!D) return;
    cudaStream_t s = dt_cuda_stream();
    size_t n = (size_t)B * NH * T;
    attn_rowdot_k<E><<<(int)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535), 256, 0, s>>>(D, dout, out, B, T, C, NH);
    DT_CUDA_LAUNCHED("attention_rowdot");
    if constexpr (sizeof(E) == 2) {
        int path = bf16_path(C, NH, seg);
        if (path == ATT_MMA) return dt_cuda_attention_mma_bwd(dqkv, dout, qkv, lse, D, seg, B, T, C, NH);
        if (path == ATT_WMMA) return dt_cuda_attention_tc_bwd(dqkv, dout, qkv, lse, D, B, T, C, NH);
    }
    dim3 grid((T + TILE - 1) / TILE, B * NH);
    float scale = 1.0f / sqrtf((float)HS);
    HS_SWITCH(HS, (attn_bwd_kv_k<H, E><<<grid, TILE, 0, s>>>(dqkv, dout, qkv, lse, D, seg, T, C, NH, scale)));
    DT_CUDA_LAUNCHED("attention_bwd_kv");
    HS_SWITCH(HS, (attn_bwd_q_k<H, E><<<grid, TILE, 0, s>>>(dqkv, dout, qkv, lse, D, seg, T, C, NH, scale)));
    DT_CUDA_LAUNCHED("attention_bwd_q");
}

template void cuda_attention_fwd<float>(float *, float *, const float *, const int *, int, int, int, int);
template void cuda_attention_fwd<bf16>(bf16 *, float *, const bf16 *, const int *, int, int, int, int);
template void cuda_attention_bwd<float>(float *, const float *, const float *, const float *, const float *,
                                        const int *, int, int, int, int);
template void cuda_attention_bwd<bf16>(bf16 *, const bf16 *, const bf16 *, const bf16 *, const float *, const int *,
                                       int, int, int, int);
