#include "state.h"

#include <math.h>

static int has(const dt_comm *c) { return c && dt_comm_size((dt_comm *)c) > 1; }

int dt_state_model_parallel(const dt_model_groups *g) { return has(g->tp) || has(g->pp); }

int dt_state_norm_class(const gpt_model *m, const gpt_tensor *t) {
    if (t->unit == 0 && !m->has_embed) return -1; /* the last stage's copy of wte */
    if (t->shard.replica != 0) return -1;           /* a replicated key/value head's other copies */
    return t->shard.pieces > 1 ? DT_NORM_SPLIT : DT_NORM_REPLICATED;
}

dt_status dt_state_norm(const dt_model_groups *g, const double part[DT_NORM_NCLASSES], double *norm) {
    double split = part[DT_NORM_SPLIT];
    if (has(g->tp)) DT_TRY(dt_allreduce(g->tp, &split, 1, DT_F64, DT_SUM));
    double total = split + part[DT_NORM_REPLICATED];
    if (has(g->pp)) DT_TRY(dt_allreduce(g->pp, &total, 1, DT_F64, DT_SUM));
    *norm = sqrt(total);
    return DT_OK;
}

size_t dt_state_tie_bytes(const dt_model_groups *g, const gpt_model *m) {
    return has(g->pp) && g->emb && m->ops->on_device ? m->tensors[0].numel * dt_elem_bytes(m->ops) : 0;
}

/* bf16 gradients are summed as bf16 (DT_BF16 adds in fp32 and rounds): over the two end
 * stages that is one rounding of the fp32 sum, the fp32 reduction's result. */
dt_status dt_state_tie_grads(const dt_model_groups *g, const gpt_model *m, float *grads, float *host) {
    const gpt_tensor *wte = &m->tensors[0]; /* unit 0 on both ends starts with wte */
    if (!has(g->pp) || !g->emb || wte->frozen) return DT_OK; /* frozen: no gradient on either end */
    size_t esz = dt_elem_bytes(m->ops), bytes = wte->numel * esz;
    dt_dtype t = m->ops->bf16 ? DT_BF16 : DT_F32;
    void *x = (char *)grads + wte->offset * esz;
    if (!m->ops->on_device) return dt_allreduce(g->emb, x, wte->numel, t, DT_SUM);
    if (!host) return dt_fail(DT_ERUNTIME, "tied embedding: no host staging for a device model");
    m->ops->download(host, x, bytes);
    DT_TRY(dt_allreduce(g->emb, host, wte->numel, t, DT_SUM));
    m->ops->upload(x, host, bytes);
    return m->ops->sync();
}
