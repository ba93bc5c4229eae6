/* Memory estimator: per-rank bytes of model state for each data-parallel mode, from
 * the seed-003 formulas (Ψ parameters, N data-parallel ranks):
 *   mixed precision (bf16 params/grads, fp32 master + Adam):  16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N
 *   fp32 (what the CPU backend holds):  ZeRO-0 16Ψ, ZeRO-1 8Ψ+8Ψ/N (full params and
 *   grads, the grads reduce-scattered in place, Adam shards), ZeRO-2 4Ψ+12Ψ/N, ZeRO-3 16Ψ/N.
 * Workspace (buckets, gathered units) and activations are reported separately. */
#ifndef DT_ESTIMATE_H
#define DT_ESTIMATE_H
#include <stdio.h>

#include "../../core/config.h"
#include "../../core/status.h"
#include "layout.h"

typedef struct {
    double params, grads, optim; /* bytes per rank */
} dt_state_bytes;

/* fp32 state bytes per rank for zero stage z (0..3) with psi parameters over n ranks. */
dt_state_bytes dt_estimate_fp32(double psi, int n, int zero);
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
