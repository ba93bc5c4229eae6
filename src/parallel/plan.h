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

#include "../core/config.h"
#include "../core/status.h"

typedef struct {
    double alpha; /* seconds per message */
    double beta;  /* bytes per second */
} dt_link;

typedef struct {
    int world, ranks_per_node;
    double memory;      /* bytes per rank available */
    double flops;       /* sustained training FLOP/s of one rank */
    dt_link intra, inter;
} dt_machine;

/* Communication of one step, per group: bytes one rank sends, and seconds. */
enum { DT_PLAN_TP, DT_PLAN_CP, DT_PLAN_PP, DT_PLAN_DP, DT_PLAN_NGROUPS };

typedef struct {
    int dp, pp, cp, tp, zero, m; /* m: micro-batches per step per data-parallel rank */
    double memory;               /* bytes per rank (the estimator's) */
    double compute_s;            /* this rank's FLOPs over the rate, without bubble */
    double bubble;               /* the schedule's idle fraction: (p−1)/(m+p−1) */
    double comm_bytes[DT_PLAN_NGROUPS], comm_s[DT_PLAN_NGROUPS];
    double step_s, tokens_per_s;
    int intra[DT_PLAN_NGROUPS]; /* the group lies inside a node */
} dt_plan_entry;

/* Whether the group of kind g (DT_PLAN_*) of a dp·pp·cp·tp layout lies within a node of
 * ranks_per_node ranks (ranks are consecutive per node). */
int dt_plan_group_intra(int g, int dp, int pp, int cp, int tp, int ranks_per_node);
/* The prediction for one layout of config c (its parallel.* and model), or DT_EINPUT
 * with one line when the layout cannot run (a divisibility rule). */
dt_status dt_plan_layout(const dt_config *c, const dt_machine *mc, int dp, int pp, int cp, int tp, int zero,
                         dt_plan_entry *out);
/* Every layout of mc->world that runs and fits, best first, into out (at most cap);
 * returns how many. */
int dt_plan_all(const dt_config *c, const dt_machine *mc, dt_plan_entry *out, int cap);
/* A rank's training FLOP/s measured here: two forward+backward passes of the config's
 * model on one micro-batch (the whole model, this process's threads), after a warm-up. */
dt_status dt_plan_calibrate(const dt_config *c, double *flops);
/* The table (json: one JSON object per line). */
void dt_plan_print(FILE *f, const dt_plan_entry *e, int n, int json);

#endif
