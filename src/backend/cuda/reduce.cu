/* Reductions in a fixed order (no atomics): the same inputs give the same bits on
 * every run, as the CPU backend promises. Two passes each: partial sums over fixed
 * row chunks / element ranges, then one ordered sum of the partials. */
#include "cuda_internal.h"

enum { COL_TILE = 32, ROW_THREADS = 8, MAX_ROW_CHUNKS = 256, SUM_BLOCKS = 512, SUM_THREADS = 256 };

/* partial[r][c] = sum of src[rows of chunk r][c]; block (x, r), threads (32 columns x 8 row lanes) */
template <typename T>
__global__ void colsum_partial(float *partial, const T *src, int N, int C, int rows_per_chunk) {
    __shared__ float acc[ROW_THREADS][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x, r = blockIdx.y;
    int r0 = r * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float s = 0.0f;
    if (c < C)
        for (int i = r0 + threadIdx.y; i < r1; i += ROW_THREADS) s += ld(src[(size_t)i * C + c]);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int k = 0; k < ROW_THREADS; k++) t += acc[k][threadIdx.x];
        partial[(size_t)r * C + c] = t;
    }
}

/* 8 lanes per column over the partials, then across lanes: a fixed order, and enough
 * threads in flight that the pass is not one long chain of dependent loads */
template <typename T>
__global__ void colsum_finish(T *dst, const float *partial, int chunks, int C) {
    __shared__ float acc[ROW_THREADS][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int r = threadIdx.y; r < chunks; r += ROW_THREADS) s += partial[(size_t)r * C + c];
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int k = 1; k < ROW_THREADS; k++) s += acc[k][threadIdx.x];
    dst[c] = st<T>(ld(dst[c]) + s);
}

template <typename T>
void cuda_colsum_acc(T *dst, const T *src, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int rows = (N + MAX_ROW_CHUNKS - 1) / MAX_ROW_CHUNKS;
    if (rows < 64) rows = 64;
    int chunks = (N + rows - 1) / rows;
    float *partial = (float *)dt_cuda_scratch((size_t)chunks * C * sizeof(float));
    if (!partial) return;
    dim3 grid((C + COL_TILE - 1) / COL_TILE, chunks), block(COL_TILE, ROW_THREADS);
    colsum_partial<<<grid, block, 0, dt_cuda_stream()>>>(partial, src, N, C, rows);
    DT_CUDA_LAUNCHED("colsum_partial");
    colsum_finish<<<(C + COL_TILE - 1) / COL_TILE, block, 0, dt_cuda_stream()>>>(dst, partial, chunks, C);
    DT_CUDA_LAUNCHED("colsum_finish");
}

template <int SQUARE, typename T>
__global__ void sum_partial(double *partial, const T *x, size_t n, size_t per_block) {
    __shared__ double sh[SUM_THREADS];
    size_t i0 = blockIdx.x * per_block, i1 = i0 + per_block < n ? i0 + per_block : n;
    double s = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += SUM_THREADS) {
        double v = ld(x[i]);
        s += SQUARE ? v * v : v;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = SUM_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

__global__ void sum_finish(double *out, const double *partial, int nblocks) {
    double s = 0.0;
    for (int i = 0; i < nblocks; i++) s += partial[i];
    *out = s;
}

template <int SQUARE, typename T>
static double sum_impl(const T *x, size_t n) {
    if (n == 0) return 0.0;
    size_t per = (n + SUM_BLOCKS - 1) / SUM_BLOCKS;
    per = (per + SUM_THREADS - 1) / SUM_THREADS * SUM_THREADS;
    int nblocks = (int)((n + per - 1) / per);
    double *partial = (double *)dt_cuda_scratch((size_t)(nblocks + 1) * sizeof(double));
    if (!partial) return NAN;
    sum_partial<SQUARE, T><<<nblocks, SUM_THREADS, 0, dt_cuda_stream()>>>(partial, x, n, per);
    DT_CUDA_LAUNCHED("sum_partial");
    sum_finish<<<1, 1, 0, dt_cuda_stream()>>>(partial + nblocks, partial, nblocks);
    DT_CUDA_LAUNCHED("sum_finish");
    double r = NAN;
    cudaError_t e = cudaMemcpyAsync(&r, partial + nblocks, sizeof r, cudaMemcpyDeviceToHost, dt_cuda_stream());
    if (e == cudaSuccess) e = cudaStreamSynchronize(dt_cuda_stream());
    if (e != cudaSuccess) {
        dt_cuda_record("sum", cudaGetErrorString(e));
        return NAN;
    }
    return r;
}

template <typename T> double cuda_sumsq(const T *x, size_t n) { return sum_impl<1, T>(x, n); }
double dt_cuda_sum(const float *x, size_t n) { return sum_impl<0, float>(x, n); }

template void cuda_colsum_acc<float>(float *, const float *, int, int);
template void cuda_colsum_acc<bf16>(bf16 *, const bf16 *, int, int);
template double cuda_sumsq<float>(const float *, size_t);
template double cuda_sumsq<bf16>(const bf16 *, size_t);
