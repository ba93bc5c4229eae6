/* ZeRO's streamed save and digest source (zero_shard.h's dt_zero_source_open): one unit
 * whole at a time, gathered over the data-parallel group into one buffer of the largest
 * unit, so a save needs that much more memory, not the model's. */
#include <stdlib.h>

#include "../../core/mem.h"
#include "zero_shard.h"

typedef struct {
    dt_dp *d;
    float *buf;
    int set, unit; /* what buf holds (-1: nothing) */
} zero_stream;

static dt_status stream_get(void *ctx, int set, int i, const float **data) {
    zero_stream *zs = ctx;
    dt_dp *d = zs->d;
    dt_zero *z = dt_zero_of(d);
    const gpt_tensor *t = &d->m->tensors[i];
    int u = t->unit;
    size_t at_u = t->offset - d->m->units[u].offset;
    if (set == 0 && z->stage <= 2 && !dt_zero_devmem(d)) { /* full parameters in fp32 host memory already */
        *data = z->params_pad + z->poff[u] + at_u;
        return DT_OK;
    }
    if (zs->set != set || zs->unit != u) { /* every rank's slice of the unit: this rank's copied to its place */
        float *mine = zs->buf + dt_zero_lo(d, u);
        zs->set = zs->unit = -1;
        DT_TRY(dt_zero_get_slice(d, set, u, mine));
        if (!dt_zero_repl(d, u)) DT_TRY(dt_allgather(d->comm, mine, zs->buf, z->S[u], DT_F32));
        zs->set = set;
        zs->unit = u;
    }
    *data = zs->buf + at_u;
    return DT_OK;
}

dt_status dt_zero_source_open(dt_dp *d, int moments, int reader, dt_ckpt_source *src) {
    dt_zero *z = dt_zero_of(d);
    (void)reader; /* every rank's slices are gathered: every rank takes part */
    zero_stream *zs = calloc(1, sizeof *zs);
    *src = (dt_ckpt_source){.get = stream_get, .ctx = zs, .moments = moments};
    if (!zs) return dt_fail(DT_ERUNTIME, "out of memory (save buffer)");
    zs->d = d;
    zs->set = zs->unit = -1;
    DT_TRY(d->mode->drain(d)); /* zero 1/2: the last update's parameters are in place */
    size_t most = 0;
    for (int u = 0; u < d->m->nunits; u++)
        if (z->P[u] > most) most = z->P[u];
    /* allocated here, so every rank must know before the gathers whether all could */
    return dt_comm_agree(d->comm, dt_alloc((void **)&zs->buf, most * sizeof(float) + 1, "save buffer (one unit)"),
                         NULL);
}

void dt_zero_source_close(dt_dp *d, dt_ckpt_source *src) {
    (void)d;
    zero_stream *zs = src->ctx;
    if (!zs) return;
    dt_free(zs->buf);
    free(zs);
    src->ctx = NULL;
}
