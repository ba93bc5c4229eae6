#include "dp_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_dp_inflight_slot(dt_dp *d, dt_request ***slot) {
    if (d->ninflight == MAX_INFLIGHT) { /* bounded: finish the oldest before starting more */
        dt_status s;
        DP_COMM(d, s = dt_wait(d->inflight[0]));
        memmove(d->inflight, d->inflight + 1, (MAX_INFLIGHT - 1) * sizeof(dt_request *));
        d->ninflight--;
        DT_TRY(s);
    }
    *slot = &d->inflight[d->ninflight];
    return DT_OK;
}

int dt_dp_tied(const dt_dp *d) {
    const dt_model_groups *g = &d->o.groups;
    return g->emb && g->pp && dt_comm_size(g->pp) >= 2;
}

dt_status dt_dp_inflight_wait(dt_dp *d) {
    dt_status s = DT_OK;
    double t0 = dt_now();
    for (int i = 0; i < d->ninflight; i++) {
        dt_status w = dt_wait(d->inflight[i]);
        if (s == DT_OK) s = w;
    }
    d->ninflight = 0;
    d->comm_s += dt_now() - t0;
    return s;
}

static dt_status over_model(void *ctx, double *part, int nparts, double *norm) {
    dt_dp *d = ctx;
    (void)nparts; /* DT_NORM_NCLASSES */
    return dt_state_norm(&d->o.groups, part, norm);
}

static dt_status over_dp(void *ctx, double *part, int nparts, double *norm) {
    dt_dp *d = ctx;
    DT_TRY(dt_allreduce(d->comm, part, (size_t)nparts, DT_F64, DT_SUM));
    if (dt_state_model_parallel(&d->o.groups)) return dt_state_norm(&d->o.groups, part, norm);
    *norm = sqrt(part[0]);
    return DT_OK;
}

dt_norm_reduce dt_dp_norm_over_model(dt_dp *d) { return (dt_norm_reduce){over_model, d}; }
dt_norm_reduce dt_dp_norm_over_dp(dt_dp *d) { return (dt_norm_reduce){over_dp, d}; }

dt_status dt_dp_views_push(dt_dp *d, dt_dp_views *v, float *base, const size_t *off, size_t elem) {
    gpt_model *m = d->m;
    v->saved = malloc((size_t)m->nunits * sizeof(float *));
    if (!v->saved) return dt_fail(DT_ERUNTIME, "out of memory (views)");
    for (int u = 0; u < m->nunits; u++) {
        v->saved[u] = m->unit_params[u];
        m->unit_params[u] = (float *)((char *)base + (off ? off[u] : m->units[u].offset) * elem);
    }
    return DT_OK;
}

void dt_dp_views_pop(dt_dp *d, dt_dp_views *v) {
    if (v->saved)
        for (int u = 0; u < d->m->nunits; u++) d->m->unit_params[u] = v->saved[u];
    free(v->saved);
    v->saved = NULL;
}
