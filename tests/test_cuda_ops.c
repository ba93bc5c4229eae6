/* Every CUDA kernel against the CPU backend on fresh random inputs, outputs poisoned
 * with NaN first so an unwritten element fails, odd shapes included; reductions twice
 * for bitwise reproducibility. Twice: fp32 (relative error ‖gpu − cpu‖ / ‖cpu‖ under
 * 1e-5) and bf16 storage (the GPU's bf16 kernels against the CPU's bf16-storage
 * adapter on the same bf16 inputs, under 1e-2: both compute in fp32, so only output
 * rounding and the GEMMs' accumulation order differ). Skips (77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/ops.h"
#include "core/bf16.h"
#include "core/rng.h"

static int failures, BF; /* BF: storage arrays hold bf16 (packed at the start of a float-sized buffer) */
static const dt_ops *G, *H;
static dt_rng rng;

static size_t E(void) { return BF ? 2 : 4; }
static float val(const float *a, size_t i) { return BF ? dt_bf16_to_f32(((const uint16_t *)a)[i]) : a[i]; }
static float *rnd32(size_t n, float scale) { /* fp32 whatever the storage (moments, statistics) */
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)dt_rng_normal(&rng);
    return x;
}
static float *rnd(size_t n, float scale) { /* in storage precision */
    float *x = rnd32(n, scale);
    if (BF)
        for (size_t i = 0; i < n; i++) ((uint16_t *)x)[i] = dt_f32_to_bf16(x[i]); /* in place: i-th over 2i-th */
    return x;
}
static float *dev_e(const float *h, size_t n, size_t e) { /* device copy of h (NaN-poisoned when h is NULL) */
    float *d;
    if (G->alloc((void **)&d, n * e, "test") != DT_OK) exit(1);
    if (h) G->upload(d, h, n * e);
    else {
        float *nan = malloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            if (e == 2) ((uint16_t *)nan)[i] = 0x7fc0;
            else nan[i] = NAN;
        }
        G->upload(d, nan, n * e);
        G->sync();
        free(nan);
    }
    return d;
}
static float *dev(const float *h, size_t n) { return dev_e(h, n, E()); }
static float *dev32(const float *h, size_t n) { return dev_e(h, n, 4); }
static float *host_e(const float *d, size_t n, size_t e) {
    float *h = malloc((n ? n : 1) * 4);
    G->download(h, d, n * e);
    return h;
}
static float *host(const float *d, size_t n) { return host_e(d, n, E()); }
/* compares device result d with the CPU's c: ‖d − c‖ / max(‖c‖, floor·√n) ≤ tol (a floor
 * makes it absolute for values near zero, such as a log-sum-exp of one small score) */
static void compare(const char *what, const float *d, const float *c, size_t n, double tol, double floor, int bf);
static void check(const char *what, const float *d, const float *c, size_t n, double tol) {
    compare(what, d, c, n, BF ? (tol > 1e-2 ? tol : 1e-2) : tol, 0.0, BF);
}
static void check32(const char *what, const float *d, const float *c, size_t n, double tol, double floor) {
    compare(what, d, c, n, BF ? (tol > 1e-4 ? tol : 1e-4) : tol, floor, 0); /* fp32 outputs from bf16 inputs */
}
static void compare(const char *what, const float *d, const float *c, size_t n, double tol, double floor, int bf) {
    int keep = BF;
    BF = bf;
    float *g = host(d, n);
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double gi = val(g, i), ci = val(c, i);
        if (!isfinite(gi) && isfinite(ci)) bad++;
        double e = gi - ci;
        num += e * e;
        den += ci * ci;
    }
    BF = keep;
    if (den < floor * floor * (double)n) den = floor * floor * (double)n;
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = bad == 0 && rel <= tol;
    printf("%-4s %s %-44s rel %.2e%s\n", ok ? "ok" : "FAIL", BF ? "bf16" : "fp32", what, rel,
           bad ? " (unwritten or non-finite)" : "");
    if (!ok) failures++;
    free(g);
}

static void test_gemm(int tA, int tB, int M, int N, int K) {
    int lda = tA ? M : K, ldb = tB ? K : N;
    float *A = rnd((size_t)M * K, 1), *B = rnd((size_t)K * N, 1), *C = rnd((size_t)M * N, 1);
    float *dA = dev(A, (size_t)M * K), *dB = dev(B, (size_t)K * N), *dC = dev(C, (size_t)M * N);
    H->gemm(tA, tB, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C, N);
    G->gemm(tA, tB, M, N, K, 0.5f, dA, lda, dB, ldb, 1.0f, dC, N);
    char name[64];
    snprintf(name, sizeof name, "gemm %c%c %dx%dx%d beta=1", tA ? 'T' : 'N', tB ? 'T' : 'N', M, N, K);
    check(name, dC, C, (size_t)M * N, 1e-5);
    free(A), free(B), free(C), G->free(dA), G->free(dB), G->free(dC);
}

static void test_linear(int N, int IC, int OC, int bias, int acc) {
    float *x = rnd((size_t)N * IC, 1), *w = rnd((size_t)IC * OC, 0.1f), *b = rnd(OC, 1), *dy = rnd((size_t)N * OC, 1);
    float *dx = rnd((size_t)N * IC, 1), *dw = rnd((size_t)IC * OC, 1), *db = rnd(OC, 1);
    float *y = rnd((size_t)N * OC, 1);
    float *gx = dev(x, (size_t)N * IC), *gw = dev(w, (size_t)IC * OC), *gb = dev(b, OC), *gdy = dev(dy, (size_t)N * OC);
    float *gy = dev(NULL, (size_t)N * OC), *gdx = acc ? dev(dx, (size_t)N * IC) : dev(NULL, (size_t)N * IC);
    float *gdw = dev(dw, (size_t)IC * OC), *gdb = dev(db, OC);
    H->linear_fwd(y, x, w, bias ? b : NULL, N, IC, OC);
    G->linear_fwd(gy, gx, gw, bias ? gb : NULL, N, IC, OC);
    H->linear_bwd(dx, dw, bias ? db : NULL, dy, x, w, N, IC, OC, acc);
    G->linear_bwd(gdx, gdw, bias ? gdb : NULL, gdy, gx, gw, N, IC, OC, acc);
    char name[80];
    snprintf(name, sizeof name, "linear %dx%d->%d bias=%d: out", N, IC, OC, bias);
    check(name, gy, y, (size_t)N * OC, 1e-5);
    snprintf(name, sizeof name, "linear %dx%d->%d acc=%d: dinp", N, IC, OC, acc);
    check(name, gdx, dx, (size_t)N * IC, 1e-5);
    snprintf(name, sizeof name, "linear %dx%d->%d: dw", N, IC, OC);
    check(name, gdw, dw, (size_t)IC * OC, 1e-5);
    if (bias) check("linear: dbias", gdb, db, OC, 1e-5);
    free(x), free(w), free(b), free(dy), free(dx), free(dw), free(db), free(y);
    G->free(gx), G->free(gw), G->free(gb), G->free(gdy), G->free(gy), G->free(gdx), G->free(gdw), G->free(gdb);
}

/* The MLP's GELU with its GEMMs (dt_linear_gelu_fwd / dt_linear_dgelu_bwd): the GPU's fused
 * epilogues (bf16), or its plain ops where it has none, against the CPU's plain ops. */
static void test_linear_gelu(int N, int IC, int OC) {
    float *x = rnd((size_t)N * IC, 1), *w = rnd((size_t)IC * OC, 0.1f), *b = rnd(OC, 1), *dy = rnd((size_t)N * IC, 1);
    float *y = rnd((size_t)N * OC, 1), *pre = rnd((size_t)N * OC, 1), *dx = rnd((size_t)N * OC, 1);
    float *w2 = rnd((size_t)OC * IC, 0.1f); /* the second layer: OC -> IC */
    float *gx = dev(x, (size_t)N * IC), *gw = dev(w, (size_t)IC * OC), *gb = dev(b, OC), *gdy = dev(dy, (size_t)N * IC);
    float *gy = dev(NULL, (size_t)N * OC), *gpre = dev(NULL, (size_t)N * OC), *gdx = dev(NULL, (size_t)N * OC);
    float *gw2 = dev(w2, (size_t)OC * IC);
    dt_linear_gelu_fwd(H, y, pre, x, w, b, N, IC, OC);
    dt_linear_gelu_fwd(G, gy, gpre, gx, gw, gb, N, IC, OC);
    char name[96];
    snprintf(name, sizeof name, "linear+gelu %dx%d->%d (%s): pre", N, IC, OC, G->linear_gelu_fwd ? "fusion" : "plain");
    check(name, gpre, pre, (size_t)N * OC, 1e-5);
    check("linear+gelu: out", gy, y, (size_t)N * OC, 1e-5);
    /* backward through a second layer OC -> IC from the same pre on both sides */
    G->upload(gpre, pre, (size_t)N * OC * E());
    dt_linear_dgelu_bwd(H, dx, dy, w2, pre, N, OC, IC);
    dt_linear_dgelu_bwd(G, gdx, gdy, gw2, gpre, N, OC, IC);
    check("linear+gelu: dinp = gelu'(pre)·(dout·wᵀ)", gdx, dx, (size_t)N * OC, 1e-5);
    if (G->linear_gelu_fwd) { /* the fusion is the point: a silent fallback on every call is a failure here */
        long fused, fell_back;
        dt_gpu_fusion_counts(&fused, &fell_back);
        printf("%-4s linear+gelu: %ld GEMMs fused, %ld fell back to the plain GEMM + kernel\n", fell_back ? "FAIL" : "ok",
               fused, fell_back);
        failures += fell_back != 0;
    }
    free(x), free(w), free(b), free(dy), free(y), free(pre), free(dx), free(w2);
    G->free(gx), G->free(gw), G->free(gb), G->free(gdy), G->free(gy), G->free(gpre), G->free(gdx), G->free(gw2);
}

static void test_layernorm(int N, int C) {
    float *x = rnd((size_t)N * C, 2), *w = rnd(C, 1), *b = rnd(C, 1), *dy = rnd((size_t)N * C, 1);
    float *y = rnd((size_t)N * C, 1), *mean = rnd32(N, 1), *rstd = rnd32(N, 1);
    float *dx = rnd((size_t)N * C, 1), *dw = rnd(C, 1), *db = rnd(C, 1);
    float *gx = dev(x, (size_t)N * C), *gw = dev(w, C), *gb = dev(b, C), *gdy = dev(dy, (size_t)N * C);
    float *gy = dev(NULL, (size_t)N * C), *gm = dev32(NULL, N), *gr = dev32(NULL, N);
    float *gdx = dev(dx, (size_t)N * C), *gdw = dev(dw, C), *gdb = dev(db, C);
    H->layernorm_fwd(y, mean, rstd, x, w, b, N, C);
    G->layernorm_fwd(gy, gm, gr, gx, gw, gb, N, C);
    H->layernorm_bwd(dx, dw, db, dy, x, w, mean, rstd, N, C);
    G->layernorm_bwd(gdx, gdw, gdb, gdy, gx, gw, gm, gr, N, C);
    char name[64];
    snprintf(name, sizeof name, "layernorm %dx%d: out", N, C);
    check(name, gy, y, (size_t)N * C, 1e-5);
    check32("layernorm: mean", gm, mean, N, 1e-5, 0);
    check32("layernorm: rstd", gr, rstd, N, 1e-5, 0);
    check("layernorm: dinp (+=)", gdx, dx, (size_t)N * C, 1e-5);
    check("layernorm: dw (+=)", gdw, dw, C, 1e-5);
    check("layernorm: db (+=)", gdb, db, C, 1e-5);
    /* the weight gradient's reduction is ordered: the same inputs give the same bits */
    G->upload(gdw, dw, C * E());
    G->layernorm_bwd(gdx, gdw, gdb, gdy, gx, gw, gm, gr, N, C);
    float *r1 = host(gdw, C);
    G->upload(gdw, dw, C * E());
    G->layernorm_bwd(gdx, gdw, gdb, gdy, gx, gw, gm, gr, N, C);
    float *r2 = host(gdw, C);
    int same = !memcmp(r1, r2, C * E());
    printf("%-4s layernorm: dw bitwise reproducible\n", same ? "ok" : "FAIL");
    failures += !same;
    free(r1), free(r2);
    free(x), free(w), free(b), free(dy), free(y), free(mean), free(rstd), free(dx), free(dw), free(db);
    G->free(gx), G->free(gw), G->free(gb), G->free(gdy), G->free(gy), G->free(gm), G->free(gr), G->free(gdx);
    G->free(gdw), G->free(gdb);
}

/* The Llama family's kernels: RMSNorm (weight gradient reproducible, and the same bits when
 * a split backward asks for dinp and dw in separate calls), SwiGLU (dup over dout, as the
 * contract allows), rotary embeddings with grouped heads (pos and inv_freq in device memory;
 * positions from p0, restarting every T rows). */
static void test_rmsnorm(int N, int C) {
    size_t NC = (size_t)N * C;
    float *x = rnd(NC, 2), *w = rnd(C, 1), *dy = rnd(NC, 1), *y = rnd(NC, 1), *rstd = rnd32(N, 1);
    float *dx = rnd(NC, 1), *dw = rnd(C, 1);
    float *gx = dev(x, NC), *gw = dev(w, C), *gdy = dev(dy, NC), *gy = dev(NULL, NC), *gr = dev32(NULL, N);
    float *gdx = dev(dx, NC), *gdw = dev(dw, C);
    H->rmsnorm_fwd(y, rstd, x, w, N, C, 1e-5f);
    G->rmsnorm_fwd(gy, gr, gx, gw, N, C, 1e-5f);
    H->rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C);
    G->rmsnorm_bwd(gdx, gdw, gdy, gx, gw, gr, N, C);
    char name[64];
    snprintf(name, sizeof name, "rmsnorm %dx%d: out", N, C);
    check(name, gy, y, NC, 1e-5);
    check32("rmsnorm: rstd", gr, rstd, N, 1e-5, 0);
    check("rmsnorm: dinp (+=)", gdx, dx, NC, 1e-5);
    check("rmsnorm: dw (+=)", gdw, dw, C, 1e-5);
    /* reproducible bits, whole and split (dinp alone, then dw alone) */
    float *dx0 = rnd(NC, 1), *dw0 = rnd(C, 1), *r[3][2];
    for (int k = 0; k < 3; k++) {
        G->upload(gdx, dx0, NC * E());
        G->upload(gdw, dw0, C * E());
        if (k < 2) G->rmsnorm_bwd(gdx, gdw, gdy, gx, gw, gr, N, C);
        else {
            G->rmsnorm_bwd(gdx, NULL, gdy, gx, gw, gr, N, C);
            G->rmsnorm_bwd(NULL, gdw, gdy, gx, gw, gr, N, C);
        }
        r[k][0] = host(gdx, NC);
        r[k][1] = host(gdw, C);
    }
    int same = !memcmp(r[0][1], r[1][1], C * E()), split = 1;
    for (int j = 0; j < 2; j++) split &= !memcmp(r[0][j], r[2][j], (j ? (size_t)C : NC) * E());
    printf("%-4s rmsnorm: dw bitwise reproducible\n", same ? "ok" : "FAIL");
    printf("%-4s rmsnorm: dinp and dw in separate calls give the same bits\n", split ? "ok" : "FAIL");
    failures += !same + !split;
    for (int k = 0; k < 3; k++) free(r[k][0]), free(r[k][1]);
    free(x), free(w), free(dy), free(y), free(rstd), free(dx), free(dw), free(dx0), free(dw0);
    G->free(gx), G->free(gw), G->free(gdy), G->free(gy), G->free(gr), G->free(gdx), G->free(gdw);
}

static void test_swiglu(size_t n) {
    float *g = rnd(n, 3), *u = rnd(n, 1), *d = rnd(n, 1), *y = rnd(n, 1), *dg = rnd(n, 1), *du = rnd(n, 1);
    float *gg = dev(g, n), *gu = dev(u, n), *gy = dev(NULL, n), *gdg = dev(NULL, n), *gdu = dev(d, n);
    H->swiglu_fwd(y, g, u, n);
    G->swiglu_fwd(gy, gg, gu, n);
    H->swiglu_bwd(dg, du, d, g, u, n);
    G->swiglu_bwd(gdg, gdu, gdu, gg, gu, n); /* dup over dout */
    char name[64];
    snprintf(name, sizeof name, "swiglu n=%zu: out", n);
    compare(name, gy, y, n, BF ? 1e-2 : 1e-6, 1.0, BF);
    compare("swiglu: dgate", gdg, dg, n, BF ? 1e-2 : 1e-6, 1.0, BF);
    compare("swiglu: dup (over dout)", gdu, du, n, BF ? 1e-2 : 1e-6, 1.0, BF);
    free(g), free(u), free(d), free(y), free(dg), free(du);
    G->free(gg), G->free(gu), G->free(gy), G->free(gdg), G->free(gdu);
}

static void test_rope(int N, int NH, int NKV, int HS, int T, int p0, double theta) {
    size_t nq = (size_t)N * NH * HS, nk = (size_t)N * NKV * HS;
    int *pos = malloc((size_t)N * sizeof *pos);
    for (int i = 0; i < N; i++) pos[i] = p0 + i % T;
    float *f = malloc((size_t)HS / 2 * sizeof *f);
    for (int d = 0; d < HS / 2; d++) f[d] = (float)(1.0 / pow(theta, (double)(2 * d) / HS));
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *dqkv = rnd(3 * nq, 1), *qkv = rnd(3 * nq, 1);
    float *dq = rnd(nq, 1), *dk = rnd(nk, 1), *dv = rnd(nk, 1);
    int *gpos = (int *)dev32((const float *)pos, N);
    float *gf = dev32(f, HS / 2), *gq = dev(q, nq), *gk = dev(k, nk), *gv = dev(v, nk), *gdqkv = dev(dqkv, 3 * nq);
    float *gqkv = dev(NULL, 3 * nq), *gdq = dev(NULL, nq), *gdk = dev(NULL, nk), *gdv = dev(NULL, nk);
    H->rope_qkv_fwd(qkv, q, k, v, pos, f, N, NH, NKV, HS);
    G->rope_qkv_fwd(gqkv, gq, gk, gv, gpos, gf, N, NH, NKV, HS);
    H->rope_qkv_bwd(dq, dk, dv, dqkv, pos, f, N, NH, NKV, HS);
    G->rope_qkv_bwd(gdq, gdk, gdv, gdqkv, gpos, gf, N, NH, NKV, HS);
    char name[96];
    snprintf(name, sizeof name, "rope_qkv N%d NH%d NKV%d HS%d pos %d..: qkv", N, NH, NKV, HS, p0);
    check(name, gqkv, qkv, 3 * nq, 1e-5);
    check("rope_qkv: dq", gdq, dq, nq, 1e-5);
    check("rope_qkv: dk (group summed)", gdk, dk, nk, 1e-5);
    check("rope_qkv: dv (group summed)", gdv, dv, nk, 1e-5);
    free(pos), free(f), free(q), free(k), free(v), free(dqkv), free(qkv), free(dq), free(dk), free(dv);
    G->free(gpos), G->free(gf), G->free(gq), G->free(gk), G->free(gv), G->free(gdqkv), G->free(gqkv);
    G->free(gdq), G->free(gdk), G->free(gdv);
}

static void test_elementwise(size_t n) {
    float *x = rnd(n, 3), *d = rnd(n, 1), *y = rnd(n, 1), *z = rnd(n, 1);
    float *gx = dev(x, n), *gd = dev(d, n), *gy = dev(NULL, n), *gz = dev(NULL, n);
    H->gelu_fwd(y, x, n);
    G->gelu_fwd(gy, gx, n);
    compare("gelu fwd", gy, y, n, BF ? 1e-2 : 1e-6, 1.0, BF); /* floor: tiny outputs of negative inputs */
    H->gelu_bwd(z, x, d, n);
    G->gelu_bwd(gz, gx, gd, n);
    compare("gelu bwd", gz, z, n, BF ? 1e-2 : 1e-6, 1.0, BF);
    H->add(y, x, d, n);
    G->add(gy, gx, gd, n);
    check("add", gy, y, n, BF ? 1e-2 : 0);
    /* adamw, with a clipping factor */
    float *p = rnd32(n, 1), *m = rnd32(n, 0.1f), *v = rnd32(n, 0.1f), *ps = rnd(n, 1);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *gp = dev32(p, n), *gm = dev32(m, n), *gv = dev32(v, n), *gps = dev(NULL, n);
    H->adamw(p, BF ? ps : NULL, d, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 0.3f, 0.7f);
    G->adamw(gp, BF ? gps : NULL, gd, gm, gv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 0.3f, 0.7f);
    check32("adamw: params (fp32 master)", gp, p, n, 1e-6, 0);
    check32("adamw: m", gm, m, n, 1e-6, 0);
    check32("adamw: v", gv, v, n, 1e-6, 0);
    if (BF) check("adamw: bf16 copy of the params", gps, ps, n, 1e-2);
    double s1 = H->sumsq(x, n), s2 = G->sumsq(gx, n), s3 = G->sumsq(gx, n);
    float *x32 = rnd32(n, 1), *gx32 = dev32(x32, n);
    double t1 = H->sum(x32, n), t2 = G->sum(gx32, n);
    int ok = fabs(s1 - s2) <= 1e-9 * s1 && s2 == s3 && fabs(t1 - t2) <= 1e-9 * (fabs(t1) + sqrt((double)n));
    printf("%-4s sumsq/sum n=%zu: %.9g vs %.9g, %.9g vs %.9g, repeat equal\n", ok ? "ok" : "FAIL", n, s2, s1, t2, t1);
    failures += !ok;
    free(x), free(d), free(y), free(z), free(p), free(m), free(v), free(ps), free(x32);
    G->free(gx), G->free(gd), G->free(gy), G->free(gz), G->free(gp), G->free(gm), G->free(gv), G->free(gps);
    G->free(gx32);
}

static void test_embed(int B, int T, int C, int V) {
    dt_token *tok = malloc((size_t)B * T * 2), *gtok;
    for (int i = 0; i < B * T; i++) tok[i] = (dt_token)(dt_rng_below(&rng, (uint64_t)(i % 3 ? V : 4))); /* repeats */
    float *wte = rnd((size_t)V * C, 1), *wpe = rnd((size_t)T * C, 1), *dy = rnd((size_t)B * T * C, 1);
    float *out = rnd((size_t)B * T * C, 1), *dwte = rnd((size_t)V * C, 1), *dwpe = rnd((size_t)T * C, 1);
    if (G->alloc((void **)&gtok, (size_t)B * T * 2, "tok") != DT_OK) exit(1);
    G->upload(gtok, tok, (size_t)B * T * 2);
    float *gwte = dev(wte, (size_t)V * C), *gwpe = dev(wpe, (size_t)T * C), *gdy = dev(dy, (size_t)B * T * C);
    float *gout = dev(NULL, (size_t)B * T * C), *gdwte = dev(dwte, (size_t)V * C), *gdwpe = dev(dwpe, (size_t)T * C);
    H->embed_fwd(out, tok, wte, wpe, B, T, C, 0, V);
    G->embed_fwd(gout, gtok, gwte, gwpe, B, T, C, 0, V);
    check("embed fwd", gout, out, (size_t)B * T * C, BF ? 1e-2 : 0);
    H->embed_bwd(dwte, dwpe, dy, tok, B, T, C, 0, V);
    G->embed_bwd(gdwte, gdwpe, gdy, gtok, B, T, C, 0, V);
    check("embed bwd: dwte (repeated tokens)", gdwte, dwte, (size_t)V * C, 1e-6);
    check("embed bwd: dwpe", gdwpe, dwpe, (size_t)T * C, 1e-6);
    free(tok), free(wte), free(wpe), free(dy), free(out), free(dwte), free(dwpe);
    G->free(gtok), G->free(gwte), G->free(gwpe), G->free(gdy), G->free(gout), G->free(gdwte), G->free(gdwpe);
}

static void test_xent(int N, int V, int Vp, float scale) {
    float *lg = rnd((size_t)N * Vp, 3), *loss = rnd32(N, 1);
    dt_token *t = malloc(N * 2), *gt;
    for (int i = 0; i < N; i++) t[i] = (dt_token)(dt_rng_below(&rng, (uint64_t)V));
    if (G->alloc((void **)&gt, N * 2, "t") != DT_OK) exit(1);
    G->upload(gt, t, N * 2);
    float *glg = dev(lg, (size_t)N * Vp), *gloss = dev32(NULL, N);
    H->softmax_xent(lg, loss, t, N, V, Vp, scale);
    G->softmax_xent(glg, gloss, gt, N, V, Vp, scale);
    char name[64];
    snprintf(name, sizeof name, "softmax_xent %dx%d(%d) scale=%g: loss", N, V, Vp, scale);
    check32(name, gloss, loss, N, 1e-6, 0);
    if (scale != 0) check("softmax_xent: dlogits (padding zero)", glg, lg, (size_t)N * Vp, 1e-5);
    free(lg), free(loss), free(t), G->free(gt), G->free(glg), G->free(gloss);
}

/* vocabulary-parallel cross-entropy steps: local columns [v0, v0 + Vl), real of them;
 * logits in storage precision, statistics and losses fp32 */
static void test_xent_tp(int N, int Vl, int real, int v0, float scale) {
    float *lg = rnd((size_t)N * Vl, 3), *mx = rnd32(N, 1), *st = rnd32(2 * (size_t)N, 1), *loss = rnd32(N, 1);
    dt_token *t = malloc(N * 2), *gt;
    for (int i = 0; i < N; i++) t[i] = (dt_token)(v0 + (int)dt_rng_below(&rng, (uint64_t)(2 * Vl)) - Vl / 2);
    if (G->alloc((void **)&gt, N * 2, "t") != DT_OK) exit(1);
    G->upload(gt, t, N * 2);
    float *glg = dev(lg, (size_t)N * Vl), *gmx = dev32(NULL, N), *gst = dev32(NULL, 2 * (size_t)N);
    float *gloss = dev32(NULL, N);
    H->xent_rowmax(lg, mx, N, Vl, real);
    G->xent_rowmax(glg, gmx, N, Vl, real);
    check32("xent_tp: row max", gmx, mx, N, 0, 0);
    G->upload(gmx, mx, N * 4);
    H->xent_rowsum(lg, mx, t, st, N, Vl, real, v0);
    G->xent_rowsum(glg, gmx, gt, gst, N, Vl, real, v0);
    check32("xent_tp: sum of exponentials, target logit", gst, st, 2 * (size_t)N, 1e-6, 0);
    G->upload(gst, st, 2 * N * 4);
    H->xent_finish(lg, loss, mx, st, t, N, Vl, real, v0, scale);
    G->xent_finish(glg, gloss, gmx, gst, gt, N, Vl, real, v0, scale);
    check32("xent_tp: loss", gloss, loss, N, 1e-6, 0);
    check("xent_tp: dlogits (padding zero)", glg, lg, (size_t)N * Vl, 1e-6);
    free(lg), free(mx), free(st), free(loss), free(t);
    G->free(gt), G->free(glg), G->free(gmx), G->free(gst), G->free(gloss);
}

/* doc_len > 0: packed documents of 1 .. doc_len tokens (each query's first key in seg) */
static void test_attention(int B, int T, int C, int NH, int doc_len) {
    size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = rnd(nqkv, 1), *dy = rnd(no, 1), *out = rnd(no, 1), *lse = rnd32(nl, 1), *dqkv = rnd(nqkv, 1);
    float *gqkv = dev(qkv, nqkv), *gdy = dev(dy, no), *gout = dev(NULL, no), *glse = dev32(NULL, nl),
          *gdqkv = dev(NULL, nqkv);
    int *seg = NULL, *gseg = NULL;
    if (doc_len) {
        seg = malloc((size_t)B * T * sizeof *seg);
        for (int b = 0; b < B; b++)
            for (int t = 0, start = 0, left = 0; t < T; t++) {
                if (!left) start = t, left = 1 + (int)dt_rng_below(&rng, (uint64_t)doc_len);
                seg[(size_t)b * T + t] = start, left--;
            }
        gseg = (int *)dev32((const float *)seg, (size_t)B * T);
    }
    H->attention_fwd(out, lse, qkv, seg, B, T, C, NH);
    G->attention_fwd(gout, glse, gqkv, gseg, B, T, C, NH);
    char name[96];
    snprintf(name, sizeof name, "attention B%d T%d C%d NH%d (hs %d)%s: out", B, T, C, NH, C / NH,
             doc_len ? " documents" : "");
    check(name, gout, out, no, 1e-5);
    check32("attention: lse", glse, lse, nl, BF ? 1e-3 : 1e-6, 1.0); /* bf16: P is rounded before it is summed */
    /* backward from the same forward outputs on both sides (the CPU's, uploaded) */
    G->upload(gout, out, no * E());
    G->upload(glse, lse, nl * 4);
    H->attention_bwd(dqkv, dy, qkv, out, lse, seg, B, T, C, NH);
    G->attention_bwd(gdqkv, gdy, gqkv, gout, glse, gseg, B, T, C, NH);
    check("attention: dqkv", gdqkv, dqkv, nqkv, 1e-5);
    float *r1 = host(gdqkv, nqkv);
    G->attention_bwd(gdqkv, gdy, gqkv, gout, glse, gseg, B, T, C, NH);
    float *r2 = host(gdqkv, nqkv);
    int same = !memcmp(r1, r2, nqkv * E());
    printf("%-4s attention: dqkv bitwise reproducible\n", same ? "ok" : "FAIL");
    failures += !same;
    free(r1), free(r2), free(qkv), free(dy), free(out), free(lse), free(dqkv), free(seg);
    if (gseg) G->free(gseg);
    G->free(gqkv), G->free(gdy), G->free(gout), G->free(glse), G->free(gdqkv);
}

static void all_ops(void);

int main(void) {
    if (dt_ops_cuda(&G, 0) != DT_OK) {
        printf("skip: %s\n", dt_error_message());
        return 77;
    }
    printf("GPU: %s\n", dt_gpu_name());
    dt_rng_seed(&rng, (uint64_t)time(NULL)); /* fresh inputs every run */
    H = dt_ops_cpu();
    all_ops();
    BF = 1;
    H = dt_ops_bf16_storage(dt_ops_cpu());
    if (dt_ops_cuda(&G, 1) != DT_OK) return 1;
    all_ops();
    dt_status s = G->sync();
    if (s != DT_OK) {
        printf("FAIL %s\n", dt_error_message());
        failures++;
    }
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}

static void all_ops(void) {
    for (int tA = 0; tA < 2; tA++)
        for (int tB = 0; tB < 2; tB++) test_gemm(tA, tB, 67, 45, 129);
    test_gemm(0, 1, 512, 1024, 768);
    test_linear(100, 48, 144, 1, 0);
    test_linear(257, 96, 32, 0, 1);
    test_linear(1024, 768, 2304, 1, 1);
    test_linear_gelu(100, 48, 192);
    test_linear_gelu(1024, 768, 3072);
    test_layernorm(1, 7);
    test_layernorm(300, 96);
    test_layernorm(4096, 768);
    test_layernorm(64, 256); /* the vectorised kernels (C a multiple of 32 vectors) */
    test_rmsnorm(1, 7);
    test_rmsnorm(300, 96);
    test_rmsnorm(37, 64);
    test_rmsnorm(4096, 768); /* the vectorised kernels (C a multiple of 32 vectors) */
    test_swiglu(1);
    test_swiglu(1000003);
    test_rope(37, 4, 4, 32, 16, 5, 1e4); /* query heads per key/value head: 1, 2, 4 */
    test_rope(50, 4, 2, 64, 20, 1000, 5e5);
    test_rope(29, 8, 2, 32, 29, 123, 1e4);
    test_rope(40, 4, 1, 64, 8, 30000, 5e5);
    test_rope(2048, 32, 8, 128, 1024, 0, 5e5);
    test_elementwise(1);
    test_elementwise(1000003);
    test_embed(3, 17, 40, 100);
    test_embed(4, 256, 768, 1000);
    test_xent(5, 100, 128, 0.0f);
    test_xent(33, 1000, 1024, 1.0f / 33);
    test_xent(8, 50257, 50304, 0.125f);
    test_xent_tp(7, 160, 160, 0, 0.25f);
    test_xent_tp(9, 160, 140, 160, 0.5f); /* the last piece: padding columns */
    static const int shapes[][4] = {{1, 1, 32, 1},   {2, 63, 64, 2},   {1, 64, 64, 1},  {2, 65, 128, 4},
                                    {1, 200, 256, 4}, {2, 130, 96, 12}, {1, 97, 512, 4}, {1, 300, 64, 8},
                                    {2, 1024, 768, 12}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_attention(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], 0);
    /* documents: shorter than a tile, longer than one, in the SIMT (fp32, head size 16) and
     * mma (bf16, head size 64) kernels */
    test_attention(2, 300, 64, 4, 20);
    test_attention(2, 1024, 768, 12, 300);
    test_attention(1, 200, 256, 4, 7);
    if (G->sync() != DT_OK) {
        printf("FAIL %s\n", dt_error_message());
        failures++;
    }
}
