/* Bitwise mode's kernels (dt_ops_cpu_fixed) give the same bits with 1, 2 and 3 threads:
 * every kernel that sums (GEMMs over K, the linear layers' weight and bias gradients,
 * LayerNorm and RMSNorm statistics and weight gradients, the softmax cross-entropy and
 * its vocabulary-parallel steps, attention's row sums, its ring blocks and bitwise cp's
 * chunks (which give the same bits whichever rank's list holds a chunk), the embedding
 * gradient, the sum of squares of the gradient norm, rotary's group sums), at shapes
 * whose K passes OpenBLAS's K block (360, 1000 > 320) and whose outputs span several
 * GEMM tiles with ragged edges. add_rows (a node of the key/value group trees) gives its
 * sums in fp32 and in bf16 storage. Also prints whether plain OpenBLAS differs here (why
 * the tiles exist; not asserted: it is the library's business). */
#include <stdint.h>
#include <stdlib.h>

#include "backend/ops.h"
#include "check.h"

enum { CAP = 1 << 21 }; /* floats of output a case may write */

static uint64_t g_rng;
static float rnd(void) { /* deterministic inputs in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((g_rng >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
}
static float *fill(size_t n) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = rnd();
    return p;
}
static size_t put(float *out, size_t at, const float *x, size_t n) {
    memcpy(out + at, x, n * sizeof(float));
    return at + n;
}

static size_t case_gemm(const dt_ops *o, float *out) {
    static const int shapes[][3] = {{300, 700, 360}, {40, 520, 1000}, {257, 513, 333}};
    size_t at = 0;
    for (int s = 0; s < 3; s++)
        for (int tA = 0; tA < 2; tA++)
            for (int tB = 0; tB < 2; tB++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                float *A = fill((size_t)M * K), *B = fill((size_t)K * N), *C = fill((size_t)M * N);
                o->gemm(tA, tB, M, N, K, 0.5f, A, tA ? M : K, B, tB ? K : N, 1.0f, C, N);
                at = put(out, at, C, (size_t)M * N);
                free(A), free(B), free(C);
            }
    return at;
}

/* The blocks of one product of 12 canonical blocks (gemm_blocks): 6 in one batch, and
 * the same 6 as two batches of 3 (another layout's ranks), which must give the same bits. */
static size_t case_gemm_blocks(const dt_ops *o, float *out) {
    enum { NB = 6, M = 300, N = 200, K = 360 };
    float *A = fill((size_t)M * K), *B = fill((size_t)K * N * NB), *C = fill((size_t)M * N * NB);
    float *D = malloc((size_t)M * N * NB * sizeof(float));
    memcpy(D, C, (size_t)M * N * NB * sizeof(float));
    const float *a[NB], *b[NB];
    float *c[NB], *d[NB];
    for (int i = 0; i < NB; i++) a[i] = A, b[i] = B + (size_t)i * N, c[i] = C + (size_t)i * N, d[i] = D + (size_t)i * N;
    dt_gemm_blocks(o, 0, 0, M, N, K, 0.5f, a, K, b, N * NB, 1.0f, c, N * NB, NB, 12);
    dt_gemm_blocks(o, 0, 0, M, N, K, 0.5f, a, K, b, N * NB, 1.0f, d, N * NB, NB / 2, 12);
    dt_gemm_blocks(o, 0, 0, M, N, K, 0.5f, a + NB / 2, K, b + NB / 2, N * NB, 1.0f, d + NB / 2, N * NB, NB / 2, 12);
    CHECK(!memcmp(C, D, (size_t)M * N * NB * sizeof(float)), "gemm_blocks: 6 blocks at once = 2 batches of 3");
    size_t at = put(out, 0, C, (size_t)M * N * NB);
    free(A), free(B), free(C), free(D);
    return at;
}

static size_t case_linear(const dt_ops *o, float *out) {
    int N = 360, IC = 72, OC = 600;
    float *x = fill((size_t)N * IC), *w = fill((size_t)IC * OC), *b = fill(OC), *y = fill((size_t)N * OC);
    float *dx = fill((size_t)N * IC), *dw = fill((size_t)IC * OC), *db = fill(OC);
    o->linear_fwd(y, x, w, b, N, IC, OC);
    o->linear_bwd(dx, dw, db, y, x, w, N, IC, OC, 1);
    size_t at = put(out, 0, y, (size_t)N * OC);
    at = put(out, at, dx, (size_t)N * IC);
    at = put(out, at, dw, (size_t)IC * OC);
    at = put(out, at, db, OC);
    free(x), free(w), free(b), free(y), free(dx), free(dw), free(db);
    return at;
}

static size_t case_norms(const dt_ops *o, float *out) {
    int N = 360, C = 200;
    size_t n = (size_t)N * C;
    float *x = fill(n), *w = fill(C), *b = fill(C), *y = fill(n), *mean = fill(N), *rstd = fill(N);
    float *dy = fill(n), *dx = fill(n), *dw = fill(C), *db = fill(C);
    o->layernorm_fwd(y, mean, rstd, x, w, b, N, C);
    o->layernorm_bwd(dx, dw, db, dy, x, w, mean, rstd, N, C);
    size_t at = put(out, 0, y, n);
    at = put(out, at, mean, N), at = put(out, at, rstd, N);
    at = put(out, at, dx, n), at = put(out, at, dw, C), at = put(out, at, db, C);
    o->rmsnorm_fwd(y, rstd, x, w, N, C, 1e-5f);
    o->rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C);
    at = put(out, at, y, n), at = put(out, at, rstd, N);
    at = put(out, at, dx, n), at = put(out, at, dw, C);
    free(x), free(w), free(b), free(y), free(mean), free(rstd), free(dy), free(dx), free(dw), free(db);
    return at;
}

static size_t case_xent(const dt_ops *o, float *out) {
    int N = 96, V = 1000, Vp = 1024, Vl = 512, real = 500, v0 = 500;
    float *lg = fill((size_t)N * Vp), *loss = fill(N), *mx = fill(N), *st = fill(2 * (size_t)N);
    dt_token *t = malloc(N * sizeof(dt_token));
    for (int i = 0; i < N; i++) t[i] = i % 7 == 3 ? -1 : (dt_token)((i * 37) % V);
    for (int i = 0; i < N; i++) lg[(size_t)i * Vp + 5] *= 8.0f;
    size_t at = 0;
    float *l2 = malloc((size_t)N * Vp * sizeof(float));
    memcpy(l2, lg, (size_t)N * Vp * sizeof(float));
    o->softmax_xent(lg, loss, t, N, V, Vp, 0.25f);
    at = put(out, at, lg, (size_t)N * Vp), at = put(out, at, loss, N);
    /* the vocabulary-parallel steps, on one slice of Vl columns (the rows of l2 as [N, Vl]) */
    o->xent_rowmax(l2, mx, N, Vl, real);
    o->xent_rowsum(l2, mx, t, st, N, Vl, real, v0);
    o->xent_finish(l2, loss, mx, st, t, N, Vl, real, v0, 0.25f);
    at = put(out, at, mx, N), at = put(out, at, st, 2 * (size_t)N);
    at = put(out, at, l2, (size_t)N * Vl), at = put(out, at, loss, N);
    free(lg), free(loss), free(mx), free(st), free(t), free(l2);
    return at;
}

static size_t case_attention(const dt_ops *o, float *out) {
    int B = 2, T = 80, C = 64, NH = 4;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = fill(nq), *y = fill(no), *lse = fill(nl), *dy = fill(no), *dqkv = fill(nq);
    int *seg = malloc((size_t)B * T * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) seg[b * T + t] = b == 0 ? 0 : t < 30 ? 0 : t < 71 ? 30 : 71; /* documents */
    size_t at = 0;
    for (int s = 0; s < 2; s++) {
        const int *sg = s ? seg : NULL;
        o->attention_fwd(y, lse, qkv, sg, B, T, C, NH);
        o->attention_bwd(dqkv, dy, qkv, y, lse, sg, B, T, C, NH);
        at = put(out, at, y, no), at = put(out, at, lse, nl), at = put(out, at, dqkv, nq);
    }
    /* ring attention: the second half of the rows' queries against the first half's keys */
    int Tq = T / 2, Tk = T / 2;
    int *qpos = malloc(Tq * sizeof(int)), *kpos = malloc(Tk * sizeof(int));
    for (int i = 0; i < Tq; i++) qpos[i] = Tk + i, kpos[i] = i;
    size_t pq = (size_t)B * Tq * 3 * C, po = (size_t)B * Tq * C, pl = (size_t)B * NH * Tq;
    float *q = fill(pq), *kv = fill(pq), *po_ = calloc(po, sizeof(float)), *pl_ = malloc(pl * sizeof(float));
    float *pdy = fill(po), *dq = calloc(pq, sizeof(float)), *dkv = calloc(pq, sizeof(float));
    for (size_t i = 0; i < pl; i++) pl_[i] = -INFINITY;
    o->attention_part_fwd(po_, pl_, q, kv, qpos, NULL, kpos, B, Tq, Tk, C, NH);
    o->attention_part_bwd(dq, dkv, pdy, q, kv, po_, pl_, qpos, NULL, kpos, B, Tq, Tk, C, NH);
    at = put(out, at, po_, po), at = put(out, at, pl_, pl), at = put(out, at, dq, pq), at = put(out, at, dkv, pq);
    free(qkv), free(y), free(lse), free(dy), free(dqkv), free(seg), free(qpos), free(kpos);
    free(q), free(kv), free(po_), free(pl_), free(pdy), free(dq), free(dkv);
    return at;
}

/* Bitwise cp's chunk kernels: the 4 canonical chunks of a sequence in one call (one
 * process) and as the lists {0, 3} and {1, 2} (cp 2's load-balanced ranks) give each
 * chunk's rows, log-sum-exps, dq and dk | dv leaves the same bits. */
static size_t case_attention_chunks(const dt_ops *o, float *out) {
    enum { B = 2, T = 384, C = 64, NH = 4, Q = 4, Tc = T / Q };
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T, nf = (size_t)B * T * 2 * C;
    float *qkv = fill(nq), *dy = fill(no), *y = malloc(no * sizeof(float)), *lse = malloc(nl * sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *lv = calloc(Q * nf, sizeof(float)), *lv2 = calloc(Q * nf, sizeof(float));
    float *y2 = malloc(no / 2 * sizeof(float)), *l2 = malloc(nl / 2 * sizeof(float)), *dy2 = malloc(no / 2 * sizeof(float));
    float *dq2 = calloc(nq / 2, sizeof(float)), *leaf[Q], *leaf2[2];
    int all[Q] = {0, Tc, 2 * Tc, 3 * Tc}, lists[2][2] = {{0, 3}, {1, 2}};
    for (int c = 0; c < Q; c++) leaf[c] = lv + (size_t)c * nf;
    o->attention_chunks_fwd(y, lse, qkv, NULL, B, T, C, NH, all, Q, Tc);
    o->attention_chunks_bwd(dq, leaf, dy, qkv, y, lse, NULL, B, T, C, NH, all, Q, Tc);
    int same = 1;
    for (int r = 0; r < 2; r++) {
        int p0[2] = {lists[r][0] * Tc, lists[r][1] * Tc}, Tq = 2 * Tc;
        for (int b = 0; b < B; b++) /* this rank's rows of dout and of the whole output */
            for (int k = 0; k < 2; k++)
                memcpy(dy2 + ((size_t)b * Tq + k * Tc) * C, dy + ((size_t)b * T + p0[k]) * C, (size_t)Tc * C * sizeof(float));
        for (int k = 0; k < 2; k++) leaf2[k] = lv2 + (size_t)lists[r][k] * nf;
        o->attention_chunks_fwd(y2, l2, qkv, NULL, B, T, C, NH, p0, 2, Tc);
        o->attention_chunks_bwd(dq2, leaf2, dy2, qkv, y2, l2, NULL, B, T, C, NH, p0, 2, Tc);
        for (int b = 0; b < B; b++)
            for (int k = 0; k < 2; k++) {
                size_t mine = (size_t)b * Tq + k * Tc, whole = (size_t)b * T + p0[k];
                same &= !memcmp(y2 + mine * C, y + whole * C, (size_t)Tc * C * sizeof(float));
                same &= !memcmp(dq2 + mine * 3 * C, dq + whole * 3 * C, (size_t)Tc * 3 * C * sizeof(float));
                for (int h = 0; h < NH; h++)
                    same &= !memcmp(l2 + ((size_t)b * NH + h) * Tq + k * Tc, lse + ((size_t)b * NH + h) * T + p0[k],
                                    (size_t)Tc * sizeof(float));
            }
    }
    for (int c = 0; c < Q; c++) /* each leaf: keys up to its chunk's end, batch by batch */
        for (int b = 0; b < B; b++)
            same &= !memcmp(lv2 + c * nf + (size_t)b * T * 2 * C, lv + c * nf + (size_t)b * T * 2 * C,
                            (size_t)(c + 1) * Tc * 2 * C * sizeof(float));
    CHECK(same, "attention chunks: the lists {0, 3} and {1, 2} give the one call's bits");
    size_t at = put(out, 0, y, no);
    at = put(out, at, lse, nl), at = put(out, at, dq, nq), at = put(out, at, lv, Q * nf);
    free(qkv), free(dy), free(y), free(lse), free(dq), free(lv), free(lv2), free(y2), free(l2), free(dy2), free(dq2);
    return at;
}

static size_t case_rest(const dt_ops *o, float *out) {
    int B = 3, T = 50, C = 96, rows = 40;
    float *dwte = fill((size_t)rows * C), *dwpe = fill((size_t)T * C), *dout = fill((size_t)B * T * C);
    dt_token *tok = malloc((size_t)B * T * sizeof(dt_token));
    for (int i = 0; i < B * T; i++) tok[i] = (dt_token)(i * i % 53); /* repeats; some outside the rows */
    o->embed_bwd(dwte, dwpe, dout, tok, B, T, C, 3, rows);
    size_t at = put(out, 0, dwte, (size_t)rows * C);
    at = put(out, at, dwpe, (size_t)T * C);
    size_t n = 300001;
    float *g = fill(n);
    double ss = o->sumsq(g, n);
    memcpy(out + at, &ss, sizeof ss);
    at += 2;
    int N = 70, NH = 8, NKV = 2, HS = 16;
    float *dqkv = fill((size_t)N * 3 * NH * HS), *inv = fill(HS / 2), *dq = fill((size_t)N * NH * HS);
    float *dk = fill((size_t)N * NKV * HS), *dv = fill((size_t)N * NKV * HS);
    int *pos = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) pos[i] = i;
    o->rope_qkv_bwd(dq, dk, dv, dqkv, pos, inv, N, NH, NKV, HS);
    at = put(out, at, dq, (size_t)N * NH * HS), at = put(out, at, dk, (size_t)N * NKV * HS);
    at = put(out, at, dv, (size_t)N * NKV * HS);
    free(dwte), free(dwpe), free(dout), free(tok), free(g), free(dqkv), free(inv), free(dq), free(dk), free(dv), free(pos);
    return at;
}

/* add_rows (the key/value group trees' nodes, attention.c): column slices of row-major
 * matrices, the sum or a's copy, out's other columns untouched; in bf16 storage each
 * result rounded, the columns between the rows kept as they were. */
static void check_add_rows(const dt_ops *o, const char *what) {
    enum { R = 5, LD = 12, N = 4 };
    float a[R * LD], b[R * LD], out[R * LD], keep[R * LD];
    for (int i = 0; i < R * LD; i++) a[i] = (float)i * 0.5f, b[i] = 100.0f + (float)i, out[i] = keep[i] = -(float)i;
    o->add_rows(out + 3, LD, a + 1, LD, b + 7, LD, R, N);
    int ok = 1;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < LD; j++) {
            float want = j >= 3 && j < 3 + N ? a[r * LD + j - 2] + b[r * LD + j + 4] : keep[r * LD + j];
            ok &= out[r * LD + j] == want;
        }
    CHECK(ok, "%s add_rows: the column slices' sums, the rest untouched", what);
    o->add_rows(out, 4, a + 2, LD, NULL, 0, R, N); /* a copy, packed rows (out's ld 4) */
    ok = 1;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < N; j++) ok &= out[r * 4 + j] == a[r * LD + 2 + j];
    CHECK(ok, "%s add_rows without b: a's copy", what);
}

static void check_add_rows_bf16(void) {
    const dt_ops *c = dt_ops_cpu(), *o = dt_ops_bf16_storage(c);
    enum { R = 3, LD = 6, N = 2 };
    float w[R * LD], v[R * LD], wy[R * LD], wx[R * LD];
    uint16_t x[R * LD], y[R * LD], before[R * LD];
    for (int i = 0; i < R * LD; i++) w[i] = 1.0f + (float)i / 256.0f, v[i] = 3.0f - (float)i / 64.0f;
    c->to_bf16(x, v, R * LD);
    c->to_bf16(y, w, R * LD);
    memcpy(before, y, sizeof before);
    /* in place, y's columns 2-3 += x's columns 1-2 (elements of 2 bytes) */
    o->add_rows((float *)(y + 2), LD, (float *)(y + 2), LD, (const float *)(x + 1), LD, R, N);
    c->from_bf16(wy, y, R * LD);
    c->from_bf16(wx, x, R * LD);
    int kept = 1, summed = 1;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < LD; j++) {
            if (j < 2 || j >= 2 + N) {
                kept &= y[r * LD + j] == before[r * LD + j];
                continue;
            }
            float was, sum;
            uint16_t h;
            c->from_bf16(&was, before + r * LD + j, 1);
            sum = was + wx[r * LD + j - 1];
            c->to_bf16(&h, &sum, 1);
            summed &= y[r * LD + j] == h;
        }
    CHECK(kept && summed, "bf16 add_rows: each sum rounded to bf16 (%g), the other columns kept", wy[2]);
}

typedef size_t (*kernel_case)(const dt_ops *o, float *out);

/* The case's outputs with t threads, from the same inputs each time. */
static size_t run(kernel_case c, const dt_ops *o, int t, float *out) {
    dt_cpu_set_threads(t);
    g_rng = 42;
    return c(o, out);
}

int main(void) {
    static const struct {
        const char *name;
        kernel_case fn;
    } cases[] = {{"gemm", case_gemm},     {"gemm blocks", case_gemm_blocks}, {"linear", case_linear},       {"layernorm/rmsnorm", case_norms},
                 {"cross-entropy", case_xent}, {"attention", case_attention}, {"attention chunks", case_attention_chunks},
                 {"embedding/sumsq/rope", case_rest}};
    const dt_ops *o = dt_ops_cpu_fixed();
    float *ref = malloc(CAP * sizeof(float)), *got = malloc(CAP * sizeof(float));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = run(cases[c].fn, o, 1, ref);
        CHECK(n <= CAP, "%s: %zu floats", cases[c].name, n);
        for (int t = 2; t <= 3; t++) {
            size_t m = run(cases[c].fn, o, t, got);
            CHECK(m == n && !memcmp(ref, got, n * sizeof(float)), "%s: %d threads differ from 1 (rel %.2e)",
                  cases[c].name, t, check_rel_diff(ref, got, n));
        }
    }
    check_add_rows(o, "fixed");
    check_add_rows(dt_ops_cpu(), "plain");
    check_add_rows_bf16();
    /* plain OpenBLAS at the same GEMMs: information only */
    size_t n = run(case_gemm, dt_ops_cpu(), 1, ref), m = run(case_gemm, dt_ops_cpu(), 2, got);
    printf("plain OpenBLAS GEMM, 1 vs 2 threads: %s\n",
           m == n && !memcmp(ref, got, n * sizeof(float)) ? "same bits" : "different bits (what the tiles fix)");
    free(ref), free(got);
    return check_finish();
}
