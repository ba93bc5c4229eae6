/* Launches of the Llama family's kernels (llama_kernels.cuh): RMSNorm as LayerNorm's
 * (kernels.cu: the vectorised kernels where the rows allow, the weight gradient through
 * ordered partials in scratch), SwiGLU and the rotary kernels as GELU's grid-stride loops.
 * pos and inv_freq are device memory (the model uploads them, gpt.c and passes.c). */
#include "cuda_internal.h"
#include "llama_kernels.cuh"

using namespace dt_llama;

static int blocks_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    size_t cap = (size_t)dt_cuda_sm_count() * 32;
    if (cap == 0) cap = 4096;
    return (int)(b < cap ? (b > 0 ? b : 1) : cap);
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <typename T>
void cuda_rmsnorm_fwd(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    if (N <= 0) return;
    int grid = (N + WARPS - 1) / WARPS;
    if (C % (32 * dt_vec<T>::N) == 0 && aligned16(out) && aligned16(inp) && aligned16(w))
        rms_fwd_vec_k<<<grid, THREADS, 0, dt_cuda_stream()>>>(out, rstd, inp, w, N, C, eps);
    else
        rms_fwd_k<<<grid, THREADS, 0, dt_cuda_stream()>>>(out, rstd, inp, w, N, C, eps);
    DT_CUDA_LAUNCHED("rmsnorm_fwd");
}

template <typename T>
void cuda_rmsnorm_bwd(T *dinp, T *dw, const T *dout, const T *inp, const T *w, const float *rstd, int N, int C) {
    if (N <= 0) return;
    cudaStream_t s = dt_cuda_stream();
    int grid = (N + WARPS - 1) / WARPS;
    if (!dinp) { /* a split backward's weight half */
    } else if (C % (32 * dt_vec<T>::N) == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w)) {
        rms_bwd_dx_vec_k<<<grid, THREADS, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
        DT_CUDA_LAUNCHED("rmsnorm_bwd_dx");
    } else {
        rms_bwd_dx_k<<<grid, THREADS, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
        DT_CUDA_LAUNCHED("rmsnorm_bwd_dx");
    }
    if (!dw) return; /* its input half */
    int rows = dw_rows_per_chunk(N), chunks = dw_chunks(N);
    float *pw = (float *)dt_cuda_scratch((size_t)chunks * C * sizeof(float));
    if (!pw) return;
    int tiles = (C + COL_TILE - 1) / COL_TILE;
    rms_dw_partial_k<<<dim3(tiles, chunks), THREADS, DW_SMEM, s>>>(pw, dout, inp, rstd, N, C, rows);
    DT_CUDA_LAUNCHED("rmsnorm_bwd_dw");
    rms_dw_finish_k<<<tiles, THREADS, DW_SMEM, s>>>(dw, pw, chunks, C);
    DT_CUDA_LAUNCHED("rmsnorm_bwd_finish");
}

template <typename T> void cuda_swiglu_fwd(T *out, const T *gate, const T *up, size_t n) {
    if (n == 0) return;
    swiglu_fwd_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(out, gate, up, n);
    DT_CUDA_LAUNCHED("swiglu_fwd");
}

template <typename T> void cuda_swiglu_bwd(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n) {
    if (n == 0) return;
    swiglu_bwd_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(dgate, dup, dout, gate, up, n);
    DT_CUDA_LAUNCHED("swiglu_bwd");
}

template <typename T>
void cuda_rope_qkv_fwd(T *qkv, const T *q, const T *k, const T *v, const int *pos, const float *inv_freq, int N,
                       int NH, int NKV, int HS) {
    size_t n = (size_t)N * 3 * NH * (HS / 2);
    if (n == 0) return;
    rope_fwd_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(qkv, q, k, v, pos, inv_freq, N, NH, NKV, HS);
    DT_CUDA_LAUNCHED("rope_qkv_fwd");
}

template <typename T>
void cuda_rope_qkv_bwd(T *dq, T *dk, T *dv, const T *dqkv, const int *pos, const float *inv_freq, int N, int NH,
                       int NKV, int HS) {
    size_t n = (size_t)N * (NH + NKV) * (HS / 2);
    if (n == 0) return;
    rope_bwd_k<<<blocks_for(n, 256), 256, 0, dt_cuda_stream()>>>(dq, dk, dv, dqkv, pos, inv_freq, N, NH, NKV, HS);
    DT_CUDA_LAUNCHED("rope_qkv_bwd");
}

/* both storage types */
#define DT_INSTANTIATE(T)                                                                                           \
    template void cuda_rmsnorm_fwd<T>(T *, float *, const T *, const T *, int, int, float);                          \
    template void cuda_rmsnorm_bwd<T>(T *, T *, const T *, const T *, const T *, const float *, int, int);           \
    template void cuda_swiglu_fwd<T>(T *, const T *, const T *, size_t);                                             \
    template void cuda_swiglu_bwd<T>(T *, T *, const T *, const T *, const T *, size_t);                             \
    template void cuda_rope_qkv_fwd<T>(T *, const T *, const T *, const T *, const int *, const float *, int, int,   \
                                       int, int);                                                                    \
    template void cuda_rope_qkv_bwd<T>(T *, T *, T *, const T *, const int *, const float *, int, int, int, int);
DT_INSTANTIATE(float)
DT_INSTANTIATE(bf16)
