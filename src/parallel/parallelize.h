/* One parallelize step (torchtitan's parallelize_module): from the layout, this rank's
 * process groups (mesh.h), its piece of the model (tensor-parallel shards, its pipeline
 * stage, its context-parallel positions), the data-parallel engine that owns the
 * optimizer (data_parallel.h) and the pipeline runner, wired together once. The handle's
 * step, eval, save and load work alike for every layout: a run without pipeline stages
 * is the one-stage case, hidden here, so the training loop has no layout branch.
 *
 * Data reaches the handle through a fill callback: it writes `micro` whole sequences (T
 * tokens, their targets and where each token's document starts: loader.h's rows)
 * starting at sequence seq0 of the step's global batch (or of the validation batch); the
 * handle keeps the positions this rank computes, and the document starts when the layout
 * has documents (data.layout pack, pad). */
#ifndef DT_PARALLELIZE_H
#define DT_PARALLELIZE_H
#include <stdint.h>
#include <stdio.h>

#include "../ckpt/checkpoint.h"
#include "../comm/comm.h"
#include "../core/mem_report.h"
#include "../core/status.h"
#include "../model/gpt.h"
#include "layout/layout.h"

typedef struct dt_par dt_par;

typedef void (*dt_par_fill)(void *ctx, int seq0, dt_token *tokens, dt_token *targets, int *seg);

/* Collective over world: builds everything for layout L (kept by pointer: it must
 * outlive the handle) on ops. The weights are not set yet: dt_par_init_weights or
 * dt_par_load. Rank 0 prints a note when checkpoint.async cannot apply. */
dt_status dt_parallelize(dt_par **out, const dt_layout *L, dt_comm *world, const dt_ops *ops);
/* failed: the run ends with an error (queued device collectives are aborted, not drained). */
void dt_par_destroy(dt_par *h, int failed);

/* GPT-2 initialisation, or weights from a safetensors file (train.init_from). */
dt_status dt_par_init_weights(dt_par *h, uint64_t seed, const char *init_from);
/* Weights, optimizer state and step count from a checkpoint step directory. */
dt_status dt_par_load(dt_par *h, const char *step_dir, long long step);
/* The per-rank state of a mode that runs outside the engine (the asynchronous parameter
 * server's gradients handed out ahead of a checkpoint, train/async_ps.h): written by every
 * rank with each checkpoint before it commits, and read by dt_par_load, as the engine's
 * own (ckpt/rank_state.h). Set before dt_par_load. */
typedef struct {
    dt_status (*save)(void *ctx, const char *dir, long long step, int rank, const char *layout);
    dt_status (*load)(void *ctx, const char *step_dir, long long step, int rank, const char *layout);
    void *ctx;
} dt_par_rank_state;
void dt_par_set_rank_state(dt_par *h, const dt_par_rank_state *rs);

/* One optimizer step `step` (0-based: the learning rate's schedule position) over the
 * layout's m micro-batches of this rank; loss_tokens: the global batch's targets in the
 * loss (not DT_IGNORE), the same on every rank. *loss = the sum of their losses over
 * loss_tokens, and the gradient is that loss's (token-exact: whatever the micro-batches,
 * ranks, schedule or context split; 0 when no target is in the loss), on every rank;
 * micro_steps: this step's micro-steps, the same on every rank (0: the layout's m; fewer
 * under a token budget; a pipeline runs its schedule's m, the rest empty);
 * *grad_norm before clipping, *lr the rate applied. settle: the state is
 * read after this step (a checkpoint, the run's end): its update is not delayed. */
/* The asynchronous parameter server's parts (dp_mode ps-async, src/train/async_ps.h; the
 * engine is this rank's alone): a task's gradients, of the rows data-parallel rank `share`
 * gets in each micro-step (the sum of its losses, the tokens in the loss: the gradient is
 * their mean), left in dt_par_grad_buffer (the model's flat fp32 gradients); an update from
 * the gradients there at rate lr (the pre-clip norm out); the fp32 weights, read or set. */
dt_status dt_par_task_gradients(dt_par *h, dt_par_fill fill, void *ctx, int share, double *loss_sum,
                                long long *tokens);
dt_status dt_par_apply(dt_par *h, double lr, double *grad_norm);
void dt_par_set_updates(dt_par *h, long long updates); /* the updates so far (the server's N per global step) */
float *dt_par_grad_buffer(dt_par *h);
size_t dt_par_nparams(const dt_par *h);
double dt_par_lr_at(const dt_par *h, long long step);
dt_status dt_par_get_weights(dt_par *h, float *dst);
dt_status dt_par_set_weights(dt_par *h, const float *src);
dt_status dt_par_step(dt_par *h, long long step, int settle, dt_par_fill fill, void *ctx, long long loss_tokens,
                      int micro_steps, double *loss, double *grad_norm, double *lr);
/* Forward only over one micro-batch (fill's seq0 is 0): *loss_sum over this rank's
 * *tokens positions. */
dt_status dt_par_eval(dt_par *h, dt_par_fill fill, void *ctx, double *loss_sum, double *tokens);
/* Sums n doubles over the ranks that hold different data (data- and context-parallel). */
dt_status dt_par_allreduce_data(dt_par *h, double *v, int n);
/* This rank's index among this job's data-parallel ranks (validation's share; the
 * training rows are those of the run's data-parallel rank, which differs only for
 * replicas as separate jobs). */
int dt_par_dp_rank(const dt_par *h);
/* Replicas as separate jobs (dt_layout jobs > 1), after the weights are initialised or
 * loaded at `step`: meets the outer server and takes its synchronised weights, at step
 * *at >= step (a replica restarted while the others went on joins them there; the
 * trainer moves its data and schedule to *at). Otherwise *at = step. */
dt_status dt_par_join(dt_par *h, long long step, long long *at);

/* Collective: the checkpoint of whole tensors (ckpt/distributed.h); with asynchronous saves
 * it returns once the state is gathered and dt_par_save_wait ends it. */
dt_status dt_par_save(dt_par *h, const char *dir, const dt_train_state *st, const char *config_json, double shard_mb);
dt_status dt_par_save_wait(dt_par *h);
int dt_par_async_save(const dt_par *h);
/* Collective: sha256 of the full weights. */
dt_status dt_par_digest(dt_par *h, char hex[65]);
/* Collective: the full weights readable through the model (for sampling), until
 * dt_par_release_full. Then, on the first replica only (dt_par_dp_rank 0), every model
 * rank calls dt_par_next_logits together (a dt_next_logits_fn: ctx is the handle). */
dt_status dt_par_gather_full(dt_par *h);
void dt_par_release_full(dt_par *h);
dt_status dt_par_next_logits(void *h, const dt_token *tokens, int T, float *logits);
/* The model this rank holds (its tensors, its longest sequence max_T). */
const gpt_model *dt_par_model(const dt_par *h);

/* Seconds the steps so far waited on data-parallel communication; -1 when not measured
 * (a single replica, or collectives queued on a device stream). */
double dt_par_comm_seconds(const dt_par *h);
/* This rank's offload I/O so far: io[0] bytes read, io[1] bytes written, io[2] seconds
 * waited for them, io[3] seconds in the updates (the streamed pass), io[4] gradient bytes
 * handed to the host as they became final (dt_optimizer_grads_early_bytes), io[5] those
 * handed over during backward; 0 when nothing is offloaded to files. */
enum { DT_OFFLOAD_IO_N = 6 };
/* This rank's totals so far: gradient bytes put into data-parallel reductions
 * (dt_dp_grad_bytes), parameter bytes all-gathered (dt_dp_param_bytes) and weight-gradient
 * GEMMs skipped for frozen tensors (gpt_model's dw_skipped); a step's are the difference
 * across it. */
void dt_par_traffic(const dt_par *h, double *grad_bytes, double *param_bytes, double *gemms_skipped);
int dt_par_offload_io(const dt_par *h, double io[DT_OFFLOAD_IO_N]);
/* This rank's memory: state, workspace and activations (peak_rss is the caller's). */
void dt_par_memory(const dt_par *h, dt_mem_report *r);
/* Collective: gathers what the final report needs from every rank (pipeline timings). */
dt_status dt_par_gather_report(dt_par *h);
/* Rank 0, after the summary: the layout's communication and pipeline lines over
 * `steps` timed steps; mem_all: 7 numbers per world rank (the summary's memory). */
void dt_par_print_report(const dt_par *h, long long steps, const double *mem_all, FILE *out);

#endif
