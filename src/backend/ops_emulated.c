/* `backend: emulated`: the CPU kernels behind a device boundary. Memory from this table
 * lies at an address the host code cannot dereference (the host address plus 2^62, which
 * is not canonical on x86-64: any load or store there faults), the kernels translate it
 * back, and the host reaches it only through upload, download and the kernels, as with a
 * GPU's memory. So the host staging of the GPU paths (DDP's gradient copies, tensor and
 * pipeline parallelism's messages, checkpoint and digest host copies, the tied embedding's
 * sum) runs, and is tested for parity, on machines without a GPU: code that hands device
 * memory to MPI or reads it on the host crashes here as it would on a GPU. The arithmetic
 * is the CPU backend's, so an emulated run gives the CPU run's numbers bit for bit.
 * The fault needs x86-64's canonical addresses: Arm's top-byte-ignore would let such an
 * access through, so there the backend runs but proves nothing (test_emulated skips). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops.h"

static const dt_ops *inner;
static const uintptr_t AWAY = (uintptr_t)1 << 62;

/* device address <-> host address; NULL stays NULL (optional arguments) */
static void *H(const void *dev) { return dev ? (void *)((uintptr_t)dev - AWAY) : NULL; }
void *dt_emulated_host(const void *dev) { return H(dev); }
#define HF(p) ((float *)H(p))
#define HT(p) ((const dt_token *)H(p))

static dt_status e_alloc(void **p, size_t bytes, const char *what) {
    void *h = NULL;
    dt_status s = inner->alloc(&h, bytes, what);
    *p = s == DT_OK && h ? (void *)((uintptr_t)h + AWAY) : NULL;
    return s;
}
static void e_free(void *p) { inner->free(H(p)); }
/* pinned host memory: page-aligned, with its size in a header page so the count can drop */
static size_t g_pinned;
static dt_status e_host_alloc(void **p, size_t bytes, const char *what) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    unsigned char *b = NULL;
    *p = NULL;
    if (posix_memalign((void **)&b, page, page + bytes) != 0)
        return dt_fail(DT_ERUNTIME, "out of host memory allocating %s (%zu bytes, pinned)", what, bytes);
    memset(b, 0, page + bytes);
    memcpy(b, &bytes, sizeof bytes);
    g_pinned += bytes;
    *p = b + page;
    return DT_OK;
}
static void e_host_free(void *p) {
    if (!p) return;
    long pg = sysconf(_SC_PAGESIZE);
    unsigned char *b = (unsigned char *)p - (pg > 0 ? (size_t)pg : 4096);
    size_t bytes;
    memcpy(&bytes, b, sizeof bytes);
    g_pinned -= bytes;
    free(b);
}
size_t dt_emulated_pinned_bytes(void) { return g_pinned; }
static void e_zero(void *p, size_t bytes) { inner->zero(H(p), bytes); }
static void e_upload(void *dst, const void *src, size_t bytes) { memcpy(H(dst), src, bytes); }
static void e_download(void *dst, const void *src, size_t bytes) { memcpy(dst, H(src), bytes); }
static void e_copy(void *dst, const void *src, size_t bytes) { inner->copy(H(dst), H(src), bytes); }
static dt_status e_sync(void) { return inner->sync(); }
static void e_to_bf16(void *d, const float *s, size_t n) { inner->to_bf16(H(d), HF(s), n); }
static void e_from_bf16(float *d, const void *s, size_t n) { inner->from_bf16(HF(d), H(s), n); }
static void e_gemm(int tA, int tB, int M, int N, int K, float al, const float *A, int lda, const float *B, int ldb,
                   float be, float *C, int ldc) {
    inner->gemm(tA, tB, M, N, K, al, HF(A), lda, HF(B), ldb, be, HF(C), ldc);
}
static void e_gemm_blocks(int tA, int tB, int M, int N, int K, float al, const float *const *A, int lda,
                          const float *const *B, int ldb, float be, float *const *C, int ldc, int count, int canon) {
    enum { MAXB = 256 };
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    for (int at = 0; at < count; at += MAXB) {
        int n = count - at < MAXB ? count - at : MAXB;
        for (int i = 0; i < n; i++) a[i] = HF(A[at + i]), b[i] = HF(B[at + i]), c[i] = HF(C[at + i]);
        dt_gemm_blocks(inner, tA, tB, M, N, K, al, a, lda, b, ldb, be, c, ldc, n, canon);
    }
}
static void e_lin_f(float *o, const float *i, const float *w, const float *b, int N, int IC, int OC) {
    inner->linear_fwd(HF(o), HF(i), HF(w), HF(b), N, IC, OC);
}
static void e_lin_b(float *di, float *dw, float *db, const float *d, const float *i, const float *w, int N, int IC,
                    int OC, int acc) {
    inner->linear_bwd(HF(di), HF(dw), HF(db), HF(d), HF(i), HF(w), N, IC, OC, acc);
}
static void e_emb_f(float *o, const dt_token *t, const float *e, const float *p, int B, int T, int C, int v0,
                    int rows) {
    inner->embed_fwd(HF(o), HT(t), HF(e), HF(p), B, T, C, v0, rows);
}
static void e_emb_b(float *de, float *dp, const float *d, const dt_token *t, int B, int T, int C, int v0, int rows) {
    inner->embed_bwd(HF(de), HF(dp), HF(d), HT(t), B, T, C, v0, rows);
}
static void e_ln_f(float *o, float *m, float *r, const float *i, const float *w, const float *b, int N, int C) {
    inner->layernorm_fwd(HF(o), HF(m), HF(r), HF(i), HF(w), HF(b), N, C);
}
static void e_ln_b(float *di, float *dw, float *db, const float *d, const float *i, const float *w, const float *m,
                   const float *r, int N, int C) {
    inner->layernorm_bwd(HF(di), HF(dw), HF(db), HF(d), HF(i), HF(w), HF(m), HF(r), N, C);
}
static void e_gelu_f(float *o, const float *i, size_t n) { inner->gelu_fwd(HF(o), HF(i), n); }
static void e_gelu_b(float *di, const float *i, const float *d, size_t n) { inner->gelu_bwd(HF(di), HF(i), HF(d), n); }
static void e_add(float *o, const float *a, const float *b, size_t n) { inner->add(HF(o), HF(a), HF(b), n); }
static void e_add_rows(float *o, int lo, const float *a, int la, const float *b, int lb, int rows, int n) {
    inner->add_rows(HF(o), lo, HF(a), la, HF(b), lb, rows, n);
}
static void e_att_f(float *o, float *l, const float *q, const int *seg, int B, int T, int C, int NH) {
    inner->attention_fwd(HF(o), HF(l), HF(q), (const int *)H(seg), B, T, C, NH);
}
static void e_att_b(float *dq, const float *d, const float *q, const float *o, const float *l, const int *seg, int B,
                    int T, int C, int NH) {
    inner->attention_bwd(HF(dq), HF(d), HF(q), HF(o), HF(l), (const int *)H(seg), B, T, C, NH);
}
static void e_xent(float *lg, float *ls, const dt_token *t, int N, int V, int Vp, float s) {
    inner->softmax_xent(HF(lg), HF(ls), HT(t), N, V, Vp, s);
}
static void e_rowmax(const float *lg, float *mx, int N, int Vl, int real) { inner->xent_rowmax(HF(lg), HF(mx), N, Vl, real); }
static void e_rowsum(const float *lg, const float *mx, const dt_token *t, float *st, int N, int Vl, int real, int v0) {
    inner->xent_rowsum(HF(lg), HF(mx), HT(t), HF(st), N, Vl, real, v0);
}
static void e_finish(float *lg, float *ls, const float *mx, const float *st, const dt_token *t, int N, int Vl,
                     int real, int v0, float s) {
    inner->xent_finish(HF(lg), HF(ls), HF(mx), HF(st), HT(t), N, Vl, real, v0, s);
}
static double e_sumsq(const float *x, size_t n) { return inner->sumsq(HF(x), n); }
static double e_sum(const float *x, size_t n) { return inner->sum(HF(x), n); }
static void e_adamw(float *p, float *ps, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                    float eps, float wd, float c1, float c2, float gs) {
    inner->adamw(HF(p), HF(ps), HF(g), HF(m), HF(v), n, lr, b1, b2, eps, wd, c1, c2, gs);
}

static void e_rms_f(float *o, float *r, const float *i, const float *w, int N, int C, float eps) {
    inner->rmsnorm_fwd(HF(o), HF(r), HF(i), HF(w), N, C, eps);
}
static void e_rms_b(float *di, float *dw, const float *d, const float *i, const float *w, const float *r, int N, int C) {
    inner->rmsnorm_bwd(HF(di), HF(dw), HF(d), HF(i), HF(w), HF(r), N, C);
}
static void e_swiglu_f(float *o, const float *g, const float *u, size_t n) { inner->swiglu_fwd(HF(o), HF(g), HF(u), n); }
static void e_swiglu_b(float *dg, float *du, const float *d, const float *g, const float *u, size_t n) {
    inner->swiglu_bwd(HF(dg), HF(du), HF(d), HF(g), HF(u), n);
}
static void e_rope_f(float *qkv, const float *q, const float *k, const float *v, const int *pos, const float *f, int N,
                     int NH, int NKV, int HS) {
    inner->rope_qkv_fwd(HF(qkv), HF(q), HF(k), HF(v), (const int *)H(pos), HF(f), N, NH, NKV, HS);
}
static void e_rope_b(float *dq, float *dk, float *dv, const float *dqkv, const int *pos, const float *f, int N, int NH,
                     int NKV, int HS) {
    inner->rope_qkv_bwd(HF(dq), HF(dk), HF(dv), HF(dqkv), (const int *)H(pos), HF(f), N, NH, NKV, HS);
}

static dt_ops EMULATED;

const dt_ops *dt_ops_emulated(const dt_ops *host) {
    inner = host;
    /* ring attention's blocks stay out, as on the GPU (its positions are host arrays) */
    EMULATED = (dt_ops){.name = host->bf16 ? "emulated+bf16-storage" : "emulated", .on_device = 1,
                        .bf16 = host->bf16, .alloc = e_alloc, .free = e_free, .zero = e_zero,
                        .upload = e_upload, .download = e_download, .copy = e_copy, .sync = e_sync,
                        .host_alloc = e_host_alloc, .host_free = e_host_free,
                        .to_bf16 = e_to_bf16, .from_bf16 = e_from_bf16, .gemm = e_gemm, .gemm_blocks = e_gemm_blocks, .linear_fwd = e_lin_f,
                        .linear_bwd = e_lin_b, .embed_fwd = e_emb_f, .embed_bwd = e_emb_b,
                        .layernorm_fwd = e_ln_f, .layernorm_bwd = e_ln_b, .gelu_fwd = e_gelu_f,
                        .gelu_bwd = e_gelu_b, .add = e_add, .attention_fwd = e_att_f, .attention_bwd = e_att_b,
                        .add_rows = host->add_rows ? e_add_rows : NULL,
                        .softmax_xent = e_xent, .xent_rowmax = host->xent_rowmax ? e_rowmax : NULL,
                        .xent_rowsum = host->xent_rowsum ? e_rowsum : NULL,
                        .xent_finish = host->xent_finish ? e_finish : NULL, .sumsq = e_sumsq, .sum = e_sum,
                        .adamw = e_adamw, .rmsnorm_fwd = host->rmsnorm_fwd ? e_rms_f : NULL,
                        .rmsnorm_bwd = host->rmsnorm_bwd ? e_rms_b : NULL,
                        .swiglu_fwd = host->swiglu_fwd ? e_swiglu_f : NULL,
                        .swiglu_bwd = host->swiglu_bwd ? e_swiglu_b : NULL,
                        .rope_qkv_fwd = host->rope_qkv_fwd ? e_rope_f : NULL,
                        .rope_qkv_bwd = host->rope_qkv_bwd ? e_rope_b : NULL};
    return &EMULATED;
}
