#include "layout.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../data_parallel/local_sgd.h"
#include "../data_parallel/strategy.h"
#include "policy.h"
#include "../model_parallel/context_parallel.h"
#include "../model_parallel/pipeline.h"
#include "../model_parallel/tensor_parallel.h"

/* The config table admits only the listed choices, so the first name is the fallback
 * for nothing but an unset (zeroed) config. */
static int pick(const char *value, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i])) return i;
    return 0;
}
#define PICK(v, ...) pick(v, (const char *const[]){__VA_ARGS__}, sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *))

/* This job's place among replicas run as separate jobs (the launcher's variables); 1: none. */
static dt_status replica_job(int *job, int *jobs, const char **addr) {
    const char *j = getenv("DTRAIN_REPLICA"), *n = getenv("DTRAIN_REPLICAS");
    *job = 0;
    *jobs = 1;
    *addr = getenv("DTRAIN_OUTER_ADDR");
    if (!n || !n[0]) return DT_OK;
    char *e1, *e2;
    long a = strtol(j ? j : "", &e1, 10), b = strtol(n, &e2, 10);
    if (!j || !j[0] || *e1 || *e2 || b < 1 || b > 4096 || a < 0 || a >= b || !*addr || !(*addr)[0] ||
        strlen(*addr) >= sizeof ((dt_replica_jobs *)0)->addr)
        return dt_fail(DT_EINPUT, "DTRAIN_REPLICA '%s' of DTRAIN_REPLICAS '%s' at DTRAIN_OUTER_ADDR '%s': not a "
                       "replica of a `dtrain launch --replicas` run", j ? j : "", n, *addr ? *addr : "");
    *job = (int)a;
    *jobs = (int)b;
    return DT_OK;
}

dt_status dt_layout_build(dt_layout *L, const dt_config *c, int world) {
    dt_config r = *c;
    int job, jobs;
    const char *addr;
    DT_TRY(replica_job(&job, &jobs, &addr));
    if (world > 0) world *= jobs; /* the run's world: every replica's job alike */
    if (world > 0) DT_TRY(dt_config_resolve_micro_batch(&r, world));
    if (jobs > 1 && job > 0) { /* replica 0 writes the run's checkpoints; the others, metrics of their own */
        r.checkpoint.dir[0] = r.checkpoint.resume[0] = 0;
        r.checkpoint.every = 0;
        if (r.log.metrics[0]) {
            size_t len = strlen(r.log.metrics);
            if (len + 16 >= sizeof r.log.metrics)
                return dt_fail(DT_EINPUT, "log.metrics '%s': too long a path", r.log.metrics);
            snprintf(r.log.metrics + len, sizeof r.log.metrics - len, ".replica%d", job);
        }
    }
    dt_layout_derive(L, &r, world);
    if (jobs > 1) {
        L->jobs.n = jobs;
        L->jobs.me = job;
        snprintf(L->jobs.addr, sizeof L->jobs.addr, "%s", addr);
        if (L->dp % jobs == 0) { /* else dt_layout_check says it */
            L->dp_shard = L->dp / jobs;
            L->dp_replicas = jobs;
        }
    }
    return DT_OK;
}

void dt_layout_derive(dt_layout *L, const dt_config *c, int world) {
    memset(L, 0, sizeof *L);
    L->cfg = *c;
    L->jobs.n = 1;
    const dt_config *k = &L->cfg;
    L->world = world;
    L->tp = k->parallel.tp > 0 ? k->parallel.tp : 1;
    L->pp = k->parallel.pp > 0 ? k->parallel.pp : 1;
    L->cp = k->parallel.cp > 0 ? k->parallel.cp : 1;
    L->sp = k->parallel.sp;
    L->v = k->parallel.virtual_stages > 1 ? k->parallel.virtual_stages : 1;
    L->zero = k->parallel.zero;
    int dp = dt_config_dp_size(world, L->tp, L->pp, L->cp);
    L->dp = dp > 0 ? dp : 1;
    L->micro = k->train.micro_batch;
    int per_step = L->micro * L->dp;
    L->global_batch = k->train.global_batch > 0 ? k->train.global_batch : per_step;
    L->m = per_step > 0 && L->global_batch / per_step > 0 ? L->global_batch / per_step : 1;
    L->T = k->train.seq_len > 0 ? k->train.seq_len : k->model.seq_len;
    L->Tl = L->T / L->cp;
    L->shape = gpt_shape_of_config(k);
    if (gpt_shape_check(&L->shape) != DT_OK) { /* dt_layout_check says it */
        dt_error_clear();
        L->shape.padded_vocab = 0; /* dt_layout_shape_ok: no */
    }
    gpt_layout units = dt_layout_shape_ok(L) ? dt_unit_layout(k->parallel.unit_split, k->parallel.unit_blocks, &L->shape)
                                             : (gpt_layout){0};
    if (dt_layout_shape_ok(L) && k->parallel.policy[0] &&
        dt_policy_stage(k->parallel.policy, k->parallel.zero, &L->shape, &units, &L->zero, &L->replicated) != DT_OK) {
        dt_error_clear(); /* dt_layout_check says it */
        L->zero = k->parallel.zero;
        L->replicated = 0;
    }
    L->backend = (dt_backend_kind)PICK(k->backend, "cpu", "cuda", "emulated");
    L->precision = (dt_precision)PICK(k->precision, "fp32", "bf16");
    L->dp_mode = (dt_dp_mode)PICK(k->parallel.dp_mode, "ddp", "ps", "ps-async");
    if (L->dp_mode == DT_DPMODE_PS_ASYNC && k->parallel.staleness == 0) L->dp_mode = DT_DPMODE_PS; /* synchronous */
    L->determinism = (dt_determinism)PICK(k->parallel.determinism, "fast", "bitwise");
    L->recompute = (dt_recompute)PICK(k->train.recompute, "none", "full");
    L->comm_backend = (dt_comm_backend)PICK(k->comm.backend, "mpi", "nccl");
    L->tokenizer = (dt_tokenizer_kind)PICK(k->data.tokenizer, "byte", "gpt2", "hf");
    L->offload_optimizer = (dt_offload_kind)PICK(k->offload.optimizer, "none", "cpu", "nvme");
    L->offload_param = (dt_offload_kind)PICK(k->offload.param, "none", "cpu", "nvme");
    L->sync = (dt_sync_mode)PICK(k->parallel.sync, "every_step", "local_sgd", "diloco");
    /* synchronising after every step is synchronous training: H = 1 runs every_step
     * (DDP's gradient average; averaging weights after each replica's own AdamW step
     * would be another algorithm at the same cost) */
    if (L->sync == DT_SYNC_LOCAL_SGD && k->parallel.sync_every <= 1) L->sync = DT_SYNC_EVERY_STEP;
    /* dp_shard: the ranks that meet every step (a ZeRO shard group under HSDP, one
     * replica's DDP group under local SGD, where each rank is a replica by default) */
    int shard_default = L->sync != DT_SYNC_EVERY_STEP ? 1 : L->dp;
    L->dp_shard = k->parallel.dp_shard > 0 && k->parallel.dp_shard <= L->dp && L->dp % k->parallel.dp_shard == 0
                      ? k->parallel.dp_shard : shard_default; /* a bad one: dt_layout_check says it */
    L->dp_replicas = L->dp / L->dp_shard;
    /* offloaded parameters are updated on the host, where they are: the optimizer's state
     * is kept there too (docs/offload.md) */
    if (L->offload_param != DT_OFFLOAD_NONE && L->offload_optimizer == DT_OFFLOAD_NONE)
        L->offload_optimizer = DT_OFFLOAD_CPU;
    if (dt_schedule_parse(k->parallel.schedule, &L->schedule) != DT_OK) {
        dt_error_clear();
        L->schedule = DT_SCHED_1F1B;
    }
}

void dt_layout_state_key(const dt_layout *L, size_t nparams, char *out, size_t cap) {
    const dt_config *k = &L->cfg;
    snprintf(out, cap, "tp %d pp %d cp %d %s %s sync %s every %d shard %d staleness %d params %zu | world %d dp %d",
             L->tp, L->pp, L->cp, k->parallel.dp_mode, k->precision, k->parallel.sync, k->parallel.sync_every,
             k->parallel.dp_shard, k->parallel.staleness, nparams, L->world, L->dp);
}

/* Pipeline parallelism: the stages (and chunks) each get a block, the schedule suits
 * (p, v, m), parallel.pp_split lists the pieces; without a pipeline, no pipeline keys. */
static dt_status check_pipeline(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    int pp = c->parallel.pp, v = c->parallel.virtual_stages;
    if (pp <= 1) {
        if (v > 1) return dt_fail(DT_EINPUT, "parallel.virtual_stages %d needs parallel.pp > 1", v);
        if (c->parallel.pp_split[0])
            return dt_fail(DT_EINPUT, "parallel.pp_split '%s' needs parallel.pp > 1", c->parallel.pp_split);
        return DT_OK;
    }
    if (c->model.n_layer < pp * v)
        return dt_fail(DT_EINPUT, "parallel.pp %d x virtual_stages %d: the model's %d blocks cannot give every stage "
                       "one", pp, v, c->model.n_layer);
    DT_TRY(dt_schedule_check(L->schedule, pp, v, L->m));
    gpt_layout lay = {0};
    return dt_pp_layout(c->model.n_layer, pp, v, 0, c->parallel.pp_split, &lay);
}

/* What `dtrain estimate` needs of a layout on paper (its own words: it names the padded
 * vocabulary and the pieces a shape allows, not what this build runs). */
static dt_status check_estimate(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    gpt_shape s = L->shape;
    DT_TRY(gpt_shape_check(&s));
    int tp = L->tp;
    if (!gpt_tp_splits_heads(&s, tp) || s.padded_vocab % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_head %d%s and the padded vocabulary %d%s", tp,
                       s.n_head, s.family == GPT_FAMILY_LLAMA ? ", model.intermediate_size" : "", s.padded_vocab,
                       s.family == GPT_FAMILY_LLAMA ? ", and model.n_kv_head or be a multiple of it" : "");
    if (L->sp && tp <= 1) return dt_fail(DT_EINPUT, "parallel.sp needs parallel.tp > 1");
    if (L->pp > 1) DT_TRY(check_pipeline(L));
    if (L->pp > 1 && dt_layout_recompute(L) && dt_schedule_splits_backward(L->schedule))
        return dt_fail(DT_EINPUT, "train.recompute full: not with a split backward (parallel.schedule %s)",
                       c->parallel.schedule); /* as gpt_create_layout refuses it */
    if (L->cp > 1) DT_TRY(dt_cp_check(L->T, L->cp));
    if (L->sp && ((long long)L->micro * L->Tl) % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.sp: the micro-batch's %d x %d tokens do not split into parallel.tp %d "
                       "sequence pieces", L->micro, L->Tl, tp);
    /* byte counts are size_t: a shape whose activations (about 40 values per token, width
     * and layer) pass 2^62 bytes would wrap; no machine holds it anyway */
    if ((double)L->micro * L->Tl * s.n_embd * s.n_layer * 64.0 + (double)L->micro * L->Tl * s.padded_vocab * 16.0 >
        4.6e18)
        return dt_fail(DT_EINPUT, "estimate: the activations of a micro-batch of %d x %d tokens (%d wide, %d layers, "
                       "vocabulary %d) exceed 4 EB per rank", L->micro, L->Tl, s.n_embd, s.n_layer, s.padded_vocab);
    return DT_OK;
}

/* parallel.unit_split's and parallel.policy's rules over the whole model (layout/policy.h):
 * refused as the run would. */
static dt_status check_policy_rules(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    if (!c->parallel.policy[0] && !c->parallel.unit_split[0]) return DT_OK;
    gpt_shape ps = L->shape;
    int stage, repl;
    DT_TRY(gpt_shape_check(&ps));
    gpt_layout units = {.unit_blocks = c->parallel.unit_blocks};
    DT_TRY(dt_unit_split(c->parallel.unit_split, &ps, &units.split_blocks));
    if (units.split_blocks && (c->parallel.unit_blocks > 1 || L->pp > 1 || dt_layout_recompute(L) ||
                               L->offload_param != DT_OFFLOAD_NONE))
        return dt_fail(DT_EINPUT, "parallel.unit_split: a block in two units runs with parallel.unit_blocks 1, pp 1, "
                       "no train.recompute and no offload.param so far (unit_blocks %d, pp %d)",
                       c->parallel.unit_blocks, L->pp);
    if (!c->parallel.policy[0]) return DT_OK;
    if (c->parallel.unit_blocks > 1 && ps.n_layer % c->parallel.unit_blocks != 0) return DT_OK; /* refused below */
    return dt_policy_stage(c->parallel.policy, c->parallel.zero, &ps, &units, &stage, &repl);
}

dt_status dt_layout_check(const dt_layout *L, int what) {
    const dt_config *c = &L->cfg;
    if (what & DT_CHECK_CONFIG) {
        DT_TRY(dt_config_validate(c));
        if (c->train.freeze[0]) {
            gpt_shape fs = L->shape;
            DT_TRY(gpt_shape_check(&fs));
            DT_TRY(gpt_freeze_check(&fs, c->train.freeze));
        }
        DT_TRY(check_policy_rules(L));
    }
    /* the order is the trainer's of old: the same config gives the same first refusal */
    int ub = c->parallel.unit_blocks;
    if ((what & DT_CHECK_FEATURES) && ub > 1 && (L->pp > 1 || L->shape.n_layer % ub != 0))
        return dt_fail(DT_EINPUT, "parallel.unit_blocks %d must divide the model's %d blocks (and pp 1 so far; pp is "
                       "%d)", ub, L->shape.n_layer, L->pp);
    if (what & DT_CHECK_FEATURES) DT_TRY(dt_dp_check_config(L));
    if (what & DT_CHECK_FEATURES) DT_TRY(dt_local_sgd_check(L));
    long long mp = dt_layout_model_ranks(L);
    if ((what & DT_CHECK_WORLD) && L->world > 0 && L->world % mp != 0)
        return dt_fail(DT_EINPUT, "parallel: world size %d is not divisible by tp x pp x cp = %lld", L->world, mp);
    if (what & DT_CHECK_FEATURES) {
        DT_TRY(dt_cp_check_config(L));
        DT_TRY(dt_tp_check(L));
    }
    if ((what & DT_CHECK_WORLD) && L->world > 0 && L->global_batch % (L->micro * L->dp) != 0)
        return dt_fail(DT_EINPUT,
                       "config: train.micro_batch x data-parallel size = %d x %d does not divide train.global_batch %d",
                       L->micro, L->dp, L->global_batch);
    if (what & DT_CHECK_FEATURES) DT_TRY(check_pipeline(L));
    if (what & DT_CHECK_ESTIMATE) DT_TRY(check_estimate(L));
    if (what & DT_CHECK_ESTIMATE) DT_TRY(check_policy_rules(L));
    return DT_OK;
}

void dt_layout_print_batch(const dt_layout *L, const char *device, FILE *out) {
    fprintf(out, "dtrain: global batch %d x %d tokens (micro-batch %d x %d data-parallel x %d accumulation), %d "
            "steps, %s, %s%s, %s\n", L->global_batch, L->T, L->micro, L->dp, L->m, L->cfg.train.steps,
            L->cfg.precision, dt_layout_ps(L) ? "ps" : dt_layout_ps_async(L) ? "ps-async" : "ddp", L->zero ? " + ZeRO" : "", device);
}

void dt_layout_print(const dt_layout *L, FILE *out) {
    const dt_config *c = &L->cfg;
    if (L->zero) fprintf(out, "dtrain: ZeRO stage %d\n", L->zero);
    if (dt_layout_recompute(L))
        fprintf(out, "dtrain: activation checkpointing: every block recomputed in its backward\n");
    if (L->tp > 1)
        fprintf(out, "dtrain: tensor parallel %d (heads and MLP columns split%s; %d-way data parallel over the rest)\n",
                L->tp, L->sp ? ", sequence parallel: LayerNorm and residual rows split" : "", L->dp);
    if (L->cp > 1) { /* the causal work of each rank's two chunks */
        int64_t lo = INT64_MAX, hi = 0;
        for (int r = 0; r < L->cp; r++) {
            int64_t w = dt_cp_attention_pairs(L->T, L->cp, r);
            lo = w < lo ? w : lo;
            hi = w > hi ? w : hi;
        }
        fprintf(out, "dtrain: context parallel %d (ring attention; each rank holds 2 of %d sequence chunks, %d "
                "positions; attention pairs per rank %lld, imbalance %.1f%%)\n", L->cp, 2 * L->cp, L->Tl,
                (long long)hi, 100.0 * (double)(hi - lo) / (double)hi);
    }
    if (L->pp > 1) {
        int v = c->parallel.virtual_stages;
        fprintf(out, "dtrain: pipeline parallel %d (%s, %d micro-batches per step), blocks per stage:", L->pp,
                dt_schedule_name(L->schedule), L->m);
        for (int r = 0; r < L->pp; r++) {
            gpt_layout lay = {0};
            if (dt_pp_layout(c->model.n_layer, L->pp, v, r, c->parallel.pp_split, &lay) != DT_OK) continue;
            if (v <= 1) fprintf(out, " [%d, %d)", lay.first_layer, lay.first_layer + lay.n_layers);
            for (int k = 0; v > 1 && k < v; k++)
                fprintf(out, "%s[%d, %d)%s", k ? " " : " {", lay.chunk_first[k],
                        lay.chunk_first[k] + lay.chunk_layers[k], k == v - 1 ? "}" : "");
        }
        fprintf(out, "\n");
    }
}

int dt_layout_split_blocks(const dt_layout *L) {
    if (!L->cfg.parallel.unit_split[0] || !dt_layout_shape_ok(L)) return 0;
    return dt_unit_layout(L->cfg.parallel.unit_split, 1, &L->shape).split_blocks;
}
