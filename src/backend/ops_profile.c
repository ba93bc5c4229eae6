/* A dt_ops that times every kernel call of another dt_ops (log.profile): where a
 * step's time goes, per kernel, without touching the model or the kernels. */
#include <stdio.h>

#include "../core/timer.h"
#include "ops.h"

enum { P_GEMM, P_LIN_F, P_LIN_B, P_EMB_F, P_EMB_B, P_LN_F, P_LN_B, P_GELU_F, P_GELU_B, P_ADD, P_ATT_F, P_ATT_B,
       P_XENT, P_SUMSQ, P_ADAMW, P_SUM, P_LIN_GELU_F, P_LIN_DGELU_B, P_RMS_F, P_RMS_B, P_SWIGLU_F, P_SWIGLU_B,
       P_ROPE_F, P_ROPE_B, P_N };
static const char *NAMES[P_N] = {"gemm (head)", "linear fwd", "linear bwd", "embed fwd", "embed bwd",
                                 "layernorm fwd", "layernorm bwd", "gelu fwd", "gelu bwd", "residual add",
                                 "attention fwd", "attention bwd", "softmax xent", "grad norm",
                                 "adamw", "loss sum", "linear+gelu fwd", "linear+gelu bwd", "rmsnorm fwd",
                                 "rmsnorm bwd", "swiglu fwd", "swiglu bwd", "rope+kv heads fwd", "rope+kv heads bwd"};
static const dt_ops *inner;
static double secs[P_N];
static long calls[P_N];

/* On a device the call only queues work: wait for it, so each kernel's own time is counted. */
#define TIMED(id, call)                          \
    do {                                         \
        double t0_ = dt_now();                   \
        call;                                    \
        if (inner->on_device) (void)inner->sync(); \
        secs[id] += dt_now() - t0_;              \
        calls[id]++;                             \
    } while (0)

static void p_gemm(int tA, int tB, int M, int N, int K, float al, const float *A, int lda, const float *B, int ldb,
                   float be, float *C, int ldc) {
    TIMED(P_GEMM, inner->gemm(tA, tB, M, N, K, al, A, lda, B, ldb, be, C, ldc));
}
static void p_gemm_blocks(int tA, int tB, int M, int N, int K, float al, const float *const *A, int lda,
                          const float *const *B, int ldb, float be, float *const *C, int ldc, int count, int canon) {
    TIMED(P_GEMM, inner->gemm_blocks(tA, tB, M, N, K, al, A, lda, B, ldb, be, C, ldc, count, canon));
}
static void p_lin_f(float *o, const float *i, const float *w, const float *b, int N, int IC, int OC) {
    TIMED(P_LIN_F, inner->linear_fwd(o, i, w, b, N, IC, OC));
}
static void p_lin_b(float *di, float *dw, float *db, const float *d, const float *i, const float *w, int N, int IC,
                    int OC, int acc) {
    TIMED(P_LIN_B, inner->linear_bwd(di, dw, db, d, i, w, N, IC, OC, acc));
}
static void p_emb_f(float *o, const dt_token *t, const float *e, const float *p, int B, int T, int C, int v0,
                    int rows) {
    TIMED(P_EMB_F, inner->embed_fwd(o, t, e, p, B, T, C, v0, rows));
}
static void p_emb_b(float *de, float *dp, const float *d, const dt_token *t, int B, int T, int C, int v0, int rows) {
    TIMED(P_EMB_B, inner->embed_bwd(de, dp, d, t, B, T, C, v0, rows));
}
static void p_ln_f(float *o, float *m, float *r, const float *i, const float *w, const float *b, int N, int C) {
    TIMED(P_LN_F, inner->layernorm_fwd(o, m, r, i, w, b, N, C));
}
static void p_ln_b(float *di, float *dw, float *db, const float *d, const float *i, const float *w, const float *m,
                   const float *r, int N, int C) {
    TIMED(P_LN_B, inner->layernorm_bwd(di, dw, db, d, i, w, m, r, N, C));
}
static void p_gelu_f(float *o, const float *i, size_t n) { TIMED(P_GELU_F, inner->gelu_fwd(o, i, n)); }
static void p_gelu_b(float *di, const float *i, const float *d, size_t n) { TIMED(P_GELU_B, inner->gelu_bwd(di, i, d, n)); }
static void p_add(float *o, const float *a, const float *b, size_t n) { TIMED(P_ADD, inner->add(o, a, b, n)); }
static void p_add_rows(float *o, int lo, const float *a, int la, const float *b, int lb, int rows, int n) {
    TIMED(P_ADD, inner->add_rows(o, lo, a, la, b, lb, rows, n));
}
static void p_att_f(float *o, float *l, const float *q, const int *sg, int B, int T, int C, int NH) {
    TIMED(P_ATT_F, inner->attention_fwd(o, l, q, sg, B, T, C, NH));
}
static void p_att_b(float *dq, const float *d, const float *q, const float *o, const float *l, const int *sg, int B,
                    int T, int C, int NH) {
    TIMED(P_ATT_B, inner->attention_bwd(dq, d, q, o, l, sg, B, T, C, NH));
}
static void p_att_pf(float *o, float *l, const float *q, const float *kv, const int *qp, const int *qs, const int *kp,
                     int B, int Tq, int Tk, int C, int NH) {
    TIMED(P_ATT_F, inner->attention_part_fwd(o, l, q, kv, qp, qs, kp, B, Tq, Tk, C, NH));
}
static void p_att_pb(float *dq, float *dkv, const float *d, const float *q, const float *kv, const float *o,
                     const float *l, const int *qp, const int *qs, const int *kp, int B, int Tq, int Tk, int C, int NH) {
    TIMED(P_ATT_B, inner->attention_part_bwd(dq, dkv, d, q, kv, o, l, qp, qs, kp, B, Tq, Tk, C, NH));
}
static void p_att_cf(float *o, float *l, const float *q, const int *sg, int B, int T, int C, int NH, const int *p0,
                     int n, int Tc) {
    TIMED(P_ATT_F, inner->attention_chunks_fwd(o, l, q, sg, B, T, C, NH, p0, n, Tc));
}
static void p_att_cb(float *dq, float *const *lf, const float *d, const float *q, const float *o, const float *l,
                     const int *sg, int B, int T, int C, int NH, const int *p0, int n, int Tc) {
    TIMED(P_ATT_B, inner->attention_chunks_bwd(dq, lf, d, q, o, l, sg, B, T, C, NH, p0, n, Tc));
}
static void p_xent(float *lg, float *ls, const dt_token *t, int N, int V, int Vp, float s) {
    TIMED(P_XENT, inner->softmax_xent(lg, ls, t, N, V, Vp, s));
}
static double p_sumsq(const float *x, size_t n) {
    double r;
    TIMED(P_SUMSQ, r = inner->sumsq(x, n));
    return r;
}
static double p_sum(const float *x, size_t n) {
    double r;
    TIMED(P_SUM, r = inner->sum(x, n));
    return r;
}
static void p_adamw(float *p, float *ps, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                    float eps, float wd, float c1, float c2, float gs) {
    TIMED(P_ADAMW, inner->adamw(p, ps, g, m, v, n, lr, b1, b2, eps, wd, c1, c2, gs));
}

static void p_lin_gelu_f(float *o, float *pre, const float *i, const float *w, const float *b, int N, int IC, int OC) {
    TIMED(P_LIN_GELU_F, inner->linear_gelu_fwd(o, pre, i, w, b, N, IC, OC));
}
static void p_lin_dgelu_b(float *di, const float *d, const float *w, const float *pre, int N, int IC, int OC) {
    TIMED(P_LIN_DGELU_B, inner->linear_dgelu_bwd(di, d, w, pre, N, IC, OC));
}

static void p_rms_f(float *o, float *r, const float *i, const float *w, int N, int C, float eps) {
    TIMED(P_RMS_F, inner->rmsnorm_fwd(o, r, i, w, N, C, eps));
}
static void p_rms_b(float *di, float *dw, const float *d, const float *i, const float *w, const float *r, int N, int C) {
    TIMED(P_RMS_B, inner->rmsnorm_bwd(di, dw, d, i, w, r, N, C));
}
static void p_swiglu_f(float *o, const float *g, const float *u, size_t n) { TIMED(P_SWIGLU_F, inner->swiglu_fwd(o, g, u, n)); }
static void p_swiglu_b(float *dg, float *du, const float *d, const float *g, const float *u, size_t n) {
    TIMED(P_SWIGLU_B, inner->swiglu_bwd(dg, du, d, g, u, n));
}
static void p_rope_f(float *qkv, const float *q, const float *k, const float *v, const int *pos, const float *f, int N,
                     int NH, int NKV, int HS) {
    TIMED(P_ROPE_F, inner->rope_qkv_fwd(qkv, q, k, v, pos, f, N, NH, NKV, HS));
}
static void p_rope_b(float *dq, float *dk, float *dv, const float *dqkv, const int *pos, const float *f, int N, int NH,
                     int NKV, int HS) {
    TIMED(P_ROPE_B, inner->rope_qkv_bwd(dq, dk, dv, dqkv, pos, f, N, NH, NKV, HS));
}

static dt_ops PROFILED;

const dt_ops *dt_ops_profiled(const dt_ops *ops) {
    inner = ops;
    PROFILED = *ops; /* memory functions pass through */
    PROFILED.name = "profiled";
    PROFILED.gemm = p_gemm;
    PROFILED.gemm_blocks = ops->gemm_blocks ? p_gemm_blocks : NULL;
    PROFILED.linear_fwd = p_lin_f;
    PROFILED.linear_bwd = p_lin_b;
    PROFILED.embed_fwd = p_emb_f;
    PROFILED.embed_bwd = p_emb_b;
    PROFILED.layernorm_fwd = p_ln_f;
    PROFILED.layernorm_bwd = p_ln_b;
    PROFILED.gelu_fwd = p_gelu_f;
    PROFILED.gelu_bwd = p_gelu_b;
    PROFILED.add = p_add;
    PROFILED.add_rows = inner->add_rows ? p_add_rows : NULL;
    PROFILED.attention_fwd = p_att_f;
    PROFILED.attention_bwd = p_att_b;
    PROFILED.linear_gelu_fwd = inner->linear_gelu_fwd ? p_lin_gelu_f : NULL; /* fusions, where the backend has them */
    PROFILED.linear_dgelu_bwd = inner->linear_dgelu_bwd ? p_lin_dgelu_b : NULL;
    PROFILED.attention_part_fwd = inner->attention_part_fwd ? p_att_pf : NULL; /* ring attention's blocks */
    PROFILED.attention_part_bwd = inner->attention_part_bwd ? p_att_pb : NULL;
    PROFILED.attention_chunks_fwd = inner->attention_chunks_fwd ? p_att_cf : NULL; /* bitwise cp's chunks */
    PROFILED.attention_chunks_bwd = inner->attention_chunks_bwd ? p_att_cb : NULL;
    PROFILED.softmax_xent = p_xent;
    PROFILED.sumsq = p_sumsq;
    PROFILED.sum = p_sum;
    PROFILED.adamw = p_adamw;
    PROFILED.rmsnorm_fwd = inner->rmsnorm_fwd ? p_rms_f : NULL;
    PROFILED.rmsnorm_bwd = inner->rmsnorm_bwd ? p_rms_b : NULL;
    PROFILED.swiglu_fwd = inner->swiglu_fwd ? p_swiglu_f : NULL;
    PROFILED.swiglu_bwd = inner->swiglu_bwd ? p_swiglu_b : NULL;
    PROFILED.rope_qkv_fwd = inner->rope_qkv_fwd ? p_rope_f : NULL;
    PROFILED.rope_qkv_bwd = inner->rope_qkv_bwd ? p_rope_b : NULL;
    return &PROFILED;
}

static int reset_done;

void dt_ops_profile_reset(void) {
    for (int i = 0; i < P_N; i++) secs[i] = 0, calls[i] = 0;
    reset_done = 1;
}

void dt_ops_profile_report(FILE *out) {
    double total = 0;
    for (int i = 0; i < P_N; i++) total += secs[i];
    fprintf(out, "profile: kernel time %.3f s%s\n", total, reset_done ? " (from the second step on)" : "");
    for (int i = 0; i < P_N; i++)
        if (calls[i])
            fprintf(out, "profile: %-14s %8.3f s %5.1f%% %8ld calls\n", NAMES[i], secs[i],
                    total > 0 ? 100 * secs[i] / total : 0, calls[i]);
}
