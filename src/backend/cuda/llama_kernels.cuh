/* The Llama family's kernels (ops.h: rmsnorm, swiglu, rope_qkv), templates over the
 * storage type T (fp32 or bf16), arithmetic in fp32, each formula as the CPU backend
 * writes it (src/backend/cpu/rmsnorm.c, rope.c, elementwise.c).
 *
 * RMSNorm is LayerNorm's structure (kernels.cu): one warp per row (a plain kernel, and one
 * on 16-byte vectors for rows a multiple of 32 vectors long), 1/rms kept in fp32; the
 * weight gradient by column tiles, 8 row lanes summing a chunk of rows each, the chunks'
 * partials then summed by a second kernel: a fixed order, no atomics, so it repeats bit
 * for bit. SwiGLU is elementwise (GELU's grid-stride loop). The rotary kernels take one
 * rotation pair (d, d + HS/2) of one head of one row per thread: the forward writes q's
 * and k's rotated pairs and v's copied ones into the attention's qkv layout, each key/value
 * head repeated for its group's query heads; the backward rotates dq back and, per
 * key/value head, sums the group's copies in head order (the CPU's order) before rotating
 * dk back. pos and inv_freq are read from device memory.
 *
 * Written against warp_mma.cuh's primitives only (dt_shfl_xor, dt_syncthreads,
 * DT_DYN_SMEM) and plain loads and stores, 1-D blocks, so tests/test_llama_sim.cpp runs
 * these very kernels on host threads (tests/warp_sim.h) against the CPU backend. */
#ifndef DT_LLAMA_KERNELS_CUH
#define DT_LLAMA_KERNELS_CUH
#include "warp_vec.cuh"

namespace dt_llama {

/* rows per block (a warp each); the weight gradient's tiles: 32 columns x 8 row lanes */
enum { WARPS = 8, THREADS = 32 * WARPS, COL_TILE = 32, ROW_LANES = 8 };
static_assert(COL_TILE * ROW_LANES == THREADS, "the weight gradient's tile is one block");

/* The weight gradient's chunks of rows: at least 64 rows each, at most 256 chunks */
static inline int dw_rows_per_chunk(int N) { return (N + 255) / 256 < 64 ? 64 : (N + 255) / 256; }
static inline int dw_chunks(int N) { return (N + dw_rows_per_chunk(N) - 1) / dw_rows_per_chunk(N); }
/* dynamic shared memory of the weight-gradient kernels */
static const size_t DW_SMEM = sizeof(float) * ROW_LANES * COL_TILE;

/* ---- RMSNorm: out = x·r·w, r = 1/sqrt(mean(x²) + eps); one warp per row ---- */

template <typename T>
__global__ void rms_fwd_k(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float v = ld(x[c]);
        ss += v * v;
    }
    float r = 1.0f / sqrtf(dt_warp_sum(ss) / C + eps);
    T *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = st<T>(ld(x[c]) * r * ld(w[c]));
    if (lane == 0) rstd[row] = r;
}

/* rows whose length is a multiple of 32 vectors, all pointers 16-byte aligned */
template <typename T>
__global__ void rms_fwd_vec_k(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    enum { V = dt_vec<T>::N };
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    float xv[V], ss = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        dt_load_vec(x + c, xv);
#pragma unroll
        for (int i = 0; i < V; i++) ss += xv[i] * xv[i];
    }
    float r = 1.0f / sqrtf(dt_warp_sum(ss) / C + eps);
    T *o = out + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float wv[V];
        dt_load_vec(x + c, xv);
        dt_load_vec(w + c, wv);
#pragma unroll
        for (int i = 0; i < V; i++) xv[i] = xv[i] * r * wv[i];
        dt_store_vec(o + c, xv);
    }
    if (lane == 0) rstd[row] = r;
}

/* dinp += r·(w∘dy) − x·r³·mean(x·w∘dy) */
template <typename T>
__global__ void rms_bwd_dx_k(T *dinp, const T *dout, const T *inp, const T *w, const float *rstd, int N, int C) {
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float r = rstd[row], dot = 0.0f;
    for (int c = lane; c < C; c += 32) dot += ld(x[c]) * ld(w[c]) * ld(dy[c]);
    float k = dt_warp_sum(dot) / C * r * r * r;
    T *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) dx[c] = st<T>(ld(dx[c]) + (ld(w[c]) * ld(dy[c]) * r - ld(x[c]) * k));
}

template <typename T>
__global__ void rms_bwd_dx_vec_k(T *dinp, const T *dout, const T *inp, const T *w, const float *rstd, int N, int C) {
    enum { V = dt_vec<T>::N };
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float r = rstd[row], dot = 0.0f;
    float xv[V], dv[V], wv[V];
    for (int c = lane * V; c < C; c += 32 * V) {
        dt_load_vec(x + c, xv);
        dt_load_vec(dy + c, dv);
        dt_load_vec(w + c, wv);
#pragma unroll
        for (int i = 0; i < V; i++) dot += xv[i] * wv[i] * dv[i];
    }
    float k = dt_warp_sum(dot) / C * r * r * r;
    T *dx = dinp + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float ov[V];
        dt_load_vec(x + c, xv);
        dt_load_vec(dy + c, dv);
        dt_load_vec(w + c, wv);
        dt_load_vec(dx + c, ov);
#pragma unroll
        for (int i = 0; i < V; i++) ov[i] += wv[i] * dv[i] * r - xv[i] * k;
        dt_store_vec(dx + c, ov);
    }
}

/* The weight gradient, dw[c] += Σ_i x[i][c]·r[i]·dy[i][c]: block (column tile, chunk of
 * rows), lane (tx, ty) = (column, row lane); the row lanes' sums are added in lane order.
 * pw[chunk][C] receives the partials. DW_SMEM bytes of shared memory. */
template <typename T>
__global__ void rms_dw_partial_k(float *pw, const T *dout, const T *inp, const float *rstd, int N, int C,
                                 int rows_per_chunk) {
    DT_DYN_SMEM(smem);
    float *sw = (float *)smem; /* [ROW_LANES][COL_TILE] */
    int tx = threadIdx.x % COL_TILE, ty = threadIdx.x / COL_TILE;
    int c = blockIdx.x * COL_TILE + tx, r = blockIdx.y;
    int r0 = r * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float aw = 0.0f;
    if (c < C)
        for (int i = r0 + ty; i < r1; i += ROW_LANES)
            aw += ld(inp[(size_t)i * C + c]) * rstd[i] * ld(dout[(size_t)i * C + c]);
    sw[ty * COL_TILE + tx] = aw;
    dt_syncthreads();
    if (ty == 0 && c < C) {
        float tw = 0.0f;
        for (int k = 0; k < ROW_LANES; k++) tw += sw[k * COL_TILE + tx];
        pw[(size_t)r * C + c] = tw;
    }
}

/* the chunks' partials of 32 columns summed by 8 lanes each, then across lanes (a fixed
 * order), added to dw */
template <typename T> __global__ void rms_dw_finish_k(T *dw, const float *pw, int chunks, int C) {
    DT_DYN_SMEM(smem);
    float *sw = (float *)smem;
    int tx = threadIdx.x % COL_TILE, ty = threadIdx.x / COL_TILE;
    int c = blockIdx.x * COL_TILE + tx;
    float tw = 0.0f;
    if (c < C)
        for (int r = ty; r < chunks; r += ROW_LANES) tw += pw[(size_t)r * C + c];
    sw[ty * COL_TILE + tx] = tw;
    dt_syncthreads();
    if (ty != 0 || c >= C) return;
    for (int k = 1; k < ROW_LANES; k++) tw += sw[k * COL_TILE + tx];
    dw[c] = st<T>(ld(dw[c]) + tw);
}

/* ---- SwiGLU: out = silu(gate)·up, silu(g) = g·sigmoid(g) ---- */

template <typename T> __global__ void swiglu_fwd_k(T *out, const T *gate, const T *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = ld(gate[i]);
        out[i] = st<T>(g / (1.0f + expf(-g)) * ld(up[i]));
    }
}

/* dup = dout·silu(gate), dgate = dout·up·silu'(gate); each element read before it is
 * written (dgate or dup may be dout) */
template <typename T>
__global__ void swiglu_bwd_k(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = ld(gate[i]), sg = 1.0f / (1.0f + expf(-g)), d = ld(dout[i]), u = ld(up[i]);
        dup[i] = st<T>(d * g * sg);
        dgate[i] = st<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
    }
}

/* ---- rotary embeddings and grouped heads ---- */

/* (y0, y1) = the pair (x0, x1) rotated by the angle of position p at frequency f (sign
 * -1: the inverse rotation); Hugging Face's rotate_half, as the CPU's rotate() */
static __device__ __forceinline__ void rotate_pair(float &y0, float &y1, float x0, float x1, int p, float f,
                                                   float sign) {
    float a = (float)p * f, c = cosf(a), s = sign * sinf(a);
    y0 = x0 * c - x1 * s;
    y1 = x1 * c + x0 * s;
}

/* qkv[N, 3C] (C = NH·HS) from q[N, C], k and v [N, NKV·HS]: thread e is the pair d of
 * head h of part (q, k, v) of row i, e = ((i·3 + part)·NH + h)·HS/2 + d */
template <typename T>
__global__ void rope_fwd_k(T *qkv, const T *q, const T *k, const T *v, const int *pos, const float *inv_freq, int N,
                           int NH, int NKV, int HS) {
    int h2 = HS / 2, C = NH * HS, Ckv = NKV * HS, group = NH / NKV;
    size_t n = (size_t)N * 3 * NH * h2;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(e % h2);
        size_t t = e / h2;
        int h = (int)(t % NH);
        t /= NH;
        int part = (int)(t % 3);
        size_t i = t / 3;
        const T *src = part == 0 ? q + i * C + (size_t)h * HS
                                 : (part == 1 ? k : v) + i * Ckv + (size_t)(h / group) * HS;
        T *dst = qkv + i * 3 * C + (size_t)part * C + (size_t)h * HS;
        if (part == 2) { /* v: copied as stored */
            dst[d] = src[d];
            dst[d + h2] = src[d + h2];
            continue;
        }
        float y0, y1;
        rotate_pair(y0, y1, ld(src[d]), ld(src[d + h2]), pos[i], inv_freq[d], 1.0f);
        dst[d] = st<T>(y0);
        dst[d + h2] = st<T>(y1);
    }
}

/* dq[N, C], dk and dv [N, NKV·HS] from dqkv[N, 3C]: thread e is the pair d of head hh of
 * row i, e = (i·(NH + NKV) + hh)·HS/2 + d; hh < NH a query head (dq rotated back), else
 * key/value head hh − NH (its group's copies summed in head order, dk rotated back) */
template <typename T>
__global__ void rope_bwd_k(T *dq, T *dk, T *dv, const T *dqkv, const int *pos, const float *inv_freq, int N, int NH,
                           int NKV, int HS) {
    int h2 = HS / 2, C = NH * HS, Ckv = NKV * HS, group = NH / NKV, heads = NH + NKV;
    size_t n = (size_t)N * heads * h2;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(e % h2);
        size_t t = e / h2;
        int hh = (int)(t % heads);
        size_t i = t / heads;
        const T *row = dqkv + i * 3 * C;
        float y0, y1;
        if (hh < NH) {
            const T *src = row + (size_t)hh * HS;
            rotate_pair(y0, y1, ld(src[d]), ld(src[d + h2]), pos[i], inv_freq[d], -1.0f);
            T *dst = dq + i * C + (size_t)hh * HS;
            dst[d] = st<T>(y0);
            dst[d + h2] = st<T>(y1);
            continue;
        }
        int kh = hh - NH;
        float k0 = 0.0f, k1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
        for (int g = 0; g < group; g++) { /* the group's copies, in head order */
            const T *kr = row + C + (size_t)(kh * group + g) * HS, *vr = kr + C;
            k0 += ld(kr[d]);
            k1 += ld(kr[d + h2]);
            v0 += ld(vr[d]);
            v1 += ld(vr[d + h2]);
        }
        T *dvd = dv + i * Ckv + (size_t)kh * HS, *dkd = dk + i * Ckv + (size_t)kh * HS;
        dvd[d] = st<T>(v0);
        dvd[d + h2] = st<T>(v1);
        rotate_pair(y0, y1, k0, k1, pos[i], inv_freq[d], -1.0f);
        dkd[d] = st<T>(y0);
        dkd[d + h2] = st<T>(y1);
    }
}

} // namespace dt_llama

#endif
