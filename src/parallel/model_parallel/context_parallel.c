#include "context_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"

dt_status dt_cp_check(int T, int cp) {
    if (cp < 1 || T < 1 || T % (2 * cp) != 0)
        return dt_fail(DT_EINPUT, "parallel.cp %d: the sequence length %d must split into 2 x cp = %d equal chunks "
                       "(causal load balance)", cp, T, 2 * cp);
    return DT_OK;
}

void dt_cp_positions(int T, int cp, int rank, int *pos) {
    int Tc = T / (2 * cp), chunks[2] = {rank, 2 * cp - 1 - rank};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < Tc; i++) pos[k * Tc + i] = chunks[k] * Tc + i;
}

int64_t dt_cp_attention_pairs(int T, int cp, int rank) {
    int Tc = T / (2 * cp), chunks[2] = {rank, 2 * cp - 1 - rank};
    int64_t n = 0;
    for (int k = 0; k < 2; k++) /* position p sees p + 1 keys */
        n += (int64_t)Tc * chunks[k] * Tc + (int64_t)Tc * (Tc + 1) / 2;
    return n;
}

dt_status dt_cp_check_config(const dt_layout *L) {
    int cp = L->cp;
    if (cp <= 1) return DT_OK;
    DT_TRY(dt_cp_check(L->T, cp));
    const char *bw = NULL, *what = NULL;
    /* what cp itself lacks first: in bitwise mode too, the chunks would not help */
    if (L->backend != DT_BACKEND_CPU) what = "a backend other than cpu";
    else if (L->precision != DT_PREC_FP32) what = "a precision other than fp32";
    if (what) return dt_fail(DT_EINPUT, "parallel.cp %d: %s is not implemented with context parallelism yet", cp, what);
    if (dt_layout_bitwise(L)) { /* the canonical sequence chunks (cp_chunks.c) */
        int canon = dt_layout_canon(L);
        if (!dt_layout_row_block(L))
            bw = "needs parallel.cp_chunks, a multiple of 2 x cp (the same in every run that must share bits)";
        else if (atoi(L->cfg.parallel.cp_chunks) % (2 * cp))
            bw = "parallel.cp_chunks must be a multiple of 2 x cp";
        else if (!canon || canon % (cp * L->tp))
            bw = "parallel.tp_chunks must be a multiple of tp x cp (a weight's canonical blocks are shared out over "
                 "the cp ranks)";
    }
    if (bw) return dt_fail(DT_EINPUT, "parallel.cp %d in bitwise mode: %s", cp, bw);
    if (L->cfg.log.sample_tokens > 0) what = "the final sample (log.sample_tokens > 0; set it to 0)";
    if (what) return dt_fail(DT_EINPUT, "parallel.cp %d: %s is not implemented with context parallelism yet", cp, what);
    return DT_OK;
}

typedef struct {
    dt_comm *comm;
    const dt_ops *ops;
    int cp, rank, T; /* T: this rank's positions */
    int *pos;        /* cp x T: every rank's positions */
    float *kv[2], *dkv[2];
} ring;

enum { TAG_KV = 1, TAG_DKV = 2 };

/* Sends cur to the next rank and receives the previous rank's block into nxt. */
static dt_status ring_start(ring *x, const float *cur, float *nxt, size_t n, int tag, dt_request **rq) {
    int prev = (x->rank - 1 + x->cp) % x->cp, next = (x->rank + 1) % x->cp;
    DT_TRY(dt_irecv(x->comm, nxt, n, DT_F32, prev, tag, &rq[0]));
    return dt_isend(x->comm, cur, n, DT_F32, next, tag, &rq[1]);
}
static dt_status ring_finish(dt_request **rq) {
    dt_status a = rq[0] ? dt_wait(rq[0]) : DT_OK, b = rq[1] ? dt_wait(rq[1]) : DT_OK;
    rq[0] = rq[1] = NULL;
    return a != DT_OK ? a : b;
}

static dt_status ring_fwd(void *ctx, float *out, float *lse, const float *qkv, const int *qseg, int B, int T, int C,
                          int NH) {
    ring *x = ctx;
    if (T != x->T) return dt_fail(DT_EINPUT, "ring attention: %d positions, attached for %d", T, x->T);
    size_t n = (size_t)B * T * 3 * C;
    memset(out, 0, (size_t)B * T * C * sizeof(float));
    for (size_t i = 0; i < (size_t)B * NH * T; i++) lse[i] = -INFINITY;
    const float *cur = qkv; /* step s holds the rows of rank - s */
    dt_status st = DT_OK;
    for (int s = 0; s < x->cp && st == DT_OK; s++) {
        dt_request *rq[2] = {NULL, NULL};
        float *nxt = x->kv[s % 2];
        if (s < x->cp - 1) st = ring_start(x, cur, nxt, n, TAG_KV, rq);
        int src = (x->rank - s + x->cp) % x->cp;
        if (st == DT_OK)
            x->ops->attention_part_fwd(out, lse, qkv, cur, x->pos + (size_t)x->rank * T, qseg, x->pos + (size_t)src * T,
                                       B, T, T, C, NH);
        dt_status w = ring_finish(rq);
        if (st == DT_OK) st = w;
        cur = nxt;
    }
    return st;
}

static dt_status ring_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, const int *qseg, int B, int T, int C, int NH) {
    ring *x = ctx;
    if (T != x->T) return dt_fail(DT_EINPUT, "ring attention: %d positions, attached for %d", T, x->T);
    size_t n = (size_t)B * T * 3 * C;
    memset(dqkv, 0, n * sizeof(float));
    memset(x->dkv[0], 0, n * sizeof(float));
    const float *cur = qkv;
    float *dcur = x->dkv[0];
    dt_status st = DT_OK;
    for (int s = 0; s < x->cp && st == DT_OK; s++) {
        dt_request *rk[2] = {NULL, NULL}, *rd[2] = {NULL, NULL};
        float *knext = x->kv[s % 2], *dnext = x->dkv[(s + 1) % 2];
        if (s < x->cp - 1) st = ring_start(x, cur, knext, n, TAG_KV, rk); /* the next block, during this one */
        int src = (x->rank - s + x->cp) % x->cp;
        if (st == DT_OK)
            x->ops->attention_part_bwd(dqkv, dcur, dout, qkv, cur, out, lse, x->pos + (size_t)x->rank * T, qseg,
                                       x->pos + (size_t)src * T, B, T, T, C, NH);
        if (st == DT_OK) st = ring_start(x, dcur, dnext, n, TAG_DKV, rd); /* its dk, dv on to the next rank */
        dt_status a = ring_finish(rk), b = ring_finish(rd);
        if (st == DT_OK) st = a != DT_OK ? a : b;
        cur = knext;
        dcur = dnext;
    }
    if (st != DT_OK) return st;
    /* after the last step this rank's own block's dk, dv are back */
    for (size_t row = 0; row < (size_t)B * T; row++) {
        float *d = dqkv + row * 3 * C + C;
        const float *e = dcur + row * 3 * C + C;
        for (int k = 0; k < 2 * C; k++) d[k] += e[k];
    }
    return DT_OK;
}

size_t dt_cp_ring_bytes(int B, int T, int cp, int C, int tp) {
    return cp > 1 ? 4 * (size_t)B * (size_t)(T / cp) * 3 * (size_t)(C / tp) * sizeof(float) : 0;
}

size_t dt_cp_bytes(const dt_layout *L) {
    int rb = dt_layout_row_block(L);
    if (rb > 0) return dt_cp_chunks_bytes(L->micro, L->T, L->cp, L->shape.n_embd, L->shape.intermediate, L->tp, L->T / rb);
    return dt_cp_ring_bytes(L->micro, L->T, L->cp, L->shape.n_embd, L->tp);
}

dt_status dt_cp_attach(gpt_model *m, dt_comm *cp, int max_B, int T, int row_block) {
    if (row_block > 0) return dt_cp_chunks_attach(m, cp, max_B, T, row_block);
    int n = dt_comm_size(cp);
    if (n <= 1) return DT_OK;
    DT_TRY(dt_cp_check(T, n));
    if (!m->ops->attention_part_fwd || !m->ops->attention_part_bwd)
        return dt_fail(DT_EINPUT, "parallel.cp %d: the %s backend has no ring attention kernels", n, m->ops->name);
    ring *x = calloc(1, sizeof *x);
    if (!x) return dt_fail(DT_ERUNTIME, "out of memory (ring attention)");
    x->comm = cp;
    x->ops = m->ops;
    x->cp = n;
    x->rank = dt_comm_rank(cp);
    x->T = T / n;
    x->pos = malloc((size_t)T * sizeof(int));
    size_t floats = (size_t)max_B * x->T * 3 * (size_t)(m->shape.n_embd / m->tp);
    dt_status s = x->pos ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (ring attention)");
    for (int k = 0; k < 2 && s == DT_OK; k++) {
        s = dt_alloc((void **)&x->kv[k], floats * sizeof(float), "ring attention buffers");
        if (s == DT_OK) s = dt_alloc((void **)&x->dkv[k], floats * sizeof(float), "ring attention buffers");
    }
    for (int r = 0; s == DT_OK && r < n; r++) dt_cp_positions(T, n, r, x->pos + (size_t)r * x->T);
    m->cp_comm = (gpt_cp_comm){.attention_fwd = ring_fwd, .attention_bwd = ring_bwd,
                               .positions = x->pos ? x->pos + (size_t)x->rank * x->T : NULL, .ctx = x};
    if (s != DT_OK) dt_cp_detach(m); /* frees x and clears the hook */
    return s;
}

void dt_cp_detach(gpt_model *m) {
    if (m->cp_comm.gather) {
        dt_cp_chunks_detach(m);
        return;
    }
    ring *x = m->cp_comm.ctx;
    if (!x) return;
    for (int k = 0; k < 2; k++) {
        dt_free(x->kv[k]);
        dt_free(x->dkv[k]);
    }
    free(x->pos);
    free(x);
    memset(&m->cp_comm, 0, sizeof m->cp_comm);
}
