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
/* Shared-memory row strides, padded so that consecutive rows start in different banks
 * (an unpadded 64-wide row is a multiple of 128 bytes: every row in the same banks). */
enum { LDS = BR + 4, LDP = BR + 8 }; /* fp32 score rows, bf16 probability rows */
template <int HS> struct ld_of { enum { H = HS + 8, O = HS + 4 }; }; /* bf16 q/k/v rows, fp32 O rows */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* rows [r0, r0+64) x HS columns of one head's q, k or v (sel 0, 1, 2) into smem [64][HS];
 * rows at or past T are zero */
template <int HS>
static __device__ void load_tile(bf16 *dst, const bf16 *src, int r0, int T, int stride) {
    enum { VEC = 8, PER_ROW = HS / VEC, LD = ld_of<HS>::H };
    for (int e = threadIdx.x; e < BR * PER_ROW; e += blockDim.x) {
        int r = e / PER_ROW, v = e % PER_ROW;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) val = *(const uint4 *)(src + (size_t)(r0 + r) * stride + v * VEC);
        *(uint4 *)(dst + r * LD + v * VEC) = val;
    }
}

/* The warp's 16 rows of A [.][HS] (smem, stride LD) as fragments, loaded once */
template <int HS>
static __device__ void load_rows(frag_a (&f)[HS / 16], const bf16 *A) {
#pragma unroll
    for (int k = 0; k < HS / 16; k++) wmma::load_matrix_sync(f[k], A + k * 16, ld_of<HS>::H);
}

/* S[16][64] (fp32, stride LDS) = A·Bᵀ: A the warp's 16 rows (fragments), B stored [64][HS] */
template <int HS>
static __device__ void mm_abt(float *S, const frag_a (&a)[HS / 16], const bf16 *B) {
#pragma unroll
    for (int j = 0; j < BR / 16; j++) {
        frag_c c;
        wmma::fill_fragment(c, 0.0f);
#pragma unroll
        for (int k = 0; k < HS / 16; k++) {
            frag_b_col b;
            wmma::load_matrix_sync(b, B + j * 16 * ld_of<HS>::H + k * 16, ld_of<HS>::H);
            wmma::mma_sync(c, a[k], b, c);
        }
        wmma::store_matrix_sync(S + j * 16, c, LDS, wmma::mem_row_major);
    }
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float warp_sum32(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int HS>
__global__ void __launch_bounds__(WARPS * 32) tc_attn_fwd_k(bf16 *out, float *lse, const bf16 *qkv, int T, int C,
                                                             int NH, float scale) {
    enum { LH = ld_of<HS>::H, LO = ld_of<HS>::O };
    extern __shared__ __align__(32) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + BR * LH, *Vs = Ks + BR * LH;
    float *Ss = (float *)(Vs + BR * LH); /* per warp [16][LDS] */
    bf16 *Ps = (bf16 *)(Ss + WARPS * WR * LDS);
    float *Os = (float *)(Ps + WARPS * WR * LDP); /* per warp [16][LO] */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int q0 = blockIdx.x * BR, qw = q0 + warp * WR; /* the warp's first query */
    const bf16 *base = qkv + (size_t)b * T * C3 + h * HS;
    float *S = Ss + warp * WR * LDS, *O = Os + warp * WR * LO;
    bf16 *P = Ps + warp * WR * LDP;
    load_tile<HS>(Qs, base, q0, T, C3);
    for (int i = lane; i < WR * LO; i += 32) O[i] = 0.0f;
    __syncthreads();
    frag_a qf[HS / 16];
    load_rows<HS>(qf, Qs + warp * WR * LH);
    /* row statistics, every lane holding all 16 rows' (row-wise work goes row by row with
     * the lanes across columns: no bank conflicts) */
    float m[WR], l[WR];
#pragma unroll
    for (int r = 0; r < WR; r++) m[r] = -INFINITY, l[r] = 0.0f;
    int ntiles = (min(T, q0 + BR) + BR - 1) / BR;
    for (int t = 0; t < ntiles; t++) {
        int k0 = t * BR;
        __syncthreads(); /* the previous tile's K/V are no longer read */
        load_tile<HS>(Ks, base + C, k0, T, C3);
        load_tile<HS>(Vs, base + 2 * C, k0, T, C3);
        __syncthreads();
        mm_abt<HS>(S, qf, Ks);
        __syncwarp();
#pragma unroll
        for (int r = 0; r < WR; r++) {
            int q = qw + r;
            float s0 = k0 + lane <= q ? S[r * LDS + lane] * scale : -INFINITY;
            float s1 = k0 + lane + 32 <= q ? S[r * LDS + lane + 32] * scale : -INFINITY;
            float mnew = fmaxf(m[r], warp_max(fmaxf(s0, s1)));
            float corr = mnew == -INFINITY ? 1.0f : expf(m[r] - mnew); /* rows past T see no key */
            bf16 p0 = __float2bfloat16_rn(s0 == -INFINITY ? 0.0f : expf(s0 - mnew));
            bf16 p1 = __float2bfloat16_rn(s1 == -INFINITY ? 0.0f : expf(s1 - mnew));
            P[r * LDP + lane] = p0;
            P[r * LDP + lane + 32] = p1;
            /* the normaliser sums what P·V multiplies */
            l[r] = l[r] * corr + warp_sum32(__bfloat162float(p0) + __bfloat162float(p1));
            m[r] = mnew;
            for (int c = lane; c < HS; c += 32) O[r * LO + c] *= corr;
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HS / 16; j++) { /* O += P·V */
            frag_c c;
            wmma::load_matrix_sync(c, O + j * 16, LO, wmma::mem_row_major);
#pragma unroll
            for (int k = 0; k < BR / 16; k++) {
                frag_a a;
                frag_b_row bv;
                wmma::load_matrix_sync(a, P + k * 16, LDP);
                wmma::load_matrix_sync(bv, Vs + k * 16 * LH + j * 16, LH);
                wmma::mma_sync(c, a, bv, c);
            }
            wmma::store_matrix_sync(O + j * 16, c, LO, wmma::mem_row_major);
        }
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < WR; r++) {
        int q = qw + r;
        if (q >= T) break;
        float inv = 1.0f / l[r];
        bf16 *o = out + ((size_t)b * T + q) * C + h * HS;
        for (int c = lane; c < HS; c += 32) o[c] = __float2bfloat16_rn(O[r * LO + c] * inv);
        if (lane == 0) lse[(size_t)bh * T + q] = m[r] + logf(l[r]);
    }
}

/* dK, dV for 64 keys: over the query tiles at or after them */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32) tc_attn_bwd_kv_k(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                                                                const float *lse, const float *D, int T, int C,
                                                                int NH, float scale) {
    enum { LH = ld_of<HS>::H };
    extern __shared__ __align__(32) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + BR * LH, *Ks = dOs + BR * LH, *Vs = Ks + BR * LH;
    float *Ss = (float *)(Vs + BR * LH), *dPs = Ss + WARPS * WR * LDS; /* per warp [16][LDS]: Sᵀ, dPᵀ */
    bf16 *Ps = (bf16 *)(dPs + WARPS * WR * LDS), *dSs = Ps + WARPS * WR * LDP;
    float *Ls = (float *)(dSs + WARPS * WR * LDP), *Ds = Ls + BR;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int k0 = blockIdx.x * BR, kw = k0 + warp * WR; /* the warp's first key */
    const bf16 *base = qkv + (size_t)b * T * C3 + h * HS, *dbase = dout + (size_t)b * T * C + h * HS;
    float *ST = Ss + warp * WR * LDS, *dPT = dPs + warp * WR * LDS;
    bf16 *PT = Ps + warp * WR * LDP, *dST = dSs + warp * WR * LDP;
    load_tile<HS>(Ks, base + C, k0, T, C3);
    load_tile<HS>(Vs, base + 2 * C, k0, T, C3);
    __syncthreads();
    frag_a kf[HS / 16], vf[HS / 16];
    load_rows<HS>(kf, Ks + warp * WR * LH);
    load_rows<HS>(vf, Vs + warp * WR * LH);
    frag_c dk[HS / 16], dv[HS / 16];
#pragma unroll
    for (int j = 0; j < HS / 16; j++) {
        wmma::fill_fragment(dk[j], 0.0f);
        wmma::fill_fragment(dv[j], 0.0f);
    }
    for (int q0 = k0; q0 < T; q0 += BR) {
        __syncthreads();
        load_tile<HS>(Qs, base, q0, T, C3);
        load_tile<HS>(dOs, dbase, q0, T, C);
        for (int i = threadIdx.x; i < BR; i += blockDim.x) {
            Ls[i] = q0 + i < T ? lse[(size_t)bh * T + q0 + i] : 0.0f;
            Ds[i] = q0 + i < T ? D[(size_t)bh * T + q0 + i] : 0.0f;
        }
        __syncthreads();
        mm_abt<HS>(ST, kf, Qs);  /* Sᵀ = K·Qᵀ */
        mm_abt<HS>(dPT, vf, dOs); /* dPᵀ = V·dOᵀ */
        __syncwarp();
        float l0 = Ls[lane], l1 = Ls[lane + 32], d0 = Ds[lane], d1 = Ds[lane + 32];
        int qa = q0 + lane, qb = q0 + lane + 32;
#pragma unroll
        for (int r = 0; r < WR; r++) {
            int key = kw + r;
            float p0 = qa >= key && qa < T ? expf(ST[r * LDS + lane] * scale - l0) : 0.0f;
            float p1 = qb >= key && qb < T ? expf(ST[r * LDS + lane + 32] * scale - l1) : 0.0f;
            PT[r * LDP + lane] = __float2bfloat16_rn(p0);
            PT[r * LDP + lane + 32] = __float2bfloat16_rn(p1);
            dST[r * LDP + lane] = __float2bfloat16_rn(p0 * (dPT[r * LDS + lane] - d0) * scale);
            dST[r * LDP + lane + 32] = __float2bfloat16_rn(p1 * (dPT[r * LDS + lane + 32] - d1) * scale);
        }
        __syncwarp();
#pragma unroll
        for (int k = 0; k < BR / 16; k++) {
            frag_a pa, sa;
            wmma::load_matrix_sync(pa, PT + k * 16, LDP);
            wmma::load_matrix_sync(sa, dST + k * 16, LDP);
#pragma unroll
            for (int j = 0; j < HS / 16; j++) {
                frag_b_row bm;
                wmma::load_matrix_sync(bm, dOs + k * 16 * LH + j * 16, LH); /* dV += Pᵀ·dO */
                wmma::mma_sync(dv[j], pa, bm, dv[j]);
                wmma::load_matrix_sync(bm, Qs + k * 16 * LH + j * 16, LH); /* dK += dSᵀ·Q */
                wmma::mma_sync(dk[j], sa, bm, dk[j]);
            }
        }
    }
    __syncwarp();
    float *stage = ST; /* [16][LDS] fp32: up to 64 columns of a result at a time */
    for (int which = 0; which < 2; which++)
        for (int j0 = 0; j0 < HS / 16; j0 += BR / 16) {
            int nj = min(BR / 16, HS / 16 - j0);
            for (int j = 0; j < nj; j++)
                wmma::store_matrix_sync(stage + j * 16, which ? dv[j0 + j] : dk[j0 + j], LDS, wmma::mem_row_major);
            __syncwarp();
            for (int r = 0; r < WR && kw + r < T; r++) {
                bf16 *g = dqkv + ((size_t)b * T + kw + r) * C3 + h * HS + (which ? 2 * C : C) + j0 * 16;
                for (int c = lane; c < nj * 16; c += 32) g[c] = __float2bfloat16_rn(stage[r * LDS + c]);
            }
            __syncwarp();
        }
}

/* dQ for 64 queries: over the key tiles up to them */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32) tc_attn_bwd_q_k(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                                                               const float *lse, const float *D, int T, int C, int NH,
                                                               float scale) {
    enum { LH = ld_of<HS>::H };
    extern __shared__ __align__(32) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + BR * LH, *Ks = dOs + BR * LH, *Vs = Ks + BR * LH;
    float *Ss = (float *)(Vs + BR * LH), *dPs = Ss + WARPS * WR * LDS;
    bf16 *dSs = (bf16 *)(dPs + WARPS * WR * LDS);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C3 = 3 * C;
    int q0 = blockIdx.x * BR, qw = q0 + warp * WR;
    const bf16 *base = qkv + (size_t)b * T * C3 + h * HS, *dbase = dout + (size_t)b * T * C + h * HS;
    float *S = Ss + warp * WR * LDS, *dP = dPs + warp * WR * LDS;
    bf16 *dS = dSs + warp * WR * LDP;
    load_tile<HS>(Qs, base, q0, T, C3);
    load_tile<HS>(dOs, dbase, q0, T, C);
    __syncthreads();
    frag_a qf[HS / 16], of[HS / 16];
    load_rows<HS>(qf, Qs + warp * WR * LH);
    load_rows<HS>(of, dOs + warp * WR * LH);
    float lq[WR], Dq[WR];
#pragma unroll
    for (int r = 0; r < WR; r++) {
        int q = qw + r;
        lq[r] = q < T ? lse[(size_t)bh * T + q] : 0.0f;
        Dq[r] = q < T ? D[(size_t)bh * T + q] : 0.0f;
    }
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
        mm_abt<HS>(S, qf, Ks);
        mm_abt<HS>(dP, of, Vs);
        __syncwarp();
#pragma unroll
        for (int r = 0; r < WR; r++) {
            int q = qw + r, ka = k0 + lane, kb = k0 + lane + 32;
            float p0 = ka <= q && q < T ? expf(S[r * LDS + lane] * scale - lq[r]) : 0.0f;
            float p1 = kb <= q && q < T ? expf(S[r * LDS + lane + 32] * scale - lq[r]) : 0.0f;
            dS[r * LDP + lane] = __float2bfloat16_rn(p0 * (dP[r * LDS + lane] - Dq[r]) * scale);
            dS[r * LDP + lane + 32] = __float2bfloat16_rn(p1 * (dP[r * LDS + lane + 32] - Dq[r]) * scale);
        }
        __syncwarp();
#pragma unroll
        for (int k = 0; k < BR / 16; k++) {
            frag_a a;
            wmma::load_matrix_sync(a, dS + k * 16, LDP); /* dQ += dS·K */
#pragma unroll
            for (int j = 0; j < HS / 16; j++) {
                frag_b_row bk;
                wmma::load_matrix_sync(bk, Ks + k * 16 * LH + j * 16, LH);
                wmma::mma_sync(dq[j], a, bk, dq[j]);
            }
        }
    }
    __syncwarp();
    float *stage = S;
    for (int j0 = 0; j0 < HS / 16; j0 += BR / 16) {
        int nj = min(BR / 16, HS / 16 - j0);
        for (int j = 0; j < nj; j++) wmma::store_matrix_sync(stage + j * 16, dq[j0 + j], LDS, wmma::mem_row_major);
        __syncwarp();
        for (int r = 0; r < WR && qw + r < T; r++) {
            bf16 *g = dqkv + ((size_t)b * T + qw + r) * C3 + h * HS + j0 * 16;
            for (int c = lane; c < nj * 16; c += 32) g[c] = __float2bfloat16_rn(stage[r * LDS + c]);
        }
        __syncwarp();
    }
}

template <int HS> static size_t fwd_smem() {
    return 3 * BR * ld_of<HS>::H * sizeof(bf16) + WARPS * WR * (LDS * sizeof(float) + LDP * sizeof(bf16)) +
           WARPS * WR * ld_of<HS>::O * sizeof(float);
}
template <int HS> static size_t kv_smem() {
    return 4 * BR * ld_of<HS>::H * sizeof(bf16) + 2 * WARPS * WR * (LDS * sizeof(float) + LDP * sizeof(bf16)) +
           2 * BR * sizeof(float);
}
template <int HS> static size_t q_smem() {
    return 4 * BR * ld_of<HS>::H * sizeof(bf16) + 2 * WARPS * WR * LDS * sizeof(float) + WARPS * WR * LDP * sizeof(bf16);
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
