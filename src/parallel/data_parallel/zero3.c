/* ZeRO-3: parameters partitioned too (FSDP). Each block is all-gathered just before its
 * forward and again before its backward (the next block's gather is started while the
 * current one computes), into two alternating buffers; unit 0 and ln_f have their own.
 * A pipeline stage that runs its blocks for many micro-batches in turn gathers its
 * parameters once per step instead (gather_once). Gradients as in ZeRO-2 (zero2.c). */
#include "zero_shard.h"

/* the block units (parallel.unit_blocks: several blocks each): units 1 .. nblocks(d) */
static int nblocks(const dt_dp *d) { return d->m->nunits - 2; }

int dt_zero3_gbuf(const dt_dp *d, int u) { return u == 0 ? 0 : u == dt_zero_lnf(d) ? 1 : 2 + (u - 1) % 2; }

static dt_status zero3_setup(dt_dp *d) { return dt_zero_setup(d, 3); }

/* the pending gather finished (none: nothing to do) */
static dt_status finish_prefetch(dt_dp *d) {
    dt_zero3_gathers *g = &dt_zero_of(d)->g3;
    if (!g->prefetch && !g->dprefetch) return DT_OK;
    dt_status s;
    if (g->dprefetch) DP_COMM(d, s = dt_dcomm_join_mark(d->o.dcomm)); /* not the reduce-scatters queued since */
    else DP_COMM(d, s = dt_wait(g->prefetch));
    g->prefetch = NULL;
    g->dprefetch = 0;
    if (s == DT_OK) s = g->fetch_err; /* after the wait: the peers' gather was matched */
    g->fetch_err = DT_OK;
    g->held[dt_zero3_gbuf(d, g->prefetch_unit)] = s == DT_OK ? g->prefetch_unit : -1;
    g->prefetch_unit = -1;
    return s;
}

static dt_status gather_unit(dt_dp *d, int u) {
    dt_zero *z = dt_zero_of(d);
    dt_zero3_gathers *g = &z->g3;
    if (d->o.gather_once || dt_zero_repl(d, u) || dt_zero_keep(d, u))
        return DT_OK; /* the whole stage is in place; a replicated or kept unit too */
    int b = dt_zero3_gbuf(d, u);
    if ((g->prefetch || g->dprefetch) && g->prefetch_unit == u) return finish_prefetch(d);
    if (g->held[b] == u) return DT_OK;
    DT_TRY(finish_prefetch(d)); /* one collective in flight at a time keeps ranks in step */
    g->held[b] = -1;
    dt_status s;
    DP_COMM(d, s = dt_zero3_gather_own(d, u, g->pgather[b]));
    if (s == DT_OK && d->o.dcomm) s = dt_dcomm_join(d->o.dcomm);
    DT_TRY(s);
    g->held[b] = u;
    return DT_OK;
}

/* Unit u's all-gather started (its offloaded slice read first), and the slice of the unit
 * after it in this pass (next: u + 1 forward, u - 1 backward) read ahead from NVMe while u
 * computes. */
static void prefetch_unit(dt_dp *d, int u, int next) {
    dt_zero *z = dt_zero_of(d);
    dt_zero3_gathers *g = &z->g3;
    /* staged gathers are not prefetched (their upload follows the collective) */
    if (u < 1 || u > nblocks(d) || g->prefetch || g->dprefetch || d->o.gather_once || dt_zero_staged(d) ||
        dt_zero_repl(d, u) || dt_zero_keep(d, u))
        return;
    int b = dt_zero3_gbuf(d, u);
    if (g->held[b] == u) return;
    g->held[b] = -1;
    if (d->o.dcomm) { /* queued behind the compute so far (the buffer's last reader); joined when needed */
        if (dt_zero3_gather_own(d, u, g->pgather[b]) != DT_OK || dt_dcomm_mark(d->o.dcomm) != DT_OK)
            return; /* gathered again, blocking, when needed */
        g->dprefetch = 1;
        g->prefetch_unit = u;
        return;
    }
    /* an offloaded slice is read to its place first (blocking), then gathered in place */
    /* (a failed read still joins the gather its peers post; the error comes at its wait) */
    const float *own = z->param_shard ? z->param_shard + z->soff[u] : g->pgather[b] + (size_t)d->rank * z->S[u];
    g->fetch_err = z->param_shard ? DT_OK : dt_zero3_fetch_own(d, u, g->pgather[b]);
    if (dt_iallgather(d->comm, own, g->pgather[b], z->S[u], DT_F32, &g->prefetch) == DT_OK)
        g->prefetch_unit = u, d->param_bytes += (double)z->P[u] * sizeof(float);
    else
        g->prefetch = NULL; /* fall back to a blocking gather when the unit is needed */
    if (z->pstore && next >= 1 && next <= nblocks(d)) dt_store_fetch_begin(z->pstore, z->soff[next], z->S[next]);
}

static dt_status zero3_before_forward(dt_dp *d, int u) {
    DT_TRY(gather_unit(d, u));
    if (u >= 1 && u <= nblocks(d)) prefetch_unit(d, u + 1, u + 2);
    return DT_OK;
}

static dt_status zero3_before_backward(dt_dp *d, int u) {
    if (u == GPT_HEAD_PART) return DT_OK;
    DT_TRY(gather_unit(d, u));
    if (u >= 1 && u <= nblocks(d)) prefetch_unit(d, u - 1, u - 2);
    return dt_zero2_before_backward(d, u);
}

static dt_status zero3_drain(dt_dp *d) {
    DT_TRY(dt_zero2_finish_pending(d));
    return finish_prefetch(d);
}

/* the parameters changed: gathered again (gather_once, and the policy's zero2 units: kept
 * whole until the next update, as ZeRO-2 keeps them) or when next used */
static dt_status refresh(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    if (!d->o.gather_once) {
        for (int b = 0; b < 4; b++) z->g3.held[b] = -1; /* gathered again when next used */
        dt_status s = DT_OK;
        for (int u = 0; s == DT_OK && u < d->m->nunits; u++)
            if (dt_zero_keep(d, u)) DP_COMM(d, s = dt_zero3_gather_own(d, u, d->m->unit_params[u]));
        return s;
    }
    dt_status s; /* the stage's parameters whole, from every rank's updated slices */
    DP_COMM(d, s = dt_zero_gather_units(d, z->g3.stage_full));
    if (d->N > 1) d->param_bytes += (double)z->padded_total * sizeof(float);
    return s;
}

static dt_status zero3_update(dt_dp *d, double lr, double norm) {
    DT_TRY(dt_zero_adamw(d, lr, norm));
    return refresh(d);
}

static dt_status zero3_init_weights(dt_dp *d, uint64_t seed, const char *init_from) {
    DT_TRY(dt_zero_init_weights(d, seed, init_from));
    return refresh(d); /* gathered before the weights changed */
}

static dt_status zero3_load(dt_dp *d, const char *step_dir) {
    DT_TRY(dt_zero_load(d, step_dir));
    return refresh(d); /* as after init: a pipeline's stage gathered again */
}

const dt_dp_strategy dt_dp_zero3 = {
    DT_ZERO_SHARED_OPS,
    .name = "zero3",
    .grads = DT_GRADS_SHARD,
    .setup = zero3_setup,
    .begin_step = dt_zero2_begin_step,
    .before_forward = zero3_before_forward,
    .before_backward = zero3_before_backward,
    .after_backward = dt_zero2_after_backward,
    .drain = zero3_drain,
    .reduce = dt_zero2_reduce,
    .update = zero3_update,
    .init_weights = zero3_init_weights,
    .load = zero3_load,
    .redistribute = refresh,
    /* the reduce-scatters; the parameters gathered once per step under a pipeline, else in
     * the forward and the backward of every micro-batch */
    .ring = {{0, 3}, {1, 1}},
    .params_shard = 1,
    .formula = {"16psi/N", "16psi/N", 0, 16, {1, 1, 1}, 0, 0},
};
