/* The table of data-parallel modes and wrappers: adding one is a file with its table of
 * operations plus an entry here (docs/adding-a-strategy.md). */
#include <stddef.h>
#include <string.h>

#include "strategy.h"

/* Offload is where the optimizer object keeps its state (docs/offload.md), so it combines
 * with every mode that has one optimizer per rank; what it cannot mean is refused here. */
static dt_status check_offload(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    if (c->offload.delayed_update && L->offload_optimizer == DT_OFFLOAD_NONE)
        return dt_fail(DT_EINPUT, "offload.delayed_update needs offload.optimizer cpu or nvme (the update it delays "
                       "runs on the host)");
    if (c->offload.delayed_update && L->offload_param != DT_OFFLOAD_NONE)
        return dt_fail(DT_EINPUT, "offload.delayed_update with offload.param %s: not supported (the update writes the "
                       "offloaded parameter shard in its pass); use offload.param none", c->offload.param);
    if (!dt_layout_offload(L)) return DT_OK;
    if (dt_layout_ps(L)) /* one rank holds and updates everything: nothing per rank to offload */
        return dt_fail(DT_EINPUT, "offload.optimizer %s, offload.param %s: not with parallel.dp_mode ps (the central "
                       "rank keeps the whole state on one rank); use dp_mode ddp with parallel.zero",
                       c->offload.optimizer, c->offload.param);
    /* as DeepSpeed's offload_param: only ZeRO-3 keeps a parameter shard between uses */
    if (L->offload_param != DT_OFFLOAD_NONE && L->zero != 3)
        return dt_fail(DT_EINPUT, "offload.param %s needs parallel.zero=3 (it offloads ZeRO-3's parameter shard; "
                       "parallel.zero is %d)", c->offload.param, L->zero);
    if ((L->offload_optimizer == DT_OFFLOAD_NVME || L->offload_param == DT_OFFLOAD_NVME) && !c->offload.nvme_path[0])
        return dt_fail(DT_EINPUT, "offload.nvme_path is empty: set the directory for the offload files (offload.%s "
                       "is nvme)", L->offload_optimizer == DT_OFFLOAD_NVME ? "optimizer" : "param");
    return DT_OK;
}

/* The asynchronous parameter server (src/train/async_ps.h): rank 0 serves, the others
 * compute, each with the whole model in fp32 on the CPU. */
static dt_status check_ps_async(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    if (L->world > 0 && L->dp < 2)
        return dt_fail(DT_EINPUT, "parallel.dp_mode ps-async needs 2 or more data-parallel ranks (a server and workers)");
    if (L->tp > 1 || L->pp > 1 || L->cp > 1)
        return dt_fail(DT_EINPUT, "parallel.dp_mode ps-async: pure data parallelism only so far (tp %d, pp %d, cp %d)",
                       L->tp, L->pp, L->cp);
    if (dt_layout_zero_enabled(L) || dt_layout_local_sgd(L) || dt_layout_offload(L))
        return dt_fail(DT_EINPUT, "parallel.dp_mode ps-async: not with ZeRO, parallel.sync or offload");
    if (L->backend != DT_BACKEND_CPU || dt_layout_bf16(L))
        return dt_fail(DT_EINPUT, "parallel.dp_mode ps-async runs on the CPU backend in fp32 so far");
    if (!strcmp(c->data.layout, "budget"))
        return dt_fail(DT_EINPUT, "parallel.dp_mode ps-async: data.layout budget is not carried");
    return DT_OK;
}

/* HSDP (parallel.dp_shard): ZeRO within shard groups, the groups' reduced shards summed
 * across them (zero_shard.c); what it runs with so far. */
static dt_status check_hsdp(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    int k = c->parallel.dp_shard;
    if (k == 0) return DT_OK;
    if (L->world > 0 && (k > L->dp || L->dp % k != 0))
        return dt_fail(DT_EINPUT, "parallel.dp_shard %d must divide the data-parallel size %d", k, L->dp);
    if (dt_layout_local_sgd(L)) { /* replicas of k ranks, DDP inside (local_sgd.h) */
        if (k > 1 && L->cp > 1)
            return dt_fail(DT_EINPUT, "parallel.dp_shard %d with parallel.sync %s: not yet with context parallelism",
                           k, c->parallel.sync);
        return DT_OK;
    }
    if (!dt_layout_hsdp(L)) return DT_OK; /* one group of all: plain ZeRO */
    if (!dt_layout_zero_enabled(L))
        return dt_fail(DT_EINPUT, "parallel.dp_shard %d: hybrid sharding shards ZeRO's state (set parallel.zero 1, 2 "
                       "or 3)", k);
    if (dt_layout_ps(L) || dt_layout_ps_async(L) || dt_layout_local_sgd(L) || c->parallel.staleness > 0)
        return dt_fail(DT_EINPUT, "parallel.dp_shard %d: not with dp_mode %s, parallel.sync or parallel.staleness", k,
                       c->parallel.dp_mode);
    if (dt_layout_offload(L) || L->cp > 1 || dt_layout_nccl(L) || L->backend != DT_BACKEND_CPU)
        return dt_fail(DT_EINPUT, "parallel.dp_shard %d: not yet with offload, context parallelism, device "
                       "collectives or a device backend", k);
    return DT_OK;
}

/* parallel.policy with ddp units among ZeRO's (zero_shard.c's replicated units), or zero2
 * units among zero3's (kept whole): what it runs with so far. */
static dt_status check_policy(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    if (!L->replicated) return DT_OK;
    if (L->pp > 1 || L->cp > 1 || L->backend != DT_BACKEND_CPU || dt_layout_bf16(L) ||
        dt_layout_offload(L) || dt_layout_nccl(L) || dt_layout_ps(L) || dt_layout_ps_async(L) ||
        dt_layout_local_sgd(L) || c->parallel.staleness > 0)
        return dt_fail(DT_EINPUT, "parallel.policy '%s' (units apart from zero%d's): data parallelism (HSDP "
                       "included) and tp on the CPU in fp32 so far: not with pp, cp, bf16, offload, comm.backend nccl, "
                       "dp_mode ps, parallel.sync or parallel.staleness", c->parallel.policy, L->zero);
    return DT_OK;
}

/* The deterministic delayed mode queues whole reduced gradients (staleness.h). */
static dt_status check_staleness(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    int s = c->parallel.staleness;
    if (dt_layout_ps_async(L)) return check_ps_async(L);
    if (dt_layout_async_inverse_lr(L))
        return dt_fail(DT_EINPUT, "parallel.staleness_lr inverse: dp_mode ps-async with a staleness only");
    if (s == 0) return DT_OK;
    if (dt_layout_zero_enabled(L))
        return dt_fail(DT_EINPUT, "parallel.staleness %d: runs dp_mode ddp or ps (ZeRO's gradients are sharded)", s);
    if (dt_layout_local_sgd(L))
        return dt_fail(DT_EINPUT, "parallel.staleness %d: not with parallel.sync %s", s, c->parallel.sync);
    if (dt_layout_offload(L))
        return dt_fail(DT_EINPUT, "parallel.staleness %d: not with offload (the update reads the gradients handed "
                       "over during backward)", s);
    if (s >= c->train.steps)
        return dt_fail(DT_EINPUT, "parallel.staleness %d: no gradient would be applied in train.steps %d", s,
                       c->train.steps);
    return DT_OK;
}

dt_status dt_dp_check_config(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    /* bf16 and a device's state reduce through fp32 host copies (staging.h) in DDP, the
     * central rank, ZeRO and bitwise mode's folds; bitwise mode needs the CPU's fixed-tile
     * kernels (the emulated device runs them; cp refuses bf16 and devices itself) */
    if (dt_layout_bitwise(L) && L->backend == DT_BACKEND_CUDA)
        return dt_fail(DT_EINPUT, "parallel.determinism=bitwise runs on the CPU and emulated backends (their "
                       "thread-invariant kernels), not backend %s", c->backend);
    DT_TRY(check_offload(L));
    DT_TRY(check_staleness(L));
    DT_TRY(check_hsdp(L));
    DT_TRY(check_policy(L));
    if (!dt_layout_nccl(L)) return DT_OK;
    /* device collectives carry the data-parallel group of DDP and ZeRO so far */
    if (L->backend == DT_BACKEND_CPU)
        return dt_fail(DT_EINPUT, "comm.backend nccl needs a device backend (cuda, or emulated to test it)");
    if (c->parallel.tp > 1 || c->parallel.pp > 1 || c->parallel.cp > 1)
        return dt_fail(DT_EINPUT, "comm.backend nccl carries data parallelism only so far (tp %d, pp %d, cp %d): "
                       "use comm.backend mpi", c->parallel.tp, c->parallel.pp, c->parallel.cp);
    if (dt_layout_ps(L) || dt_layout_bitwise(L))
        return dt_fail(DT_EINPUT, "comm.backend nccl runs DDP and ZeRO (not dp_mode ps or bitwise mode)");
    return DT_OK;
}

/* In the order `dtrain estimate` prints them: the ZeRO stages' rows, then the central rank. */
const dt_dp_strategy *const dt_dp_modes[] = {&dt_dp_ddp, &dt_dp_zero1, &dt_dp_zero2, &dt_dp_zero3, &dt_dp_ps, NULL};

/* The mode's name from the options: dp_mode ps, else the ZeRO stage (0: DDP). */
static const char *mode_name(const dt_dp_opts *o) {
    static const char *const zero[] = {"ddp", "zero1", "zero2", "zero3"};
    if (o->ps) return "ps";
    return o->zero >= 0 && o->zero <= 3 ? zero[o->zero] : "";
}

/* Wrappers, applied in this order to the mode's table when their option is set. */
static const struct {
    size_t opt; /* offset of the int option in dt_dp_opts that turns it on */
    void (*wrap)(dt_dp_strategy *s);
} wrappers[] = {
    {offsetof(dt_dp_opts, bitwise), dt_bitwise_wrap},
};

dt_status dt_dp_strategy_for(const dt_dp_opts *o, const dt_dp_strategy **mode, dt_dp_strategy *run) {
    const char *name = mode_name(o);
    *mode = NULL;
    for (int i = 0; dt_dp_modes[i]; i++)
        if (!strcmp(dt_dp_modes[i]->name, name)) *mode = dt_dp_modes[i];
    if (!*mode) return dt_fail(DT_EINPUT, "parallel.zero: no data-parallel mode for stage %d", o->zero);
    *run = **mode;
    for (size_t i = 0; i < sizeof wrappers / sizeof wrappers[0]; i++)
        if (*(const int *)((const char *)o + wrappers[i].opt)) wrappers[i].wrap(run);
    return DT_OK;
}

void dt_dp_opts_of_layout(dt_dp_opts *o, const dt_layout *L) {
    o->ps = dt_layout_ps(L);
    o->zero = L->zero;
    o->policy = L->replicated ? L->cfg.parallel.policy : NULL;
    o->policy_zero = L->cfg.parallel.zero;
    o->bitwise = dt_layout_bitwise(L) && !dt_layout_ps_async(L); /* ps-async: one rank's engine, a fixed order */
    o->staleness = dt_layout_ps_async(L) ? 0 : L->cfg.parallel.staleness; /* ps-async: a bound, not a queue */
}

dt_status dt_dp_strategy_of_layout(const dt_layout *L, const dt_dp_strategy **mode, dt_dp_strategy *run) {
    dt_dp_opts o = {0};
    dt_dp_opts_of_layout(&o, L);
    return dt_dp_strategy_for(&o, mode, run);
}

const dt_dp_strategy *dt_dp_candidate(dt_config *c, int zero) {
    strcpy(c->parallel.dp_mode, "ddp");
    c->parallel.zero = zero;
    dt_dp_opts o = {.zero = zero};
    const dt_dp_strategy *mode;
    dt_dp_strategy run;
    if (dt_dp_strategy_for(&o, &mode, &run) == DT_OK) return mode;
    dt_error_clear();
    return NULL;
}
