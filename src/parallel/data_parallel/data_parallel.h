/* Data parallelism: every rank runs the whole model on its share of each global batch
 * and the ranks combine gradients. One engine (data_parallel.c) runs the mode's strategy
 * through one table of operations (strategy.h), chosen when it is created from
 * dt_dp_opts: the central rank (ps.c), DDP's bucketed all-reduce (ddp.c), ZeRO stages 1-3
 * (zero1.c, zero2.c, zero3.c over zero_shard.c), optionally wrapped for bitwise
 * reproducibility (bitwise.c). With one rank every mode is plain single-process
 * training. The strategies own the optimizer state, so the engine also loads it and
 * hands its pieces to checkpoints and the digest (ckpt/distributed.h, which decides who
 * writes what); how a rank's tensors add up in training (the norm over tensor-parallel
 * pieces, tied embeddings) comes from state.h. */
#ifndef DT_DATA_PARALLEL_H
#define DT_DATA_PARALLEL_H
#include <stdint.h>

#include "../../ckpt/checkpoint.h"
#include "../../ckpt/distributed.h"
#include "../../core/config.h"
#include "../../comm/comm.h"
#include "../../comm/device_comm.h"
#include "../../model/gpt.h"
#include "../../optim/optimizer.h"
#include "../../core/mem_report.h"
#include "state.h"

typedef struct {
    int ps;              /* dp_mode ps */
    int zero;            /* 0..3 */
    size_t bucket_bytes; /* DDP bucket size */
    int bitwise;         /* parallel.determinism = bitwise (canonical.h) */
    int overlap;         /* DDP, ZeRO-1: start gradient collectives during backward */
    int leaves;          /* bitwise: accumulation micro-steps per optimizer step */
    dt_model_groups groups; /* the model-parallel groups this rank's state spans (state.h) */
    int gather_once;        /* ZeRO-3: parameters gathered once per step (after the update), not per use:
                               a pipeline stage runs its blocks for many micro-batches in turn */
    dt_dcomm *dcomm;        /* device collectives over the data-parallel group (comm.backend nccl; NULL: the
                               host communicator, a device's state staged through host memory) */
    dt_optimizer_offload offload; /* where the optimizer state lives (store kind 0: with the parameters) */
    long long delayed_warmup;     /* offload.delayed_update: the first steps' updates are not delayed */
    dt_store_opts offload_param;  /* ZeRO-3: where the parameter shard lives between uses (kind 0: the model's memory) */
    char offload_tag[48], param_tag[48]; /* name this rank's offload files (the stores' tags point here) */
    int staleness;                /* the deterministic delayed mode: gradients applied s steps late (staleness.h) */
    int no_update;                /* this rank never updates (an asynchronous worker): DDP keeps no moments */
    const char *policy;           /* parallel.policy with ddp units among ZeRO's (layout/policy.h; NULL: none):
                                     those units replicated, whole on every rank (zero_shard.c) */
    int policy_zero;              /* its unmatched units' mode (parallel.zero) */
    dt_comm *replicas;            /* HSDP: the same shard of the other shard groups (NULL: none); ZeRO's reduced
                                     gradient shard is summed over it before the norm (zero_shard.c) */
} dt_dp_opts;

/* ZeRO pads each unit to a multiple of shards x this many elements (a wrapper may ask for
 * more: DT_CANON_CHUNK, so shard boundaries never split a chunk of the canonical norm). */
#define DT_SHARD_ALIGN 64

typedef struct dt_dp dt_dp;

/* Creates the engine and the model's parameter/gradient storage for this mode
 * (the model must come from gpt_create_ex(..., alloc_state = 0)). */
dt_status dt_dp_create(dt_dp **out, dt_comm *comm, gpt_model *m, const dt_adamw_hparams *hp, const dt_dp_opts *o);
void dt_dp_destroy(dt_dp *d);
/* GPT-2 initialisation (identical on every rank), or weights from a safetensors file. */
dt_status dt_dp_init_weights(dt_dp *d, uint64_t seed, const char *init_from);
/* Weights, optimizer moments and step count from a checkpoint step directory. */
dt_status dt_dp_load(dt_dp *d, const char *step_dir, long long step);
/* The optimizer's update count (AdamW's bias correction counts from it): the asynchronous
 * server's, which updates N times per global step. */
void dt_dp_set_updates(dt_dp *d, long long updates);
/* Before the first micro-step of an optimizer step. */
void dt_dp_begin_step(dt_dp *d);
/* Before each micro-step; last = the final accumulation micro-step of this step. */
void dt_dp_begin_micro(dt_dp *d, int last);
/* Combines gradients, clips to the global norm, updates, re-distributes parameters.
 * settle: the state is read after this step (a checkpoint, the last step), so its update
 * is not delayed (offload.delayed_update). */
dt_status dt_dp_end_step(dt_dp *d, double lr, double *grad_norm, int settle);
/* The strategy's state as a checkpoint's pieces (ckpt/distributed.h: the full state as
 * unit views, or streamed where the strategy streams), d their context: the checkpoint
 * module decides who writes what, assembles and commits. */
dt_ckpt_pieces dt_dp_ckpt_pieces(dt_dp *d);
/* Collective: a delayed update in flight (offload.delayed_update) waited for, applied and
 * its parameters re-distributed, so the model, saves and digests see every update (nothing
 * to do without one). */
dt_status dt_dp_settle(dt_dp *d);
/* Collective: makes the full weights readable through the model (ZeRO-3 gathers them;
 * call dt_dp_release_full after use). */
dt_status dt_dp_gather_full(dt_dp *d);
void dt_dp_release_full(dt_dp *d);
/* The fp32 weights of the whole model this rank holds (n = the model's nparams, host
 * memory), read or written (the master weights and the model's copy): modes that keep
 * them whole on a rank (DDP; DT_EINPUT otherwise). Local SGD's synchronisation. */
dt_status dt_dp_get_weights(dt_dp *d, float *dst);
dt_status dt_dp_set_weights(dt_dp *d, const float *src);
/* The same for AdamW's moments (which: 0 first, 1 second). */
dt_status dt_dp_get_moments(dt_dp *d, int which, float *dst);
dt_status dt_dp_set_moments(dt_dp *d, int which, const float *src);
/* The delayed mode's queued gradients (parallel.staleness) as this rank's checkpoint state
 * (ckpt/rank_state.h) at the engine's step, and back after dt_dp_load; whether there is any. */
int dt_dp_has_rank_state(const dt_dp *d);
dt_status dt_dp_save_rank_state(dt_dp *d, const char *dir, int rank, const char *layout);
dt_status dt_dp_load_rank_state(dt_dp *d, const char *step_dir, int rank, const char *layout);
/* Seconds the training steps so far spent waiting on communication (exposed time). */
double dt_dp_comm_seconds(const dt_dp *d);
/* Gradient bytes the steps so far put into the data-parallel reductions (all-reduce,
 * reduce-scatter, reduce to the central rank, the bitwise tree, HSDP's sum over the
 * replicas), as this rank's input in fp32, the element type they reduce in; frozen
 * tensors' gradients are not among them. */
double dt_dp_grad_bytes(const dt_dp *d);
/* Parameter bytes the steps so far all-gathered (ZeRO-1/2 after each update, ZeRO-3
 * before each use, its kept units once a step), as the gathered units' whole size in fp32;
 * 0 for the modes that gather none. */
double dt_dp_param_bytes(const dt_dp *d);
/* Seconds the steps so far spent in the optimizer update (clip, AdamW, re-distribution). */
double dt_dp_update_seconds(const dt_dp *d);
/* Bytes this rank holds for parameters, gradients, optimizer state and workspace. */
void dt_dp_memory(const dt_dp *d, dt_mem_report *r);

#endif
