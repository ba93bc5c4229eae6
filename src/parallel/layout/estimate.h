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

typedef struct {
    double params, grads, optim; /* bytes per rank */
} dt_state_bytes;

/* fp32 state bytes per rank for zero stage z (0..3) with psi parameters over n ranks. */
dt_state_bytes dt_estimate_fp32(double psi, int n, int zero);
/* Bytes one rank of this config needs with dp data-parallel ranks: fp32 state for its
 * ZeRO stage (the ps root's 16psi in ps mode), activations, and the largest workspace. */
double dt_estimate_rank_bytes(const dt_config *c, int dp);
/* Memory this process may still use: MemAvailable, or the cgroup's remaining limit
 * when lower; 0 when unknown. */
double dt_memory_available(void);
/* Prints the estimate table (json: one JSON object instead). */
dt_status dt_estimate_print(const dt_config *c, int n, int json, FILE *out);

#endif
