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
static size_t g_held, g_peak; /* device bytes dtrain holds now, and at most */

static void held(long long delta) {
    g_held += delta;
    if (g_held > g_peak) g_peak = g_held;
}
void dt_cuda_count_alloc(size_t bytes) { held((long long)bytes); }

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
    held(-(long long)g_scratch_bytes);
    g_scratch = NULL;
    g_scratch_bytes = 0;
    size_t want = bytes + bytes / 4;
    cudaError_t e = cudaMalloc(&g_scratch, want);
    if (e != cudaSuccess) {
        dt_cuda_record("cuda scratch", cudaGetErrorString(e));
        return NULL;
    }
    g_scratch_bytes = want;
    held((long long)want);
    return g_scratch;
}

/* sizes of live allocations, for the peak (a few dozen buffers: a linear list is fine) */
enum { MAX_LIVE = 4096 };
static void *g_live_p[MAX_LIVE];
static size_t g_live_n[MAX_LIVE];

/* page-locked host memory (offload.pin_memory): DMA at the bus's rate, no staging copy */
static dt_status cu_host_alloc(void **p, size_t bytes, const char *what) {
    *p = NULL;
    cudaError_t e = cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        return dt_fail(DT_ERUNTIME, "out of page-locked host memory allocating %s (%.2f GB): %s", what, bytes / 1e9,
                       cudaGetErrorString(e));
    }
    memset(*p, 0, bytes);
    return DT_OK;
}
static void cu_host_free(void *p) {
    if (p) cudaFreeHost(p);
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
    for (int i = 0; i < MAX_LIVE; i++)
        if (!g_live_p[i]) {
            g_live_p[i] = *p;
            g_live_n[i] = bytes;
            held((long long)bytes);
            break;
        }
    return DT_OK;
}

static void cu_free(void *p) {
    if (!p) return;
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_live_p[i] == p) {
            held(-(long long)g_live_n[i]);
            g_live_p[i] = NULL;
            break;
        }
    cudaFree(p);
}

static void cu_zero(void *p, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, g_stream);
    if (e != cudaSuccess) dt_cuda_record("cudaMemsetAsync", cudaGetErrorString(e));
}

static void cu_copy(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream);
    if (e != cudaSuccess) dt_cuda_record("copy", cudaGetErrorString(e));
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

/* device-to-host copies that overlap the compute queued after them: on their own stream,
 * after an event marking what was queued before (the data they read is final by then) */
static cudaStream_t g_d2h;
static cudaEvent_t g_d2h_ready;
static void cu_download_async(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaSuccess;
    if (!g_d2h) {
        e = cudaStreamCreateWithFlags(&g_d2h, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g_d2h_ready, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) e = cudaEventRecord(g_d2h_ready, g_stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g_d2h, g_d2h_ready, 0);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_d2h);
    if (e != cudaSuccess) dt_cuda_record("download_async", cudaGetErrorString(e));
}

static dt_status cu_sync(void) {
    if (g_d2h) {
        cudaError_t d = cudaStreamSynchronize(g_d2h);
        if (d != cudaSuccess) dt_cuda_record("download_async", cudaGetErrorString(d));
    }
    cudaError_t e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) dt_cuda_record("cuda", cudaGetErrorString(e));
    if (g_failed) return dt_fail(DT_ERUNTIME, "cuda backend: %s", g_err);
    return DT_OK;
}

/* The ops.h signatures (float *) over the storage type T of each table. */
template <typename T> struct wrap {
    static T *P(float *p) { return (T *)p; }
    static const T *P(const float *p) { return (const T *)p; }
    static void gemm(int tA, int tB, int M, int N, int K, float al, const float *A, int lda, const float *B, int ldb,
                     float be, float *C, int ldc) {
        cuda_gemm<T>(tA, tB, M, N, K, al, P(A), lda, P(B), ldb, be, P(C), ldc);
    }
    static void lin_f(float *o, const float *i, const float *w, const float *b, int N, int IC, int OC) {
        cuda_linear_fwd<T>(P(o), P(i), P(w), P(b), N, IC, OC);
    }
    static void lin_b(float *di, float *dw, float *db, const float *d, const float *i, const float *w, int N, int IC,
                      int OC, int acc) {
        cuda_linear_bwd<T>(P(di), P(dw), P(db), P(d), P(i), P(w), N, IC, OC, acc);
    }
    static void emb_f(float *o, const dt_token *t, const float *e, const float *p, int B, int Tn, int C, int v0,
                      int rows) {
        cuda_embed_fwd<T>(P(o), t, P(e), P(p), B, Tn, C, v0, rows);
    }
    static void emb_b(float *de, float *dp, const float *d, const dt_token *t, int B, int Tn, int C, int v0,
                      int rows) {
        cuda_embed_bwd<T>(P(de), P(dp), P(d), t, B, Tn, C, v0, rows);
    }
    static void ln_f(float *o, float *m, float *r, const float *i, const float *w, const float *b, int N, int C) {
        cuda_layernorm_fwd<T>(P(o), m, r, P(i), P(w), P(b), N, C);
    }
    static void ln_b(float *di, float *dw, float *db, const float *d, const float *i, const float *w, const float *m,
                     const float *r, int N, int C) {
        cuda_layernorm_bwd<T>(P(di), P(dw), P(db), P(d), P(i), P(w), m, r, N, C);
    }
    /* the MLP's GELU fused into its GEMMs (bf16 only: fp32 stays the exact parity path) */
    static void lin_gelu_f(float *o, float *pre, const float *i, const float *w, const float *b, int N, int IC,
                           int OC) {
        if (cuda_linear_gelu_fwd<T>(P(o), P(pre), P(i), P(w), P(b), N, IC, OC)) return;
        cuda_linear_fwd<T>(P(pre), P(i), P(w), P(b), N, IC, OC);
        cuda_gelu_fwd<T>(P(o), P(pre), (size_t)N * OC);
    }
    static void lin_dgelu_b(float *di, const float *d, const float *w, const float *pre, int N, int IC, int OC) {
        if (cuda_linear_dgelu_bwd<T>(P(di), P(d), P(w), P(pre), N, IC, OC)) return;
        cuda_linear_bwd<T>(P(di), NULL, NULL, P(d), NULL, P(w), N, IC, OC, 0);
        cuda_gelu_bwd<T>(P(di), P(pre), P(di), (size_t)N * IC);
    }
    static void gelu_f(float *o, const float *i, size_t n) { cuda_gelu_fwd<T>(P(o), P(i), n); }
    static void gelu_b(float *di, const float *i, const float *d, size_t n) { cuda_gelu_bwd<T>(P(di), P(i), P(d), n); }
    static void add(float *o, const float *a, const float *b, size_t n) { cuda_add<T>(P(o), P(a), P(b), n); }
    static void att_f(float *o, float *l, const float *q, const int *seg, int B, int Tn, int C, int NH) {
        cuda_attention_fwd<T>(P(o), l, P(q), seg, B, Tn, C, NH);
    }
    static void att_b(float *dq, const float *d, const float *q, const float *o, const float *l, const int *seg, int B,
                      int Tn, int C, int NH) {
        cuda_attention_bwd<T>(P(dq), P(d), P(q), P(o), l, seg, B, Tn, C, NH);
    }
    static void xent(float *lg, float *ls, const dt_token *t, int N, int V, int Vp, float s) {
        cuda_softmax_xent<T>(P(lg), ls, t, N, V, Vp, s);
    }
    static void rowmax(const float *lg, float *mx, int N, int Vl, int real) {
        cuda_xent_rowmax<T>(P(lg), mx, N, Vl, real);
    }
    static void rowsum(const float *lg, const float *mx, const dt_token *t, float *st, int N, int Vl, int real, int v0) {
        cuda_xent_rowsum<T>(P(lg), mx, t, st, N, Vl, real, v0);
    }
    static void finish(float *lg, float *ls, const float *mx, const float *st, const dt_token *t, int N, int Vl,
                       int real, int v0, float s) {
        cuda_xent_finish<T>(P(lg), ls, mx, st, t, N, Vl, real, v0, s);
    }
    static double sumsq(const float *x, size_t n) { return cuda_sumsq<T>(P(x), n); }
    static void adamw(float *p, float *ps, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                      float eps, float wd, float c1, float c2, float gs) {
        cuda_adamw<T>(p, P(ps), P(g), m, v, n, lr, b1, b2, eps, wd, c1, c2, gs);
    }
    /* the Llama family's (llama.cu) */
    static void rms_f(float *o, float *r, const float *i, const float *w, int N, int C, float eps) {
        cuda_rmsnorm_fwd<T>(P(o), r, P(i), P(w), N, C, eps);
    }
    static void rms_b(float *di, float *dw, const float *d, const float *i, const float *w, const float *r, int N,
                      int C) {
        cuda_rmsnorm_bwd<T>(P(di), P(dw), P(d), P(i), P(w), r, N, C);
    }
    static void swiglu_f(float *o, const float *g, const float *u, size_t n) {
        cuda_swiglu_fwd<T>(P(o), P(g), P(u), n);
    }
    static void swiglu_b(float *dg, float *du, const float *d, const float *g, const float *u, size_t n) {
        cuda_swiglu_bwd<T>(P(dg), P(du), P(d), P(g), P(u), n);
    }
    static void rope_f(float *qkv, const float *q, const float *k, const float *v, const int *pos, const float *f,
                       int N, int NH, int NKV, int HS) {
        cuda_rope_qkv_fwd<T>(P(qkv), P(q), P(k), P(v), pos, f, N, NH, NKV, HS);
    }
    static void rope_b(float *dq, float *dk, float *dv, const float *dqkv, const int *pos, const float *f, int N,
                       int NH, int NKV, int HS) {
        cuda_rope_qkv_bwd<T>(P(dq), P(dk), P(dv), P(dqkv), pos, f, N, NH, NKV, HS);
    }
    static dt_ops table(const char *name, int bf16) {
        dt_ops o = {};
        o.name = name;
        o.on_device = 1;
        o.bf16 = bf16;
        o.alloc = cu_alloc;
        o.free = cu_free;
        o.host_alloc = cu_host_alloc;
        o.host_free = cu_host_free;
        o.zero = cu_zero;
        o.upload = cu_upload;
        o.copy = cu_copy;
        o.download = cu_download;
        o.download_async = cu_download_async;
        o.sync = cu_sync;
        o.to_bf16 = dt_cuda_to_bf16;
        o.from_bf16 = dt_cuda_from_bf16;
        o.gemm = gemm;
        o.linear_fwd = lin_f;
        o.linear_bwd = lin_b;
        o.embed_fwd = emb_f;
        o.embed_bwd = emb_b;
        o.layernorm_fwd = ln_f;
        o.layernorm_bwd = ln_b;
        o.gelu_fwd = gelu_f;
        o.gelu_bwd = gelu_b;
        o.add = add;
        o.attention_fwd = att_f;
        o.attention_bwd = att_b;
        o.softmax_xent = xent;
        o.xent_rowmax = rowmax; /* vocabulary-parallel cross-entropy */
        o.xent_rowsum = rowsum;
        o.xent_finish = finish;
        o.sumsq = sumsq;
        o.sum = dt_cuda_sum;
        o.adamw = adamw;
        o.rmsnorm_fwd = rms_f; /* the Llama family */
        o.rmsnorm_bwd = rms_b;
        o.swiglu_fwd = swiglu_f;
        o.swiglu_bwd = swiglu_b;
        o.rope_qkv_fwd = rope_f;
        o.rope_qkv_bwd = rope_b;
        if (bf16 && !getenv("DT_CUDA_NO_GELU_FUSION")) { /* (set: the separate GELU kernels, to compare) */
            o.linear_gelu_fwd = lin_gelu_f;
            o.linear_dgelu_bwd = lin_dgelu_b;
        }
        return o;
    }
};

static dt_ops g_f32, g_bf16;
static int g_local_rank = -1;

extern "C" void dt_gpu_select(int local_rank) { g_local_rank = local_rank; }

extern "C" dt_status dt_ops_cuda(const dt_ops **out, int want_bf16) {
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
        int dev = g_local_rank >= 0 ? g_local_rank % n : lr ? atoi(lr) % n : 0;
        e = cudaSetDevice(dev);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return dt_fail(DT_ERUNTIME, "backend cuda: GPU %d: %s", dev, cudaGetErrorString(e));
        if (!dt_cuda_gemm_init()) return dt_fail(DT_ERUNTIME, "backend cuda: cuBLASLt: %s", g_err);
        g_f32 = wrap<float>::table("cuda", 0);
        g_bf16 = wrap<bf16>::table("cuda-bf16", 1);
        inited = 1;
    }
    *out = want_bf16 ? &g_bf16 : &g_f32;
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

extern "C" size_t dt_gpu_peak_bytes(void) { return g_peak; }

extern "C" void *dt_gpu_stream(void) { return g_stream; }

extern "C" double dt_gpu_bf16_peak(void) {
    const char *n = dt_gpu_name();
    if (strstr(n, "H100") && strstr(n, "PCIe")) return 756e12;
    if (strstr(n, "H100") || strstr(n, "H200") || strstr(n, "GH200")) return 989e12; /* SXM / HBM3 */
    if (strstr(n, "A100")) return 312e12;
    if (strstr(n, "L40S")) return 362e12;
    return 0.0;
}
