#include "parallelize.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/device_comm.h"
#include "../comm/watchdog.h"
#include "../core/timer.h"
#include "../launch/heartbeat.h"
#include "../optim/optimizer.h"
#include "data_parallel/data_parallel.h"
#include "../ckpt/rank_state.h"
#include "data_parallel/local_sgd.h"
#include "data_parallel/strategy.h"
#include "layout/mesh.h"
#include "model_parallel/context_parallel.h"
#include "model_parallel/pipeline.h"
#include "model_parallel/tensor_parallel.h"

struct dt_par {
    const dt_layout *L;
    dt_comm *world;
    dt_mesh mesh;
    dt_comm *data_comm; /* where gradients, losses and validation sums are reduced: dp, or dp x cp */
    dt_comm *engine_comm; /* the data-parallel engine's: data_comm, or one replica's part of it (local SGD) */
    dt_comm *own;         /* a group this handle made for the engine: of one (local SGD without cp), a shard group (HSDP) */
    dt_comm *replicas;    /* HSDP: this rank's peers in the other shard groups */
    dt_local_sgd *outer;  /* local SGD / DiLoCo: the replicas' synchronisation (NULL: every step) */
    int data_rank;        /* the data-parallel rank whose rows this rank trains (replica jobs: offset by the job's) */
    dt_par_rank_state extra; /* a mode's per-rank state outside the engine (dt_par_set_rank_state) */
    gpt_model model;
    dt_dp *dpe;
    dt_dcomm *dcomm;   /* comm.backend nccl: the data group's device collectives */
    dt_pipeline *pipe; /* NULL: one stage, the micro-steps run here */
    dt_adamw_hparams hp;
    dt_token *inp, *tgt; /* one micro-batch of whole sequences (micro x T) */
    int *seg;            /* and its document starts (loader.h) */
    dt_ckpt_dist ckpt; /* saves and the digest of the engine's state (ckpt/distributed.h) */
    double *pipe_all; /* the final pipeline report: 3 numbers per world rank */
    gpt_hooks hooks;  /* the engine's hooks while the full weights are in place */
    gpt_cp_comm cp;   /* and the model's context-parallel hooks (a group of one's sequence chunks step aside) */
    dt_par_fill fill; /* the current step's data, for the pipeline's callbacks */
    void *fill_ctx;
};

/* Every data-parallel collective algorithm key, on both groups that carry them. */
static dt_status set_algorithms(dt_par *h, const dt_config *c) {
    static const struct { int coll; size_t off; } algo_keys[] = {
        {DT_COLL_ALLREDUCE, offsetof(dt_config, comm.allreduce)},
        {DT_COLL_REDUCE_SCATTER, offsetof(dt_config, comm.reduce_scatter)},
        {DT_COLL_ALLGATHER, offsetof(dt_config, comm.allgather)},
        {DT_COLL_BCAST, offsetof(dt_config, comm.bcast)},
    };
    for (size_t i = 0; i < sizeof algo_keys / sizeof algo_keys[0]; i++) {
        dt_algo a;
        DT_TRY(dt_algo_parse((const char *)c + algo_keys[i].off, &a));
        DT_TRY(dt_comm_set_algo(h->mesh.dp_comm, (dt_coll)algo_keys[i].coll, a));
        DT_TRY(dt_comm_set_algo(h->mesh.dp_cp_comm, (dt_coll)algo_keys[i].coll, a));
    }
    return DT_OK;
}

/* The model's piece on this rank: tensor-parallel shards, its pipeline stage (its blocks
 * or chunks, and the activation slots its schedule needs), its context-parallel ring. */
static dt_status create_model(dt_par *h, const dt_layout *L, const dt_ops *ops) {
    const dt_config *c = &L->cfg;
    gpt_layout layout = {.tp = h->mesh.tp, .tp_rank = h->mesh.tp_rank, .sp = L->sp,
                         .recompute = dt_layout_recompute(L), .documents = dt_layout_documents(L),
                         .unit_blocks = c->parallel.unit_blocks, .canon = dt_layout_canon(L), .row_block = dt_layout_row_block(L),
                         .split_blocks = dt_layout_split_blocks(L)};
    if (dt_layout_pp_enabled(L)) {
        DT_TRY(dt_pp_layout(c->model.n_layer, L->pp, L->v, h->mesh.pp_rank, c->parallel.pp_split, &layout));
        layout.slots = dt_pp_slots(L->schedule, L->pp, L->v, h->mesh.pp_rank, L->m);
        layout.split_backward = dt_schedule_splits_backward(L->schedule);
    }
    gpt_shape shape = L->shape;
    /* activations are rank-local; the data-parallel setup after it is collective */
    DT_TRY(dt_comm_agree(h->world, gpt_create_layout(&h->model, &shape, ops, L->micro, L->Tl, 0, &layout), NULL));
    if (c->train.freeze[0]) gpt_freeze(&h->model, c->train.freeze, NULL);
    DT_TRY(dt_comm_agree(h->world, dt_tp_attach(&h->model, h->mesh.tp_comm), NULL));
    return dt_comm_agree(h->world, dt_cp_attach(&h->model, h->mesh.cp_comm, L->micro, L->T, dt_layout_row_block(L)), NULL);
}

/* The data-parallel engine over the data group, with the model-parallel groups its
 * state spans (state.h), and the checkpoints of its state (ckpt/distributed.h). */
static dt_status create_engine(dt_par *h, const dt_layout *L) {
    const dt_config *c = &L->cfg;
    h->hp = (dt_adamw_hparams){c->train.lr, c->train.min_lr, c->train.beta1, c->train.beta2, c->train.eps,
                               c->train.weight_decay, c->train.grad_clip, c->train.warmup_steps, c->train.steps};
    int pp = dt_layout_pp_enabled(L);
    dt_model_groups groups = {dt_layout_tp_enabled(L) ? h->mesh.tp_comm : NULL, pp ? h->mesh.pp_comm : NULL,
                              pp && h->mesh.in_emb && L->shape.tie ? h->mesh.emb_comm : NULL}; /* the tie's sum */
    dt_dp_opts o = {.bucket_bytes = (size_t)(c->parallel.bucket_mb * 1024.0 * 1024.0),
                    .overlap = c->parallel.overlap, .leaves = L->m, .groups = groups, .gather_once = pp};
    dt_dp_opts_of_layout(&o, L); /* the mode */
    o.no_update = dt_layout_ps_async(L) && h->mesh.dp_rank != 0; /* a worker: the server updates */
    o.replicas = dt_layout_hsdp(L) ? h->replicas : NULL; /* local SGD's replicas meet below, not every step */
    /* offload (the layout's check: param offload with ZeRO-3 and optimizer offload): one
     * file per rank of the world for each */
    dt_store_opts st = {.dir = c->offload.nvme_path, .block_bytes = (size_t)(c->offload.block_mb * 1024.0 * 1024.0),
                        .buffers = c->offload.buffer_count};
    if (c->offload.pin_memory && h->model.ops->host_alloc) { /* a device's: page-locked (DeepSpeed's pin_memory) */
        st.host_alloc = h->model.ops->host_alloc;
        st.host_free = h->model.ops->host_free;
    }
    static const dt_store_kind kinds[] = {[DT_OFFLOAD_NONE] = 0, [DT_OFFLOAD_CPU] = DT_STORE_CPU,
                                          [DT_OFFLOAD_NVME] = DT_STORE_NVME};
    o.offload.store = st;
    o.offload.store.kind = kinds[L->offload_optimizer];
    o.offload.params_host = L->offload_param != DT_OFFLOAD_NONE;
    o.offload.delayed = c->offload.delayed_update;
    o.delayed_warmup = c->offload.delayed_update_warmup;
    o.offload_param = st;
    o.offload_param.kind = kinds[L->offload_param];
    snprintf(o.offload_tag, sizeof o.offload_tag, "optimizer-rank%d", dt_comm_rank(h->world));
    snprintf(o.param_tag, sizeof o.param_tag, "param-rank%d", dt_comm_rank(h->world));
    if (dt_layout_nccl(L)) { /* the layout's check: a device, pure data parallelism */
        if (L->backend == DT_BACKEND_CUDA) DT_TRY(dt_dcomm_nccl(h->data_comm, &h->dcomm));
        else DT_TRY(dt_dcomm_emulated(h->data_comm, dt_emulated_host, &h->dcomm));
        o.dcomm = h->dcomm;
    }
    DT_TRY(dt_dp_create(&h->dpe, h->engine_comm, &h->model, &h->hp, &o));
    if (dt_layout_local_sgd(L)) /* the replicas meet over the data-parallel group, or their peers' in it */
        DT_TRY(dt_local_sgd_create(&h->outer, L, h->replicas ? h->replicas : h->mesh.dp_comm,
                                   h->replicas ? h->own : NULL, h->dpe, h->model.nparams, c->train.steps,
                                   dt_comm_rank(h->world)));
    /* the ranks the engine's state spans (HSDP: a shard group, the first of them writing) */
    dt_ckpt_groups cg = {dt_layout_hsdp(L) ? h->engine_comm : h->data_comm, {groups.tp, groups.pp},
                         dt_layout_hsdp(L) ? h->replicas : NULL};
    dt_ckpt_pieces pieces = dt_dp_ckpt_pieces(h->dpe);
    dt_ckpt_dist_init(&h->ckpt, &cg, &h->model, &pieces);
    /* a forked writer would share the offload stores' buffers and rings: saved synchronously */
    if (c->checkpoint.async && dt_layout_offload(L)) {
        if (dt_comm_rank(h->world) == 0)
            printf("dtrain: note: checkpoint.async with offload.*: saving synchronously (a forked writer would share "
                   "the offload buffers)\n");
    } else if (c->checkpoint.async && !dt_ckpt_dist_set_async(&h->ckpt, 1) && dt_comm_rank(h->world) == 0)
        printf("dtrain: note: checkpoint.async applies where rank 0 writes alone (no tp, pp or cp); saving "
               "synchronously\n");
    return DT_OK;
}

dt_status dt_parallelize(dt_par **out, const dt_layout *L, dt_comm *world, const dt_ops *ops) {
    dt_par *h = calloc(1, sizeof *h);
    *out = h;
    if (!h) return dt_fail(DT_ERUNTIME, "out of memory (parallelize)");
    h->L = L;
    h->world = world;
    size_t ntok = (size_t)L->micro * L->T;
    h->inp = malloc(ntok * sizeof(dt_token));
    h->tgt = malloc(ntok * sizeof(dt_token));
    h->seg = malloc(ntok * sizeof(int));
    h->pipe_all = calloc((size_t)dt_comm_size(world) * 3, sizeof(double));
    /* every rank's answer is the same (or the agreement below fails them all) */
    DT_TRY(dt_comm_agree(world, h->inp && h->tgt && h->seg && h->pipe_all ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (batch)"),
                         NULL));
    DT_TRY(dt_mesh_create(&h->mesh, world, L->tp, L->pp, L->cp));
    h->data_rank = L->jobs.me * dt_layout_job_dp(L) + h->mesh.dp_rank;
    h->data_comm = dt_layout_cp_enabled(L) ? h->mesh.dp_cp_comm : h->mesh.dp_comm;
    h->engine_comm = h->data_comm;
    /* HSDP: ZeRO within a shard group of consecutive dp ranks, replicated across; local
     * SGD: replicas of dp_shard consecutive dp ranks, DDP within each */
    if (dt_layout_hsdp(L) || (dt_layout_local_sgd(L) && L->dp_shard > 1)) {
        int g = h->mesh.dp_rank / L->dp_shard, i = h->mesh.dp_rank % L->dp_shard;
        DT_TRY(dt_comm_split(h->mesh.dp_comm, g, i, &h->own));
        dt_comm_set_name(h->own, "shard");
        DT_TRY(dt_comm_split(h->mesh.dp_comm, i, g, &h->replicas));
        dt_comm_set_name(h->replicas, "replica");
        h->engine_comm = h->own;
    }
    if ((dt_layout_local_sgd(L) && L->dp_shard == 1) || dt_layout_ps_async(L)) { /* each replica's engine alone: over
                                                                                   * its context-parallel ranks, or nothing */
        if (dt_layout_cp_enabled(L)) {
            h->engine_comm = h->mesh.cp_comm;
        } else {
            DT_TRY(dt_comm_split(h->mesh.dp_comm, h->mesh.dp_rank, 0, &h->own));
            dt_comm_set_name(h->own, "replica");
            h->engine_comm = h->own;
        }
    }
    DT_TRY(set_algorithms(h, &L->cfg));
    DT_TRY(create_model(h, L, ops));
    DT_TRY(create_engine(h, L));
    if (dt_layout_pp_enabled(L))
        DT_TRY(dt_pipeline_create(&h->pipe, &h->model, h->mesh.pp_comm, L->schedule, L->v, L->m, L->micro, L->Tl));
    return DT_OK;
}

void dt_par_destroy(dt_par *h, int failed) {
    if (!h) return;
    dt_pipeline_destroy(h->pipe);
    /* collectives still queued (a failed step's) end before the buffers they use are
     * freed: drained, or aborted after a failure (a peer may never issue its side) */
    dt_dcomm_free(h->dcomm, failed);
    dt_ckpt_dist_finish(&h->ckpt); /* a failed run still lets a started save finish */
    dt_local_sgd_free(h->outer);
    dt_dp_destroy(h->dpe);
    if (h->own) dt_comm_free(h->own);
    if (h->replicas) dt_comm_free(h->replicas);
    dt_cp_detach(&h->model);
    dt_tp_detach(&h->model);
    gpt_destroy(&h->model);
    dt_mesh_destroy(&h->mesh);
    free(h->pipe_all);
    free(h->inp);
    free(h->tgt);
    free(h->seg);
    free(h);
}

dt_status dt_par_init_weights(dt_par *h, uint64_t seed, const char *init_from) {
    return dt_dp_init_weights(h->dpe, seed, init_from);
}

/* The layout a rank's own state belongs to (ckpt/rank_state.h): a resume must be this. */
static void rank_state_layout(const dt_par *h, char *out, size_t cap) {
    dt_layout_state_key(h->L, h->model.nparams, out, cap);
}

static int has_rank_state(const dt_par *h) { return h->outer || h->extra.save || dt_dp_has_rank_state(h->dpe); }

void dt_par_set_rank_state(dt_par *h, const dt_par_rank_state *rs) { h->extra = *rs; }

dt_status dt_par_load(dt_par *h, const char *step_dir, long long step) {
    DT_TRY(dt_dp_load(h->dpe, step_dir, step));
    if (!has_rank_state(h)) return DT_OK;
    char layout[256];
    rank_state_layout(h, layout, sizeof layout);
    int rank = dt_comm_rank(h->world);
    dt_status s = h->outer        ? dt_local_sgd_load(h->outer, step_dir, step, rank, layout)
                  : h->extra.load ? h->extra.load(h->extra.ctx, step_dir, step, rank, layout)
                                  : dt_dp_load_rank_state(h->dpe, step_dir, rank, layout);
    return dt_comm_agree(h->world, s, NULL);
}

/* Context parallelism: of the micro-batch's whole sequences in inp/tgt (micro x T),
 * keep this rank's positions (micro x Tl, in place: every kept entry moves left). */
static void cp_select(dt_par *h) {
    const int *pos = h->model.cp_comm.positions;
    if (!pos) return;
    int micro = h->L->micro, T = h->L->T, Tl = h->L->Tl;
    for (int b = 0; b < micro; b++)
        for (int i = 0; i < Tl; i++) {
            h->inp[(size_t)b * Tl + i] = h->inp[(size_t)b * T + pos[i]];
            h->tgt[(size_t)b * Tl + i] = h->tgt[(size_t)b * T + pos[i]];
            h->seg[(size_t)b * Tl + i] = h->seg[(size_t)b * T + pos[i]]; /* a position of the whole row */
        }
}

/* Micro-step k's sequences of this data-parallel rank: [(k·dp + r)·micro, +micro) of
 * the global batch, so the batch's content never depends on the layout. */
static void load_micro(dt_par *h, int k) {
    h->fill(h->fill_ctx, (k * h->L->dp + h->data_rank) * h->L->micro, h->inp, h->tgt, h->seg);
    cp_select(h);
}

/* The document starts of the loaded micro-batch for the model's slot (none: stream). */
static const int *documents(const dt_par *h) { return dt_layout_documents(h->L) ? h->seg : NULL; }

/* The pipeline runner's view of the data: validation's micro-batch already loaded, or
 * training's micro-step mb. */
static void copy_out(dt_par *h, dt_token *tokens, dt_token *targets, int *seg) {
    size_t n = (size_t)h->L->micro * h->L->Tl;
    memcpy(tokens, h->inp, n * sizeof(dt_token));
    memcpy(targets, h->tgt, n * sizeof(dt_token));
    if (seg) memcpy(seg, h->seg, n * sizeof(int));
}
static void fill_current(void *ctx, int mb, dt_token *tokens, dt_token *targets, int *seg) {
    (void)mb;
    copy_out(ctx, tokens, targets, seg);
}
static void fill_step(void *ctx, int mb, dt_token *tokens, dt_token *targets, int *seg) {
    load_micro(ctx, mb);
    copy_out(ctx, tokens, targets, seg);
}
static void micro_step(void *ctx, int last) { dt_dp_begin_micro(((dt_par *)ctx)->dpe, last); }

/* Targets in the loss over this replica's micro-batches of the step, those of data-parallel
 * ranks share .. share + shares - 1 (whole sequences: every context-parallel rank counts
 * them all). */
static long long replica_tokens(dt_par *h, int share, int shares) {
    size_t n = (size_t)h->L->micro * h->L->T;
    long long count = 0;
    for (int k = 0; k < h->L->m; k++)
        for (int r = share; r < share + shares; r++) {
            h->fill(h->fill_ctx, (k * h->L->dp + r) * h->L->micro, h->inp, h->tgt, h->seg);
            for (size_t i = 0; i < n; i++) count += h->tgt[i] != DT_IGNORE;
        }
    return count;
}

dt_status dt_par_step(dt_par *h, long long step, int settle, dt_par_fill fill, void *ctx, long long loss_tokens,
                      int micro_steps, double *loss, double *grad_norm, double *lr) {
    const dt_layout *L = h->L;
    h->fill = fill;
    h->fill_ctx = ctx;
    long long scale_tokens = loss_tokens;
    if (h->outer) { /* a replica's gradient is the mean over its own tokens: it updates alone */
        DT_TRY(dt_local_sgd_before_step(h->outer));
        int k = h->L->dp_shard; /* the replica's ranks */
        scale_tokens = replica_tokens(h, h->data_rank / k * k, k);
    }
    double t_step = dt_now();
    dt_dp_begin_step(h->dpe);
    float grad_scale = scale_tokens > 0 ? 1.0f / (float)scale_tokens : 0.0f;
    double sum = 0.0;
    if (h->pipe) { /* the schedule runs every micro-step of the step */
        dt_pp_io io = {fill_step, micro_step, h, dt_layout_documents(h->L)};
        DT_TRY(dt_pipeline_step(h->pipe, &io, grad_scale, &sum));
    }
    /* a pipeline's schedule runs its m: the micro-batches past micro_steps are empty */
    int m = !h->pipe && micro_steps > 0 && micro_steps < L->m ? micro_steps : L->m;
    for (int k = 0; !h->pipe && k < m; k++) {
        load_micro(h, k);
        dt_watchdog_micro(k);
        dt_dp_begin_micro(h->dpe, k == m - 1);
        gpt_set_documents(&h->model, 0, documents(h), L->micro, L->Tl);
        double l;
        DT_TRY(gpt_forward_backward(&h->model, h->inp, h->tgt, L->micro, L->Tl, grad_scale, &l));
        sum += l;
    }
    dt_test_straggle(h->L->jobs.me * dt_comm_size(h->world) + dt_comm_rank(h->world), dt_now() - t_step); /* a test's slow rank, before the gradients meet */
    *lr = dt_lr_at(&h->hp, step);
    DT_TRY(dt_dp_end_step(h->dpe, *lr, grad_norm, settle));
    if (h->outer) DT_TRY(dt_local_sgd_after_step(h->outer, step + 1));
    DT_TRY(h->model.ops->sync()); /* a device failure during the step surfaces here */
    if (dt_layout_dp_cp_enabled(L)) /* context-parallel ranks hold the other positions */
        DT_TRY(dt_allreduce(h->data_comm, &sum, 1, DT_F64, DT_SUM));
    *loss = loss_tokens > 0 ? sum / (double)loss_tokens : 0.0;
    return DT_OK;
}

dt_status dt_par_eval(dt_par *h, dt_par_fill fill, void *ctx, double *loss_sum, double *tokens) {
    DT_TRY(dt_dp_settle(h->dpe)); /* the weights with every update applied */
    fill(ctx, 0, h->inp, h->tgt, h->seg);
    cp_select(h);
    gpt_set_documents(&h->model, 0, documents(h), h->L->micro, h->L->Tl);
    if (h->pipe) {
        dt_pp_io io = {fill_current, NULL, h, dt_layout_documents(h->L)};
        DT_TRY(dt_pipeline_eval(h->pipe, &io, 1, loss_sum));
    } else {
        DT_TRY(gpt_eval_loss(&h->model, h->inp, h->tgt, h->L->micro, h->L->Tl, loss_sum));
    }
    size_t n = (size_t)h->L->micro * h->L->Tl, in_loss = 0;
    for (size_t i = 0; i < n; i++) in_loss += h->tgt[i] != DT_IGNORE;
    *tokens = (double)in_loss;
    return DT_OK;
}

dt_status dt_par_allreduce_data(dt_par *h, double *v, int n) {
    return dt_allreduce(h->data_comm, v, (size_t)n, DT_F64, DT_SUM);
}

int dt_par_dp_rank(const dt_par *h) { return h->mesh.dp_rank; }

dt_status dt_par_join(dt_par *h, long long step, long long *at) {
    *at = step;
    return h->outer ? dt_local_sgd_join(h->outer, step, at) : DT_OK;
}

dt_status dt_par_save(dt_par *h, const char *dir, const dt_train_state *st, const char *config_json, double shard_mb) {
    DT_TRY(dt_dp_settle(h->dpe)); /* a save the run did not plan (a signal): the update in flight applied */
    if (has_rank_state(h)) { /* every rank's own, before the step commits */
        char layout[256];
        rank_state_layout(h, layout, sizeof layout);
        int rank = dt_comm_rank(h->world);
        if (rank == 0) dt_rank_state_clear(dir, st->step); /* an earlier save's files of this step */
        DT_TRY(dt_comm_agree(h->world, DT_OK, NULL));
        dt_status s = h->outer        ? dt_local_sgd_save(h->outer, dir, st->step, rank, layout)
                      : h->extra.save ? h->extra.save(h->extra.ctx, dir, st->step, rank, layout)
                                      : dt_dp_save_rank_state(h->dpe, dir, rank, layout);
        DT_TRY(dt_comm_agree(h->world, s, NULL));
    }
    dt_status s = dt_ckpt_save_distributed(&h->ckpt, dir, st, config_json, shard_mb);
    return dt_layout_hsdp(h->L) ? dt_comm_agree(h->world, s, NULL) : s; /* the other shard groups wrote nothing */
}

dt_status dt_par_save_wait(dt_par *h) {
    dt_status s = dt_ckpt_save_wait(&h->ckpt);
    return dt_layout_hsdp(h->L) ? dt_comm_agree(h->world, s, NULL) : s; /* only the first shard group wrote */
}

int dt_par_async_save(const dt_par *h) { return h->ckpt.async; }

dt_status dt_par_digest(dt_par *h, char hex[65]) {
    DT_TRY(dt_dp_settle(h->dpe));
    return dt_ckpt_digest_distributed(&h->ckpt, hex);
}

dt_status dt_par_gather_full(dt_par *h) {
    DT_TRY(dt_dp_settle(h->dpe));
    DT_TRY(dt_dp_gather_full(h->dpe));
    h->hooks = h->model.hooks; /* the full weights are in place: no per-unit gathers */
    memset(&h->model.hooks, 0, sizeof h->hooks);
    /* a sample runs one sequence of any length, which bitwise mode's sequence chunks
     * (parallel.cp_chunks) cannot cut: on a group of one they step aside (the sample is a
     * log, not the weights; with cp ranks sampling is refused before any work) */
    h->cp = h->model.cp_comm;
    if (h->cp.gather && h->cp.size == 1) memset(&h->model.cp_comm, 0, sizeof h->model.cp_comm);
    return DT_OK;
}

void dt_par_release_full(dt_par *h) {
    h->model.cp_comm = h->cp;
    h->model.hooks = h->hooks;
    dt_dp_release_full(h->dpe);
}

/* A pipeline passes the sequence through its stages and broadcasts the last stage's
 * logits; tensor-parallel ranks compute vocabulary-parallel logits together. */
dt_status dt_par_next_logits(void *ctx, const dt_token *tokens, int T, float *logits) {
    dt_par *h = ctx;
    return h->pipe ? dt_pipeline_next_logits(h->pipe, tokens, T, logits)
                   : gpt_next_logits(&h->model, tokens, T, logits);
}

const gpt_model *dt_par_model(const dt_par *h) { return &h->model; }

double dt_par_comm_seconds(const dt_par *h) {
    double outer, sent;
    dt_local_sgd_stats(h->outer, &outer, &sent);
    return dt_layout_dp_cp_enabled(h->L) && !h->dcomm ? dt_dp_comm_seconds(h->dpe) + outer : -1.0;
}

int dt_par_offload_io(const dt_par *h, double io[DT_OFFLOAD_IO_N]) {
    if (h->L->offload_optimizer != DT_OFFLOAD_NVME && h->L->offload_param != DT_OFFLOAD_NVME) return 0;
    dt_store_stats st;
    dt_store_totals(&st);
    io[0] = st.read_bytes;
    io[1] = st.write_bytes;
    io[2] = st.wait_s;
    io[3] = dt_dp_update_seconds(h->dpe);
    io[4] = dt_optimizer_grads_early_bytes();
    io[5] = dt_optimizer_grads_backward_bytes();
    return 1;
}

void dt_par_traffic(const dt_par *h, double *grad_bytes, double *param_bytes, double *gemms_skipped) {
    *grad_bytes = dt_dp_grad_bytes(h->dpe);
    *param_bytes = dt_dp_param_bytes(h->dpe);
    *gemms_skipped = (double)h->model.dw_skipped;
}

void dt_par_memory(const dt_par *h, dt_mem_report *r) {
    dt_dp_memory(h->dpe, r);
    r->activations = h->model.act_bytes;
    r->workspace += dt_local_sgd_bytes(h->outer); /* the synchronised weights, the change, DiLoCo's momentum */
    r->workspace += dt_cp_bytes(h->L); /* the ring's K/V buffers or the chunks', as the estimator counts them */
}

dt_status dt_par_gather_report(dt_par *h) {
    if (!h->pipe) return DT_OK;
    double pt[3]; /* every stage's busy, waiting and pipeline time, for rank 0's report */
    dt_pipeline_times(h->pipe, &pt[0], &pt[1], &pt[2]);
    return dt_allgather(h->world, pt, h->pipe_all, 3, DT_F64);
}

/* Per stage (the first data-parallel and tensor-parallel rank of each): compute and
 * waiting time per step, the measured bubble (1 - compute / time in the schedule) next to
 * the schedule's formula, and the activation bytes the stage holds. */
static void print_pipeline(const dt_par *h, long long steps, const double *mem_all, FILE *out) {
    const dt_mesh *g = &h->mesh;
    const dt_layout *L = h->L;
    double busy = 0, span = 0;
    fprintf(out, "pipeline: %s, %d stages, %d micro-batches per step; per stage (ms/step compute, waiting; "
            "activations):", dt_schedule_name(L->schedule), g->pp, L->m);
    for (int r = 0; r < g->pp; r++) {
        int at = dt_mesh_rank_of(0, r, 0, 0, g->pp, g->cp, g->tp);
        const double *x = h->pipe_all + 3 * at;
        fprintf(out, " %s%.1f, %.1f; %.1f MB", r ? "| " : "", 1e3 * x[0] / steps, 1e3 * x[1] / steps,
                mem_all[7 * at + 3] / 1e6);
        busy += x[0];
        span += x[2];
    }
    int zb = dt_schedule_splits_backward(L->schedule), v = L->cfg.parallel.virtual_stages;
    fprintf(out, "\npipeline bubble: measured %.3f, formula %s = %.3f\n", 1.0 - busy / span,
            zb ? "(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W)) with F:B:W = 1:1:1"
               : v > 1 ? "(p-1)/(v·m+p-1)" : "(p-1)/(m+p-1)",
            dt_schedule_bubble_formula(L->schedule, g->pp, v, L->m, 1.0, zb ? 1.0 : 2.0, 1.0));
}

void dt_par_print_report(const dt_par *h, long long steps, const double *mem_all, FILE *out) {
    if (steps <= 0) return;
    if (dt_layout_tp_enabled(h->L))
        fprintf(out, "tensor-parallel communication: %.1f ms/step (%s inside forward and backward, validation "
                "included, rank 0)\n", 1e3 * dt_tp_comm_seconds(&h->model) / (double)steps,
                h->model.sp ? "all-gathers, reduce-scatters and all-reduces" : "all-reduces");
    if (h->pipe) print_pipeline(h, steps, mem_all, out);
    if (h->dcomm) /* the host only queues them: their waits are the GPU's */
        fprintf(out, "communication: data-parallel collectives on the device communicator's stream (%s); exposed "
                "time not measured\n", dt_dcomm_name(h->dcomm));
    else if (dt_layout_dp_cp_enabled(h->L))
        fprintf(out, "communication: %.1f ms/step exposed (waiting on gradient/parameter collectives, rank 0)\n",
                1e3 * dt_dp_comm_seconds(h->dpe) / (double)steps);
}

/* ---- the asynchronous parameter server's parts (dp_mode ps-async; src/train/async_ps.h) ---- */

dt_status dt_par_task_gradients(dt_par *h, dt_par_fill fill, void *ctx, int share, double *loss_sum,
                                long long *tokens) {
    const dt_layout *L = h->L;
    h->fill = fill;
    h->fill_ctx = ctx;
    double t0 = dt_now();
    long long n = replica_tokens(h, share, 1);
    *tokens = n;
    dt_dp_begin_step(h->dpe);
    float grad_scale = n > 0 ? 1.0f / (float)n : 0.0f;
    double sum = 0.0;
    for (int k = 0; k < L->m; k++) {
        h->fill(h->fill_ctx, (k * L->dp + share) * L->micro, h->inp, h->tgt, h->seg);
        dt_dp_begin_micro(h->dpe, k == L->m - 1);
        gpt_set_documents(&h->model, 0, documents(h), L->micro, L->Tl);
        double l;
        DT_TRY(gpt_forward_backward(&h->model, h->inp, h->tgt, L->micro, L->Tl, grad_scale, &l));
        sum += l;
    }
    *loss_sum = sum;
    DT_TRY(h->model.ops->sync());
    dt_test_straggle(h->L->jobs.me * dt_comm_size(h->world) + dt_comm_rank(h->world), dt_now() - t0);
    return DT_OK;
}

dt_status dt_par_apply(dt_par *h, double lr, double *grad_norm) {
    DT_TRY(dt_dp_end_step(h->dpe, lr, grad_norm, 1));
    return h->model.ops->sync();
}

void dt_par_set_updates(dt_par *h, long long updates) { dt_dp_set_updates(h->dpe, updates); }
float *dt_par_grad_buffer(dt_par *h) { return h->model.grads; }
size_t dt_par_nparams(const dt_par *h) { return h->model.nparams; }
double dt_par_lr_at(const dt_par *h, long long step) { return dt_lr_at(&h->hp, step); }
dt_status dt_par_get_weights(dt_par *h, float *dst) { return dt_dp_get_weights(h->dpe, dst); }
dt_status dt_par_set_weights(dt_par *h, const float *src) { return dt_dp_set_weights(h->dpe, src); }
