/* Causal attention on tensor cores (bf16 operands, fp32 accumulation): the
 * FlashAttention-2 recurrence with WMMA 16x16x16 tiles. A block of 4 warps takes 64
 * query rows (forward, dQ) or 64 keys (dK/dV) of one (batch, head); each warp owns 16
 * of them. Scores are staged through shared memory for the row-wise softmax, so the
 * kernels never hold a T×T matrix: forward keeps the running max/sum per row and
 * stores the log-sum-exp; backward recomputes P from it in two passes (dK/dV per key
 * tile, dQ per query tile), each summing in a fixed order, so results are
 * reproducible bit for bit (no atomics). Needs head size 32, 64 or 128 and C % 8 == 0
 * (16-byte loads); attention.cu falls back to its CUDA-core kernels otherwise. */
#include <mma.h>
#include <stdio.h>

#include "cuda_internal.h"

using namespace nvcuda;

enum { BR = 64, WARPS = 4, WR = 16 }; /* rows per block, warps, rows per warp */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* rows [r0, r0+64) x HS columns of one head's q, k or v (sel 0, 1, 2) into smem [64][HS];
 * rows at or past T are zero */
template <int HS>
static __device__ void load_tile(bf16 *dst, const bf16 *src, int r0, int T, int stride) {
    enum { VEC = 8, PER_ROW = HS / VEC };
    for (int e = threadIdx.x; e < BR * PER_ROW; e += blockDim.x) {
        int r = e / PER_ROW, v = e % PER_ROW;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) val = *(const uint4 *)(src + (size_t)(r0 + r) * stride + v * VEC);
        *(uint4 *)(dst + r * HS + v * VEC) = val;
    }
}

/* S[16][64] (fp32, ld 64) = A[16][HS] · Bᵀ, with B stored [64][HS] (rows are keys or queries) */
template <int HS>
static __device__ void mm_abt(float *S, const bf16 *A, const bf16 *B) {
    for (int j = 0; j < BR / 16; j++) {
        frag_c c;
        wmma::fill_fragment(c, 0.0f);
#pragma unroll
        for (int k = 0; k < HS / 16; k++) {
            frag_a a;
            frag_b_col b;
            wmma::load_matrix_sync(a, A + k * 16, HS);
            wmma::load_matrix_sync(b, B + j * 16 * HS + k * 16, HS);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(S + j * 16, c, BR, wmma::mem_row_major);
    }
}

template <int HS>
__global__ void __launch_bounds__(WARPS * 32) tc_attn_fwd_k(bf16 *out, float *lse, const bf16 *qkv, int T, int C,
                                                             int NH, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + BR * HS, *Vs = Ks + BR * HS;
    float *Ss = (float *)(Vs + BR * HS); /* per warp [16][64] */
    bf16 *Ps = (bf16 *)(Ss + WARPS * WR * BR);
    float *Os = (float *)(Ps + WARPS * WR * BR); /* per warp [16][HS] */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int q0 = blockIdx.x * BR;
    const bf16 *base = qkv + (size_t)b * T * C3 + h * HS;
    float *S = Ss + warp * WR * BR, *O = Os + warp * WR * HS;
    bf16 *P = Ps + warp * WR * BR;
    load_tile<HS>(Qs, base, q0, T, C3);
    for (int i = lane; i < WR * HS; i += 32) O[i] = 0.0f;
    /* lanes 2r and 2r+1 own row r of the warp's 16, columns [32·(lane&1), +32) */
    int row = lane / 2, half = lane % 2, q = q0 + warp * WR + row;
    float m = -INFINITY, l = 0.0f;
    int ntiles = (min(T, q0 + BR) + BR - 1) / BR;
    for (int t = 0; t < ntiles; t++) {
        int k0 = t * BR;
        __syncthreads(); /* the previous tile's K/V are no longer read */
        load_tile<HS>(Ks, base + C, k0, T, C3);
        load_tile<HS>(Vs, base + 2 * C, k0, T, C3);
        __syncthreads();
        mm_abt<HS>(S, Qs + warp * WR * HS, Ks);
        __syncwarp();
        float *srow = S + row * BR + half * 32;
        float mx = -INFINITY;
        for (int c = 0; c < 32; c++) {
            int k = k0 + half * 32 + c;
            float s = k <= q ? srow[c] * scale : -INFINITY;
            srow[c] = s;
            mx = fmaxf(mx, s);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float mnew = fmaxf(m, mx);
        float corr = mnew == -INFINITY ? 1.0f : expf(m - mnew); /* rows past T see no key */
        float sum = 0.0f;
        bf16 *prow = P + row * BR + half * 32;
        for (int c = 0; c < 32; c++) {
            float p = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - mnew);
            bf16 pb = __float2bfloat16_rn(p);
            prow[c] = pb;
            sum += __bfloat162float(pb); /* the normaliser sums what P·V multiplies */
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * corr + sum;
        m = mnew;
        for (int c = 0; c < HS / 2; c++) O[row * HS + half * (HS / 2) + c] *= corr;
        __syncwarp();
        for (int j = 0; j < HS / 16; j++) { /* O += P·V */
            frag_c c;
            wmma::load_matrix_sync(c, O + j * 16, HS, wmma::mem_row_major);
#pragma unroll
            for (int k = 0; k < BR / 16; k++) {
                frag_a a;
                frag_b_row bv;
                wmma::load_matrix_sync(a, P + k * 16, BR);
                wmma::load_matrix_sync(bv, Vs + k * 16 * HS + j * 16, HS);
                wmma::mma_sync(c, a, bv, c);
            }
            wmma::store_matrix_sync(O + j * 16, c, HS, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (q >= T) return;
    float inv = 1.0f / l;
    bf16 *o = out + ((size_t)b * T + q) * C + h * HS + half * (HS / 2);
    for (int c = 0; c < HS / 2; c++) o[c] = __float2bfloat16_rn(O[row * HS + half * (HS / 2) + c] * inv);
    if (half == 0) lse[(size_t)bh * T + q] = m + logf(l);
}

/* dK, dV for 64 keys: over the query tiles at or after them */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32) tc_attn_bwd_kv_k(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                                                                const float *lse, const float *D, int T, int C,
                                                                int NH, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + BR * HS, *Ks = dOs + BR * HS, *Vs = Ks + BR * HS;
    float *Ss = (float *)(Vs + BR * HS), *dPs = Ss + WARPS * WR * BR; /* per warp [16][64]: Sᵀ, dPᵀ */
    bf16 *Ps = (bf16 *)(dPs + WARPS * WR * BR), *dSs = Ps + WARPS * WR * BR;
    float *Ls = (float *)(dSs + WARPS * WR * BR), *Ds = Ls + BR;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int k0 = blockIdx.x * BR;
    const bf16 *base = qkv + (size_t)b * T * C3 + h * HS, *dbase = dout + (size_t)b * T * C + h * HS;
    float *ST = Ss + warp * WR * BR, *dPT = dPs + warp * WR * BR;
    bf16 *PT = Ps + warp * WR * BR, *dST = dSs + warp * WR * BR;
    load_tile<HS>(Ks, base + C, k0, T, C3);
    load_tile<HS>(Vs, base + 2 * C, k0, T, C3);
    frag_c dk[HS / 16], dv[HS / 16];
#pragma unroll
    for (int j = 0; j < HS / 16; j++) {
        wmma::fill_fragment(dk[j], 0.0f);
        wmma::fill_fragment(dv[j], 0.0f);
    }
    int row = lane / 2, half = lane % 2, key = k0 + warp * WR + row; /* this lane's key row */
    for (int q0 = k0; q0 < T; q0 += BR) {
        __syncthreads();
        load_tile<HS>(Qs, base, q0, T, C3);
        load_tile<HS>(dOs, dbase, q0, T, C);
        for (int i = threadIdx.x; i < BR; i += blockDim.x) {
            Ls[i] = q0 + i < T ? lse[(size_t)bh * T + q0 + i] : 0.0f;
            Ds[i] = q0 + i < T ? D[(size_t)bh * T + q0 + i] : 0.0f;
        }
        __syncthreads();
        mm_abt<HS>(ST, Ks + warp * WR * HS, Qs);  /* Sᵀ = K·Qᵀ */
        mm_abt<HS>(dPT, Vs + warp * WR * HS, dOs); /* dPᵀ = V·dOᵀ */
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            int ci = half * 32 + c, qi = q0 + ci;
            float p = qi >= key && qi < T ? expf(ST[row * BR + ci] * scale - Ls[ci]) : 0.0f;
            float ds = p * (dPT[row * BR + ci] - Ds[ci]) * scale;
            PT[row * BR + ci] = __float2bfloat16_rn(p);
            dST[row * BR + ci] = __float2bfloat16_rn(ds);
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HS / 16; j++)
#pragma unroll
            for (int k = 0; k < BR / 16; k++) {
                frag_a a;
                frag_b_row bm;
                wmma::load_matrix_sync(a, PT + k * 16, BR); /* dV += Pᵀ·dO */
                wmma::load_matrix_sync(bm, dOs + k * 16 * HS + j * 16, HS);
                wmma::mma_sync(dv[j], a, bm, dv[j]);
                wmma::load_matrix_sync(a, dST + k * 16, BR); /* dK += dSᵀ·Q */
                wmma::load_matrix_sync(bm, Qs + k * 16 * HS + j * 16, HS);
                wmma::mma_sync(dk[j], a, bm, dk[j]);
            }
    }
    __syncwarp();
    float *stage = ST; /* [16][64] fp32 holds one 16 x HS result at a time (HS <= 64) or half of it */
    for (int which = 0; which < 2; which++) {
        for (int j0 = 0; j0 < HS / 16; j0 += BR / 16) {
            int nj = min(BR / 16, HS / 16 - j0);
            for (int j = 0; j < nj; j++)
                wmma::store_matrix_sync(stage + j * 16, which ? dv[j0 + j] : dk[j0 + j], BR, wmma::mem_row_major);
            __syncwarp();
            if (key < T) {
                bf16 *g = dqkv + ((size_t)b * T + key) * C3 + h * HS + (which ? 2 * C : C) + j0 * 16;
                for (int c = half; c < nj * 16; c += 2) g[c] = __float2bfloat16_rn(stage[row * BR + c]);
            }
            __syncwarp();
        }
    }
}

/* dQ for 64 queries: over the key tiles up to them */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32) tc_attn_bwd_q_k(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                                                               const float *lse, const float *D, int T, int C, int NH,
                                                               float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + BR * HS, *Ks = dOs + BR * HS, *Vs = Ks + BR * HS;
    float *Ss = (float *)(Vs + BR * HS), *dPs = Ss + WARPS * WR * BR;
    bf16 *dSs = (bf16 *)(dPs + WARPS * WR * BR);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int q0 = blockIdx.x * BR;
    const bf16 *base = qkv + (size_t)b * T * C3 + h * HS, *dbase = dout + (size_t)b * T * C + h * HS;
    float *S = Ss + warp * WR * BR, *dP = dPs + warp * WR * BR;
    bf16 *dS = dSs + warp * WR * BR;
    load_tile<HS>(Qs, base, q0, T, C3);
    load_tile<HS>(dOs, dbase, q0, T, C);
    int row = lane / 2, half = lane % 2, q = q0 + warp * WR + row;
    float lq = q < T ? lse[(size_t)bh * T + q] : 0.0f, Dq = q < T ? D[(size_t)bh * T + q] : 0.0f;
    frag_c dq[HS / 16];
#pragma unroll
    for (int j = 0; j < HS / 16; j++) wmma::fill_fragment(dq[j], 0.0f);
    int ntiles = (min(T, q0 + BR) + BR - 1) / BR;
    for (int t = 0; t < ntiles; t++) {
        int k0 = t * BR;
        __syncthreads();
        load_tile<HS>(Ks, base + C, k0, T, C3);
        load_tile<HS>(Vs, base + 2 * C, k0, T, C3);
        __syncthreads();
        mm_abt<HS>(S, Qs + warp * WR * HS, Ks);
        mm_abt<HS>(dP, dOs + warp * WR * HS, Vs);
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            int ci = half * 32 + c, k = k0 + ci;
            float p = k <= q && q < T ? expf(S[row * BR + ci] * scale - lq) : 0.0f;
            dS[row * BR + ci] = __float2bfloat16_rn(p * (dP[row * BR + ci] - Dq) * scale);
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HS / 16; j++)
#pragma unroll
            for (int k = 0; k < BR / 16; k++) {
                frag_a a;
                frag_b_row bk;
                wmma::load_matrix_sync(a, dS + k * 16, BR); /* dQ += dS·K */
                wmma::load_matrix_sync(bk, Ks + k * 16 * HS + j * 16, HS);
                wmma::mma_sync(dq[j], a, bk, dq[j]);
            }
    }
    __syncwarp();
    float *stage = S;
    for (int j0 = 0; j0 < HS / 16; j0 += BR / 16) {
        int nj = min(BR / 16, HS / 16 - j0);
        for (int j = 0; j < nj; j++) wmma::store_matrix_sync(stage + j * 16, dq[j0 + j], BR, wmma::mem_row_major);
        __syncwarp();
        if (q < T) {
            bf16 *g = dqkv + ((size_t)b * T + q) * C3 + h * HS + j0 * 16;
            for (int c = half; c < nj * 16; c += 2) g[c] = __float2bfloat16_rn(stage[row * BR + c]);
        }
        __syncwarp();
    }
}

template <int HS> static size_t fwd_smem() {
    return 3 * BR * HS * sizeof(bf16) + WARPS * WR * BR * (sizeof(float) + sizeof(bf16)) + WARPS * WR * HS * sizeof(float);
}
template <int HS> static size_t kv_smem() {
    return 4 * BR * HS * sizeof(bf16) + 2 * WARPS * WR * BR * (sizeof(float) + sizeof(bf16)) + 2 * BR * sizeof(float);
}
template <int HS> static size_t q_smem() {
    return 4 * BR * HS * sizeof(bf16) + 2 * WARPS * WR * BR * sizeof(float) + WARPS * WR * BR * sizeof(bf16);
}

template <int HS> static void set_smem_limits(void) {
    static int done;
    if (done) return;
    done = 1;
    cudaFuncSetAttribute(tc_attn_fwd_k<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem<HS>());
    cudaFuncSetAttribute(tc_attn_bwd_kv_k<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kv_smem<HS>());
    cudaFuncSetAttribute(tc_attn_bwd_q_k<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)q_smem<HS>());
}

int dt_cuda_attention_tc_ok(int C, int NH) {
    int HS = C / NH;
    return (HS == 32 || HS == 64 || HS == 128) && C % 8 == 0;
}

template <int HS> static void fwd(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int C, int NH) {
    set_smem_limits<HS>();
    dim3 grid((T + BR - 1) / BR, B * NH);
    tc_attn_fwd_k<HS><<<grid, WARPS * 32, fwd_smem<HS>(), dt_cuda_stream()>>>(out, lse, qkv, T, C, NH,
                                                                              1.0f / sqrtf((float)HS));
    DT_CUDA_LAUNCHED("attention_fwd (tensor cores)");
}

template <int HS>
static void bwd(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *D, int B, int T, int C,
                int NH) {
    set_smem_limits<HS>();
    dim3 grid((T + BR - 1) / BR, B * NH);
    float scale = 1.0f / sqrtf((float)HS);
    tc_attn_bwd_kv_k<HS><<<grid, WARPS * 32, kv_smem<HS>(), dt_cuda_stream()>>>(dqkv, dout, qkv, lse, D, T, C, NH,
                                                                                scale);
    DT_CUDA_LAUNCHED("attention_bwd_kv (tensor cores)");
    tc_attn_bwd_q_k<HS><<<grid, WARPS * 32, q_smem<HS>(), dt_cuda_stream()>>>(dqkv, dout, qkv, lse, D, T, C, NH,
                                                                              scale);
    DT_CUDA_LAUNCHED("attention_bwd_q (tensor cores)");
}

void dt_cuda_attention_tc_fwd(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int C, int NH) {
    switch (C / NH) {
    case 32: fwd<32>(out, lse, qkv, B, T, C, NH); break;
    case 64: fwd<64>(out, lse, qkv, B, T, C, NH); break;
    case 128: fwd<128>(out, lse, qkv, B, T, C, NH); break;
    }
}

void dt_cuda_attention_tc_bwd(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *D, int B,
                              int T, int C, int NH) {
    switch (C / NH) {
    case 32: bwd<32>(dqkv, dout, qkv, lse, D, B, T, C, NH); break;
    case 64: bwd<64>(dqkv, dout, qkv, lse, D, B, T, C, NH); break;
    case 128: bwd<128>(dqkv, dout, qkv, lse, D, B, T, C, NH); break;
    }
}
