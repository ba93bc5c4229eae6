/* The per-unit sharding policy (parallel.policy): comma-separated GLOB:MODE rules over
 * tensor names (train.freeze's globs), MODE one of ddp, zero1, zero2, zero3. A tensor
 * takes the mode of the first rule whose glob matches it, else parallel.zero; a unit (the
 * model's wrap unit: the embeddings, a block or parallel.unit_blocks of them, ln_f) takes
 * its tensors' mode, which must be one. Pure: from the model's table, no engine. The
 * engine runs one ZeRO stage with some units replicated (ddp: whole parameters, gradients
 * all-reduced, whole moments on every rank) and, in ZeRO-3, some kept whole between
 * updates (zero2: gathered once after each update, as ZeRO-2 does, instead of before each
 * use); dt_layout_check refuses what it does not run. */
#ifndef DT_POLICY_H
#define DT_POLICY_H
#include "../../core/status.h"
#include "../../model/gpt.h"

/* mode[u] for each unit of m: the ZeRO stage 1-3, or 0 for ddp (replicated). zero: the
 * unmatched units' (parallel.zero). Refuses (one line, DT_EINPUT) a rule without a mode,
 * an unknown mode, a glob that matches no tensor of m, a unit whose tensors take two
 * modes. mode may be NULL (only checked). */
dt_status dt_policy_units(const char *policy, int zero, const gpt_model *m, signed char *mode);
/* The whole model's policy (shape; units: its unit_blocks and split_blocks, as
 * dt_unit_layout gives them): *stage the highest ZeRO stage among the units (0: every unit
 * ddp), *replicated 1 when the units differ: some ddp and others sharded, or zero2 units
 * among zero3's (kept whole between updates, their gradients and moments sharded); refuses
 * other mixes of ZeRO stages (zero1 with zero2 or zero3). */
dt_status dt_policy_stage(const char *policy, int zero, const gpt_shape *shape, const gpt_layout *units, int *stage,
                          int *replicated);

/* What policy replicates inside its ZeRO stage (as dt_policy_stage): the parameters and
 * the units of its ddp units (0 and 0 when nothing is, or every unit is ddp), and of its
 * zero2 units kept whole among zero3's (0 and 0 when none); refuses what dt_policy_stage
 * refuses. The planner's traffic and update. */
dt_status dt_policy_replicated(const char *policy, int zero, const gpt_shape *shape, const gpt_layout *units,
                               size_t *params, int *units_out, size_t *kept_params, int *kept_units);

/* Where units begin inside a block (parallel.unit_split): comma-separated globs over the
 * whole model's tensor names, each naming tensors that begin a unit (FSDP's wrapping of a
 * block's submodules apart). A block can begin a unit at its second norm (GPT-2's
 * h.N.ln_2.weight, Llama's model.layers.N.post_attention_layernorm.weight: its MLP half);
 * a tensor that begins a unit anyway (a block's first, the embeddings', ln_f's) changes
 * nothing. *split_blocks: 1 when the blocks split. Refuses (one line, DT_EINPUT) a glob
 * matching no tensor, a unit that would begin inside a half (cutting the tensors one op
 * uses together), and splitting some blocks but not all. */
dt_status dt_unit_split(const char *split, const gpt_shape *shape, int *split_blocks);
/* The wrap units of a config's model on paper: parallel.unit_blocks, and split_blocks
 * from parallel.unit_split (0 where it does not parse: dt_layout_check says why). */
gpt_layout dt_unit_layout(const char *split, int unit_blocks, const gpt_shape *shape);

#endif
