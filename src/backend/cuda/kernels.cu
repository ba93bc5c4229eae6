/* Embedding, LayerNorm, GELU, residual add, softmax cross-entropy and AdamW on the GPU,
 * templates over the storage type (fp32 or bf16), arithmetic in fp32. Row-wise kernels give one warp (or one block for vocabulary rows) to a row;
 * sums over rows go through fixed-order partials (reduce.cu's pattern), so results are
 * reproducible run to run. */
#include <math.h>

#include "cuda_internal.h"
#include "warp_vec.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static int blocks_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    size_t cap = (size_t)dt_cuda_sm_count() * 32;
    if (cap == 0) cap = 4096;
    return (int)(b < cap ? (b > 0 ? b : 1) : cap);
}

/* ---- embedding ---- */

template <typename T>
__global__ void embed_fwd_k(T *out, const dt_token *tok, const T *wte, const T *wpe, int BT, int Tn, int C, int v0,
                            int rows) {
    size_t n = (size_t)BT * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C, c = i % C;
        int id = (int)tok[bt] - v0;
        float e = id >= 0 && id < rows ? ld(wte[(size_t)id * C + c]) : 0.0f;
        out[i] = st<T>(wpe ? e + ld(wpe[(bt % Tn) * C + c]) : e);
    }
}

template <typename T>
void cuda_embed_fwd(T *out, const dt_token *tok, const T *wte, const T *wpe, int B, int Tn, int C, int v0, int rows) {
    embed_fwd_k<<<blocks_for((size_t)B * Tn * C, 256), 256, 0, dt_cuda_stream()>>>(out, tok, wte, wpe, B * Tn, Tn, C,
                                                                                   v0, rows);
    DT_CUDA_LAUNCHED("embed_fwd");
}

/* dwpe[t][c] += sum over b, in b order (deterministic) */
template <typename T>
__global__ void embed_bwd_pos_k(T *dwpe, const T *dout, int B, int Tn, int C) {
    size_t n = (size_t)Tn * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += ld(dout[(size_t)b * n + i]);
        dwpe[i] = st<T>(ld(dwpe[i]) + s);
    }
}

/* dwte[tok][c] += dout[bt][c]: tokens repeat, so rows collide; atomics make the
 * summation order (and the last bits) vary from run to run. bf16 rows are added with
 * bf16x2 atomics, two channels at a time (C is even). */
__global__ void embed_bwd_tok_k(float *dwte, const float *dout, const dt_token *tok, int BT, int C, int v0, int rows) {
    size_t n = (size_t)BT * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C, c = i % C;
        int id = (int)tok[bt] - v0;
        if (id >= 0 && id < rows) atomicAdd(&dwte[(size_t)id * C + c], dout[i]);
    }
}
__global__ void embed_bwd_tok_k(bf16 *dwte, const bf16 *dout, const dt_token *tok, int BT, int C, int v0, int rows) {
    size_t n = (size_t)BT * C / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = 2 * i / C, c = 2 * i % C;
        int id = (int)tok[bt] - v0;
        if (id >= 0 && id < rows)
            atomicAdd((__nv_bfloat162 *)&dwte[(size_t)id * C + c], *(const __nv_bfloat162 *)&dout[2 * i]);
    }
}

template <typename T>
void cuda_embed_bwd(T *dwte, T *dwpe, const T *dout, const dt_token *tok, int B, int Tn, int C, int v0, int rows) {
    if (dwpe) {
        embed_bwd_pos_k<<<blocks_for((size_t)Tn * C, 256), 256, 0, dt_cuda_stream()>>>(dwpe, dout, B, Tn, C);
        DT_CUDA_LAUNCHED("embed_bwd_pos");
    }
    embed_bwd_tok_k<<<blocks_for((size_t)B * Tn * C, 256), 256, 0, dt_cuda_stream()>>>(dwte, dout, tok, B * Tn, C, v0,
                                                                                       rows);
    DT_CUDA_LAUNCHED("embed_bwd_tok");
}

/* ---- LayerNorm: one warp per row ---- */

enum { LN_WARPS = 8 };

template <typename T>
__global__ void ln_fwd_k(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N, int C) {
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += ld(x[c]);
    float m = dt_warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = ld(x[c]) - m;
        v += d * d;
    }
    float r = 1.0f / sqrtf(dt_warp_sum(v) / C + 1e-5f);
    T *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = st<T>((ld(x[c]) - m) * r * ld(w[c]) + ld(b[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* rows whose length is a multiple of 32 vectors, all pointers 16-byte aligned */
template <typename T>
__global__ void ln_fwd_vec_k(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N, int C) {
    enum { V = dt_vec<T>::N };
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    float xv[V], s = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        dt_load_vec(x + c, xv);
#pragma unroll
        for (int i = 0; i < V; i++) s += xv[i];
    }
    float m = dt_warp_sum(s) / C, v = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        dt_load_vec(x + c, xv);
#pragma unroll
        for (int i = 0; i < V; i++) v += (xv[i] - m) * (xv[i] - m);
    }
    float r = 1.0f / sqrtf(dt_warp_sum(v) / C + 1e-5f);
    T *o = out + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float wv[V], bv[V];
        dt_load_vec(x + c, xv);
        dt_load_vec(w + c, wv);
        dt_load_vec(b + c, bv);
#pragma unroll
        for (int i = 0; i < V; i++) xv[i] = (xv[i] - m) * r * wv[i] + bv[i];
        dt_store_vec(o + c, xv);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

template <typename T>
__global__ void ln_bwd_dx_vec_k(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                const float *rstd, int N, int C) {
    enum { V = dt_vec<T>::N };
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row], a = 0.0f, bsum = 0.0f;
    float xv[V], dv[V], wv[V];
    for (int c = lane * V; c < C; c += 32 * V) {
        dt_load_vec(x + c, xv);
        dt_load_vec(dy + c, dv);
        dt_load_vec(w + c, wv);
#pragma unroll
        for (int i = 0; i < V; i++) {
            float dn = wv[i] * dv[i];
            a += dn;
            bsum += dn * (xv[i] - m) * r;
        }
    }
    a = dt_warp_sum(a) / C;
    bsum = dt_warp_sum(bsum) / C;
    T *dx = dinp + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float ov[V];
        dt_load_vec(x + c, xv);
        dt_load_vec(dy + c, dv);
        dt_load_vec(w + c, wv);
        dt_load_vec(dx + c, ov);
#pragma unroll
        for (int i = 0; i < V; i++) ov[i] += (wv[i] * dv[i] - a - (xv[i] - m) * r * bsum) * r;
        dt_store_vec(dx + c, ov);
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <typename T>
void cuda_layernorm_fwd(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N, int C) {
    if (C % (32 * dt_vec<T>::N) == 0 && aligned16(out) && aligned16(inp) && aligned16(w) && aligned16(b)) {
        ln_fwd_vec_k<<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS, 0, dt_cuda_stream()>>>(out, mean, rstd, inp, w, b,
                                                                                          N, C);
        DT_CUDA_LAUNCHED("layernorm_fwd");
        return;
    }
    ln_fwd_k<<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS, 0, dt_cuda_stream()>>>(out, mean, rstd, inp, w, b, N, C);
    DT_CUDA_LAUNCHED("layernorm_fwd");
}

template <typename T>
__global__ void ln_bwd_dx_k(T *dinp, const T *dout, const T *inp, const T *w, const float *mean, const float *rstd,
                            int N, int C) {
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float a = 0.0f, bsum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = ld(w[c]) * ld(dy[c]);
        a += dn;
        bsum += dn * (ld(x[c]) - m) * r;
    }
    a = dt_warp_sum(a) / C;
    bsum = dt_warp_sum(bsum) / C;
    T *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float n = (ld(x[c]) - m) * r;
        dx[c] = st<T>(ld(dx[c]) + (ld(w[c]) * ld(dy[c]) - a - n * bsum) * r);
    }
}

enum { COL_TILE = 32, ROW_LANES = 8 };

/* partial sums over a chunk of rows of (x-mean)·rstd·dy and dy, per column */
template <typename T>
__global__ void ln_dwdb_partial_k(float *pw, float *pb, const T *dout, const T *inp, const float *mean,
                                  const float *rstd, int N, int C, int rows_per_chunk) {
    __shared__ float sw[ROW_LANES][COL_TILE], sb[ROW_LANES][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x, r = blockIdx.y;
    int r0 = r * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int i = r0 + threadIdx.y; i < r1; i += ROW_LANES) {
            float dy = ld(dout[(size_t)i * C + c]);
            aw += (ld(inp[(size_t)i * C + c]) - mean[i]) * rstd[i] * dy;
            ab += dy;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < ROW_LANES; k++) {
            tw += sw[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        pw[(size_t)r * C + c] = tw;
        pb[(size_t)r * C + c] = tb;
    }
}

/* the partials of 32 columns summed by 8 lanes each, then across lanes (a fixed order) */
template <typename T>
__global__ void ln_dwdb_finish_k(T *dw, T *db, const float *pw, const float *pb, int chunks, int C) {
    __shared__ float sw[ROW_LANES][COL_TILE], sb[ROW_LANES][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    float tw = 0.0f, tb = 0.0f;
    if (c < C)
        for (int r = threadIdx.y; r < chunks; r += ROW_LANES) {
            tw += pw[(size_t)r * C + c];
            tb += pb[(size_t)r * C + c];
        }
    sw[threadIdx.y][threadIdx.x] = tw;
    sb[threadIdx.y][threadIdx.x] = tb;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int k = 1; k < ROW_LANES; k++) {
        tw += sw[k][threadIdx.x];
        tb += sb[k][threadIdx.x];
    }
    dw[c] = st<T>(ld(dw[c]) + tw);
    db[c] = st<T>(ld(db[c]) + tb);
}

template <typename T>
void cuda_layernorm_bwd(T *dinp, T *dw, T *db, const T *dout, const T *inp, const T *w, const float *mean,
                        const float *rstd, int N, int C) {
    cudaStream_t s = dt_cuda_stream();
    if (!dinp) { /* a split backward's weight half */
    } else if (C % (32 * dt_vec<T>::N) == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w)) {
        ln_bwd_dx_vec_k<<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
        DT_CUDA_LAUNCHED("layernorm_bwd_dx");
    } else {
        ln_bwd_dx_k<<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
        DT_CUDA_LAUNCHED("layernorm_bwd_dx");
    }
    if (!dw) return; /* its input half */
    int rows = (N + 255) / 256;
    if (rows < 64) rows = 64;
    int chunks = (N + rows - 1) / rows;
    float *pw = (float *)dt_cuda_scratch(2 * (size_t)chunks * C * sizeof(float));
    if (!pw) return;
    float *pb = pw + (size_t)chunks * C;
    dim3 grid((C + COL_TILE - 1) / COL_TILE, chunks), block(COL_TILE, ROW_LANES);
    ln_dwdb_partial_k<<<grid, block, 0, s>>>(pw, pb, dout, inp, mean, rstd, N, C, rows);
    DT_CUDA_LAUNCHED("layernorm_bwd_dwdb");
    ln_dwdb_finish_k<<<(C + COL_TILE - 1) / COL_TILE, block, 0, s>>>(dw, db, pw, pb, chunks, C);
    DT_CUDA_LAUNCHED("layernorm_bwd_finish");
}

/* ---- elementwise ---- */

template <typename T>
__global__ void gelu_fwd_k(T *out, const T *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp[i]);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        out[i] = st<T>(0.5f * x * (1.0f + tanhf(u)));
    }
}

template <typename T>
__global__ void gelu_bwd_k(T *dinp, const T *inp, const T *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp[i]);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = st<T>(g * ld(dout[i]));
    }
}

template <typename T>
__global__ void add_k(T *out, const T *a, const T *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = st<T>(ld(a[i]) + ld(b[i]));
}

template <typename T>
void cuda_gelu_fwd(T *out, const T *inp, size_t n) {
    gelu_fwd_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(out, inp, n);
    DT_CUDA_LAUNCHED("gelu_fwd");
}
template <typename T>
void cuda_gelu_bwd(T *dinp, const T *inp, const T *dout, size_t n) {
    gelu_bwd_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(dinp, inp, dout, n);
    DT_CUDA_LAUNCHED("gelu_bwd");
}
template <typename T>
void cuda_add(T *out, const T *a, const T *b, size_t n) {
    add_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(out, a, b, n);
    DT_CUDA_LAUNCHED("add");
}

/* ---- softmax cross-entropy: one block per row ---- */

enum { XENT_THREADS = 512 };

static __device__ __forceinline__ void merge_max_sum(float &m, float &s, float m2, float s2) {
    float M = fmaxf(m, m2);
    if (M == -INFINITY) return; /* both empty */
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

template <typename T>
__global__ void xent_k(T *logits, float *losses, const dt_token *targets, int V, int Vp, float scale) {
    __shared__ float sm[XENT_THREADS / 32], ss[XENT_THREADS / 32];
    __shared__ float row_m, row_s;
    T *x = logits + (size_t)blockIdx.x * Vp;
    int t = targets[blockIdx.x];
    if (t < 0) { /* DT_IGNORE: not in the loss (the whole block takes this branch) */
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        if (scale != 0.0f)
            for (int j = threadIdx.x; j < Vp; j += XENT_THREADS) x[j] = st<T>(0.0f);
        return;
    }
    float xt = ld(x[t]); /* read before any thread overwrites the row */
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < V; j += XENT_THREADS) { /* online max and sum of exponentials */
        float v = ld(x[j]);
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int o = 16; o > 0; o /= 2) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        merge_max_sum(m, s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sm[0], S = ss[0];
        for (int w = 1; w < XENT_THREADS / 32; w++) merge_max_sum(M, S, sm[w], ss[w]);
        row_m = M;
        row_s = S;
        losses[blockIdx.x] = logf(S) + M - xt;
    }
    __syncthreads();
    if (scale == 0.0f) return;
    float M = row_m, k = scale / row_s;
    for (int j = threadIdx.x; j < Vp; j += XENT_THREADS) {
        float g = j < V ? expf(ld(x[j]) - M) * k : 0.0f;
        x[j] = st<T>(j == t ? g - scale : g);
    }
}

template <typename T>
void cuda_softmax_xent(T *logits, float *losses, const dt_token *targets, int N, int V, int Vp, float scale) {
    if (N <= 0) return;
    xent_k<<<N, XENT_THREADS, 0, dt_cuda_stream()>>>(logits, losses, targets, V, Vp, scale);
    DT_CUDA_LAUNCHED("softmax_xent");
}

/* ---- vocabulary-parallel cross-entropy (fp32): one block per row, as above ---- */

static __device__ float block_max(float v, float *sh) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = sh[0];
    for (int w = 1; w < XENT_THREADS / 32; w++) r = fmaxf(r, sh[w]);
    __syncthreads();
    return r;
}
static __device__ float block_sum(float v, float *sh) { /* fixed order: lanes, then warps */
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < XENT_THREADS / 32; w++) r += sh[w];
    __syncthreads();
    return r;
}

/* The vocabulary-parallel steps over logits [N, Vl] in storage type T; statistics fp32. */
template <typename T> __global__ void xent_rowmax_k(const T *logits, float *mx, int Vl, int real) {
    __shared__ float sh[XENT_THREADS / 32];
    const T *x = logits + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < real; j += XENT_THREADS) m = fmaxf(m, ld(x[j]));
    m = block_max(m, sh);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

template <typename T>
__global__ void xent_rowsum_k(const T *logits, const float *mx, const dt_token *targets, float *st, int Vl, int real,
                              int v0) {
    __shared__ float sh[XENT_THREADS / 32];
    const T *x = logits + (size_t)blockIdx.x * Vl;
    float m = mx[blockIdx.x], s = 0.0f;
    for (int j = threadIdx.x; j < real; j += XENT_THREADS) s += expf(ld(x[j]) - m);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        int t = (int)targets[blockIdx.x] - v0;
        st[2 * blockIdx.x] = s;
        st[2 * blockIdx.x + 1] = t >= 0 && t < real ? ld(x[t]) : 0.0f;
    }
}

template <typename T>
__global__ void xent_finish_k(T *logits, float *losses, const float *mx, const float *stats, const dt_token *targets,
                              int Vl, int real, int v0, float scale) {
    T *x = logits + (size_t)blockIdx.x * Vl;
    float m = mx[blockIdx.x], sum = stats[2 * blockIdx.x];
    if (targets[blockIdx.x] < 0) { /* DT_IGNORE: not in the loss */
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        if (scale != 0.0f)
            for (int j = threadIdx.x; j < Vl; j += XENT_THREADS) x[j] = st<T>(0.0f);
        return;
    }
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + m - stats[2 * blockIdx.x + 1];
    if (scale == 0.0f) return;
    int t = (int)targets[blockIdx.x] - v0;
    float k = scale / sum;
    for (int j = threadIdx.x; j < Vl; j += XENT_THREADS) {
        float g = j < real ? expf(ld(x[j]) - m) * k : 0.0f;
        x[j] = st<T>(j == t ? g - scale : g);
    }
}

template <typename T> void cuda_xent_rowmax(const T *logits, float *mx, int N, int Vl, int real) {
    if (N <= 0) return;
    xent_rowmax_k<T><<<N, XENT_THREADS, 0, dt_cuda_stream()>>>(logits, mx, Vl, real);
    DT_CUDA_LAUNCHED("xent_rowmax");
}
template <typename T>
void cuda_xent_rowsum(const T *logits, const float *mx, const dt_token *targets, float *st, int N, int Vl, int real,
                      int v0) {
    if (N <= 0) return;
    xent_rowsum_k<T><<<N, XENT_THREADS, 0, dt_cuda_stream()>>>(logits, mx, targets, st, Vl, real, v0);
    DT_CUDA_LAUNCHED("xent_rowsum");
}
template <typename T>
void cuda_xent_finish(T *logits, float *losses, const float *mx, const float *st, const dt_token *targets, int N,
                      int Vl, int real, int v0, float scale) {
    if (N <= 0) return;
    xent_finish_k<T><<<N, XENT_THREADS, 0, dt_cuda_stream()>>>(logits, losses, mx, st, targets, Vl, real, v0, scale);
    DT_CUDA_LAUNCHED("xent_finish");
}
template void cuda_xent_rowmax<float>(const float *, float *, int, int, int);
template void cuda_xent_rowmax<bf16>(const bf16 *, float *, int, int, int);
template void cuda_xent_rowsum<float>(const float *, const float *, const dt_token *, float *, int, int, int, int);
template void cuda_xent_rowsum<bf16>(const bf16 *, const float *, const dt_token *, float *, int, int, int, int);
template void cuda_xent_finish<float>(float *, float *, const float *, const float *, const dt_token *, int, int, int,
                                      int, float);
template void cuda_xent_finish<bf16>(bf16 *, float *, const float *, const float *, const dt_token *, int, int, int,
                                     int, float);

/* ---- AdamW ---- */

template <typename T>
__global__ void adamw_k(float *p, T *p_store, const T *g, float *m, float *v, size_t n, float lr, float beta1,
                        float beta2, float eps, float wd, float bc1, float bc2, float gscale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = ld(g[i]) * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float pi = p[i] - lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
        p[i] = pi;
        if (p_store) p_store[i] = st<T>(pi);
    }
}

template <typename T>
void cuda_adamw(float *p, T *p_store, const T *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float wd, float bc1, float bc2, float gscale) {
    if (n == 0) return;
    adamw_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(p, p_store, g, m, v, n, lr, beta1, beta2, eps, wd, bc1,
                                                               bc2, gscale);
    DT_CUDA_LAUNCHED("adamw");
}

__global__ void to_bf16_k(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = st<bf16>(src[i]);
}
__global__ void from_bf16_k(float *dst, const bf16 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ld(src[i]);
}
void dt_cuda_to_bf16(void *dst, const float *src, size_t n) {
    if (n == 0) return;
    to_bf16_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>((bf16 *)dst, src, n);
    DT_CUDA_LAUNCHED("to_bf16");
}
void dt_cuda_from_bf16(float *dst, const void *src, size_t n) {
    if (n == 0) return;
    from_bf16_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(dst, (const bf16 *)src, n);
    DT_CUDA_LAUNCHED("from_bf16");
}

/* both storage types */
#define DT_INSTANTIATE(T)                                                                                           \
    template void cuda_embed_fwd<T>(T *, const dt_token *, const T *, const T *, int, int, int, int, int);            \
    template void cuda_embed_bwd<T>(T *, T *, const T *, const dt_token *, int, int, int, int, int);                  \
    template void cuda_layernorm_fwd<T>(T *, float *, float *, const T *, const T *, const T *, int, int);            \
    template void cuda_layernorm_bwd<T>(T *, T *, T *, const T *, const T *, const T *, const float *, const float *, \
                                        int, int);                                                                   \
    template void cuda_gelu_fwd<T>(T *, const T *, size_t);                                                          \
    template void cuda_gelu_bwd<T>(T *, const T *, const T *, size_t);                                               \
    template void cuda_add<T>(T *, const T *, const T *, size_t);                                                    \
    template void cuda_softmax_xent<T>(T *, float *, const dt_token *, int, int, int, float);                         \
    template void cuda_adamw<T>(float *, T *, const T *, float *, float *, size_t, float, float, float, float, float, \
                                float, float, float);
DT_INSTANTIATE(float)
DT_INSTANTIATE(bf16)
