/* The paired functions of tensor and sequence parallelism as the model calls them
 * (Megatron's f and g; with sp, all-gather and reduce-scatter): identities on one rank.
 * The collectives themselves are the strategy's (gpt_tp_comm). */
#include "gpt_internal.h"

dt_status gpt_tp_sum(gpt_model *m, float *x, size_t n) {
    return m->tp_comm.allreduce ? m->tp_comm.allreduce(m->tp_comm.ctx, x, n, GPT_TP_SUM) : DT_OK;
}

dt_status gpt_kv_sum(gpt_model *m, float *x, size_t n) {
    return m->tp_comm.kv_sum ? m->tp_comm.kv_sum(m->tp_comm.ctx, x, n) : DT_OK;
}

dt_status gpt_tp_complete(gpt_model *m, float *x, float *out, int N, float **done) {
    size_t C = (size_t)m->shape.n_embd;
    if (!m->sp) {
        *done = x;
        return gpt_tp_sum(m, x, (size_t)N * C);
    }
    *done = out;
    return m->tp_comm.reduce_scatter(m->tp_comm.ctx, out, x, (size_t)local_rows(m, N) * C);
}

dt_status gpt_seq_gather(gpt_model *m, float *x, int N, float **all) {
    if (!m->sp) {
        *all = x;
        return DT_OK;
    }
    *all = m->acts->full;
    return m->tp_comm.allgather(m->tp_comm.ctx, m->acts->full, x, (size_t)local_rows(m, N) * m->shape.n_embd);
}

/* With sp in bitwise mode the norms' gradients are whole on every rank (norm.c): none to sum. */
ln_grads gpt_ln_grad_target(gpt_model *m, float *dw, float *db, int part) {
    if (!m->sp || !dw || m->canon) return (ln_grads){dw, db};
    float *w = S(m, m->acts->lngrad, (size_t)part * 2 * m->shape.n_embd);
    return (ln_grads){w, S(m, w, (size_t)m->shape.n_embd)};
}

dt_status gpt_ln_grad_finish(gpt_model *m, const ln_grads *dw, int nparts) {
    if (!m->sp || m->canon) return DT_OK;
    int any = 0;
    for (int k = 0; k < nparts; k++) any |= dw[k].w != NULL;
    if (!any) return DT_OK; /* every one frozen (on every tensor-parallel rank alike): nothing to sum */
    size_t C = (size_t)m->shape.n_embd;
    DT_TRY(gpt_tp_sum(m, m->acts->lngrad, (size_t)nparts * 2 * C));
    for (int k = 0; k < nparts; k++) {
        const float *part = S(m, m->acts->lngrad, (size_t)k * 2 * C);
        if (dw[k].w) m->ops->add(dw[k].w, dw[k].w, part, C);
        if (dw[k].w && dw[k].b) m->ops->add(dw[k].b, dw[k].b, S(m, part, C), C); /* RMSNorm: no bias */
    }
    return DT_OK;
}
