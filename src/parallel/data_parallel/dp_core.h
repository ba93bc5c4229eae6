/* The engine's core state, shared by every strategy (strategy.h): the data-parallel
 * group, the model, the chosen tables, the in-flight request queue and the step's
 * communication time. Each strategy keeps its own state behind priv (flat.h for ps and
 * DDP, zero_shard.h for ZeRO), a wrapper behind wrap. */
#ifndef DT_DP_CORE_H
#define DT_DP_CORE_H
#include "data_parallel.h"

#include "../../core/timer.h"
#include "strategy.h"

enum { MAX_INFLIGHT = 64 };

struct dt_dp {
    dt_comm *comm;
    int N, rank;
    gpt_model *m;
    const dt_ops *ops;
    dt_adamw_hparams hp;
    dt_dp_opts o;
    long long step;
    int last_micro;          /* the step's last accumulation micro-step is running */
    size_t align;            /* ZeRO's unit padding: DT_SHARD_ALIGN, or a wrapper's (bitwise: its chunk) */
    dt_dp_strategy st;           /* the operations the engine runs: the mode's, maybe wrapped */
    const dt_dp_strategy *mode;  /* the mode's own (a wrapper calls them) */
    void *priv;                  /* the mode's state */
    void *wrap;                  /* the wrapper's state */
    dt_optimizer *opt;           /* the mode's optimizer (told which updates may be delayed) */
    /* gradient collectives started during backward (DDP buckets, ZeRO-1 units), oldest first */
    dt_request *inflight[MAX_INFLIGHT];
    int ninflight;
    size_t workspace_bytes; /* scratch the strategies hold (the memory report's workspace) */
    double comm_s;          /* wall time the steps waited on gradient/parameter communication */
    double update_s;        /* wall time of the updates (an offloaded optimizer's pass, its I/O included) */
    double grad_bytes;      /* gradient bytes the steps so far put into data-parallel reductions (fp32) */
    double param_bytes;     /* parameter bytes the steps so far all-gathered (ZeRO: the units whole, fp32) */
    struct dt_stale *stale; /* parallel.staleness > 0: the gradients waiting to be applied (staleness.h) */
};

/* A free slot in d->inflight for a new request (the oldest is finished first when full). */
dt_status dt_dp_inflight_slot(dt_dp *d, dt_request ***slot);
/* Finishes every request in d->inflight, charging the wait to d->comm_s; first error wins. */
dt_status dt_dp_inflight_wait(dt_dp *d);
/* The model's parameter views pointed at another copy of the full parameters (an fp32
 * host copy for init, load, save and the digest; ZeRO's gathered ones), the previous
 * views kept to be restored: unit u at base + off[u] elements of elem bytes (off NULL: the
 * model's own flat offsets). pop restores them (nothing pushed: nothing to do). */
typedef struct {
    float **saved;
} dt_dp_views;
dt_status dt_dp_views_push(dt_dp *d, dt_dp_views *v, float *base, const size_t *off, size_t elem);
void dt_dp_views_pop(dt_dp *d, dt_dp_views *v);
/* Reductions for the gradient norm (optimizer.h's dt_grad_norm_of) of pieces complete
 * over the data-parallel group: over the model-parallel groups (state.h's classes); and of
 * pieces this rank holds of a data-parallel shard: summed over the data-parallel group
 * first (one class, or state.h's with model parallelism). */
dt_norm_reduce dt_dp_norm_over_model(dt_dp *d);
dt_norm_reduce dt_dp_norm_over_dp(dt_dp *d);
/* The weights (moments: and the optimizer moments) one unit at a time through fp32 host
 * memory of the largest unit (len[u] elements each: the unit and any padding, zeroed; len
 * NULL: the units' own sizes), so
 * the whole model is never in one rank's memory: from NULL, GPT-2's initialisation (the
 * same values as a whole-model init: each element's is a function of its global index,
 * gpt.h); else a weights file or a checkpoint step directory (moments: its optimizer
 * moments too), read a unit at a time. put keeps what this rank holds of unit u from
 * sets[0..nsets) (weights, exp_avg, exp_avg_sq). Collective (the buffer's allocation is
 * agreed). */
typedef dt_status (*dt_dp_unit_put)(dt_dp *d, void *ctx, int u, float *const *sets, int nsets);
dt_status dt_dp_by_unit(dt_dp *d, uint64_t seed, const char *from, int moments, const size_t *len,
                        dt_dp_unit_put put, void *ctx);
/* A pipeline's end stage: unit 0 holds the tied wte, whose gradient is final only after
 * its sum with the other end's (state.h dt_state_tie_grads; ZeRO's tie_unit0). Both ends
 * lay unit 0 out alike (gpt.h's tied_gap). */
int dt_dp_tied(const dt_dp *d);
/* base + n storage-precision elements. */
static inline float *dt_dp_at(const dt_dp *d, const float *base, size_t n) {
    return (float *)((char *)base + n * dt_elem_bytes(d->ops));
}

/* Runs a communication statement and charges its wall time to d->comm_s. */
#define DP_COMM(d, stmt)                  \
    do {                                  \
        double dp_t0_ = dt_now();         \
        stmt;                             \
        (d)->comm_s += dt_now() - dp_t0_; \
    } while (0)

#endif
