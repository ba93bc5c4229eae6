/* The CUDA backend's table: device memory, one stream, deferred errors. Ranks on one
 * node take GPUs round-robin by local rank (several ranks may share one GPU). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static cudaStream_t g_stream;
static char g_err[512];
static int g_failed;
static void *g_scratch;
static size_t g_scratch_bytes;
static int g_sms;

cudaStream_t dt_cuda_stream(void) { return g_stream; }
int dt_cuda_sm_count(void) { return g_sms; }

void dt_cuda_record(const char *what, const char *detail) {
    if (g_failed) return;
    g_failed = 1;
    snprintf(g_err, sizeof g_err, "%s: %s", what, detail);
}

void dt_cuda_check_launch(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) dt_cuda_record(kernel, cudaGetErrorString(e));
}

void *dt_cuda_scratch(size_t bytes) {
    if (bytes <= g_scratch_bytes) return g_scratch;
    /* grows to the largest request seen, then stays: no allocation in steady state */
    if (g_scratch) cudaFree(g_scratch); /* synchronising: earlier users are done */
    g_scratch = NULL;
    g_scratch_bytes = 0;
    size_t want = bytes + bytes / 4;
    cudaError_t e = cudaMalloc(&g_scratch, want);
    if (e != cudaSuccess) {
        dt_cuda_record("cuda scratch", cudaGetErrorString(e));
        return NULL;
    }
    g_scratch_bytes = want;
    return g_scratch;
}

static dt_status cu_alloc(void **p, size_t bytes, const char *what) {
    *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        size_t freeb = 0, total = 0;
        cudaMemGetInfo(&freeb, &total);
        cudaGetLastError();
        *p = NULL;
        return dt_fail(DT_ERUNTIME, "out of GPU memory allocating %s (%.2f GB; %.2f GB of %.2f GB free): %s", what,
                       bytes / 1e9, freeb / 1e9, total / 1e9, cudaGetErrorString(e));
    }
    e = cudaMemsetAsync(*p, 0, bytes, g_stream);
    if (e != cudaSuccess) dt_cuda_record("cudaMemset", cudaGetErrorString(e));
    return DT_OK;
}

static void cu_free(void *p) {
    if (p) cudaFree(p);
}

static void cu_zero(void *p, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, g_stream);
    if (e != cudaSuccess) dt_cuda_record("cudaMemsetAsync", cudaGetErrorString(e));
}

static void cu_upload(void *dst, const void *src, size_t bytes) {
    /* from pageable host memory: the copy is staged before the call returns, so the
     * caller may reuse src at once */
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream);
    if (e != cudaSuccess) dt_cuda_record("upload", cudaGetErrorString(e));
}

static void cu_download(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) dt_cuda_record("download", cudaGetErrorString(e));
}

static dt_status cu_sync(void) {
    cudaError_t e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) dt_cuda_record("cuda", cudaGetErrorString(e));
    if (g_failed) return dt_fail(DT_ERUNTIME, "cuda backend: %s", g_err);
    return DT_OK;
}

static const dt_ops CUDA_OPS = {
    .name = "cuda",
    .on_device = 1,
    .alloc = cu_alloc,
    .free = cu_free,
    .zero = cu_zero,
    .upload = cu_upload,
    .download = cu_download,
    .sync = cu_sync,
    .gemm = dt_cuda_gemm,
    .linear_fwd = dt_cuda_linear_fwd,
    .linear_bwd = dt_cuda_linear_bwd,
    .embed_fwd = dt_cuda_embed_fwd,
    .embed_bwd = dt_cuda_embed_bwd,
    .layernorm_fwd = dt_cuda_layernorm_fwd,
    .layernorm_bwd = dt_cuda_layernorm_bwd,
    .gelu_fwd = dt_cuda_gelu_fwd,
    .gelu_bwd = dt_cuda_gelu_bwd,
    .add = dt_cuda_add,
    .attention_fwd = dt_cuda_attention_fwd,
    .attention_bwd = dt_cuda_attention_bwd,
    .softmax_xent = dt_cuda_softmax_xent,
    .sumsq = dt_cuda_sumsq,
    .sum = dt_cuda_sum,
    .adamw = dt_cuda_adamw,
};

extern "C" dt_status dt_ops_cuda(const dt_ops **out) {
    static int inited;
    *out = NULL;
    if (!inited) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n == 0)
            return dt_fail(DT_EINPUT, "backend cuda: no usable GPU on this machine (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        if (!lr) lr = getenv("LOCAL_RANK");
        int dev = lr ? atoi(lr) % n : 0;
        e = cudaSetDevice(dev);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return dt_fail(DT_ERUNTIME, "backend cuda: GPU %d: %s", dev, cudaGetErrorString(e));
        if (!dt_cuda_gemm_init()) return dt_fail(DT_ERUNTIME, "backend cuda: cuBLASLt: %s", g_err);
        inited = 1;
    }
    *out = &CUDA_OPS;
    return DT_OK;
}

extern "C" const char *dt_gpu_name(void) {
    static char name[256];
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "unknown GPU";
    snprintf(name, sizeof name, "%s", p.name);
    return name;
}
