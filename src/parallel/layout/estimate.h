/* Memory estimator: per-rank bytes of each data-parallel mode, asked of the mode's
 * strategy (strategy.h: its formula for the textbook table, its estimate for what it lays
 * out: parameters, gradients, optimizer state, workspace), plus activations and context
 * parallelism's ring blocks. The formulas and the fp32 analogues: docs/parallelism.md. */
#ifndef DT_ESTIMATE_H
#define DT_ESTIMATE_H
#include <stdio.h>

#include "../../core/config.h"
#include "../../core/status.h"
#include "layout.h"

/* Bytes one rank of this config needs with dp data-parallel ranks: fp32 state for its
 * ZeRO stage (the ps root's 16psi in ps mode), activations, and the largest workspace. */
double dt_estimate_rank_bytes(const dt_config *c, int dp);
/* The same for a layout (its dp). */
double dt_estimate_layout_bytes(const dt_layout *L);
/* Refuses (DT_EINPUT, one line with both figures) a layout whose estimated memory (this
 * rank's state, activations and largest workspace, times the ranks on this node) exceeds
 * avail bytes (0: unknown, never refused): better one line now than the OOM killer
 * halfway through allocation. */
dt_status dt_estimate_check_node(const dt_layout *L, int ranks, double avail);
/* Memory this process may still use: MemAvailable, or the cgroup's remaining limit
 * when lower; 0 when unknown. */
double dt_memory_available(void);
/* Prints the estimate table for L's data-parallel size (json: one JSON object instead),
 * after dt_layout_check(L, DT_CHECK_ESTIMATE). */
dt_status dt_estimate_print(const dt_layout *L, int json, FILE *out);

#endif
