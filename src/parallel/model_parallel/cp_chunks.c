/* Context parallelism in bitwise mode: canonical sequence chunks (parallel.cp_chunks).
 *
 * Ring attention merges key blocks in an order that depends on cp, and a rank's weight
 * gradients sum its own rows only, so neither gives the single process's bits. Here the
 * sequence is cut into Q canonical chunks of T / Q positions, in every layout alike (one
 * process included: this is attached on a group of one too), and:
 *   - every GEMM over rows is issued per chunk-sized row block (tp_chunks.c, head.c), so a
 *     row's products have the same shapes whichever rank computes them;
 *   - attention: the keys and values of the whole sequence are gathered, each query chunk
 *     is computed by the backend's chunk kernels, and chunk c's share of dk, dv is its own
 *     leaf; the Q leaves of a key are summed by one fixed binary tree by the key's owner
 *     (the leaves of other ranks' chunks arrive by an all-reduce in which each element has
 *     one non-zero term, so it is exact);
 *   - a weight gradient (and a bias's, a norm's, the embeddings') is computed by one rank
 *     over the whole sequence's rows, gathered in sequence order: the canonical column
 *     blocks of a weight are shared out over the cp ranks, the rest is cp rank 0's. The
 *     others hold zeros there, so the data-parallel sum over dp x cp adds exact zeros and
 *     the bitwise tree over micro-batches is unchanged.
 * The cost: the gathers (activations of the whole sequence, per linear's weight gradient)
 * and the leaves (Q x B x T x 2C/tp floats): this mode is for proving layouts equal, the
 * ring for speed. */
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "context_parallel.h"

enum { SLOTS = 5, WIDE = 2 }; /* slots 0, 1: activations (maxw floats a row); 2-4: two floats a row */

typedef struct {
    dt_comm *comm;
    const dt_ops *ops;
    int cp, rank, Bmax, T, Tl, Q, Tr; /* T: the whole sequence; Tl: this rank's positions; Tr = T / Q */
    int *pos;                         /* cp x Tl: every rank's positions */
    int *p0, nchunks;                 /* this rank's canonical chunks (their first positions), in row order */
    size_t maxw;                      /* floats in a row of an activation gathered */
    char *stage;                      /* cp x Bmax x Tl rows: the all-gather's */
    char *slot[SLOTS];
    float *leaves;                    /* Q x Bmax x T x 2C/tp */
    float *ones, *scratch;
} chunks;

static size_t slot_row_bytes(const chunks *x, int s) { return s < WIDE ? x->maxw * sizeof(float) : 2 * sizeof(float); }

static dt_status gather(void *ctx, const void *src, int N, size_t bytes, int s, const void **out) {
    chunks *x = ctx;
    if (x->cp == 1) {
        *out = src;
        return DT_OK;
    }
    int B = N / x->Tl;
    if (s < 0 || s >= SLOTS || bytes > slot_row_bytes(x, s) || bytes % sizeof(float) || N % x->Tl || B > x->Bmax)
        return dt_fail(DT_ERUNTIME, "context parallelism: a gather of %d rows of %zu bytes does not fit slot %d", N,
                       bytes, s);
    DT_TRY(dt_allgather(x->comm, src, x->stage, (size_t)N * bytes / sizeof(float), DT_F32));
    for (int r = 0; r < x->cp; r++) /* rank r's rows to their places in the sequence */
        for (int b = 0; b < B; b++)
            for (int t = 0; t < x->Tl; t++)
                memcpy(x->slot[s] + ((size_t)b * x->T + x->pos[r * x->Tl + t]) * bytes,
                       x->stage + (((size_t)r * B + b) * x->Tl + t) * bytes, bytes);
    *out = x->slot[s];
    return DT_OK;
}

static dt_status chunks_fwd(void *ctx, float *out, float *lse, const float *qkv, const int *qseg, int B, int T, int C,
                            int NH) {
    chunks *x = ctx;
    if (T != x->Tl) return dt_fail(DT_EINPUT, "context parallelism: %d positions here, attached for %d", T, x->Tl);
    const void *all;
    DT_TRY(gather(x, qkv, B * T, 3 * (size_t)C * sizeof(float), 0, &all));
    x->ops->attention_chunks_fwd(out, lse, all, qseg, B, x->T, C, NH, x->p0, x->nchunks, x->Tr);
    return DT_OK;
}

static dt_status chunks_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int *qseg, int B, int T, int C, int NH) {
    chunks *x = ctx;
    if (T != x->Tl) return dt_fail(DT_EINPUT, "context parallelism: %d positions here, attached for %d", T, x->Tl);
    const void *all;
    DT_TRY(gather(x, qkv, B * T, 3 * (size_t)C * sizeof(float), 0, &all));
    size_t leaf_n = (size_t)B * x->T * 2 * C; /* one chunk's dk | dv over the whole sequence */
    float *leaf[64];
    memset(x->leaves, 0, (size_t)x->Q * leaf_n * sizeof(float));
    for (int i = 0; i < x->nchunks; i++) leaf[i] = x->leaves + (size_t)(x->p0[i] / x->Tr) * leaf_n;
    x->ops->attention_chunks_bwd(dqkv, leaf, dout, all, out, lse, qseg, B, x->T, C, NH, x->p0, x->nchunks, x->Tr);
    if (x->cp > 1) DT_TRY(dt_allreduce(x->comm, x->leaves, (size_t)x->Q * leaf_n, DT_F32, DT_SUM));
    /* each of this rank's keys: its Q leaves by the canonical tree, into dqkv's k | v */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t row = ((size_t)b * x->T + x->pos[x->rank * x->Tl + t]) * 2 * C;
            for (int w = 1; w < x->Q; w *= 2)
                for (int i = 0; i + w < x->Q; i += 2 * w) {
                    float *a = x->leaves + (size_t)i * leaf_n + row;
                    const float *e = x->leaves + (size_t)(i + w) * leaf_n + row;
                    for (int k = 0; k < 2 * C; k++) a[k] += e[k];
                }
            memcpy(dqkv + ((size_t)b * T + t) * 3 * C + C, x->leaves + row, 2 * (size_t)C * sizeof(float));
        }
    return DT_OK;
}

size_t dt_cp_chunks_bytes(int B, int T, int cp, int C, int I, int tp, int Q) {
    if (Q <= 1) return 0;
    size_t BT = (size_t)B * T, Cl = (size_t)C / tp, maxw = 4 * Cl > (size_t)C ? 4 * Cl : (size_t)C;
    if ((size_t)I / tp > maxw) maxw = (size_t)I / tp;
    size_t rows = cp > 1 ? BT * (2 * maxw + 3 * 2) + BT * maxw : 0; /* slots and the stage */
    return (rows + (size_t)Q * BT * 2 * Cl + 4 * BT) * sizeof(float); /* ones, scratch */
}

void dt_cp_chunks_detach(gpt_model *m) {
    chunks *x = m->cp_comm.ctx;
    if (!x) return;
    dt_free(x->stage);
    for (int s = 0; s < SLOTS; s++) dt_free(x->slot[s]);
    dt_free(x->leaves);
    dt_free(x->ones);
    dt_free(x->scratch);
    free(x->pos);
    free(x->p0);
    free(x);
    memset(&m->cp_comm, 0, sizeof m->cp_comm);
}

dt_status dt_cp_chunks_attach(gpt_model *m, dt_comm *cp, int max_B, int T, int row_block) {
    int n = dt_comm_size(cp), Q = row_block > 0 ? T / row_block : 0;
    if (Q < 2 || T % row_block || Q > 64 || (T / (2 * n)) % row_block)
        return dt_fail(DT_EINPUT, "parallel.cp_chunks %d: the sequence's %d positions must cut into them, and each of "
                       "the 2 x cp = %d load-balance chunks into whole ones", Q, T, 2 * n);
    if (!m->ops->attention_chunks_fwd || !m->ops->attention_chunks_bwd)
        return dt_fail(DT_EINPUT, "parallel.cp_chunks: the %s backend has no chunked attention", m->ops->name);
    chunks *x = calloc(1, sizeof *x);
    if (!x) return dt_fail(DT_ERUNTIME, "out of memory (context-parallel chunks)");
    int C = m->shape.n_embd, Cl = C / m->tp;
    *x = (chunks){.comm = cp, .ops = m->ops, .cp = n, .rank = dt_comm_rank(cp), .Bmax = max_B, .T = T, .Tl = T / n,
                  .Q = Q, .Tr = row_block, .nchunks = T / n / row_block};
    size_t Il = (size_t)m->shape.intermediate / m->tp; /* Llama's gate and up */
    x->maxw = 4 * (size_t)Cl > (size_t)C ? 4 * (size_t)Cl : (size_t)C;
    if (Il > x->maxw) x->maxw = Il;
    m->cp_comm = (gpt_cp_comm){.attention_fwd = chunks_fwd, .attention_bwd = chunks_bwd, .ctx = x, .gather = gather,
                               .rank = x->rank, .size = n, .row_block = row_block};
    size_t BT = (size_t)max_B * T;
    x->pos = malloc((size_t)T * sizeof(int));
    x->p0 = malloc((size_t)x->nchunks * sizeof(int));
    dt_status s = x->pos && x->p0 ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (context-parallel chunks)");
    if (s == DT_OK) s = dt_alloc((void **)&x->leaves, (size_t)Q * BT * 2 * Cl * sizeof(float), "cp chunks' leaves");
    if (s == DT_OK) s = dt_alloc((void **)&x->ones, BT * sizeof(float), "cp chunks' ones");
    if (s == DT_OK) s = dt_alloc((void **)&x->scratch, 3 * BT * sizeof(float), "cp chunks' scratch");
    for (int k = 0; n > 1 && k < SLOTS && s == DT_OK; k++)
        s = dt_alloc((void **)&x->slot[k], BT * slot_row_bytes(x, k), "cp chunks' gathered rows");
    if (n > 1 && s == DT_OK) s = dt_alloc((void **)&x->stage, BT * x->maxw * sizeof(float), "cp chunks' gathered rows");
    if (s != DT_OK) {
        dt_cp_chunks_detach(m);
        return s;
    }
    for (int r = 0; r < n; r++) dt_cp_positions(T, n, r, x->pos + (size_t)r * x->Tl);
    for (int i = 0; i < x->nchunks; i++) x->p0[i] = x->pos[(size_t)x->rank * x->Tl + (size_t)i * row_block];
    for (size_t i = 0; i < BT; i++) x->ones[i] = 1.0f;
    m->cp_comm.positions = n > 1 ? x->pos + (size_t)x->rank * x->Tl : NULL;
    m->cp_comm.ones = x->ones;
    m->cp_comm.scratch = x->scratch;
    return DT_OK;
}
