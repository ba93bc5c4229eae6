/* What the ZeRO stages share (zero_shard.c; the stages: zero1.c, zero2.c, zero3.c). Unit
 * u is padded to P[u] = N·S[u] elements and rank r owns elements [r·S[u], (r+1)·S[u]) of
 * it, stored at shard offset soff[u] (in the padded full layout, at poff[u]). Parameters
 * and gradients (and their scratch and gathered copies) are in storage precision, the
 * moments and master weights fp32, all in the backend's memory. */
#ifndef DT_DP_ZERO_SHARD_H
#define DT_DP_ZERO_SHARD_H
#include "dp_core.h"

/* ZeRO-3's gathered parameters (zero3.c). */
typedef struct {
    float *pgather[4];    /* unit 0, ln_f, two block buffers */
    float *stage_full;    /* with gather_once: every unit's parameters, gathered after each update */
    dt_request *prefetch; /* pending gather */
    int dprefetch;        /* the pending gather is on the device communicator */
    int prefetch_unit;
    int held[4];          /* unit currently in each gather buffer (-1: none) */
    dt_status fetch_err;  /* the pending gather's slice could not be read from the offload store */
    unsigned char *keep;  /* per unit: parallel.policy's zero2 among zero3's: kept whole, gathered once after each
                             update into kept (NULL: none) */
    float *kept;          /* those units' parameters, whole, one after the other */
} dt_zero3_gathers;

typedef struct {
    int stage;                 /* 1, 2 or 3 */
    size_t *P, *S, *poff, *soff;
    size_t shard_total, padded_total;
    float *params_pad;         /* zero 1/2: full parameters in the padded layout */
    float *grads_pad;          /* zero 1: full gradients in the padded layout, reduced in place */
    float *param_shard;        /* zero 3 (NULL: offloaded, in pstore) */
    dt_store *pstore;          /* zero 3 with offload.param: the parameter shard (storage precision) off the model's memory */
    void *ptmp;                /* pstore: host room for the largest slice in storage precision */
    float *grad_shard;         /* zero 2/3 (zero 1's slice is in grads_pad: dt_zero_grad_slice) */
    dt_optimizer opt;          /* over the shard (bf16: with the fp32 master weights of this rank's slices) */
    /* staged (a device's or bf16 storage, staging.h): the collectives run on host copies */
    float *zhost;              /* fp32, the largest unit (node-shared: reduce-scatter input, all-gather output) */
    float *zslice;             /* fp32, the largest slice: the reduce-scatter's output */
    /* bf16 with device collectives: fp32 device copies the reductions run on */
    float *unit32;             /* the largest unit's gradients, widened */
    float *slice32;            /* the reduce-scatter's output */
    float *gscratch[4];        /* zero 2/3 gradient scratch: unit 0, ln_f, blocks (two, alternating, when their
                                  reduce-scatters overlap backward: dt_zero_rs_overlap) */
    float *rs_tmp;             /* zero 2/3: reduce-scatter output before accumulation */
    float *rs_alt;             /* rs_overlap: the other output buffer (they alternate) */
    int rs_pending;            /* rs_overlap: unit whose reduce-scatter into rs_alt is in flight (-1: none) */
    int rs_pending_final;      /* ... queued in the last micro-step: the slice is final once added */
    unsigned char *rs_started; /* zero 1: unit's reduce-scatter started during backward */
    dt_request **ag_pending;   /* zero 1/2: unit's parameter all-gather still in flight */
    dt_request **rep_pending;  /* HSDP, zero 2/3: unit's final slice summed over the replicas, in flight */
    struct {
        int host;              /* tmp is fp32 host memory (else the model's) */
        float *tmp;            /* gather_full: temporary full padded parameters */
        dt_dp_views view;      /* the model's units at tmp */
    } full;
    dt_grad_piece *pieces;     /* the norm's pieces (max(tensors, units)): allocated once, so no rank fails alone */
    unsigned char *repl;       /* per unit: replicated (parallel.policy's ddp): S = P, every rank owns the whole
                                  unit, its gradients all-reduced, nothing gathered (NULL: none) */
    dt_zero3_gathers g3;
} dt_zero;

static inline dt_zero *dt_zero_of(const dt_dp *d) { return d->priv; }
/* the model's memory is not fp32 host memory: a device's, or bf16 */
int dt_zero_devmem(const dt_dp *d);
/* its collectives go through host copies (no device communicator) */
int dt_zero_staged(const dt_dp *d);
/* zero 2/3 on the device communicator in fp32: each unit's reduce-scatter runs while the
 * next unit's backward computes, into alternating buffers (zero2.c) */
int dt_zero_rs_overlap(const dt_dp *d);
/* zero 2/3: which gradient scratch unit u writes */
int dt_zero_gscratch_of(const dt_dp *d, int u);
/* Where this rank's slice of unit u starts in it: rank x S[u], or 0 for a replicated unit. */
static inline size_t dt_zero_lo(const dt_dp *d, int u) {
    const dt_zero *z = d->priv;
    return z->repl && z->repl[u] ? 0 : (size_t)d->rank * z->S[u];
}
static inline int dt_zero_repl(const dt_dp *d, int u) {
    const dt_zero *z = d->priv;
    return z->repl && z->repl[u];
}
/* zero 3: unit u is one of parallel.policy's zero2 units (kept whole between updates) */
static inline int dt_zero_keep(const dt_dp *d, int u) {
    const dt_zero *z = d->priv;
    return z->g3.keep && z->g3.keep[u];
}
/* ln_f's unit */
static inline int dt_zero_lnf(const dt_dp *d) { return gpt_lnf_unit(d->m); }

/* zero_shard.c */
dt_status dt_zero_setup(dt_dp *d, int stage);
void dt_zero_free(dt_dp *d);
/* This rank's slice of unit u as fp32 host values, set 0: the weights AdamW updates (the
 * master weights, or the parameters), 1 and 2: the moments, wherever the optimizer keeps
 * them (the backend's memory or an offload store). */
dt_status dt_zero_get_slice(dt_dp *d, int set, int u, float *dst);
/* This rank's S[u] reduced gradients of unit u after the step's reduction: its slice of
 * the padded full gradients (zero 1, reduced there in place) or of the shard (zero 2/3). */
float *dt_zero_grad_slice(const dt_dp *d, int u);
/* Unit u's gradients (P[u]) summed over the ranks in fp32, this rank's slice into out
 * (S[u], may be the slice inside unit): through host copies (staged) or on the device
 * communicator (joined if join; else the caller joins before compute touches out). */
dt_status dt_zero_staged_reduce_scatter(dt_dp *d, int u, const float *unit, float *out);
dt_status dt_zero_direct_reduce_scatter(dt_dp *d, int u, const float *unit, float *out, int join);
/* Unit u all-gathered from each rank's slice own into unit (the caller joins); a
 * replicated unit: own copied (nothing when it is unit). */
dt_status dt_zero_gather_one(dt_dp *d, int u, const float *own, float *unit);
/* zero 3: unit u's parameters from each rank's slice of the parameter shard (in the
 * model's memory, or read from the offload store first) into unit (the caller joins). */
dt_status dt_zero3_gather_own(dt_dp *d, int u, float *unit);
/* zero 3: this rank's slice of unit u read from the offload store into the place it takes
 * in unit (host memory, before an in-place all-gather). */
dt_status dt_zero3_fetch_own(dt_dp *d, int u, float *unit);
/* Every unit's parameters from each rank's slices (dt_zero3_gather_own) into the padded full buffer. */
dt_status dt_zero_gather_units(dt_dp *d, float *full);
/* zero 1/2: waits for unit u's (every unit's) parameter all-gather in flight. */
dt_status dt_zero_settle_unit(dt_dp *d, int u);
dt_status dt_zero_settle_all(dt_dp *d);
/* The global norm of the reduced gradients (tied wte summed over a pipeline's end stages
 * first); collective. */
dt_status dt_zero_norm(dt_dp *d, double *norm);
/* AdamW over this rank's slices. */
dt_status dt_zero_adamw(dt_dp *d, double lr, double norm);
dt_status dt_zero_init_weights(dt_dp *d, uint64_t seed, const char *init_from);
dt_status dt_zero_load(dt_dp *d, const char *step_dir);
/* The full parameters as the model's unit views, in its memory and precision, until
 * dt_zero_release_full. */
dt_status dt_zero_gather_full(dt_dp *d);
void dt_zero_release_full(dt_dp *d);
dt_status dt_zero_open_full(dt_dp *d, int moments, int snapshot, int reader, float ***mv, float ***vv);
dt_status dt_zero_close_full(dt_dp *d, float **mv, float **vv);
/* A streamed save's or digest's source (zero_stream.c): the fp32 weights (bf16: the master weights) or
 * moments of one unit at a time, gathered whole over the data-parallel group into one
 * buffer of the largest unit when its first tensor is asked for, so a save needs that
 * much more memory, not the model's; collective. */
dt_status dt_zero_source_open(dt_dp *d, int moments, int reader, dt_ckpt_source *src);
void dt_zero_source_close(dt_dp *d, dt_ckpt_source *src);
void dt_zero_memory(const dt_dp *d, dt_mem_report *r);

/* The entries every stage's table shares. */
#define DT_ZERO_SHARED_OPS                                                                                 \
    .free = dt_zero_free, .gather_full = dt_zero_gather_full, .release_full = dt_zero_release_full,         \
    .open_full = dt_zero_open_full, .close_full = dt_zero_close_full, .source_open = dt_zero_source_open, \
    .source_close = dt_zero_source_close, .memory = dt_zero_memory, .sharded = 1, \
    .estimate = dt_zero_estimate
/* zero 1/2: AdamW over the slices, then the parameters all-gathered. */
dt_status dt_zero_update_gather(dt_dp *d, double lr, double norm);
/* zero 1/2: the parameters all-gathered again (this rank's slices changed outside an
 * update: a delayed update applied), waited for. */
dt_status dt_zero_redistribute(dt_dp *d);

/* A stage's units on paper (embedding, the largest block unit, ln_f:
 * gpt_unit_counts_layout), each padded to a multiple of shards x align (P), one rank's
 * slice of it (S); the totals count every block unit (both halves of a split block). */
typedef struct {
    double cnt[3], P[3], S[3];
    double flat, padded, shard; /* the stage's elements: as they are, padded, one rank's slices */
    int nb;                     /* block units (every stage holds one: dt_pp_split) */
    double maxS;                /* the largest slice */
    double gather;              /* ZeRO-3's gather buffers: the embeddings', ln_f's, two blocks' (none for a
                                   replicated unit: parallel.policy's ddp; S = P for those) */
} dt_zero_units;
dt_zero_units dt_zero_units_of(const dt_dp_stage *s);
/* Rank r's frozen elements among its slices (unit u's S[u] at shard offset soff[u]): the
 * whole slices of a unit whose tensors are all frozen (padding too, so every rank holds
 * alike), else the frozen tensors' parts; as ranges in shard order into out (NULL: only
 * counted; room for ntensors + nunits), *n of them. Returns the elements: what gets no
 * optimizer moments (zero_shard.c's setup, and the estimate). */
double dt_zero_frozen_ranges(const gpt_model *m, const size_t *S, const size_t *soff, const unsigned char *repl,
                             size_t r, dt_opt_range *out, int *n);
/* parallel.policy's replicated units of m (repl[u] = 1 for a ddp unit) from policy's rules
 * (zero: the unmatched units' mode); policy NULL: none. keep (NULL: not wanted): 1 for a
 * zero2 unit where other units are zero3 (its parameters kept whole, gathered once a step). */
dt_status dt_zero_policy_repl(const char *policy, int zero, const gpt_model *m, unsigned char *repl,
                              unsigned char *keep);
/* The estimate of a ZeRO stage (strategy.h), from what its table says it keeps whole (in
 * the padded layout) or as this rank's shard: the gradients (grads), the parameters
 * (params_shard: then gathered for use). All of it state: the buffers count there. */
void dt_zero_estimate(const dt_dp_stage *s, double *state, double *work);

/* zero2.c: the gradient shard, shared by ZeRO-3 */
void dt_zero2_begin_step(dt_dp *d);
dt_status dt_zero2_before_backward(dt_dp *d, int u);
dt_status dt_zero2_after_backward(dt_dp *d, int u);
/* rs_overlap: the reduce-scatter in flight, joined, and its slice added to the shard. */
dt_status dt_zero2_finish_pending(dt_dp *d);
dt_status dt_zero2_reduce(dt_dp *d, double *norm);

/* zero3.c */
/* which gather buffer holds unit u */
int dt_zero3_gbuf(const dt_dp *d, int u);

/* HSDP: unit u's slice of the shard is final (its last micro-step's reduce-scatter added):
 * its sum over the replicas posted now, waited on in the norm (zero 2/3). */
dt_status dt_zero_replicas_post(dt_dp *d, int u);

#endif
