/* ZeRO stages 1-3 (seed 003: 16Ψ -> 4Ψ+12Ψ/N -> 2Ψ+14Ψ/N -> 16Ψ/N with bf16; here the
 * fp32 analogues, see docs/parallelism.md). Sharding is per model unit, like FSDP's
 * flat parameters: unit u is padded to P[u] = N·S[u] elements and rank r owns the
 * slice [r·S[u], (r+1)·S[u]), so every unit's reduce-scatter and all-gather are
 * equal-count collectives.
 *   ZeRO-1  full parameters and gradients; after accumulation each unit's gradients are
 *           reduce-scattered in place (the rank's reduced slice replaces its own slice of
 *           the full buffer, so there is no separate gradient shard: 8Ψ+8Ψ/N in fp32),
 *           each rank updates its slice, parameters are all-gathered.
 *   ZeRO-2  gradients partitioned: each unit's gradients are produced in a scratch buffer,
 *           reduce-scattered as soon as the unit's backward is done and accumulated into
 *           the rank's gradient shard; no full-size gradient buffer exists.
 *   ZeRO-3  parameters partitioned too (FSDP): each block is all-gathered just before its
 *           forward and again before its backward (the next block's gather is started
 *           while the current one computes), into two alternating buffers.
 * With bf16 storage the parameters and gradients above are bf16 and each rank keeps
 * fp32 master weights of its slices: the seed's 16Ψ -> 4Ψ+12Ψ/N -> 2Ψ+14Ψ/N -> 16Ψ/N.
 * A device's state (or bf16's) is staged (staging.h): each collective copies the unit
 * to fp32 host memory and back, gradients reduced in fp32, without overlap for now; or,
 * with a device communicator (comm.backend nccl), the collectives run on device memory,
 * bf16 gradients widened to an fp32 device copy first. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "dp_internal.h"
#include "staging.h"

static int nblocks(const dt_dp *d) { return d->m->nblocks; }
/* the model's memory is not fp32 host memory: a device's, or bf16 */
static int devmem(const dt_dp *d) { return dt_stage_needed(d->ops); }
/* its collectives go through host copies (no device communicator) */
static int staged(const dt_dp *d) { return devmem(d) && !d->o.dcomm; }
static size_t esz(const dt_dp *d) { return dt_elem_bytes(d->ops); }
/* base + n storage-precision elements */
static float *at(const dt_dp *d, float *base, size_t n) { return (float *)((char *)base + n * esz(d)); }
static dt_dtype storage_dtype(const dt_dp *d) { return d->ops->bf16 ? DT_BF16 : DT_F32; }
static dt_status gather_stage(dt_dp *d);
static int lnf_unit(const dt_dp *d) { return nblocks(d) + 1; }

/* The part of tensor t inside this rank's slice of its unit: *x0 its offset in the unit,
 * *n its length, *k its offset in the shard buffers; 0 when they do not meet. */
static int shard_segment(const dt_dp *d, const gpt_tensor *t, size_t *x0, size_t *n, size_t *k) {
    int u = t->unit;
    size_t a = t->offset - d->m->units[u].offset, b = a + t->numel;
    size_t lo = (size_t)d->rank * d->S[u], hi = lo + d->S[u];
    size_t s = a > lo ? a : lo, e = b < hi ? b : hi;
    if (s >= e) return 0;
    *x0 = s;
    *n = e - s;
    *k = d->soff[u] + (s - lo);
    return 1;
}

float *dt_zero_grad_slice(const dt_dp *d, int u) {
    if (d->o.zero == 1) return at(d, d->grads_pad, d->poff[u] + (size_t)d->rank * d->S[u]);
    return at(d, d->grad_shard, d->soff[u]);
}

/* Reduced gradient at unit-relative element x of this rank's slice of unit u. */
static float *slice_grad(const dt_dp *d, int u, size_t x) {
    return at(d, dt_zero_grad_slice(d, u), x - (size_t)d->rank * d->S[u]);
}

/* Parameters (storage precision) of this rank's slice of unit u, at unit-relative element x. */
static float *slice_param(const dt_dp *d, int u, size_t x) {
    if (d->o.zero <= 2) return at(d, d->params_pad, d->poff[u] + x);
    return at(d, d->param_shard, d->soff[u] + (x - (size_t)d->rank * d->S[u]));
}

/* The fp32 weights AdamW updates there: bf16's master weights, else the parameters. */
static float *slice_weights(const dt_dp *d, int u, size_t x) {
    if (!d->master_shard) return slice_param(d, u, x);
    return d->master_shard + d->soff[u] + (x - (size_t)d->rank * d->S[u]);
}

/* zero 3: which gather buffer holds unit u */
static int gbuf_of(const dt_dp *d, int u) { return u == 0 ? 0 : u == lnf_unit(d) ? 1 : 2 + (u - 1) % 2; }
/* zero 2/3 on the device communicator in fp32: each unit's reduce-scatter runs while the
 * next unit's backward computes, into alternating buffers, and is added to the shard at
 * the next unit's end (bf16's share one fp32 copy and run in turn) */
static int rs_overlap(const dt_dp *d) { return d->o.dcomm && !d->ops->bf16 && d->o.overlap && d->o.zero >= 2; }
/* zero 2/3: which gradient scratch unit u writes */
static int gscr_of(const dt_dp *d, int u) {
    return u == 0 ? 0 : u == lnf_unit(d) ? 1 : rs_overlap(d) ? 2 + (u - 1) % 2 : 2;
}

/* A buffer the collectives read in place: node-shared on the CPU (collective), else in
 * the backend's memory (rank-local). */
static dt_status alloc_unit_buffer(dt_dp *d, size_t bytes, const char *what, float **p) {
    if (devmem(d)) return d->ops->alloc((void **)p, bytes, what);
    return dt_comm_alloc_shared(d->comm, bytes, what, (void **)p);
}
static void free_unit_buffer(dt_dp *d, float *p) {
    if (devmem(d)) d->ops->free(p);
    else dt_comm_free_shared(d->comm, p);
}

/* The rank-local part of the setup: layout and private buffers (no communication). */
static dt_status zero_setup_local(dt_dp *d) {
    gpt_model *m = d->m;
    int U = m->nunits, N = d->N;
    size_t e = esz(d), f = sizeof(float);
    d->rs_pending = -1;
    d->P = calloc((size_t)U, sizeof(size_t));
    d->S = calloc((size_t)U, sizeof(size_t));
    d->poff = calloc((size_t)U, sizeof(size_t));
    d->soff = calloc((size_t)U, sizeof(size_t));
    if (!d->P || !d->S || !d->poff || !d->soff) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    size_t A = (size_t)N * dt_dp_align(d), maxS = 0;
    for (int u = 0; u < U; u++) {
        d->P[u] = (m->units[u].count + A - 1) / A * A;
        d->S[u] = d->P[u] / (size_t)N;
        d->poff[u] = d->padded_total;
        d->soff[u] = d->shard_total;
        d->padded_total += d->P[u];
        d->shard_total += d->S[u];
        if (d->S[u] > maxS) maxS = d->S[u];
    }
    /* zero 1 reduce-scatters in place into its full gradients: no shard, no staging */
    if (d->o.zero >= 2) {
        DT_TRY(d->ops->alloc((void **)&d->grad_shard, d->shard_total * e, "gradient shard"));
        DT_TRY(d->ops->alloc((void **)&d->rs_tmp, maxS * e, "reduce-scatter buffer"));
        d->workspace_bytes = maxS * e;
        if (rs_overlap(d)) {
            DT_TRY(d->ops->alloc((void **)&d->rs_alt, maxS * e, "reduce-scatter buffer"));
            d->workspace_bytes += maxS * e;
        }
    }
    DT_TRY(d->ops->alloc((void **)&d->m_shard, d->shard_total * f, "AdamW first moments (shard)"));
    DT_TRY(d->ops->alloc((void **)&d->v_shard, d->shard_total * f, "AdamW second moments (shard)"));
    if (d->ops->bf16) DT_TRY(d->ops->alloc((void **)&d->master_shard, d->shard_total * f, "fp32 master weights (shard)"));
    if (d->o.zero <= 2) {
        d->ag_pending = calloc((size_t)U, sizeof(dt_request *));
        if (!d->ag_pending) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    } else {
        DT_TRY(d->ops->alloc((void **)&d->param_shard, d->shard_total * e, "parameter shard"));
    }
    if (d->o.zero == 1) {
        d->rs_started = calloc((size_t)U, 1);
        if (!d->rs_started) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    }
    if (staged(d)) {
        DT_TRY(dt_alloc((void **)&d->zslice, maxS * f, "ZeRO host staging (slice)"));
        if (!d->ops->on_device) d->workspace_bytes += maxS * f; /* host memory is the state's memory here */
    }
    if (d->o.dcomm && d->ops->bf16) { /* fp32 reductions of bf16 gradients, on the device */
        size_t maxP = 0;
        for (int u = 0; u < U; u++) maxP = d->P[u] > maxP ? d->P[u] : maxP;
        DT_TRY(d->ops->alloc((void **)&d->unit32, maxP * f, "fp32 gradients for the reduction"));
        DT_TRY(d->ops->alloc((void **)&d->slice32, maxS * f, "fp32 reduce-scatter output"));
        d->workspace_bytes += (maxP + maxS) * f;
    }
    return DT_OK;
}

/* The buffers the model's views point at: full parameters (zero 1/2) or gathered ones
 * (zero 3), full gradients (zero 1) or gradient scratch (zero 2/3). */
static dt_status alloc_model_buffers(dt_dp *d) {
    gpt_model *m = d->m;
    int U = m->nunits, z = d->o.zero;
    size_t e = esz(d);
    if (z <= 2) {
        /* node-shared where peers read it: the all-gather into it reads peers' copies in place */
        DT_TRY(alloc_unit_buffer(d, d->padded_total * e, "parameters", &d->params_pad));
        for (int u = 0; u < U; u++) m->unit_params[u] = at(d, d->params_pad, d->poff[u]);
    } else if (d->o.gather_once) {
        DT_TRY(alloc_unit_buffer(d, d->padded_total * e, "gathered parameters", &d->stage_full));
        d->workspace_bytes += d->padded_total * e;
        for (int u = 0; u < U; u++) m->unit_params[u] = at(d, d->stage_full, d->poff[u]);
    } else {
        size_t sizes[4] = {d->P[0], d->P[lnf_unit(d)], d->P[1], d->P[1]};
        for (int b = 0; b < 4; b++) {
            DT_TRY(alloc_unit_buffer(d, sizes[b] * e, "gathered parameters", &d->pgather[b]));
            d->workspace_bytes += sizes[b] * e;
            d->held[b] = -1;
        }
        for (int u = 0; u < U; u++) m->unit_params[u] = d->pgather[gbuf_of(d, u)];
        d->prefetch_unit = -1;
    }
    if (z == 1) {
        DT_TRY(alloc_unit_buffer(d, d->padded_total * e, "gradients", &d->grads_pad));
        for (int u = 0; u < U; u++) m->unit_grads[u] = at(d, d->grads_pad, d->poff[u]);
    } else {
        size_t sizes[4] = {d->P[0], d->P[lnf_unit(d)], d->P[1], d->P[1]};
        for (int b = 0; b < (rs_overlap(d) ? 4 : 3); b++) {
            DT_TRY(alloc_unit_buffer(d, sizes[b] * e, "gradient scratch", &d->gscratch[b]));
            d->workspace_bytes += sizes[b] * e;
        }
        for (int u = 0; u < U; u++) m->unit_grads[u] = d->gscratch[gscr_of(d, u)];
    }
    return DT_OK;
}

dt_status dt_zero_setup(dt_dp *d) {
    gpt_model *m = d->m;
    /* staged, the model's buffers are rank-local; else node-shared, allocated collectively
     * below, so every rank must get there */
    dt_status s = zero_setup_local(d);
    if (s == DT_OK && devmem(d)) s = alloc_model_buffers(d);
    DT_TRY(dt_comm_agree(d->comm, s, NULL));
    if (!devmem(d)) {
        DT_TRY(alloc_model_buffers(d));
    } else if (staged(d)) {
        size_t maxP = 0;
        for (int u = 0; u < m->nunits; u++) maxP = d->P[u] > maxP ? d->P[u] : maxP;
        DT_TRY(dt_comm_alloc_shared(d->comm, maxP * sizeof(float), "ZeRO host staging", (void **)&d->zhost));
        if (!d->ops->on_device) d->workspace_bytes += maxP * sizeof(float);
    }
    m->params = m->grads = NULL; /* no flat layout in ZeRO modes */
    return DT_OK;
}

/* zero 1/2: waits for unit u's parameter all-gather, if one is in flight. */
static dt_status settle_unit(dt_dp *d, int u) {
    if (!d->ag_pending || !d->ag_pending[u]) return DT_OK;
    dt_status s;
    DP_COMM(d, s = dt_wait(d->ag_pending[u]));
    d->ag_pending[u] = NULL;
    return s;
}

/* zero 1/2: waits for every parameter all-gather still in flight; first error wins. */
static dt_status settle_all(dt_dp *d) {
    dt_status s = DT_OK;
    for (int u = 0; d->ag_pending && u < d->m->nunits; u++) {
        dt_status w = settle_unit(d, u);
        if (s == DT_OK) s = w;
    }
    return s;
}

static void pop_full_view(dt_dp *d);

void dt_zero_free(dt_dp *d) {
    if (d->prefetch) dt_wait(d->prefetch);
    settle_all(d);
    pop_full_view(d);
    free(d->ag_pending);
    /* collective for node-shared buffers: every rank frees in this order */
    free_unit_buffer(d, d->params_pad);
    free_unit_buffer(d, d->grads_pad);
    d->ops->free(d->param_shard);
    d->ops->free(d->grad_shard);
    d->ops->free(d->m_shard);
    d->ops->free(d->v_shard);
    d->ops->free(d->master_shard);
    d->ops->free(d->rs_tmp); /* the trainer drained or aborted the device communicator first */
    d->ops->free(d->rs_alt);
    for (int b = 0; b < 4; b++) free_unit_buffer(d, d->gscratch[b]);
    for (int b = 0; b < 4; b++) free_unit_buffer(d, d->pgather[b]);
    free_unit_buffer(d, d->stage_full);
    dt_comm_free_shared(d->comm, d->zhost);
    dt_free(d->zslice);
    d->ops->free(d->unit32);
    d->ops->free(d->slice32);
    free(d->rs_started);
    free(d->P);
    free(d->S);
    free(d->poff);
    free(d->soff);
}

/* ---- staged collectives (staging.h): through host memory, one unit at a time ---- */

/* Unit u all-gathered from every rank's slice own (S[u] elements) into unit (P[u]), both
 * in storage precision in the backend's memory; own may lie inside unit. */
static dt_status staged_gather(dt_dp *d, int u, const float *own, float *unit) {
    size_t e = esz(d), S = d->S[u];
    char *h = (char *)d->zhost, *mine = h + (size_t)d->rank * S * e;
    d->ops->download(mine, own, S * e);
    DT_TRY(dt_allgather(d->comm, mine, h, S, storage_dtype(d)));
    d->ops->upload(unit, h, d->P[u] * e);
    return DT_OK;
}

/* Unit u's gradients (P[u], storage precision) summed over the ranks in fp32; this
 * rank's slice of the sum, rounded to storage precision, into out (S[u] elements, which
 * may be the slice inside unit). */
static dt_status staged_reduce_scatter(dt_dp *d, int u, const float *unit, float *out) {
    dt_stage_widen(d->ops, d->zhost, unit, d->P[u]);
    DT_TRY(dt_reduce_scatter(d->comm, d->zhost, d->zslice, d->S[u], DT_F32, DT_SUM));
    dt_stage_narrow(d->ops, out, d->zslice, d->S[u]);
    return DT_OK;
}

/* ---- device collectives (comm.backend nccl): on device memory ---- */

/* Unit u's gradients summed over the ranks in fp32, this rank's slice into out (storage
 * precision; may be the slice inside unit). fp32 runs in place on the communicator's
 * stream, joined if `join` (else the caller joins before compute touches out); bf16 goes
 * through the fp32 device copies, joined before rounding. */
static dt_status direct_reduce_scatter(dt_dp *d, int u, const float *unit, float *out, int join) {
    dt_dcomm *dc = d->o.dcomm;
    if (!d->ops->bf16) {
        DT_TRY(dt_dcomm_reduce_scatter(dc, unit, out, d->S[u], DT_F32, DT_SUM));
        return join ? dt_dcomm_join(dc) : DT_OK;
    }
    d->ops->from_bf16(d->unit32, unit, d->P[u]);
    DT_TRY(dt_dcomm_reduce_scatter(dc, d->unit32, d->slice32, d->S[u], DT_F32, DT_SUM));
    DT_TRY(dt_dcomm_join(dc));
    d->ops->to_bf16(out, d->slice32, d->S[u]);
    return DT_OK;
}

/* Unit u all-gathered from each rank's slice own into unit (the caller joins). */
static dt_status gather_one(dt_dp *d, int u, const float *own, float *unit) {
    if (d->o.dcomm) return dt_dcomm_allgather(d->o.dcomm, own, unit, d->S[u], storage_dtype(d));
    if (staged(d)) return staged_gather(d, u, own, unit);
    return dt_allgather(d->comm, own, unit, d->S[u], DT_F32);
}

/* The parameters of every unit, from each rank's slices in shard (storage precision,
 * the model's memory), into the padded full buffer full. */
static dt_status gather_units(dt_dp *d, float *shard, float *full) {
    for (int u = 0; u < d->m->nunits; u++) DT_TRY(gather_one(d, u, at(d, shard, d->soff[u]), at(d, full, d->poff[u])));
    return d->o.dcomm ? dt_dcomm_join(d->o.dcomm) : DT_OK;
}

/* fp32 slices in the backend's memory (slice(u): unit u's) gathered whole into fp32 host
 * memory full (padded layout): each rank's slice copied to its place, then gathered in place. */
static dt_status gather_units_f32(dt_dp *d, float *(*slice)(const dt_dp *, int), float *full) {
    for (int u = 0; u < d->m->nunits; u++) {
        float *mine = full + d->poff[u] + (size_t)d->rank * d->S[u];
        d->ops->download(mine, slice(d, u), d->S[u] * sizeof(float));
        DT_TRY(dt_allgather(d->comm, mine, full + d->poff[u], d->S[u], DT_F32));
    }
    return DT_OK;
}

static float *weights_of(const dt_dp *d, int u) { return slice_weights(d, u, (size_t)d->rank * d->S[u]); }
static float *m_of(const dt_dp *d, int u) { return d->m_shard + d->soff[u]; }
static float *v_of(const dt_dp *d, int u) { return d->v_shard + d->soff[u]; }

/* This rank's slices of an fp32 host buffer in the padded layout into slice(u) (fp32, the
 * backend's memory). */
static void put_slices(dt_dp *d, const float *full, float *(*slice)(const dt_dp *, int)) {
    for (int u = 0; u < d->m->nunits; u++)
        d->ops->upload(slice(d, u), full + d->poff[u] + (size_t)d->rank * d->S[u], d->S[u] * sizeof(float));
}

/* ---- ZeRO-3 gathers ---- */

static dt_status finish_prefetch(dt_dp *d) {
    if (!d->prefetch && !d->dprefetch) return DT_OK;
    dt_status s;
    if (d->dprefetch) DP_COMM(d, s = dt_dcomm_join_mark(d->o.dcomm)); /* not the reduce-scatters queued since */
    else DP_COMM(d, s = dt_wait(d->prefetch));
    d->prefetch = NULL;
    d->dprefetch = 0;
    d->held[gbuf_of(d, d->prefetch_unit)] = s == DT_OK ? d->prefetch_unit : -1;
    d->prefetch_unit = -1;
    return s;
}

static dt_status gather_unit(dt_dp *d, int u) {
    if (d->o.gather_once) return DT_OK; /* the whole stage is in place */
    int b = gbuf_of(d, u);
    if ((d->prefetch || d->dprefetch) && d->prefetch_unit == u) return finish_prefetch(d);
    if (d->held[b] == u) return DT_OK;
    DT_TRY(finish_prefetch(d)); /* one collective in flight at a time keeps ranks in step */
    d->held[b] = -1;
    dt_status s;
    DP_COMM(d, s = gather_one(d, u, at(d, d->param_shard, d->soff[u]), d->pgather[b]));
    if (s == DT_OK && d->o.dcomm) s = dt_dcomm_join(d->o.dcomm);
    DT_TRY(s);
    d->held[b] = u;
    return DT_OK;
}

static void prefetch_unit(dt_dp *d, int u) {
    /* staged gathers are not prefetched (their upload follows the collective) */
    if (u < 1 || u > nblocks(d) || d->prefetch || d->dprefetch || d->o.gather_once || staged(d)) return;
    int b = gbuf_of(d, u);
    if (d->held[b] == u) return;
    d->held[b] = -1;
    if (d->o.dcomm) { /* queued behind the compute so far (the buffer's last reader); joined when needed */
        if (gather_one(d, u, at(d, d->param_shard, d->soff[u]), d->pgather[b]) != DT_OK ||
            dt_dcomm_mark(d->o.dcomm) != DT_OK)
            return; /* gathered again, blocking, when needed */
        d->dprefetch = 1;
        d->prefetch_unit = u;
        return;
    }
    if (dt_iallgather(d->comm, d->param_shard + d->soff[u], d->pgather[b], d->S[u], DT_F32, &d->prefetch) == DT_OK)
        d->prefetch_unit = u;
    else
        d->prefetch = NULL; /* fall back to a blocking gather when the unit is needed */
}

dt_status dt_zero_before_forward(dt_dp *d, int u) {
    if (d->o.zero < 3) return settle_unit(d, u); /* the update's all-gather of this unit */
    DT_TRY(gather_unit(d, u));
    if (u >= 1 && u <= nblocks(d)) prefetch_unit(d, u + 1);
    return DT_OK;
}

/* rs_overlap: the reduce-scatter in flight, joined, and its slice added to the shard. */
static dt_status finish_pending_rs(dt_dp *d) {
    if (d->rs_pending < 0) return DT_OK;
    int p = d->rs_pending;
    d->rs_pending = -1;
    dt_status s;
    DP_COMM(d, s = dt_dcomm_join(d->o.dcomm));
    DT_TRY(s);
    float *dst = at(d, d->grad_shard, d->soff[p]);
    d->ops->add(dst, dst, d->rs_alt, d->S[p]);
    return DT_OK;
}

dt_status dt_zero_before_backward(dt_dp *d, int u) {
    if (d->o.zero >= 3) {
        DT_TRY(gather_unit(d, u));
        if (u >= 1 && u <= nblocks(d)) prefetch_unit(d, u - 1);
    }
    if (d->o.zero >= 2) {
        /* a reduce-scatter still reading this scratch (unit 0's, from the last micro-step) ends first */
        if (d->rs_pending >= 0 && gscr_of(d, d->rs_pending) == gscr_of(d, u)) DT_TRY(finish_pending_rs(d));
        d->ops->zero(d->m->unit_grads[u], d->P[u] * esz(d));
    }
    return DT_OK;
}

/* zero 1: unit u's gradients, reduce-scattered in place: this rank's slice of the unit
 * becomes the sum over ranks, the other slices are left undefined (begin_step zeroes
 * them). Backward never touches a unit again after its after_backward hook. */
static dt_status zero1_reduce_scatter(dt_dp *d, int u, dt_request **req) {
    float *unit = at(d, d->grads_pad, d->poff[u]);
    if (d->o.dcomm) return direct_reduce_scatter(d, u, unit, dt_zero_grad_slice(d, u), 0); /* end_step joins */
    if (staged(d)) return staged_reduce_scatter(d, u, unit, dt_zero_grad_slice(d, u));
    if (req) return dt_ireduce_scatter(d->comm, unit, dt_zero_grad_slice(d, u), d->S[u], DT_F32, DT_SUM, req);
    return dt_reduce_scatter(d->comm, unit, dt_zero_grad_slice(d, u), d->S[u], DT_F32, DT_SUM);
}

/* zero 1: unit u's gradients are final (last micro-step): start its reduce-scatter now,
 * overlapping the rest of backward, as DDP does with buckets. A unit whose start fails is
 * reduce-scattered blocking in end_step (staged ones all are, and bf16's on the device
 * communicator, which share its fp32 copy). On the device communicator the collective is
 * queued on its stream, and end_step joins it. */
static dt_status zero1_after_backward(dt_dp *d, int u) {
    if (!d->last_micro || d->N == 1 || d->o.bitwise || !d->o.overlap || staged(d)) return DT_OK;
    if (d->o.dcomm) {
        if (d->ops->bf16) return DT_OK;
        DT_TRY(zero1_reduce_scatter(d, u, NULL));
        d->rs_started[u] = 1;
        return DT_OK;
    }
    dt_request **slot;
    DT_TRY(dt_dp_inflight_slot(d, &slot));
    DT_TRY(zero1_reduce_scatter(d, u, slot));
    d->ninflight++;
    d->rs_started[u] = 1;
    return DT_OK;
}

dt_status dt_zero_after_backward(dt_dp *d, int u) {
    if (d->o.zero == 1) return zero1_after_backward(d, u);
    if (d->o.zero < 2) return DT_OK;
    dt_status s;
    if (rs_overlap(d)) { /* the previous unit's slice added, this unit's queued behind its backward */
        DT_TRY(finish_pending_rs(d));
        DP_COMM(d, s = direct_reduce_scatter(d, u, d->m->unit_grads[u], d->rs_tmp, 0));
        DT_TRY(s);
        float *t = d->rs_tmp; /* in flight into rs_alt now; the next one goes to the other buffer */
        d->rs_tmp = d->rs_alt;
        d->rs_alt = t;
        d->rs_pending = u;
        return DT_OK;
    }
    /* reduce-scatter this unit's gradients now and keep only this rank's slice */
    if (d->o.dcomm) DP_COMM(d, s = direct_reduce_scatter(d, u, d->m->unit_grads[u], d->rs_tmp, 1));
    else if (staged(d)) DP_COMM(d, s = staged_reduce_scatter(d, u, d->m->unit_grads[u], d->rs_tmp));
    else DP_COMM(d, s = dt_reduce_scatter(d->comm, d->m->unit_grads[u], d->rs_tmp, d->S[u], DT_F32, DT_SUM));
    DT_TRY(s);
    float *dst = at(d, d->grad_shard, d->soff[u]);
    d->ops->add(dst, dst, d->rs_tmp, d->S[u]);
    return DT_OK;
}

/* ---- step ---- */

void dt_zero_begin_step(dt_dp *d) {
    if (d->o.zero == 1) d->ops->zero(d->grads_pad, d->padded_total * esz(d));
    else d->ops->zero(d->grad_shard, d->shard_total * esz(d));
}

/* Pipeline: the first and the last stage both hold wte in unit 0, laid out alike on both
 * (gpt.h's tied_gap), so this rank's slice of it is the same elements on both: their sum
 * is the tied gradient (the first stage's wpe meets zeros). */
static dt_status tie_unit0(dt_dp *d) {
    const dt_model_groups *g = &d->o.groups;
    if (!g->emb || !g->pp || dt_comm_size(g->pp) < 2) return DT_OK;
    float *slice = dt_zero_grad_slice(d, 0);
    if (!devmem(d)) return dt_allreduce(g->emb, slice, d->S[0], DT_F32, DT_SUM);
    if (d->o.dcomm) return dt_fail(DT_EINPUT, "comm.backend nccl: pipelines are not carried yet");
    dt_stage_widen(d->ops, d->zslice, slice, d->S[0]);
    DT_TRY(dt_allreduce(g->emb, d->zslice, d->S[0], DT_F32, DT_SUM));
    dt_stage_narrow(d->ops, slice, d->zslice, d->S[0]);
    return DT_OK;
}

static dt_status gather_stage(dt_dp *d);

dt_status dt_zero_end_step(dt_dp *d, double lr, double *grad_norm) {
    gpt_model *m = d->m;
    DT_TRY(finish_pending_rs(d));
    if (d->o.zero >= 3) DT_TRY(finish_prefetch(d));
    DT_TRY(settle_all(d));
    if (d->o.bitwise) {
        DT_TRY(dt_bw_finish(d, grad_norm));
    } else {
        if (d->o.zero == 1) {
            DT_TRY(dt_dp_inflight_wait(d)); /* the units started during backward */
            double t0 = dt_now();
            for (int u = 0; u < m->nunits; u++) {
                if (!d->rs_started[u]) DT_TRY(zero1_reduce_scatter(d, u, NULL));
                d->rs_started[u] = 0;
            }
            if (d->o.dcomm) DT_TRY(dt_dcomm_join(d->o.dcomm));
            d->comm_s += dt_now() - t0;
        }
        DT_TRY(tie_unit0(d));
        if (dt_state_model_parallel(&d->o.groups)) { /* each tensor's shard in its class (state.h), then over the
                                                        model's groups */
            double ss[DT_NORM_NCLASSES] = {0.0, 0.0};
            size_t x0, n, k;
            for (int i = 0; i < m->ntensors; i++) {
                const gpt_tensor *t = &m->tensors[i];
                int c = dt_state_norm_class(m, t);
                if (c >= 0 && shard_segment(d, t, &x0, &n, &k)) ss[c] += d->ops->sumsq(slice_grad(d, t->unit, x0), n);
            }
            DT_TRY(dt_allreduce(d->comm, ss, DT_NORM_NCLASSES, DT_F64, DT_SUM));
            DT_TRY(dt_state_norm(&d->o.groups, ss, grad_norm));
        } else {
            double ss = 0.0;
            if (d->grad_shard) ss = d->ops->sumsq(d->grad_shard, d->shard_total);
            else /* zero 1: its slices lie apart, one per unit of the full buffer */
                for (int u = 0; u < m->nunits; u++) ss += d->ops->sumsq(dt_zero_grad_slice(d, u), d->S[u]);
            DT_TRY(dt_allreduce(d->comm, &ss, 1, DT_F64, DT_SUM));
            *grad_norm = sqrt(ss);
        }
    }
    float gscale = dt_clip_coef(*grad_norm, d->hp.grad_clip);
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        size_t x0, n, k;
        if (t->frozen || !shard_segment(d, t, &x0, &n, &k)) continue;
        float *store = d->master_shard ? slice_param(d, t->unit, x0) : NULL; /* bf16: the model's copy */
        dt_adamw_range(&d->hp, d->ops, d->step + 1, t->decay, lr, gscale, slice_weights(d, t->unit, x0), store,
                       slice_grad(d, t->unit, x0), d->m_shard + k, d->v_shard + k, n);
    }
    if (d->o.zero <= 2) {
        /* updated slices to every rank; with overlap they travel while the next forward
         * computes, each unit waited for just before its forward (settle_unit) */
        double t0 = dt_now();
        for (int u = 0; u < m->nunits; u++) {
            float *unit = at(d, d->params_pad, d->poff[u]);
            float *own = at(d, unit, (size_t)d->rank * d->S[u]);
            if (!devmem(d) && d->o.overlap && d->N > 1)
                DT_TRY(dt_iallgather(d->comm, own, unit, d->S[u], DT_F32, &d->ag_pending[u]));
            else
                DT_TRY(gather_one(d, u, own, unit));
        }
        /* the next forward reads them after this (on a GPU it overlaps nothing yet) */
        if (d->o.dcomm) DT_TRY(dt_dcomm_join(d->o.dcomm));
        d->comm_s += dt_now() - t0;
    } else if (d->o.gather_once) {
        DT_TRY(gather_stage(d));
    } else {
        for (int b = 0; b < 4; b++) d->held[b] = -1; /* parameters changed: gather again */
    }
    return DT_OK;
}

/* ---- full views for init, load, save, digest and the sample ---- */

/* zero 3, gather_once: the stage's parameters whole, from every rank's updated slices. */
static dt_status gather_stage(dt_dp *d) {
    dt_status s;
    DP_COMM(d, s = gather_units(d, d->param_shard, d->stage_full));
    return s;
}

/* Points the model at a full padded parameter buffer: fp32 host memory (host), or the
 * model's memory and precision. */
static dt_status push_full_view(dt_dp *d, int host) {
    gpt_model *m = d->m;
    d->full_host = host;
    if (host) DT_TRY(dt_alloc((void **)&d->full_tmp, d->padded_total * sizeof(float), "full parameters"));
    else DT_TRY(d->ops->alloc((void **)&d->full_tmp, d->padded_total * esz(d), "full parameters"));
    d->saved_view = malloc((size_t)m->nunits * sizeof(float *));
    if (!d->saved_view) return dt_fail(DT_ERUNTIME, "out of memory (views)");
    for (int u = 0; u < m->nunits; u++) {
        d->saved_view[u] = m->unit_params[u];
        m->unit_params[u] = host ? d->full_tmp + d->poff[u] : at(d, d->full_tmp, d->poff[u]);
    }
    return DT_OK;
}

static void pop_full_view(dt_dp *d) {
    if (d->saved_view)
        for (int u = 0; u < d->m->nunits; u++) d->m->unit_params[u] = d->saved_view[u];
    free(d->saved_view);
    d->saved_view = NULL;
    if (d->full_host) dt_free(d->full_tmp);
    else d->ops->free(d->full_tmp);
    d->full_tmp = NULL;
}

dt_status dt_zero_init_weights(dt_dp *d, uint64_t seed, const char *init_from) {
    /* written whole into a full view, then each rank keeps its slices: on a device or
     * with bf16 the view is fp32 host memory; else zero 1/2's parameters are full already */
    int view = devmem(d) || d->o.zero >= 3;
    dt_status s = view ? push_full_view(d, 1) : DT_OK;
    if (s == DT_OK && init_from && *init_from) s = dt_ckpt_load_weights(init_from, d->m);
    else if (s == DT_OK) gpt_init(d->m, seed);
    if (s == DT_OK && view) {
        put_slices(d, d->full_tmp, weights_of); /* fp32: bf16's master weights, else the parameters */
        if (d->o.zero >= 3 && d->master_shard) d->ops->to_bf16(d->param_shard, d->master_shard, d->shard_total);
        if (d->o.zero <= 2) dt_stage_narrow(d->ops, d->params_pad, d->full_tmp, d->padded_total); /* all of them */
        s = d->ops->sync(); /* the uploads have read the host view */
    }
    if (view) pop_full_view(d);
    for (int b = 0; b < 4; b++) d->held[b] = -1; /* zero 3: gathered before the weights changed */
    if (s == DT_OK && d->o.zero >= 3 && d->o.gather_once) s = gather_stage(d);
    return s;
}

static dt_status alloc_views(dt_dp *d, float **base, float ***view) {
    DT_TRY(dt_alloc((void **)base, d->padded_total * sizeof(float), "full optimizer state"));
    *view = malloc((size_t)d->m->nunits * sizeof(float *));
    if (!*view) {
        dt_free(*base);
        *base = NULL;
        return dt_fail(DT_ERUNTIME, "out of memory (views)");
    }
    for (int u = 0; u < d->m->nunits; u++) (*view)[u] = *base + d->poff[u];
    return DT_OK;
}

void dt_zero_free_views(float **m_view, float **v_view) {
    if (m_view) dt_free(m_view[0]); /* poff[0] == 0: the first unit starts the buffer */
    if (v_view) dt_free(v_view[0]);
    free(m_view);
    free(v_view);
}

dt_status dt_zero_load(dt_dp *d, const char *step_dir) {
    DT_TRY(dt_zero_init_weights(d, 0, step_dir)); /* model.safetensors or its index */
    float *mb = NULL, *vb = NULL, **mv = NULL, **vv = NULL;
    dt_status s = alloc_views(d, &mb, &mv);
    if (s == DT_OK) s = alloc_views(d, &vb, &vv);
    if (s == DT_OK) s = dt_ckpt_load_optimizer(step_dir, d->m, mv, vv);
    if (s == DT_OK) {
        put_slices(d, mb, m_of);
        put_slices(d, vb, v_of);
        s = d->ops->sync();
    }
    if (mv) dt_zero_free_views(mv, vv);
    else {
        dt_free(mb);
        dt_free(vb);
    }
    return s;
}

dt_status dt_zero_gather_full(dt_dp *d, int host) {
    int snapshot = host == 2;
    if (!devmem(d)) host = snapshot; /* the model's memory is fp32 host memory */
    if (d->o.zero >= 3) DT_TRY(finish_prefetch(d));
    DT_TRY(settle_all(d));
    if (!host && (d->o.zero <= 2 || d->o.gather_once)) return DT_OK; /* full already */
    /* allocated here, so every rank must know before the gathers whether all could */
    DT_TRY(dt_comm_agree(d->comm, push_full_view(d, host), NULL));
    if (snapshot && !devmem(d) && d->o.zero <= 2) { /* node-shared: a fork's child would see later steps */
        memcpy(d->full_tmp, d->params_pad, d->padded_total * sizeof(float));
        return DT_OK;
    }
    if (host) return gather_units_f32(d, weights_of, d->full_tmp);
    return gather_units(d, d->param_shard, d->full_tmp);
}

void dt_zero_release_full(dt_dp *d) { pop_full_view(d); }

dt_status dt_zero_full_moments(dt_dp *d, float ***m_view, float ***v_view) {
    float *mb = NULL, *vb = NULL;
    *m_view = *v_view = NULL;
    dt_status s = alloc_views(d, &mb, m_view);
    if (s == DT_OK) s = alloc_views(d, &vb, v_view);
    DT_TRY(dt_comm_agree(d->comm, s, NULL)); /* before the gathers, as above */
    DT_TRY(gather_units_f32(d, m_of, mb));
    return gather_units_f32(d, v_of, vb);
}

/* ---- streamed saves and digests: one unit whole at a time ---- */

static dt_status stream_get(void *ctx, int set, int i, const float **data) {
    dt_zero_stream *z = ctx;
    dt_dp *d = z->d;
    const gpt_tensor *t = &d->m->tensors[i];
    int u = t->unit;
    size_t at_u = t->offset - d->m->units[u].offset;
    if (set == 0 && d->o.zero <= 2 && !devmem(d)) { /* full parameters in fp32 host memory already */
        *data = d->params_pad + d->poff[u] + at_u;
        return DT_OK;
    }
    if (z->set != set || z->unit != u) { /* every rank's slice of the unit: this rank's copied to its place */
        static float *(*const slice[3])(const dt_dp *, int) = {weights_of, m_of, v_of};
        float *mine = z->buf + (size_t)d->rank * d->S[u];
        z->set = z->unit = -1;
        d->ops->download(mine, slice[set](d, u), d->S[u] * sizeof(float));
        DT_TRY(dt_allgather(d->comm, mine, z->buf, d->S[u], DT_F32));
        z->set = set;
        z->unit = u;
    }
    *data = z->buf + at_u;
    return DT_OK;
}

dt_status dt_zero_stream_open(dt_dp *d, dt_zero_stream *z, dt_ckpt_source *src, int moments) {
    memset(z, 0, sizeof *z);
    z->d = d;
    z->set = z->unit = -1;
    *src = (dt_ckpt_source){.get = stream_get, .ctx = z, .moments = moments};
    if (d->o.zero >= 3) DT_TRY(finish_prefetch(d));
    DT_TRY(settle_all(d)); /* zero 1/2: the last update's parameters are in place */
    size_t most = 0;
    for (int u = 0; u < d->m->nunits; u++)
        if (d->P[u] > most) most = d->P[u];
    /* allocated here, so every rank must know before the gathers whether all could */
    return dt_comm_agree(d->comm, dt_alloc((void **)&z->buf, most * sizeof(float) + 1, "save buffer (one unit)"),
                         NULL);
}

void dt_zero_stream_close(dt_zero_stream *z) {
    dt_free(z->buf);
    z->buf = NULL;
}

void dt_zero_memory(const dt_dp *d, dt_mem_report *r) {
    size_t f = sizeof(float), e = esz(d);
    r->params = (d->o.zero <= 2 ? d->padded_total : d->shard_total) * e + (d->master_shard ? d->shard_total * f : 0);
    r->grads = (d->o.zero == 1 ? d->padded_total : d->shard_total) * e; /* zero 1: reduced in place */
    r->optim = 2 * d->shard_total * f;
    r->workspace = d->workspace_bytes;
}
