/* Pipeline parallelism (docs/parallelism.md, "Pipeline parallelism"): the layer stack cut into parallel.pp stages, one
 * per pipeline rank; micro-batches flow forward through the stages and their gradients
 * back, in the order a schedule (schedule.h) lists for each rank. This module cuts the
 * model (which blocks a stage holds) and runs a rank's list on its stage of the model
 * (gpt.h's stage API): activations and gradients cross stages by point-to-point messages
 * over the pipeline group. */
#ifndef DT_PIPELINE_H
#define DT_PIPELINE_H
#include "../../comm/comm.h"
#include "../../model/gpt.h"
#include "schedule.h"

/* The blocks of stage `stage` of pp for n_layer blocks: balanced, the first n_layer % pp
 * stages one block more. Fails (DT_EINPUT) when a stage would get no block. */
dt_status dt_pp_split(int n_layer, int pp, int stage, int *first, int *count);
/* Pipeline rank r's blocks in lay (first_layer/n_layers, or with v > 1 its v chunks: the
 * layers cut into p·v pieces, rank r holding pieces r, r + p, ...). The pieces are
 * balanced (dt_pp_split), or split (parallel.pp_split; NULL or "": balanced) lists the
 * blocks of each piece in model order, e.g. "3,2,2,1"; a list that does not give p·v
 * pieces of at least one block adding up to n_layer fails (DT_EINPUT, one line). */
dt_status dt_pp_layout(int n_layer, int p, int v, int r, const char *split, gpt_layout *lay);

/* Which (pp, virtual stages, schedule, m, pp_split) run is the layout's one check to say
 * (layout.h: dt_layout_check). */

/* What the trainer gives the runner: micro-batch mb's tokens (needed on the first stage),
 * targets (on the last) and document starts (on every stage: attention in every block
 * needs them), and the data-parallel engine's per-micro-step call (last: the operation
 * after which this rank's gradients of some unit become final). */
typedef struct {
    void (*fill)(void *ctx, int mb, dt_token *tokens, dt_token *targets, int *seg);
    void (*micro)(void *ctx, int last);
    void *ctx;
    int documents; /* the rows hold documents (gpt_set_documents) */
} dt_pp_io;

typedef struct dt_pipeline dt_pipeline;

/* The runner for this rank (its rank in the pipeline group pp, m micro-batches of B x T
 * per step) of schedule s on model (the rank's v chunks, dt_pp_layout, with enough
 * activation slots: dt_pp_slots). Allocates its message bookkeeping once. */
dt_status dt_pipeline_create(dt_pipeline **out, gpt_model *model, dt_comm *pp, dt_schedule s, int v, int m, int B,
                             int T);
void dt_pipeline_destroy(dt_pipeline *pl);
/* Activation slots rank r needs for schedule s (dt_schedule_slots: a pass holds one from
 * its first operation to its last, and a slot whose sends may still be in flight is not
 * reused where waiting for them could deadlock; for every plan checked that is exactly
 * the passes in flight), 0 if (p, v, m) do not suit s. */
int dt_pp_slots(dt_schedule s, int p, int v, int r, int m);
/* One step's forwards and backwards: gradients accumulate (grads += d(loss·grad_scale));
 * *loss = the sum of per-token losses over the m micro-batches, on every pipeline rank.
 * busy/idle seconds of the step are added to the pipeline's counters. */
dt_status dt_pipeline_step(dt_pipeline *pl, const dt_pp_io *io, float grad_scale, double *loss);
/* Forward only (validation): *loss as above for the m micro-batches io->fill gives. */
dt_status dt_pipeline_eval(dt_pipeline *pl, const dt_pp_io *io, int m, double *loss);
/* Sampling through the pipeline: the next token's logits (vocab_size floats, on every
 * pipeline rank) after tokens[0..T), one sequence forward through every chunk in model
 * order, the last stage's head, its logits broadcast over the pipeline group. */
dt_status dt_pipeline_next_logits(dt_pipeline *pl, const dt_token *tokens, int T, float *logits);
/* Seconds, since creation, this rank computed (F, B, W), waited on receives, and spent in
 * dt_pipeline_step in all (its bubble: 1 - busy / span). */
void dt_pipeline_times(const dt_pipeline *pl, double *busy, double *wait, double *span);

#endif
