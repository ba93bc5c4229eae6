/* The flat layout ps and DDP share (ps.c, ddp.c): every rank holds the whole model's
 * parameters and gradients in the model's table order, and (DDP; ps: the central rank
 * only) the optimizer state over them. */
#ifndef DT_DP_FLAT_H
#define DT_DP_FLAT_H
#include "dp_core.h"

/* A device's (bf16's, an offloaded optimizer's) state seen from the host: the model's unit
 * views (and the moment views) pointed at an fp32 host copy, made at save/load time only. */
typedef struct {
    float *p, *mom[2];
    dt_dp_views views;     /* unit_params at p: the device views, restored at close */
    float **mom_view[2];   /* the state's moment views (NULL: offloaded), restored at close */
    int swapped[2];        /* mom_view[k] holds the state's views, the host's are in place */
} dt_flat_host;

typedef struct {
    float *params, *grads;          /* storage precision, the backend's memory */
    dt_optimizer opt;               /* over the flat layout (moments NULL on the central rank's peers;
                                       bf16: master weights, params their bf16 copy) */
    float **m_view, **v_view;       /* the moments as unit views */
    float *grads_host; /* device state with several ranks, or bf16: the fp32 host copy the MPI collectives reduce */
    float *tie_host;   /* device state on a pipeline's end stages: the tied wte gradient's host copy */
    double *norm_parts;             /* DDP: every rank's partial sum of squares (N) */
    dt_grad_piece *pieces;          /* the norm's pieces with model parallelism (one per tensor) */
    /* DDP buckets: a contiguous range [lo, hi) of the flat gradient buffer grows downwards
     * as units finish (units finish in descending offset order). */
    size_t bucket_lo, bucket_hi;
    float *bucket32;                /* bf16 on the device communicator: one bucket's gradients, widened */
    size_t bucket32_bytes;
    dt_flat_host host;              /* open_full's host copy */
} dt_flat;

static inline dt_flat *dt_flat_of(const dt_dp *d) { return d->priv; }

/* The entries ps's and DDP's tables share. */
#define DT_FLAT_SHARED_OPS                                                                                 \
    .free = dt_flat_free, .begin_step = dt_flat_begin_step, .open_full = dt_flat_open_full,                 \
    .close_full = dt_flat_close_full, .init_weights = dt_flat_init_weights, .load = dt_flat_load,          \
    .memory = dt_flat_memory, .estimate = dt_flat_estimate, .ring = {{2, 0}, {2, 0}}

/* moments: this rank keeps optimizer state (ps: the central rank only). */
dt_status dt_flat_setup(dt_dp *d, int moments);
void dt_flat_free(dt_dp *d);
void dt_flat_begin_step(dt_dp *d);
/* The gradients into the fp32 host buffer the collectives reduce, and back (staging.h). */
void dt_flat_grads_to_host(dt_dp *d);
void dt_flat_grads_from_host(dt_dp *d);
/* A model-parallel rank's gradient norm (its gradients complete over the data-parallel
 * group): tied gradients summed over the stages, each tensor's squares in its class
 * (state.h), combined over the model-parallel groups. */
dt_status dt_flat_layout_norm(dt_dp *d, double *norm);
/* The norm of gradients this rank holds whole (model-parallel or not, no data-parallel
 * reduction). */
dt_status dt_flat_local_norm(dt_dp *d, double *norm);
/* AdamW over the whole flat buffer at step d->step + 1. */
dt_status dt_flat_update(dt_dp *d, double lr, double norm);
dt_status dt_flat_open_full(dt_dp *d, int moments, int snapshot, int reader, float ***mv, float ***vv);
dt_status dt_flat_close_full(dt_dp *d, float **mv, float **vv);
dt_status dt_flat_init_weights(dt_dp *d, uint64_t seed, const char *init_from);
dt_status dt_flat_load(dt_dp *d, const char *step_dir);
void dt_flat_memory(const dt_dp *d, dt_mem_report *r);
/* The flat layout on paper: 16 bytes per parameter (fp32: 4 + 4 + 8; bf16: 2 + 2 + the
 * fp32 master and Adam), and bf16's fp32 reduction copy (the CPU: the whole gradient; a
 * device communicator: one bucket). Per step, one all-reduce: two ring passes (ring). */
void dt_flat_estimate(const dt_dp_stage *s, double *state, double *work);

#endif
