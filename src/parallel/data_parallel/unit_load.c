/* Weights and optimizer state brought in one model unit at a time (dp_core.h): what an
 * offloaded state needs to initialise and resume without the whole model in memory. */
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "dp_core.h"

static size_t unit_len(const gpt_model *m, const size_t *len, int u) { return len ? len[u] : m->units[u].count; }

dt_status dt_dp_by_unit(dt_dp *d, uint64_t seed, const char *from, int moments, const size_t *len,
                        dt_dp_unit_put put, void *ctx) {
    gpt_model *m = d->m;
    int nu = m->nunits, nsets = moments ? 3 : 1;
    size_t most = 0;
    for (int u = 0; u < nu; u++) most = unit_len(m, len, u) > most ? unit_len(m, len, u) : most;
    float *buf = NULL, **views = calloc(3 * (size_t)nu, sizeof *views); /* weights, exp_avg, exp_avg_sq */
    dt_status s = views ? dt_alloc((void **)&buf, nsets * most * sizeof(float) + 1, "load buffer (one unit)")
                        : dt_fail(DT_ERUNTIME, "out of memory (views)");
    s = dt_comm_agree(d->comm, s, NULL); /* allocated here, so every rank must know whether all could */
    float *sets[3] = {NULL, NULL, NULL};
    for (int k = 0; k < nsets && buf; k++) sets[k] = buf + k * most;
    for (int u = 0; u < nu && s == DT_OK; u++) {
        for (int k = 0; k < nsets; k++) memset(sets[k], 0, unit_len(m, len, u) * sizeof(float)); /* padding stays zero */
        if (!from) {
            float *own = m->unit_params[u];
            m->unit_params[u] = buf;
            gpt_init_unit(m, seed, u);
            m->unit_params[u] = own;
        } else {
            for (int k = 0; k < nsets; k++) views[k * nu + u] = sets[k];
            s = dt_ckpt_load_weights_into(from, m, views);
            if (s == DT_OK && moments) s = dt_ckpt_load_optimizer(from, m, views + nu, views + 2 * nu);
            for (int k = 0; k < nsets; k++) views[k * nu + u] = NULL;
        }
        if (s == DT_OK) s = put(d, ctx, u, sets, nsets);
        if (s == DT_OK) s = d->ops->sync(); /* the uploads have read buf */
    }
    dt_free(buf);
    free(views);
    return s;
}
