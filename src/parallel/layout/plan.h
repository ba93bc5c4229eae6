/* The layout planner (`dtrain plan`): every dp × pp × cp × tp layout of a world (with each
 * ZeRO stage) that fits in memory, ranked by predicted step time, from the seeds'
 * formulas: compute from the model's FLOPs at a measured rate per rank, stretched by the
 * pipeline bubble; communication per group from the α-β model of its link class (inside a
 * node or across nodes; the mesh puts tp innermost, then cp, pp, dp), with each
 * collective's ring volume (all-reduce 2(N−1)/N·M, all-gather and reduce-scatter
 * (N−1)/N·M, point-to-point M); memory from the estimator. Pure: no MPI, no model run. */
#ifndef DT_PLAN_H
#define DT_PLAN_H
#include <stdio.h>

#include "../../core/config.h"
#include "../../core/status.h"
#include "../../model/gpt.h"

typedef struct {
    double alpha; /* seconds per message */
    double beta;  /* bytes per second */
} dt_link;

/* A measured compute rate for one rank's shard shape (tensor-parallel pieces tp, its T/cp
 * positions): small GEMMs run slower than big ones. */
typedef struct {
    int tp, cp;
    double flops;
} dt_plan_rate;

#define DT_PLAN_MAX_RATES 64
typedef struct {
    int world, ranks_per_node;
    int cores;          /* cores of a node that its ranks' compute shares (0: a core, or GPU, per rank) */
    double memory;      /* bytes per rank available */
    double flops;       /* sustained training FLOP/s of one rank (where rates has no entry) */
    double optim_s;     /* seconds the optimizer update (norm, clip, AdamW) takes per parameter */
    dt_link intra, inter;
    int any_feature;    /* also layouts whose features this build refuses (tp or cp with bf16, ...): a plan on paper */
    int nrates;
    dt_plan_rate rates[DT_PLAN_MAX_RATES];
} dt_machine;

/* Communication of one step, per group: bytes one rank sends, and seconds. */
enum { DT_PLAN_TP, DT_PLAN_CP, DT_PLAN_PP, DT_PLAN_DP, DT_PLAN_NGROUPS };

typedef struct {
    int dp, pp, cp, tp, zero, m; /* m: micro-batches per step per data-parallel rank */
    int shard;                   /* HSDP: ZeRO within groups of this many dp ranks, replicas across (0: one group) */
    int policy;                  /* dt_plan_policies' index (0: the config's parallel.policy) */
    double cross_bytes;          /* what a node sends across its link per step (every group of it that crosses) */
    double memory;               /* bytes per rank (the estimator's) */
    double compute_s;            /* this rank's FLOPs over its rate, without bubble or core sharing */
    double optim_s;              /* this rank's optimizer update */
    double share;                /* ranks per core of a node (>= 1): how much slower each computes */
    double bubble;               /* the schedule's idle fraction: (p−1)/(m+p−1) */
    double comm_bytes[DT_PLAN_NGROUPS], comm_s[DT_PLAN_NGROUPS];
    double step_s, tokens_per_s;
    int intra[DT_PLAN_NGROUPS]; /* the group lies inside a node */
} dt_plan_entry;

/* Whether the group of kind g (DT_PLAN_*) of a dp·pp·cp·tp layout lies within a node of
 * ranks_per_node ranks (ranks are consecutive per node). */
int dt_plan_group_intra(int g, int dp, int pp, int cp, int tp, int ranks_per_node);
/* How many groups of kind g have members on one node (ranks 0..R-1): a group spanning
 * nodes shares the node's link with that many of its kind. */
int dt_plan_link_share(int g, int dp, int pp, int cp, int tp, int ranks_per_node);
/* Whether a rank's shard shape exists for tp and cp: tp divides the heads and the padded
 * vocabulary, the sequence splits into 2·cp chunks (s: the model's checked shape). The
 * rule dt_plan_layout applies, and the shapes `dtrain plan` calibrates. */
int dt_plan_shard_ok(const dt_config *c, const gpt_shape *s, int tp, int cp);
/* The prediction for one layout of config c (its parallel.* and model), or DT_EINPUT
 * with one line when the layout cannot run (a divisibility rule). */
dt_status dt_plan_layout(const dt_config *c, const dt_machine *mc, int dp, int pp, int cp, int tp, int zero,
                         dt_plan_entry *out);
/* ... with hybrid sharding (parallel.dp_shard): ZeRO stage zero >= 1 within groups of
 * `shard` consecutive data-parallel ranks (1 < shard < dp; 0: one group of all), the
 * groups' gradient shards all-reduced across once per step. */
dt_status dt_plan_layout_hsdp(const dt_config *c, const dt_machine *mc, int dp, int pp, int cp, int tp, int zero,
                              int shard, dt_plan_entry *out);
/* The per-unit policies (parallel.policy) the planner tries with each ZeRO stage when
 * the config names none; index 0 is the config's own. The small units replicated: their
 * gathers and reduce-scatters per micro-batch cost latency (messages) that an all-reduce
 * does not, for 16 bytes per parameter of memory. */
#define DT_PLAN_NPOLICIES 4
extern const char *const dt_plan_policies[DT_PLAN_NPOLICIES];
/* ... with policy dt_plan_policies[policy] (0: the config's): its ddp units' gradients
 * all-reduced as the stage reduces (per micro-batch from ZeRO-2), across the replicas too
 * under HSDP, nothing gathered for them, updated whole on every rank. */
dt_status dt_plan_layout_policy(const dt_config *c, const dt_machine *mc, int dp, int pp, int cp, int tp, int zero,
                                int shard, int policy, dt_plan_entry *out);
/* Every layout of mc->world that runs and fits (with each ZeRO stage, HSDP shard size
 * and, where the config names no policy, each of dt_plan_policies), best first, into out
 * (at most cap); returns how many. */
int dt_plan_all(const dt_config *c, const dt_machine *mc, dt_plan_entry *out, int cap);
/* When no layout fits: the nearest layout and the changes that make one fit, each
 * checked by planning again with it (so every suggestion is a plan that has a layout). */
enum { DT_FIX_RANKS, DT_FIX_RECOMPUTE, DT_FIX_MICRO, DT_FIX_BF16, DT_FIX_ALL, DT_FIX_OFFLOAD_CPU, DT_FIX_OFFLOAD_NVME,
       DT_FIX_N };
#define DT_PLAN_MAX_WORLD 4096 /* the more-ranks search stops here */
typedef struct {
    int kind;           /* DT_FIX_* */
    int value;          /* the new world (ranks) or train.micro_batch (micro) */
    dt_plan_entry best; /* the best layout that fits with the change */
} dt_plan_fix;

typedef struct {
    int runs;              /* some layout of the world runs, memory aside (else there is no nearest) */
    dt_plan_entry nearest; /* the layout needing the least memory per rank (ZeRO stages included) */
    int nfixes;
    dt_plan_fix fixes[DT_FIX_N]; /* in DT_FIX_* order, those that work */
    int only_offload;            /* at this world only an offload fix works */
} dt_plan_advice;

/* The nearest layout of c on mc (every ZeRO stage tried) and what makes a layout fit:
 * more ranks (the smallest world up to DT_PLAN_MAX_WORLD at the same memory per rank),
 * train.recompute=full, the largest smaller micro-batch, bf16; each alone, or where none
 * of the last three does alone, all three together (DT_FIX_ALL, micro-batch 1); then
 * offload.optimizer=cpu, and offload.optimizer=nvme with offload.param=nvme (ZeRO-3
 * layouts), each where the config does not have it already. Pure. */
void dt_plan_advise(const dt_config *c, const dt_machine *mc, dt_plan_advice *a);
/* The advice against mc->memory bytes per rank, as text, or one JSON object (a line). */
void dt_plan_print_advice(FILE *f, const dt_plan_advice *a, const dt_machine *mc, int json);

/* Calibrates mc (mc->world set): its rates for every tp x cp shard shape a layout of the
 * world gives a rank, the 1 x 1 rate as mc->flops, and mc->optim_s. load > 1: load
 * processes (this one and load - 1 forked copies, before this one runs any kernel) run
 * each measurement at once and the figures are their mean: a rank's speed while the
 * other ranks sharing its cores compute too (caches, memory bandwidth and the scheduler
 * included), for a node with more ranks than cores; the plan then counts no core sharing. */
dt_status dt_plan_calibrate_machine(const dt_config *c, dt_machine *mc, int load);
/* The table (json: one JSON object per line). */
void dt_plan_print(FILE *f, const dt_plan_entry *e, int n, int json);

#endif
