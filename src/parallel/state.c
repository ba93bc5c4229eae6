#include "state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_parallel.h"

static int has(const dt_comm *c) { return c && dt_comm_size((dt_comm *)c) > 1; }

int dt_state_model_parallel(const dt_model_groups *g) { return has(g->tp) || has(g->pp); }

int dt_state_norm_class(const gpt_model *m, const gpt_tensor *t) {
    if (t->unit == 0 && !m->has_embed) return -1; /* the last stage's copy of wte */
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

dt_status dt_state_tie_grads(const dt_model_groups *g, const gpt_model *m, float *grads) {
    if (!has(g->pp) || !g->emb) return DT_OK;
    const gpt_tensor *wte = &m->tensors[0]; /* unit 0 on both ends starts with wte */
    return dt_allreduce(g->emb, grads + wte->offset, wte->numel, DT_F32, DT_SUM);
}

int dt_state_is_root(const dt_model_groups *g) { return !has(g->tp) || dt_comm_rank(g->tp) == 0; }

void dt_whole_free(dt_whole_model *w) {
    gpt_destroy(&w->full);
    for (int k = 0; k < 2; k++) {
        free(w->mom[k]);
        free(w->view[k]);
    }
    memset(w, 0, sizeof *w);
}

dt_status dt_state_gather_whole(const dt_model_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                                dt_whole_model *w) {
    int moments = mv != NULL, root = dt_state_is_root(g), tp = has(g->tp) ? dt_comm_size(g->tp) : 1;
    memset(w, 0, sizeof *w);
    size_t maxn = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].numel > maxn) maxn = m->tensors[i].numel;
    float *scratch = NULL;
    dt_status s = DT_OK;
    if (root) {
        s = gpt_create_ex(&w->full, &m->shape, dt_ops_cpu(), 1, 1, 1);
        for (int k = 0; s == DT_OK && k < (moments ? 2 : 0); k++) {
            w->mom[k] = calloc(w->full.nparams, sizeof(float));
            if (!w->mom[k]) s = dt_fail(DT_ERUNTIME, "out of memory (whole optimizer state for the checkpoint)");
            else s = gpt_unit_views(&w->full, w->mom[k], &w->view[k]);
        }
        scratch = s == DT_OK ? malloc((size_t)tp * maxn * sizeof(float)) : NULL;
        if (s == DT_OK && !scratch) s = dt_fail(DT_ERUNTIME, "out of memory (gathering tensor pieces)");
    }
    if (has(g->tp)) s = dt_comm_agree(g->tp, s, NULL);
    float *const *src[3] = {m->unit_params, mv, vv};
    for (int k = 0; s == DT_OK && k < (moments ? 3 : 1); k++)
        for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            const gpt_tensor *wt = root ? gpt_find(&w->full, t->name) : NULL; /* by name: any cut of the model */
            float *dst = wt ? (k == 0 ? w->full.params : w->mom[k - 1]) + wt->offset : NULL;
            const float *piece = src[k][t->unit] + (t->offset - m->units[t->unit].offset);
            if (has(g->tp)) s = dt_tp_gather_tensor(g->tp, t, piece, dst, scratch);
            else if (dst) memcpy(dst, piece, t->numel * sizeof(float));
        }
    free(scratch);
    return s;
}
