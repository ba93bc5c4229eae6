/* bf16 storage around an fp32 table (ops.h): every kernel widens its bf16 arguments
 * into fp32 scratch, runs the fp32 kernel there and rounds what it wrote back to bf16.
 * Arithmetic is the fp32 kernel's; only storage is bf16, as with `precision: bf16` on
 * the CPU. Scratch lives in the inner backend's memory, one grow-only buffer per
 * argument slot, so steady-state steps allocate nothing. A failed allocation is kept
 * and returned by sync (kernels return nothing). */
#include <stdio.h>

#include "ops.h"

static const dt_ops *in;
static dt_ops T;
static int failed;
static char failure[256];

enum { SLOTS = 7 };
static float *slot[SLOTS];
static size_t slot_cap[SLOTS];

static float *buf(int k, size_t n) {
    if (n <= slot_cap[k]) return slot[k];
    in->free(slot[k]);
    slot[k] = NULL;
    slot_cap[k] = 0;
    if (in->alloc((void **)&slot[k], n * sizeof(float), "bf16 scratch") != DT_OK) {
        if (!failed) snprintf(failure, sizeof failure, "%s", dt_error_message());
        failed = 1;
        dt_error_clear();
        return NULL;
    }
    slot_cap[k] = n;
    return slot[k];
}
/* fp32 copy of the bf16 x (NULL stays NULL) */
static float *wide(int k, const float *x, size_t n) {
    if (!x) return NULL;
    float *b = buf(k, n);
    if (b) in->from_bf16(b, x, n);
    return b;
}
static void narrow(float *dst, const float *b, size_t n) {
    if (dst && b) in->to_bf16(dst, b, n);
}
#define NEED(...)                                                 \
    do {                                                          \
        const void *need_[] = {__VA_ARGS__};                      \
        for (size_t i_ = 0; i_ < sizeof need_ / sizeof *need_; i_++) \
            if (!need_[i_]) return;                               \
    } while (0)

static void b_gemm(int tA, int tB, int M, int N, int K, float al, const float *A, int lda, const float *B, int ldb,
                   float be, float *C, int ldc) {
    size_t na = (size_t)(tA ? K : M) * lda, nb = (size_t)(tB ? N : K) * ldb, nc = (size_t)M * ldc;
    float *a = wide(0, A, na), *b = wide(1, B, nb), *c = wide(2, C, nc); /* C whole: ldc may exceed N */
    NEED(a, b, c);
    in->gemm(tA, tB, M, N, K, al, a, lda, b, ldb, be, c, ldc);
    narrow(C, c, nc);
}

static void b_lin_f(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC) {
    float *o = buf(0, (size_t)N * OC), *x = wide(1, inp, (size_t)N * IC), *ww = wide(2, w, (size_t)IC * OC);
    float *bb = wide(3, bias, (size_t)OC);
    NEED(o, x, ww);
    if (bias && !bb) return;
    in->linear_fwd(o, x, ww, bb, N, IC, OC);
    narrow(out, o, (size_t)N * OC);
}

static void b_lin_b(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N,
                    int IC, int OC, int acc) {
    float *dx = !dinp ? NULL : acc ? wide(0, dinp, (size_t)N * IC) : buf(0, (size_t)N * IC);
    float *dww = wide(1, dw, (size_t)IC * OC), *db = wide(2, dbias, (size_t)OC);
    float *dy = wide(3, dout, (size_t)N * OC);
    /* the input gradient alone reads the weights, the weight gradient alone the input (a
     * split backward passes only what its half reads: zero-bubble schedules) */
    float *ww = dinp ? wide(5, w, (size_t)IC * OC) : NULL, *x = dw ? wide(4, inp, (size_t)N * IC) : NULL;
    NEED(dy);
    if ((dinp && (!dx || !ww)) || (dw && (!dww || !x)) || (dbias && !db)) return;
    in->linear_bwd(dx, dww, db, dy, x, ww, N, IC, OC, acc);
    narrow(dinp, dx, (size_t)N * IC);
    narrow(dw, dww, (size_t)IC * OC);
    narrow(dbias, db, (size_t)OC);
}

static void b_emb_f(float *out, const dt_token *tok, const float *wte, const float *wpe, int B, int Tt, int C, int v0,
                    int rows) {
    size_t n = (size_t)B * Tt * C;
    float *o = buf(0, n), *e = wide(1, wte, (size_t)rows * C), *p = wide(2, wpe, (size_t)Tt * C);
    NEED(o, e);
    if (wpe && !p) return;
    in->embed_fwd(o, tok, e, p, B, Tt, C, v0, rows);
    narrow(out, o, n);
}

static void b_emb_b(float *dwte, float *dwpe, const float *dout, const dt_token *tok, int B, int Tt, int C, int v0,
                    int rows) {
    float *de = wide(0, dwte, (size_t)rows * C), *dp = wide(1, dwpe, (size_t)Tt * C);
    float *d = wide(2, dout, (size_t)B * Tt * C);
    NEED(de, d);
    if (dwpe && !dp) return;
    in->embed_bwd(de, dp, d, tok, B, Tt, C, v0, rows);
    narrow(dwte, de, (size_t)rows * C);
    narrow(dwpe, dp, (size_t)Tt * C);
}

static void b_ln_f(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                   int C) {
    float *o = buf(0, (size_t)N * C), *x = wide(1, inp, (size_t)N * C), *ww = wide(2, w, (size_t)C);
    float *bb = wide(3, b, (size_t)C);
    NEED(o, x, ww, bb);
    in->layernorm_fwd(o, mean, rstd, x, ww, bb, N, C);
    narrow(out, o, (size_t)N * C);
}

static void b_ln_b(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                   const float *mean, const float *rstd, int N, int C) {
    float *dx = wide(0, dinp, (size_t)N * C), *dww = wide(1, dw, (size_t)C), *dbb = wide(2, db, (size_t)C);
    float *dy = wide(3, dout, (size_t)N * C), *x = wide(4, inp, (size_t)N * C), *ww = wide(5, w, (size_t)C);
    NEED(dy, x, ww); /* dinp or dw/db may be NULL (a split backward's halves) */
    if ((dinp && !dx) || (dw && (!dww || !dbb))) return;
    in->layernorm_bwd(dx, dww, dbb, dy, x, ww, mean, rstd, N, C);
    narrow(dinp, dx, (size_t)N * C);
    narrow(dw, dww, (size_t)C);
    narrow(db, dbb, (size_t)C);
}

static void b_gelu_f(float *out, const float *inp, size_t n) {
    float *o = buf(0, n), *x = wide(1, inp, n);
    NEED(o, x);
    in->gelu_fwd(o, x, n);
    narrow(out, o, n);
}

static void b_gelu_b(float *dinp, const float *inp, const float *dout, size_t n) {
    float *dx = buf(0, n), *x = wide(1, inp, n), *dy = wide(2, dout, n); /* dinp may be dout */
    NEED(dx, x, dy);
    in->gelu_bwd(dx, x, dy, n);
    narrow(dinp, dx, n);
}

static void b_add(float *out, const float *a, const float *b, size_t n) {
    float *o = buf(0, n), *x = wide(1, a, n), *y = wide(2, b, n);
    NEED(o, x, y);
    in->add(o, x, y, n);
    narrow(out, o, n);
}

/* out's whole extent is widened and narrowed back (exact for the elements between its
 * rows, bf16 values); a that is out shares its buffer */
static void b_add_rows(float *out, int lo, const float *a, int la, const float *b, int lb, int rows, int n) {
    if (rows <= 0 || n <= 0) return;
    size_t eo = (size_t)(rows - 1) * lo + n, ea = (size_t)(rows - 1) * la + n, eb = (size_t)(rows - 1) * lb + n;
    float *o = wide(0, out, eo), *x = a == out && la == lo ? o : wide(1, a, ea), *y = b ? wide(2, b, eb) : NULL;
    NEED(o, x);
    if (b && !y) return;
    in->add_rows(o, lo, x, la, y, lb, rows, n);
    narrow(out, o, eo);
}

static void b_att_f(float *out, float *lse, const float *qkv, const int *seg, int B, int Tt, int C, int NH) {
    size_t n = (size_t)B * Tt * C;
    float *o = buf(0, n), *q = wide(1, qkv, 3 * n);
    NEED(o, q);
    in->attention_fwd(o, lse, q, seg, B, Tt, C, NH);
    narrow(out, o, n);
}

static void b_att_b(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                    const int *seg, int B, int Tt, int C, int NH) {
    size_t n = (size_t)B * Tt * C;
    float *dq = buf(0, 3 * n), *dy = wide(1, dout, n), *q = wide(2, qkv, 3 * n), *o = wide(3, out, n);
    NEED(dq, dy, q, o);
    in->attention_bwd(dq, dy, q, o, lse, seg, B, Tt, C, NH);
    narrow(dqkv, dq, 3 * n);
}

static void b_xent(float *logits, float *losses, const dt_token *targets, int N, int V, int Vp, float scale) {
    size_t n = (size_t)N * Vp;
    float *l = wide(0, logits, n);
    NEED(l);
    in->softmax_xent(l, losses, targets, N, V, Vp, scale);
    if (scale != 0.0f) narrow(logits, l, n);
}

/* The vocabulary-parallel cross-entropy's steps over bf16 logits [N, Vl]; the row
 * statistics and losses are fp32 already. */
static void b_rowmax(const float *logits, float *mx, int N, int Vl, int real) {
    float *l = wide(0, logits, (size_t)N * Vl);
    NEED(l);
    in->xent_rowmax(l, mx, N, Vl, real);
}
static void b_rowsum(const float *logits, const float *mx, const dt_token *tg, float *st, int N, int Vl, int real,
                     int v0) {
    float *l = wide(0, logits, (size_t)N * Vl);
    NEED(l);
    in->xent_rowsum(l, mx, tg, st, N, Vl, real, v0);
}
static void b_finish(float *logits, float *losses, const float *mx, const float *st, const dt_token *tg, int N,
                     int Vl, int real, int v0, float scale) {
    size_t n = (size_t)N * Vl;
    float *l = wide(0, logits, n);
    NEED(l);
    in->xent_finish(l, losses, mx, st, tg, N, Vl, real, v0, scale);
    if (scale != 0.0f) narrow(logits, l, n);
}

static double b_sumsq(const float *x, size_t n) {
    float *w = wide(0, x, n);
    return w ? in->sumsq(w, n) : 0.0;
}

static void b_adamw(float *p, float *p_store, const float *g, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float c1, float c2, float gs) {
    float *gw = wide(0, g, n);
    NEED(gw);
    in->adamw(p, NULL, gw, m, v, n, lr, b1, b2, eps, wd, c1, c2, gs);
    narrow(p_store, p, n);
}

static void b_rms_f(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    float *o = buf(0, (size_t)N * C), *x = wide(1, inp, (size_t)N * C), *ww = wide(2, w, (size_t)C);
    NEED(o, x, ww);
    in->rmsnorm_fwd(o, rstd, x, ww, N, C, eps);
    narrow(out, o, (size_t)N * C);
}
static void b_rms_b(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                    int N, int C) {
    float *dx = wide(0, dinp, (size_t)N * C), *dww = wide(1, dw, (size_t)C);
    float *dy = wide(3, dout, (size_t)N * C), *x = wide(4, inp, (size_t)N * C), *ww = wide(5, w, (size_t)C);
    NEED(dy, x, ww);
    if ((dinp && !dx) || (dw && !dww)) return;
    in->rmsnorm_bwd(dx, dww, dy, x, ww, rstd, N, C);
    narrow(dinp, dx, (size_t)N * C);
    narrow(dw, dww, (size_t)C);
}
static void b_swiglu_f(float *out, const float *gate, const float *up, size_t n) {
    float *o = buf(0, n), *g = wide(1, gate, n), *u = wide(2, up, n);
    NEED(o, g, u);
    in->swiglu_fwd(o, g, u, n);
    narrow(out, o, n);
}
static void b_swiglu_b(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    float *dg = buf(0, n), *du = buf(1, n), *d = wide(2, dout, n), *g = wide(3, gate, n), *u = wide(4, up, n);
    NEED(dg, du, d, g, u);
    in->swiglu_bwd(dg, du, d, g, u, n);
    narrow(dgate, dg, n);
    narrow(dup, du, n);
}
static void b_rope_f(float *qkv, const float *q, const float *k, const float *v, const int *pos, const float *f, int N,
                     int NH, int NKV, int HS) {
    size_t nq = (size_t)N * NH * HS, nk = (size_t)N * NKV * HS;
    float *o = buf(0, 3 * nq), *qq = wide(1, q, nq), *kk = wide(2, k, nk), *vv = wide(3, v, nk);
    NEED(o, qq, kk, vv);
    in->rope_qkv_fwd(o, qq, kk, vv, pos, f, N, NH, NKV, HS);
    narrow(qkv, o, 3 * nq);
}
static void b_rope_b(float *dq, float *dk, float *dv, const float *dqkv, const int *pos, const float *f, int N, int NH,
                     int NKV, int HS) {
    size_t nq = (size_t)N * NH * HS, nk = (size_t)N * NKV * HS;
    float *a = buf(0, nq), *b = buf(1, nk), *c = buf(2, nk), *d = wide(3, dqkv, 3 * nq);
    NEED(a, b, c, d);
    in->rope_qkv_bwd(a, b, c, d, pos, f, N, NH, NKV, HS);
    narrow(dq, a, nq);
    narrow(dk, b, nk);
    narrow(dv, c, nk);
}

static dt_status b_sync(void) {
    dt_status s = in->sync();
    if (s == DT_OK && failed) s = dt_fail(DT_ERUNTIME, "bf16 storage: %s", failure);
    return s;
}

const dt_ops *dt_ops_bf16_storage(const dt_ops *f32) {
    in = f32;
    T = *f32; /* memory functions pass through */
    T.name = f32->on_device ? "cuda+bf16-storage" : "cpu+bf16-storage";
    T.bf16 = 1;
    T.sync = b_sync;
    T.gemm = b_gemm;
    T.gemm_blocks = NULL; /* each block through b_gemm's conversions */
    T.linear_fwd = b_lin_f;
    T.linear_bwd = b_lin_b;
    T.embed_fwd = b_emb_f;
    T.embed_bwd = b_emb_b;
    T.layernorm_fwd = b_ln_f;
    T.layernorm_bwd = b_ln_b;
    T.gelu_fwd = b_gelu_f;
    T.gelu_bwd = b_gelu_b;
    T.add = b_add;
    T.add_rows = f32->add_rows ? b_add_rows : NULL;
    T.attention_fwd = b_att_f;
    T.attention_bwd = b_att_b;
    T.attention_chunks_fwd = NULL; /* bitwise cp's chunks: fp32 storage only */
    T.attention_chunks_bwd = NULL;
    T.softmax_xent = b_xent;
    T.xent_rowmax = f32->xent_rowmax ? b_rowmax : NULL;
    T.xent_rowsum = f32->xent_rowsum ? b_rowsum : NULL;
    T.xent_finish = f32->xent_finish ? b_finish : NULL;
    T.sumsq = b_sumsq;
    T.adamw = b_adamw;
    T.rmsnorm_fwd = f32->rmsnorm_fwd ? b_rms_f : NULL;
    T.rmsnorm_bwd = f32->rmsnorm_bwd ? b_rms_b : NULL;
    T.swiglu_fwd = f32->swiglu_fwd ? b_swiglu_f : NULL;
    T.swiglu_bwd = f32->swiglu_bwd ? b_swiglu_b : NULL;
    T.rope_qkv_fwd = f32->rope_qkv_fwd ? b_rope_f : NULL;
    T.rope_qkv_bwd = f32->rope_qkv_bwd ? b_rope_b : NULL;
    T.linear_gelu_fwd = NULL; /* composed from the wrapped ops above */
    T.linear_dgelu_bwd = NULL;
    return &T;
}
