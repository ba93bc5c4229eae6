/* The per-unit sharding policy (parallel.policy): comma-separated GLOB:MODE rules over
 * tensor names (train.freeze's globs), MODE one of ddp, zero1, zero2, zero3. A tensor
 * takes the mode of the first rule whose glob matches it, else parallel.zero; a unit (the
 * model's wrap unit: the embeddings, a block or parallel.unit_blocks of them, ln_f) takes
 * its tensors' mode, which must be one. Pure: from the model's table, no engine. The
 * engine runs one ZeRO stage with some units replicated (ddp: whole parameters, gradients
 * all-reduced, whole moments on every rank); dt_layout_check refuses what it does not run. */
#ifndef DT_POLICY_H
#define DT_POLICY_H
#include "../../core/status.h"
#include "../../model/gpt.h"

/* mode[u] for each unit of m: the ZeRO stage 1-3, or 0 for ddp (replicated). zero: the
 * unmatched units' (parallel.zero). Refuses (one line, DT_EINPUT) a rule without a mode,
 * an unknown mode, a glob that matches no tensor of m, a unit whose tensors take two
 * modes. mode may be NULL (only checked). */
dt_status dt_policy_units(const char *policy, int zero, const gpt_model *m, signed char *mode);
/* The whole model's policy (shape, parallel.unit_blocks): *stage the highest ZeRO stage
 * among the units (0: every unit ddp), *replicated 1 when some units are ddp and others
 * sharded; refuses two different ZeRO stages (one stage with ddp units so far). */
dt_status dt_policy_stage(const char *policy, int zero, const gpt_shape *shape, int unit_blocks, int *stage,
                          int *replicated);

/* What policy replicates inside its ZeRO stage (shape, parallel.unit_blocks): the
 * parameters and the units of its ddp units (0 and 0 when nothing is, or every unit is
 * ddp); refuses what dt_policy_stage refuses. The planner's traffic and update. */
dt_status dt_policy_replicated(const char *policy, int zero, const gpt_shape *shape, int unit_blocks, size_t *params,
                               int *units);

#endif
