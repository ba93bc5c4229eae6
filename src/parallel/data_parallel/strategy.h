/* A data-parallel strategy: one table of operations per mode (ps.c, ddp.c, zero1.c,
 * zero2.c, zero3.c), chosen once when the engine is created (strategy.c); the engine
 * (data_parallel.c) only dispatches through it. A wrapper (bitwise.c) takes a mode's
 * table and replaces some of its entries, calling the mode's own (dt_dp.mode) around its
 * additions. Adding a mode: docs/adding-a-strategy.md. */
#ifndef DT_DP_STRATEGY_H
#define DT_DP_STRATEGY_H
#include <stdint.h>

#include "../layout/layout.h"
#include "data_parallel.h"

/* Where a strategy keeps the reduced gradients it updates from (a wrapper that replaces
 * the reduction, bitwise.c, fills them): the flat model layout (every rank all of them),
 * the padded layout with this rank's slice of each unit in place (ZeRO-1), or this rank's
 * shard (ZeRO-2/3). */
enum { DT_GRADS_FLAT, DT_GRADS_PADDED, DT_GRADS_SHARD };

/* What a mode keeps off the device under the layout's offload.* (docs/offload.md), as its
 * estimate reports it: the estimator sizes host memory, the files and their I/O from it
 * the way the store (src/offload/store.h) lays a state out. */
typedef struct {
    double optim_n;    /* elements of each of the optimizer store's fp32 fields (master
                        * weights, AdamW moments) of what this rank updates; 0: not offloaded */
    int optim_fields;  /* 3, or 2 without master weights (dt_layout_offload_master) */
    double param_n;    /* elements of the parameter store (ZeRO-3's shard); 0: not offloaded */
    double param_elem; /* bytes per element there (the model's precision) */
    double param_reads; /* reads of the parameter store per optimizer step */
    double param_fetch; /* elements of its read-ahead buffer (store.h's fetch_max; 0: none) */
    int grads_early;    /* the gradients are handed to the optimizer during backward (a host copy of them
                         * where they are not fp32 host memory: a device's, bf16's) */
    double optim_frozen; /* elements it owns without moments (train.freeze): not in the store; their fp32
                          * master weights in host memory apart (where the store keeps master weights) */
} dt_dp_offload;

/* What the estimator asks a strategy about (layout/estimate.c): one rank of one pipeline
 * stage of a layout, on paper. */
typedef struct dt_dp_stage {
    const dt_layout *L;
    const gpt_layout *lay;               /* the stage's blocks and tensor-parallel pieces */
    double psi;                          /* parameters one rank of the stage holds */
    int shards;                          /* ranks the state is sharded over: dp x cp */
    size_t align;                        /* ZeRO's unit padding (DT_SHARD_ALIGN, or a wrapper's) */
    const struct dt_dp_strategy *mode;   /* the mode's own table (a wrapper calls it) */
    dt_dp_offload *off;                  /* filled by estimate with what leaves the device (NULL: not asked) */
} dt_dp_stage;

/* The textbook per-rank bytes of a mode's model state (ZeRO paper; Psi parameters, N
 * ranks), as `dtrain estimate` tabulates them. fp32: params, grads, optimizer state at 4, 4
 * and 8 bytes per parameter, each whole or 1/N. Mixed precision (bf16 parameters and
 * gradients, fp32 master weights and Adam): whole x Psi + shard x Psi/N. A central rank
 * (root > 0): it holds root x Psi, the others others x Psi. */
typedef struct {
    const char *mixed_text, *fp32_text; /* the formulas as printed; NULL: no row in the table */
    double mixed_whole, mixed_shard;
    int sharded[3];                     /* fp32 params, grads, optimizer state: 1/N per rank */
    double root, others;
} dt_dp_formula;

typedef struct dt_dp_strategy {
    const char *name;
    int grads;   /* DT_GRADS_* */
    int sharded; /* the optimizer state is split over the data-parallel ranks (needs several) */
    int params_shard; /* the parameters too: a rank keeps its shard, gathered for use (ZeRO-3) */
    dt_dp_formula formula;
    /* The state for this rank's model (its private state in dt_dp.priv) and the model's
     * parameter/gradient views; collective (node-shared buffers). free: every rank, in the
     * same order; must accept a setup that failed part-way. */
    dt_status (*setup)(dt_dp *d);
    void (*free)(dt_dp *d);
    /* Before the first micro-step of an optimizer step (gradients to zero). */
    void (*begin_step)(dt_dp *d);
    /* The model's hooks (gpt.h; NULL: nothing to do). u may be GPT_HEAD_PART only where a
     * wrapper set the model's head_grad. */
    dt_status (*before_forward)(dt_dp *d, int u);
    dt_status (*after_forward)(dt_dp *d, int u);
    dt_status (*before_backward)(dt_dp *d, int u);
    dt_status (*after_backward)(dt_dp *d, int u);
    /* End of step, in three parts so a wrapper can replace the middle one: finish the
     * collectives the hooks or the last update left in flight (NULL: none); combine the
     * gradients and compute the global norm (the same on every rank); clip, update and
     * re-distribute the parameters. */
    dt_status (*drain)(dt_dp *d);
    dt_status (*reduce)(dt_dp *d, double *norm);
    dt_status (*update)(dt_dp *d, double lr, double norm);
    /* This rank's parameters changed outside update (a delayed update applied late):
     * re-distributed as update does (NULL: every rank holds its own, nothing to do).
     * Collective. */
    dt_status (*redistribute)(dt_dp *d);
    /* The full parameters readable through the model, in its memory and precision, until
     * release_full (NULL: they always are). Collective. */
    dt_status (*gather_full)(dt_dp *d);
    void (*release_full)(dt_dp *d);
    /* The full fp32 weights (bf16: the master weights) as the model's unit views in host
     * memory, and with moments the optimizer moments as unit views (*mv, *vv), on the
     * ranks where reader is set; the others only take part in the gathers. snapshot: in
     * the rank's private memory (an asynchronous save's fork sees no later change).
     * close_full undoes it; collective over the data-parallel group where the state is
     * sharded. */
    dt_status (*open_full)(dt_dp *d, int moments, int snapshot, int reader, float ***mv, float ***vv);
    dt_status (*close_full)(dt_dp *d, float **mv, float **vv);
    /* A streamed save's or digest's source (checkpoint.h), one piece whole at a time
     * (NULL: saves and digests read open_full's views); reader: this rank uses the
     * pieces (the others only make the same calls, for the collectives behind them).
     * Collective. */
    dt_status (*source_open)(dt_dp *d, int moments, int reader, dt_ckpt_source *src);
    void (*source_close)(dt_dp *d, dt_ckpt_source *src);
    /* GPT-2 initialisation or weights from a file; weights and moments of a checkpoint. */
    dt_status (*init_weights)(dt_dp *d, uint64_t seed, const char *init_from);
    dt_status (*load)(dt_dp *d, const char *step_dir);
    void (*memory)(const dt_dp *d, dt_mem_report *r);
    /* Pure, no engine: the per-rank bytes of stage s as this mode lays them out (what
     * memory reports once it runs): *state its parameters, gradients and optimizer state
     * in device memory, added to *work its buffers (buckets, scratch, staging copies); the
     * estimator and the planner read memory only from here. Under offload (the layout's
     * offload.*) *state leaves out what moves off the device, and s->off (when set) says
     * how much that is. A wrapper adds its own after the mode's. */
    void (*estimate)(const dt_dp_stage *s, double *state, double *work);
    /* The planner's gradient and parameter traffic per optimizer step, in ring passes of
     * the gradients' volume: ring[gather_once][0] + ring[gather_once][1] x m for m
     * micro-batches per step (gather_once: parameters gathered once per step, as under a
     * pipeline). */
    double ring[2][2];
} dt_dp_strategy;

extern const dt_dp_strategy dt_dp_ps, dt_dp_ddp, dt_dp_zero1, dt_dp_zero2, dt_dp_zero3;
/* The stage's frozen elements on one rank (train.freeze; zero_estimate.c): of the whole
 * stage (the flat layout's), and of a rank's ZeRO slices with the units padded to
 * shards x align (a frozen unit's slices whole, padding too; elsewhere the frozen
 * tensors' parts; the rank with the fewest, so the most moments). 0 without a freeze. */
double dt_dp_frozen_flat(const dt_dp_stage *s);
double dt_dp_frozen_shard(const dt_dp_stage *s);
/* Refuses (one line, DT_EINPUT) what the modes do not run for this precision, backend and
 * communicator: bitwise mode off the CPU or in bf16; offload (offload.*) with the central
 * rank, parameter offload below ZeRO-3, nvme without offload.nvme_path, offload with device
 * collectives; device collectives (comm.backend nccl) with the CPU backend, model
 * parallelism, the central rank or bitwise mode. */
dt_status dt_dp_check_config(const dt_layout *L);
/* Every mode, in the order `dtrain estimate` lists them (NULL-terminated). */
extern const dt_dp_strategy *const dt_dp_modes[];

/* The mode keys of the options (ps, zero, bitwise) from the layout; the caller fills the
 * rest (parallelize.c). */
void dt_dp_opts_of_layout(dt_dp_opts *o, const dt_layout *L);
/* The layout's mode (*mode) and the table that runs it (wrapped as the layout asks). */
dt_status dt_dp_strategy_of_layout(const dt_layout *L, const dt_dp_strategy **mode, dt_dp_strategy *run);
/* A planner's candidate: the config c set to the data-parallel mode of ZeRO stage zero
 * (DDP at 0); its table, NULL when no mode runs that stage. */
const dt_dp_strategy *dt_dp_candidate(dt_config *c, int zero);

/* The mode opts asks for (*mode) and the table the engine runs: the mode's, wrapped as
 * opts asks (bitwise mode). */
dt_status dt_dp_strategy_for(const dt_dp_opts *o, const dt_dp_strategy **mode, dt_dp_strategy *run);
/* bitwise.c: replaces the entries bitwise mode changes (the leaves, folds and the
 * canonical norm around the mode's own operations). */
void dt_bitwise_wrap(dt_dp_strategy *s);

#endif
