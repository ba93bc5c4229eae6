/* The data-parallel engine: creates the mode's strategy (strategy.h) and runs the model's
 * hooks, the step, loads and the memory report through its table. Saves and the digest
 * are the checkpoint's (ckpt/distributed.h): the engine hands it the strategy's pieces
 * (dt_dp_ckpt_pieces); a load reads this rank's pieces out of the files' whole tensors by
 * their shard specs (checkpoint.h), so any layout, with any ZeRO stage, reads any
 * checkpoint. */
#include "data_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "dp_core.h"
#include "staleness.h"

/* ---- the model's hooks ---- */

/* h_NAME calls the table's NAME, if any */
#define HOOK(name)                                              \
    static dt_status h_##name(void *ctx, int u) {               \
        dt_dp *d = ctx;                                         \
        return d->st.name ? d->st.name(d, u) : DT_OK;           \
    }
HOOK(before_forward)
HOOK(after_forward)
HOOK(before_backward)
HOOK(after_backward)

dt_status dt_dp_create(dt_dp **out, dt_comm *comm, gpt_model *m, const dt_adamw_hparams *hp, const dt_dp_opts *o) {
    dt_dp *d = calloc(1, sizeof *d);
    if (!d) return dt_fail(DT_ERUNTIME, "out of memory (data parallel)");
    *out = d;
    d->comm = comm;
    d->N = dt_comm_size(comm);
    d->rank = dt_comm_rank(comm);
    d->m = m;
    d->ops = m->ops;
    d->hp = *hp;
    d->o = *o;
    d->o.offload.store.tag = d->o.offload_tag; /* the copy's own names, not the caller's */
    d->o.offload_param.tag = d->o.param_tag;
    d->align = DT_SHARD_ALIGN;
    m->hooks = (gpt_hooks){h_before_forward, h_after_forward, h_before_backward, h_after_backward, d};
    dt_status s = dt_dp_strategy_for(o, &d->mode, &d->st);
    if (s == DT_OK) s = d->st.setup(d);
    if (s == DT_OK && o->staleness > 0)
        s = d->st.grads == DT_GRADS_FLAT ? dt_stale_create(&d->stale, d->ops, m->nparams, o->staleness)
                                         : dt_fail(DT_EINPUT, "parallel.staleness: the %s mode's gradients are not "
                                                   "whole on a rank (ddp or ps)", d->st.name);
    return dt_comm_agree(d->comm, s, NULL); /* what follows communicates */
}

void dt_dp_destroy(dt_dp *d) {
    if (!d) return;
    for (int i = 0; i < d->ninflight; i++) dt_wait(d->inflight[i]);
    if (d->st.free) d->st.free(d);
    dt_stale_free(d->stale);
    d->m->params = d->m->grads = NULL;
    memset(&d->m->hooks, 0, sizeof d->m->hooks);
    free(d);
}

dt_status dt_dp_init_weights(dt_dp *d, uint64_t seed, const char *init_from) {
    return d->st.init_weights(d, seed, init_from);
}

dt_status dt_dp_load(dt_dp *d, const char *step_dir, long long step) {
    d->step = step;
    return d->st.load(d, step_dir);
}

void dt_dp_begin_step(dt_dp *d) { d->st.begin_step(d); }

void dt_dp_set_updates(dt_dp *d, long long updates) { d->step = updates; }

void dt_dp_begin_micro(dt_dp *d, int last) { d->last_micro = last; }

dt_status dt_dp_end_step(dt_dp *d, double lr, double *grad_norm, int settle) {
    if (d->opt) dt_optimizer_backward_done(d->opt); /* handed over so far: during backward */
    dt_status s = d->st.drain ? d->st.drain(d) : DT_OK;
    if (s == DT_OK) s = d->st.reduce(d, grad_norm);
    if (d->opt) dt_optimizer_delay_next(d->opt, !settle && d->step + 1 > d->o.delayed_warmup);
    double t0 = dt_now(), norm = *grad_norm; /* the step's norm is reported; the applied one clips */
    long long late = 0; /* staleness: the applied gradient's own step, which AdamW counts */
    if (s == DT_OK && d->stale) {
        late = d->o.staleness;
        if (!dt_stale_exchange(d->stale, d->step, d->m->grads, &norm)) { /* the queue fills: no update yet */
            d->step++;
            return DT_OK;
        }
    }
    d->step -= late;
    if (s == DT_OK) s = d->st.update(d, lr, norm);
    d->step += late + 1;
    d->update_s += dt_now() - t0;
    return s;
}

dt_status dt_dp_settle(dt_dp *d) {
    if (!d->opt || !dt_optimizer_pending(d->opt)) return DT_OK; /* the same on every rank: the same schedule */
    DT_TRY(dt_comm_agree(d->comm, dt_optimizer_settle(d->opt), NULL)); /* before the re-distribution's collectives */
    return d->st.redistribute ? d->st.redistribute(d) : DT_OK;
}

dt_status dt_dp_gather_full(dt_dp *d) { return d->st.gather_full ? d->st.gather_full(d) : DT_OK; }

void dt_dp_release_full(dt_dp *d) {
    if (d->st.release_full) d->st.release_full(d);
}

/* ---- the pieces a checkpoint is made of (ckpt/distributed.h), through the table ---- */

static dt_status ck_open_full(void *ctx, int moments, int snapshot, int reader, float ***mv, float ***vv) {
    dt_dp *d = ctx;
    return d->st.open_full(d, moments, snapshot, reader, mv, vv);
}
static dt_status ck_close_full(void *ctx, float **mv, float **vv) {
    dt_dp *d = ctx;
    return d->st.close_full(d, mv, vv);
}
static dt_status ck_source_open(void *ctx, int moments, int reader, dt_ckpt_source *src) {
    dt_dp *d = ctx;
    return d->st.source_open(d, moments, reader, src);
}
static void ck_source_close(void *ctx, dt_ckpt_source *src) {
    dt_dp *d = ctx;
    d->st.source_close(d, src);
}

dt_ckpt_pieces dt_dp_ckpt_pieces(dt_dp *d) {
    return (dt_ckpt_pieces){d, ck_open_full, ck_close_full, d->st.source_open ? ck_source_open : NULL,
                            d->st.source_open ? ck_source_close : NULL};
}

static dt_status whole_weights(const dt_dp *d) {
    if (d->st.grads == DT_GRADS_FLAT && d->opt && d->m->params) return DT_OK;
    return dt_fail(DT_EINPUT, "data-parallel mode %s: the weights are not whole on a rank", d->st.name);
}

dt_status dt_dp_get_weights(dt_dp *d, float *dst) {
    DT_TRY(whole_weights(d));
    return dt_optimizer_get_weights(d->opt, 0, d->m->nparams, d->m->params, dst);
}

dt_status dt_dp_set_weights(dt_dp *d, const float *src) {
    DT_TRY(whole_weights(d));
    DT_TRY(dt_optimizer_set_weights(d->opt, 0, d->m->nparams, src, d->m->params));
    return d->ops->sync();
}

dt_status dt_dp_get_moments(dt_dp *d, int which, float *dst) {
    DT_TRY(whole_weights(d));
    return dt_optimizer_get_moments(d->opt, which, 0, d->m->nparams, dst);
}

dt_status dt_dp_set_moments(dt_dp *d, int which, const float *src) {
    DT_TRY(whole_weights(d));
    return dt_optimizer_set_moments(d->opt, which, 0, d->m->nparams, src);
}

int dt_dp_has_rank_state(const dt_dp *d) { return d->stale != NULL; }

dt_status dt_dp_save_rank_state(dt_dp *d, const char *dir, int rank, const char *layout) {
    return d->stale ? dt_stale_save(d->stale, d->step, dir, rank, layout) : DT_OK;
}

dt_status dt_dp_load_rank_state(dt_dp *d, const char *step_dir, int rank, const char *layout) {
    return d->stale ? dt_stale_load(d->stale, d->step, step_dir, rank, layout) : DT_OK;
}

double dt_dp_comm_seconds(const dt_dp *d) { return d->comm_s; }
double dt_dp_update_seconds(const dt_dp *d) { return d->update_s; }
double dt_dp_grad_bytes(const dt_dp *d) { return d->grad_bytes; }
double dt_dp_param_bytes(const dt_dp *d) { return d->param_bytes; }

void dt_dp_memory(const dt_dp *d, dt_mem_report *r) {
    memset(r, 0, sizeof *r);
    d->st.memory(d, r);
    r->workspace += dt_stale_bytes(d->stale);
}
