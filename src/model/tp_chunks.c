/* Canonical chunks of the tensor-parallel sums (bitwise mode with tp; m->canon = Q > 1).
 *
 * A row-parallel layer's output and a column-parallel layer's input gradient are sums
 * over a dimension that tp splits; so is the vocabulary-parallel head's. Here that
 * dimension is cut into Q canonical chunks whatever tp is (tp divides Q): each chunk's
 * product is a leaf, a rank's Q / tp leaves are summed by a balanced binary tree, and the
 * tensor-parallel sum (recursive halving over the ranks: tensor_parallel.c) is the tree's
 * upper levels, so one process computing all Q leaves gets the same bits. The other
 * products (a column-parallel output, every weight gradient) have no such sum, but a
 * GEMM's bits depend on its shape, so they are issued per canonical column (or row)
 * block too: the same calls in every layout. In bf16 each leaf and each tree node is
 * rounded to bf16 (the backend's add; tensor_parallel.c's tree rounds alike). */
#include "gpt_internal.h"

static int local_chunks(const gpt_model *m) { return m->canon / m->tp; }

void gpt_canon_tree(gpt_model *m, float *const *leaf, int L, size_t n) {
    for (int w = 1; w < L; w *= 2)
        for (int i = 0; i + w < L; i += 2 * w) m->ops->add(leaf[i], leaf[i], leaf[i + w], n);
}

/* The leaves of an [N, n] sum: out, then the scratch (canon / tp - 1 of them). */
static void leaves_of(gpt_model *m, float *out, size_t n, float **leaf) {
    leaf[0] = out;
    for (int l = 1; l < local_chunks(m); l++) leaf[l] = S(m, m->acts->leaves, (size_t)(l - 1) * n);
}

void gpt_add_bias(gpt_model *m, float *out, const float *bias, int N, int n) {
    m->ops->gemm(0, 0, N, n, 1, 1.0f, m->acts->ones, 1, bias, n, 1.0f, out, n);
}

/* The blocks of one product, through the backend's gemm_blocks: at most 3 sections of
 * 64 chunks. canon: the product's blocks in every layout (a rank runs count of them). */
enum { MAXB = 3 * 64 };
#define BLOCKS(tA, tB, M, N, K, A, lda, B, ldb, beta, C, ldc, count, canon)                                     \
    dt_gemm_blocks(m->ops, tA, tB, M, N, K, 1.0f, (const float *const *)(A), lda, (const float *const *)(B), ldb, \
                   beta, C, ldc, count, canon)

/* Bitwise mode with parallel.cp_chunks (cp_chunks.c): the rows of a product over rows go
 * in canonical row blocks, the same shapes in every layout; else all N at once. */
static int row_step(const gpt_model *m, int N) {
    int r = m->cp_comm.row_block;
    return r > 0 && r < N ? r : N;
}

/* A weight gradient's inputs over the whole sequence (cp_chunks.c: every cp rank's rows in
 * order; else this rank's), and the share of its `blocks` canonical blocks this rank
 * computes: [*first, *first + *count). */
typedef struct {
    const float *in, *dy, *ones;
    int N, first, count;
} wgrad;
static dt_status wgrad_of(gpt_model *m, const float *in, const float *dy, int N, int IC, int OC, int blocks,
                          wgrad *g) {
    *g = (wgrad){in, dy, m->acts->ones, N, 0, blocks};
    if (!m->cp_comm.gather) return DT_OK;
    const void *a = NULL, *b = NULL;
    if (in) DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, in, N, (size_t)IC * sizeof(float), 0, &a));
    DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, dy, N, (size_t)OC * sizeof(float), 1, &b));
    int n = m->cp_comm.size;
    *g = (wgrad){a, b, m->cp_comm.ones, N * n, m->cp_comm.rank * (blocks / n), blocks / n};
    return DT_OK;
}

void gpt_col_fwd(gpt_model *m, float *out, const float *in, const float *w, const float *bias, int N, int IC, int OCl,
                 int sections) {
    int blocks = sections * local_chunks(m), wb = OCl / blocks, R = row_step(m, N);
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    for (int r0 = 0; r0 < N; r0 += R) {
        for (int k = 0; k < blocks; k++)
            a[k] = S(m, in, (size_t)r0 * IC), b[k] = S(m, w, (size_t)k * wb), c[k] = S(m, out, (size_t)r0 * OCl + k * wb);
        BLOCKS(0, 0, R, wb, IC, a, IC, b, OCl, 0.0f, c, OCl, blocks, sections * m->canon);
        if (!bias) continue;
        for (int k = 0; k < blocks; k++) a[k] = m->acts->ones, b[k] = S(m, bias, (size_t)k * wb);
        BLOCKS(0, 0, R, wb, 1, a, 1, b, wb, 1.0f, c, OCl, blocks, sections * m->canon);
    }
}

dt_status gpt_col_bwd(gpt_model *m, float *dx, float *dw, float *db, const float *dy, const float *in, const float *w,
                      int N, int IC, int OCl, int sections) {
    const dt_ops *o = m->ops;
    int L = local_chunks(m), blocks = sections * L, wb = OCl / blocks, sec = OCl / sections, R = row_step(m, N);
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    if (dw || db) {
        wgrad g;
        DT_TRY(wgrad_of(m, dw ? in : NULL, dy, N, IC, OCl, blocks, &g));
        if (dw) {
            for (int i = 0; i < g.count; i++) {
                size_t k = (size_t)(g.first + i) * wb;
                a[i] = g.in, b[i] = S(m, g.dy, k), c[i] = S(m, dw, k);
            }
            BLOCKS(1, 0, IC, wb, g.N, a, IC, b, OCl, 1.0f, c, OCl, g.count, sections * m->canon);
        }
        for (int i = 0; db && i < g.count; i++) {
            size_t k = (size_t)(g.first + i) * wb;
            o->gemm(1, 0, wb, 1, g.N, 1.0f, S(m, g.dy, k), OCl, g.ones, 1, 1.0f, S(m, db, k), 1);
        }
    }
    if (!dx) return DT_OK;
    float *leaf[64];
    leaves_of(m, dx, (size_t)N * IC, leaf);
    for (int r0 = 0; r0 < N; r0 += R)
        for (int s = 0; s < sections; s++) { /* chunk l: its block of each section (q, k, v), in order */
            for (int l = 0; l < L; l++) {
                size_t at = (size_t)s * sec + (size_t)l * wb;
                a[l] = S(m, dy, (size_t)r0 * OCl + at), b[l] = S(m, w, at), c[l] = S(m, leaf[l], (size_t)r0 * IC);
            }
            BLOCKS(0, 1, R, IC, wb, a, OCl, b, OCl, s ? 1.0f : 0.0f, c, IC, L, m->canon);
        }
    gpt_canon_tree(m, leaf, L, (size_t)N * IC);
    return DT_OK;
}

void gpt_row_fwd(gpt_model *m, float *out, const float *in, const float *w, int N, int ICl, int OC) {
    int L = local_chunks(m), kb = ICl / L, R = row_step(m, N);
    float *leaf[64], *c[MAXB];
    const float *a[MAXB], *b[MAXB];
    leaves_of(m, out, (size_t)N * OC, leaf);
    for (int r0 = 0; r0 < N; r0 += R) {
        for (int l = 0; l < L; l++)
            a[l] = S(m, in, (size_t)r0 * ICl + l * kb), b[l] = S(m, w, (size_t)l * kb * OC),
            c[l] = S(m, leaf[l], (size_t)r0 * OC);
        BLOCKS(0, 0, R, OC, kb, a, ICl, b, OC, 0.0f, c, OC, L, m->canon);
    }
    gpt_canon_tree(m, leaf, L, (size_t)N * OC);
}

dt_status gpt_row_bwd(gpt_model *m, float *dx, float *dw, float *db, const float *dy, const float *in, const float *w,
                      int N, int ICl, int OC) {
    const dt_ops *o = m->ops;
    int L = local_chunks(m), kb = ICl / L, R = row_step(m, N);
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    if (dw || db) {
        wgrad g;
        DT_TRY(wgrad_of(m, dw ? in : NULL, dy, N, ICl, OC, L, &g));
        if (dw) {
            for (int i = 0; i < g.count; i++) {
                size_t l = (size_t)(g.first + i);
                a[i] = S(m, g.in, l * kb), b[i] = g.dy, c[i] = S(m, dw, l * kb * OC);
            }
            BLOCKS(1, 0, kb, OC, g.N, a, ICl, b, OC, 1.0f, c, OC, g.count, m->canon);
        }
        if (db && g.first == 0) o->gemm(1, 0, OC, 1, g.N, 1.0f, g.dy, OC, g.ones, 1, 1.0f, db, 1);
    }
    if (!dx) return DT_OK;
    for (int r0 = 0; r0 < N; r0 += R) {
        for (int l = 0; l < L; l++)
            a[l] = S(m, dy, (size_t)r0 * OC), b[l] = S(m, w, (size_t)l * kb * OC),
            c[l] = S(m, dx, (size_t)r0 * ICl + l * kb);
        BLOCKS(0, 1, R, kb, OC, a, OC, b, OC, 0.0f, c, ICl, L, m->canon);
    }
    return DT_OK;
}

/* ---- the same in nn.Linear's layout (weight [out, in]: Llama's projections) ---- */

void gpt_canon_leaves(gpt_model *m, float *out, size_t n, float **leaf) { leaves_of(m, out, n, leaf); }

/* A projection's canonical blocks held here: Q / tp, or for Llama's replicated key/value
 * heads (kv) all of this rank's head, Q / n_kv_head = replicas · Q / tp; the input
 * gradient's leaves (this rank's Q / tp chunks) take the ones from *first. */
static int colt_blocks(const gpt_model *m, int kv, int *first) {
    int L = local_chunks(m), r = kv ? gpt_kv_replicas(&m->shape, m->tp) : 1;
    *first = m->tp_rank % r * L;
    return r * L;
}

void gpt_colt_fwd(gpt_model *m, float *out, const float *in, const float *w, const float *bias, int N, int IN, int OUTl,
                  int kv) {
    int first, L = colt_blocks(m, kv, &first), ob = OUTl / L, R = row_step(m, N);
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    for (int r0 = 0; r0 < N; r0 += R) {
        for (int k = 0; k < L; k++)
            a[k] = S(m, in, (size_t)r0 * IN), b[k] = S(m, w, (size_t)k * ob * IN), c[k] = S(m, out, (size_t)r0 * OUTl + k * ob);
        BLOCKS(0, 1, R, ob, IN, a, IN, b, IN, 0.0f, c, OUTl, L, m->canon);
        if (!bias) continue;
        for (int k = 0; k < L; k++) a[k] = m->acts->ones, b[k] = S(m, bias, (size_t)k * ob);
        BLOCKS(0, 0, R, ob, 1, a, 1, b, ob, 1.0f, c, OUTl, L, m->canon);
    }
}

dt_status gpt_colt_bwd(gpt_model *m, float *const *leaf, int acc, float *dw, float *db, const float *dy, const float *in,
                       const float *w, int N, int IN, int OUTl, int kv) {
    int first, blocks = colt_blocks(m, kv, &first), L = local_chunks(m), ob = OUTl / blocks, R = row_step(m, N);
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    if (dw || db) {
        wgrad g;
        DT_TRY(wgrad_of(m, dw ? in : NULL, dy, N, IN, OUTl, blocks, &g));
        if (dw) {
            for (int i = 0; i < g.count; i++) {
                size_t k = (size_t)(g.first + i) * ob;
                a[i] = S(m, g.dy, k), b[i] = g.in, c[i] = S(m, dw, k * IN);
            }
            BLOCKS(1, 0, ob, IN, g.N, a, OUTl, b, IN, 1.0f, c, IN, g.count, m->canon);
        }
        for (int i = 0; db && i < g.count; i++) {
            size_t k = (size_t)(g.first + i) * ob;
            m->ops->gemm(1, 0, ob, 1, g.N, 1.0f, S(m, g.dy, k), OUTl, g.ones, 1, 1.0f, S(m, db, k), 1);
        }
    }
    if (!leaf) return DT_OK;
    for (int r0 = 0; r0 < N; r0 += R) {
        for (int l = 0; l < L; l++) {
            size_t k = (size_t)(first + l) * ob;
            a[l] = S(m, dy, (size_t)r0 * OUTl + k), b[l] = S(m, w, k * IN), c[l] = S(m, leaf[l], (size_t)r0 * IN);
        }
        BLOCKS(0, 0, R, IN, ob, a, OUTl, b, IN, acc ? 1.0f : 0.0f, c, IN, L, m->canon);
    }
    return DT_OK;
}

void gpt_rowt_fwd(gpt_model *m, float *out, const float *in, const float *w, int N, int INl, int OUT) {
    int L = local_chunks(m), kb = INl / L, R = row_step(m, N);
    float *leaf[64], *c[MAXB];
    const float *a[MAXB], *b[MAXB];
    leaves_of(m, out, (size_t)N * OUT, leaf);
    for (int r0 = 0; r0 < N; r0 += R) {
        for (int l = 0; l < L; l++)
            a[l] = S(m, in, (size_t)r0 * INl + l * kb), b[l] = S(m, w, (size_t)l * kb), c[l] = S(m, leaf[l], (size_t)r0 * OUT);
        BLOCKS(0, 1, R, OUT, kb, a, INl, b, INl, 0.0f, c, OUT, L, m->canon);
    }
    gpt_canon_tree(m, leaf, L, (size_t)N * OUT);
}

dt_status gpt_rowt_bwd(gpt_model *m, float *dx, float *dw, const float *dy, const float *in, const float *w, int N,
                       int INl, int OUT) {
    int L = local_chunks(m), kb = INl / L, R = row_step(m, N);
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    if (dw) {
        wgrad g;
        DT_TRY(wgrad_of(m, in, dy, N, INl, OUT, L, &g));
        for (int i = 0; i < g.count; i++) {
            size_t l = (size_t)(g.first + i);
            a[i] = g.dy, b[i] = S(m, g.in, l * kb), c[i] = S(m, dw, l * kb);
        }
        BLOCKS(1, 0, OUT, kb, g.N, a, OUT, b, INl, 1.0f, c, INl, g.count, m->canon);
    }
    if (!dx) return DT_OK;
    for (int r0 = 0; r0 < N; r0 += R) {
        for (int l = 0; l < L; l++)
            a[l] = S(m, dy, (size_t)r0 * OUT), b[l] = S(m, w, (size_t)l * kb), c[l] = S(m, dx, (size_t)r0 * INl + l * kb);
        BLOCKS(0, 0, R, kb, OUT, a, OUT, b, INl, 0.0f, c, INl, L, m->canon);
    }
    return DT_OK;
}
