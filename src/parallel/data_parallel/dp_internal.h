/* Shared between data_parallel.c (engine, ps, DDP) and zero.c (ZeRO 1/2/3). */
#ifndef DT_DP_INTERNAL_H
#define DT_DP_INTERNAL_H
#include "data_parallel.h"

#include "../../ckpt/async_save.h"
#include "../../core/timer.h"
#include "canonical.h"

enum { MAX_INFLIGHT = 64 };

struct dt_dp {
    dt_comm *comm;
    int N, rank;
    gpt_model *m;
    const dt_ops *ops;
    dt_adamw_hparams hp;
    dt_dp_opts o;
    long long step;
    int last_micro;
    int async_save;          /* checkpoint.async: rank 0 writes saves in a child (ckpt/async_save.h) */
    dt_ckpt_async save_job;  /* the save in flight */

    /* plain layout (ps, ddp): flat buffers from the model table */
    float *params, *grads, *exp_avg, *exp_avg_sq; /* exp_avg* NULL on non-root ps ranks */
    float *master;                                /* bf16: fp32 master weights (params is their bf16 copy) */
    float *grads_host; /* device state with several ranks: the host copy the MPI collectives reduce */
    float *tie_host;   /* device state on a pipeline's end stages: the tied wte gradient's host copy */
    float **m_view, **v_view;                     /* optimizer moments as unit views */

    /* DDP buckets: a contiguous range [lo, hi) of the flat gradient buffer grows downwards
     * as units finish (units finish in descending offset order). */
    size_t bucket_lo, bucket_hi;
    /* gradient collectives started during backward (DDP buckets, ZeRO-1 units), oldest first */
    dt_request *inflight[MAX_INFLIGHT];
    int ninflight;
    double *norm_parts; /* DDP: every rank's partial sum of squares (N) */

    /* ZeRO layout: unit u is padded to P[u] = N·S[u] elements; rank r owns elements
     * [r·S[u], (r+1)·S[u]) of it, stored at shard offset soff[u]. Parameters and
     * gradients (and their scratch and gathered copies) are in storage precision, the
     * moments and master weights fp32, all in the backend's memory. */
    size_t *P, *S, *poff, *soff;
    size_t shard_total, padded_total;
    float *params_pad;         /* zero 1/2: full parameters in the padded layout */
    float *grads_pad;          /* zero 1: full gradients in the padded layout, reduced in place */
    float *param_shard;        /* zero 3 */
    float *grad_shard;         /* zero 2/3 (zero 1's slice is in grads_pad: dt_zero_grad_slice) */
    float *m_shard, *v_shard;
    float *master_shard;       /* bf16: fp32 master weights of this rank's slices */
    /* staged (a device's or bf16 storage, staging.h): the collectives run on host copies */
    float *zhost;              /* fp32, the largest unit (node-shared: reduce-scatter input, all-gather output) */
    float *zslice;             /* fp32, the largest slice: the reduce-scatter's output */
    /* bf16 with device collectives: fp32 device copies the reductions run on */
    float *unit32;             /* ZeRO: the largest unit's gradients, widened */
    float *slice32;            /* ZeRO: the reduce-scatter's output */
    float *bucket32;           /* DDP: one bucket's gradients, widened */
    size_t bucket32_bytes;
    int full_host;             /* full_tmp is fp32 host memory (else the model's) */
    float *gscratch[4];        /* zero 2/3 gradient scratch: unit 0, ln_f, blocks (two, alternating, when their
                                  reduce-scatters overlap backward: rs_overlap) */
    float *pgather[4];         /* zero 3 gathered parameters: unit 0, ln_f, two block buffers */
    float *stage_full;         /* zero 3 with gather_once: every unit's parameters, gathered after each update */
    dt_request *prefetch;      /* zero 3: pending gather */
    int dprefetch;             /* zero 3: the pending gather is on the device communicator */
    int prefetch_unit;
    int held[4];               /* zero 3: unit currently in each gather buffer (-1: none) */
    float *rs_tmp;             /* zero 2/3: reduce-scatter output before accumulation */
    float *rs_alt;             /* rs_overlap: the other output buffer (they alternate) */
    int rs_pending;            /* rs_overlap: unit whose reduce-scatter into rs_alt is in flight (-1: none) */
    unsigned char *rs_started; /* zero 1: unit's reduce-scatter started during backward */
    dt_request **ag_pending;   /* zero 1/2: unit's parameter all-gather still in flight */
    float *full_tmp;           /* gather_full: temporary full padded parameters */
    float **saved_view;
    size_t workspace_bytes;
    double comm_s; /* wall time the step waited on gradient/parameter communication */

    /* bitwise mode (bitwise.c) */
    dt_fold fold;       /* over the flat grads (ps/ddp), padded grads (zero 1) or shard (zero 2/3), one
                           part per unit, and the head's share of wte on a model with both ends */
    unsigned char *bw_open; /* per part: its leaf of this micro-batch is being written */
    int *bw_key;        /* per unit: its place in the whole model's order (-1: not counted here) */
    float *bw_head;     /* zero 2/3: the head's share of wte in full, reduced when final */
    float *tree_tmp;    /* dt_tree_allreduce exchange buffer */
    double *canon_part; /* partial sums of squares for the canonical norm */
    double *canon_global; /* with a pipeline: the whole model's partials */
    size_t canon_global_n;
    double *bw_cnt;     /* with a pipeline: partials per key of the whole model */
    size_t *bw_first, *bw_num; /* per unit: where its partials start in canon_part, how many */
};

size_t dt_dp_align(const dt_dp *d);
/* A free slot in d->inflight for a new request (the oldest is finished first when full). */
dt_status dt_dp_inflight_slot(dt_dp *d, dt_request ***slot);
/* Finishes every request in d->inflight, charging the wait to d->comm_s; first error wins. */
dt_status dt_dp_inflight_wait(dt_dp *d);

/* Runs a communication statement and charges its wall time to d->comm_s. */
#define DP_COMM(d, stmt)                  \
    do {                                  \
        double dp_t0_ = dt_now();         \
        stmt;                             \
        (d)->comm_s += dt_now() - dp_t0_; \
    } while (0)
/* bitwise.c: the bitwise mode's leaves, folds and norm (hooks routed here in that mode). */
dt_status dt_bw_setup(dt_dp *d);
void dt_bw_free(dt_dp *d);
void dt_bw_begin_step(dt_dp *d);
dt_status dt_bw_before_backward(dt_dp *d, int u);
dt_status dt_bw_after_backward(dt_dp *d, int u);
/* After the step's micro-batches: this rank's reduced gradients (flat, zero-1 slices or
 * shard) from the folds, the tied wte's shares added, and the canonical norm. */
dt_status dt_bw_finish(dt_dp *d, double *norm);

/* zero.c */
dt_status dt_zero_setup(dt_dp *d);
void dt_zero_free(dt_dp *d);
void dt_zero_begin_step(dt_dp *d);
dt_status dt_zero_end_step(dt_dp *d, double lr, double *grad_norm);
/* The model's hooks in ZeRO modes: gathers (stage 3), waits for the update's all-gather
 * (stages 1-2), gradient reduce-scatters; a failed collective is returned. */
dt_status dt_zero_before_forward(dt_dp *d, int u);
dt_status dt_zero_before_backward(dt_dp *d, int u);
dt_status dt_zero_after_backward(dt_dp *d, int u);
dt_status dt_zero_init_weights(dt_dp *d, uint64_t seed, const char *init_from);
dt_status dt_zero_load(dt_dp *d, const char *step_dir);
/* The full parameters as the model's unit views until dt_zero_release_full: in the
 * model's memory and precision (host = 0: for running it), or as fp32 host memory
 * (host = 1: for checkpoints and the digest; with bf16, the master weights; host = 2: the
 * same, and in private memory even where the parameters are whole already, which on the
 * CPU are node-shared: an asynchronous save's fork snapshots private pages only). */
dt_status dt_zero_gather_full(dt_dp *d, int host);
void dt_zero_release_full(dt_dp *d);
/* Full optimizer moments as unit views (temporary buffers, freed by dt_zero_free_views). */
dt_status dt_zero_full_moments(dt_dp *d, float ***m_view, float ***v_view);
void dt_zero_free_views(float **m_view, float **v_view);
void dt_zero_memory(const dt_dp *d, dt_mem_report *r);
/* A streamed save's or digest's source (checkpoint.h: dt_ckpt_source): the fp32 weights
 * (bf16: the master weights) or moments of one unit at a time, gathered whole over the
 * data-parallel group into one buffer of the largest unit when its first tensor is asked
 * for, so a save needs that much more memory, not the model's; collective. */
typedef struct {
    dt_dp *d;
    float *buf;
    int set, unit; /* what buf holds (-1: nothing) */
} dt_zero_stream;
dt_status dt_zero_stream_open(dt_dp *d, dt_zero_stream *z, dt_ckpt_source *src, int moments);
void dt_zero_stream_close(dt_zero_stream *z);
/* This rank's S[u] reduced gradients of unit u after the step's reduction: its slice of
 * the padded full gradients (zero 1, reduced there in place) or of the shard (zero 2/3). */
float *dt_zero_grad_slice(const dt_dp *d, int u);

#endif
