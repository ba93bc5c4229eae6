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

void gpt_col_fwd(gpt_model *m, float *out, const float *in, const float *w, const float *bias, int N, int IC, int OCl,
                 int sections) {
    int blocks = sections * local_chunks(m), wb = OCl / blocks;
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    for (int k = 0; k < blocks; k++) a[k] = in, b[k] = S(m, w, (size_t)k * wb), c[k] = S(m, out, (size_t)k * wb);
    BLOCKS(0, 0, N, wb, IC, a, IC, b, OCl, 0.0f, c, OCl, blocks, sections * m->canon);
    if (!bias) return;
    for (int k = 0; k < blocks; k++) a[k] = m->acts->ones, b[k] = S(m, bias, (size_t)k * wb);
    BLOCKS(0, 0, N, wb, 1, a, 1, b, wb, 1.0f, c, OCl, blocks, sections * m->canon);
}

void gpt_col_bwd(gpt_model *m, float *dx, float *dw, float *db, const float *dy, const float *in, const float *w, int N,
                 int IC, int OCl, int sections) {
    const dt_ops *o = m->ops;
    int L = local_chunks(m), blocks = sections * L, wb = OCl / blocks, sec = OCl / sections;
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    if (dw) {
        for (int k = 0; k < blocks; k++) a[k] = in, b[k] = S(m, dy, (size_t)k * wb), c[k] = S(m, dw, (size_t)k * wb);
        BLOCKS(1, 0, IC, wb, N, a, IC, b, OCl, 1.0f, c, OCl, blocks, sections * m->canon);
    }
    for (int k = 0; db && k < blocks; k++)
        o->gemm(1, 0, wb, 1, N, 1.0f, S(m, dy, (size_t)k * wb), OCl, m->acts->ones, 1, 1.0f, S(m, db, (size_t)k * wb), 1);
    if (!dx) return;
    float *leaf[64];
    leaves_of(m, dx, (size_t)N * IC, leaf);
    for (int s = 0; s < sections; s++) { /* chunk l: its block of each section (q, k, v), in order */
        for (int l = 0; l < L; l++) {
            size_t at = (size_t)s * sec + (size_t)l * wb;
            a[l] = S(m, dy, at), b[l] = S(m, w, at), c[l] = leaf[l];
        }
        BLOCKS(0, 1, N, IC, wb, a, OCl, b, OCl, s ? 1.0f : 0.0f, c, IC, L, m->canon);
    }
    gpt_canon_tree(m, leaf, L, (size_t)N * IC);
}

void gpt_row_fwd(gpt_model *m, float *out, const float *in, const float *w, int N, int ICl, int OC) {
    int L = local_chunks(m), kb = ICl / L;
    float *leaf[64];
    const float *a[MAXB], *b[MAXB];
    leaves_of(m, out, (size_t)N * OC, leaf);
    for (int l = 0; l < L; l++) a[l] = S(m, in, (size_t)l * kb), b[l] = S(m, w, (size_t)l * kb * OC);
    BLOCKS(0, 0, N, OC, kb, a, ICl, b, OC, 0.0f, leaf, OC, L, m->canon);
    gpt_canon_tree(m, leaf, L, (size_t)N * OC);
}

void gpt_row_bwd(gpt_model *m, float *dx, float *dw, float *db, const float *dy, const float *in, const float *w, int N,
                 int ICl, int OC) {
    const dt_ops *o = m->ops;
    int L = local_chunks(m), kb = ICl / L;
    const float *a[MAXB], *b[MAXB];
    float *c[MAXB];
    if (dw) {
        for (int l = 0; l < L; l++) a[l] = S(m, in, (size_t)l * kb), b[l] = dy, c[l] = S(m, dw, (size_t)l * kb * OC);
        BLOCKS(1, 0, kb, OC, N, a, ICl, b, OC, 1.0f, c, OC, L, m->canon);
    }
    if (dx) {
        for (int l = 0; l < L; l++) a[l] = dy, b[l] = S(m, w, (size_t)l * kb * OC), c[l] = S(m, dx, (size_t)l * kb);
        BLOCKS(0, 1, N, kb, OC, a, OC, b, OC, 0.0f, c, ICl, L, m->canon);
    }
    if (db) o->gemm(1, 0, OC, 1, N, 1.0f, dy, OC, m->acts->ones, 1, 1.0f, db, 1);
}
