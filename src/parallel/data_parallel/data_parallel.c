/* The data-parallel engine: creates the mode's strategy (strategy.h) and runs the model's
 * hooks, the step, saves, loads and the digest through its table. Checkpoints and the
 * digest are of whole tensors: with model parallelism the digest's are assembled at one
 * rank, a checkpoint's at each pipeline stage's first rank, which writes its stage's
 * files (state.h, a host copy made at save time only); a load reads this rank's pieces
 * out of the file's whole tensors by their shard specs (checkpoint.c), so any layout,
 * with any ZeRO stage, reads any checkpoint. */
#include "data_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "dp_core.h"

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
    d->align = DT_SHARD_ALIGN;
    m->hooks = (gpt_hooks){h_before_forward, h_after_forward, h_before_backward, h_after_backward, d};
    dt_status s = dt_dp_strategy_for(o, &d->mode, &d->st);
    if (s == DT_OK) s = d->st.setup(d);
    return dt_comm_agree(d->comm, s, NULL); /* what follows communicates */
}

int dt_dp_set_async_save(dt_dp *d, int on) { return d->async_save = on && !dt_state_model_parallel(&d->o.groups); }

dt_status dt_dp_save_wait(dt_dp *d) {
    return dt_comm_agree(d->comm, d->rank == 0 ? dt_ckpt_async_wait(&d->save_job) : DT_OK, NULL);
}

void dt_dp_destroy(dt_dp *d) {
    if (!d) return;
    if (d->save_job.pid > 0) { /* a failed run still lets a started save finish (it commits or not) */
        dt_status s = dt_ckpt_async_wait(&d->save_job);
        (void)s;
    }
    for (int i = 0; i < d->ninflight; i++) dt_wait(d->inflight[i]);
    if (d->st.free) d->st.free(d);
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

void dt_dp_begin_micro(dt_dp *d, int last) { d->last_micro = last; }

dt_status dt_dp_end_step(dt_dp *d, double lr, double *grad_norm) {
    dt_status s = d->st.drain ? d->st.drain(d) : DT_OK;
    if (s == DT_OK) s = d->st.reduce(d, grad_norm);
    if (s == DT_OK) s = d->st.update(d, lr, *grad_norm);
    d->step++;
    return s;
}

dt_status dt_dp_gather_full(dt_dp *d) { return d->st.gather_full ? d->st.gather_full(d) : DT_OK; }

void dt_dp_release_full(dt_dp *d) {
    if (d->st.release_full) d->st.release_full(d);
}

dt_status dt_dp_save(dt_dp *d, const char *dir, const dt_train_state *st, const char *config_json, double shard_mb) {
    float **mv = NULL, **vv = NULL;
    dt_status s = DT_OK;
    if (dt_state_model_parallel(&d->o.groups)) { /* whole tensors, each stage's at its first tensor-parallel rank */
        dt_whole_model f;
        memset(&f, 0, sizeof f);
        /* the first replica's model-parallel groups write the files (a group's ranks share
         * their data-parallel rank); the other replicas take part in the gathers only */
        int writer = d->rank == 0;
        s = d->st.open_full(d, 1, 1, writer, &mv, &vv); /* this rank's pieces whole over the data-parallel group */
        if (writer) {
            s = dt_state_agree(&d->o.groups, s); /* what follows is collective over the groups */
            if (s == DT_OK) s = dt_state_gather_stage(&d->o.groups, d->m, mv, vv, &f);
        }
        /* each pipeline stage's files written by its own root, in parallel (state.c) */
        if (writer && dt_state_is_stage_root(&d->o.groups))
            s = dt_state_save_stages(&d->o.groups, &f, s, dir, st, config_json, shard_mb);
        dt_whole_free(&f);
        dt_status c = d->st.close_full(d, mv, vv);
        if (s == DT_OK) s = c;
        s = dt_state_agree(&d->o.groups, s);
        return dt_comm_agree(d->comm, s, NULL);
    }
    if (d->st.source_open && !d->async_save) { /* streamed: one piece whole at a time, written as it comes */
        dt_ckpt_source src;
        s = d->st.source_open(d, 1, &src);
        if (s == DT_OK) s = dt_ckpt_save_stream(dir, d->m, &src, d->rank == 0, st, config_json, shard_mb);
        d->st.source_close(d, &src);
        return dt_comm_agree(d->comm, s, NULL);
    }
    /* rank 0 writes; an asynchronous save's child from a snapshot of the whole state (fork) */
    s = d->st.open_full(d, 1, 1, d->rank == 0, &mv, &vv);
    if (s == DT_OK && d->rank == 0)
        s = d->async_save ? dt_ckpt_save_async(&d->save_job, dir, d->m, mv, vv, st, config_json, shard_mb)
                          : dt_ckpt_save(dir, d->m, mv, vv, st, config_json, shard_mb);
    dt_status c = d->st.close_full(d, mv, vv);
    if (s == DT_OK) s = c;
    return dt_comm_agree(d->comm, s, NULL);
}

dt_status dt_dp_digest(dt_dp *d, char hex[65]) {
    float **mv = NULL, **vv = NULL;
    if (dt_state_model_parallel(&d->o.groups)) { /* of the whole model, at the groups' first rank */
        dt_whole_model f;
        memset(&f, 0, sizeof f);
        int writer = d->rank == 0; /* the first replica's groups (as in dt_dp_save) */
        dt_status s = d->st.open_full(d, 0, 0, writer, &mv, &vv);
        if (writer) {
            s = dt_state_agree(&d->o.groups, s);
            if (s == DT_OK) s = dt_state_gather_whole(&d->o.groups, d->m, NULL, NULL, &f);
        }
        hex[0] = 0;
        if (s == DT_OK && writer && dt_state_is_root(&d->o.groups)) dt_weights_digest(&f.full, hex);
        dt_whole_free(&f);
        dt_status c = d->st.close_full(d, mv, vv);
        if (s == DT_OK) s = c;
        return dt_state_agree(&d->o.groups, s);
    }
    if (d->st.source_open) { /* streamed as a save is (every rank gets the digest) */
        dt_ckpt_source src;
        dt_status s = d->st.source_open(d, 0, &src);
        if (s == DT_OK) s = dt_weights_digest_stream(d->m, &src, hex);
        d->st.source_close(d, &src);
        return s;
    }
    dt_status s = d->st.open_full(d, 0, 0, 1, &mv, &vv);
    if (s == DT_OK) dt_weights_digest(d->m, hex);
    dt_status c = d->st.close_full(d, mv, vv);
    return s != DT_OK ? s : c;
}

double dt_dp_comm_seconds(const dt_dp *d) { return d->comm_s; }

void dt_dp_memory(const dt_dp *d, dt_mem_report *r) {
    memset(r, 0, sizeof *r);
    d->st.memory(d, r);
}
