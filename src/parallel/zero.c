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
 *           while the current one computes), into two alternating buffers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mem.h"
#include "dp_internal.h"

static int nblocks(const dt_dp *d) { return d->m->nblocks; }
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
    if (d->o.zero == 1) return d->grads_pad + d->poff[u] + (size_t)d->rank * d->S[u];
    return d->grad_shard + d->soff[u];
}

/* Reduced gradient at unit-relative element x of this rank's slice of unit u. */
static float *slice_grad(const dt_dp *d, int u, size_t x) {
    return dt_zero_grad_slice(d, u) + (x - (size_t)d->rank * d->S[u]);
}

/* zero 3: which gather buffer holds unit u */
static int gbuf_of(const dt_dp *d, int u) { return u == 0 ? 0 : u == lnf_unit(d) ? 1 : 2 + (u - 1) % 2; }
/* zero 2/3: which gradient scratch unit u writes */
static int gscr_of(const dt_dp *d, int u) { return u == 0 ? 0 : u == lnf_unit(d) ? 1 : 2; }



/* The rank-local part of the setup: layout and private buffers (no communication). */
static dt_status zero_setup_local(dt_dp *d) {
    gpt_model *m = d->m;
    int U = m->nunits, N = d->N;
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
        DT_TRY(dt_alloc((void **)&d->grad_shard, d->shard_total * sizeof(float), "gradient shard"));
        DT_TRY(dt_alloc((void **)&d->rs_tmp, maxS * sizeof(float), "reduce-scatter buffer"));
        d->workspace_bytes = maxS * sizeof(float);
    }
    DT_TRY(dt_alloc((void **)&d->m_shard, d->shard_total * sizeof(float), "AdamW first moments (shard)"));
    DT_TRY(dt_alloc((void **)&d->v_shard, d->shard_total * sizeof(float), "AdamW second moments (shard)"));
    if (d->o.zero <= 2) {
        d->ag_pending = calloc((size_t)U, sizeof(dt_request *));
        if (!d->ag_pending) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    } else {
        DT_TRY(dt_alloc((void **)&d->param_shard, d->shard_total * sizeof(float), "parameter shard"));
    }
    if (d->o.zero == 1) {
        d->rs_started = calloc((size_t)U, 1);
        if (!d->rs_started) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    }
    return DT_OK;
}

dt_status dt_zero_setup(dt_dp *d) {
    gpt_model *m = d->m;
    int U = m->nunits;
    /* the node-shared buffers below are collective: every rank must get there */
    DT_TRY(dt_comm_agree(d->comm, zero_setup_local(d), NULL));
    int z = d->o.zero;
    if (z <= 2) {
        /* node-shared where peers read it: the all-gather into it reads peers' copies in place */
        DT_TRY(dt_comm_alloc_shared(d->comm, d->padded_total * sizeof(float), "parameters", (void **)&d->params_pad));
        for (int u = 0; u < U; u++) m->unit_params[u] = d->params_pad + d->poff[u];
    } else if (d->o.gather_once) {
        DT_TRY(dt_comm_alloc_shared(d->comm, d->padded_total * sizeof(float), "gathered parameters",
                                    (void **)&d->stage_full));
        d->workspace_bytes += d->padded_total * sizeof(float);
        for (int u = 0; u < U; u++) m->unit_params[u] = d->stage_full + d->poff[u];
    } else {
        size_t sizes[4] = {d->P[0], d->P[lnf_unit(d)], d->P[1], d->P[1]};
        for (int b = 0; b < 4; b++) {
            DT_TRY(dt_comm_alloc_shared(d->comm, sizes[b] * sizeof(float), "gathered parameters",
                                        (void **)&d->pgather[b]));
            d->workspace_bytes += sizes[b] * sizeof(float);
            d->held[b] = -1;
        }
        for (int u = 0; u < U; u++) m->unit_params[u] = d->pgather[gbuf_of(d, u)];
        d->prefetch_unit = -1;
    }
    if (z == 1) {
        DT_TRY(dt_comm_alloc_shared(d->comm, d->padded_total * sizeof(float), "gradients", (void **)&d->grads_pad));
        for (int u = 0; u < U; u++) m->unit_grads[u] = d->grads_pad + d->poff[u];
    } else {
        size_t sizes[3] = {d->P[0], d->P[lnf_unit(d)], d->P[1]};
        for (int b = 0; b < 3; b++) {
            DT_TRY(dt_comm_alloc_shared(d->comm, sizes[b] * sizeof(float), "gradient scratch",
                                        (void **)&d->gscratch[b]));
            d->workspace_bytes += sizes[b] * sizeof(float);
        }
        for (int u = 0; u < U; u++) m->unit_grads[u] = d->gscratch[gscr_of(d, u)];
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

void dt_zero_free(dt_dp *d) {
    if (d->prefetch) dt_wait(d->prefetch);
    settle_all(d);
    free(d->ag_pending);
    /* collective for node-shared buffers: every rank frees in this order */
    dt_comm_free_shared(d->comm, d->params_pad);
    dt_comm_free_shared(d->comm, d->grads_pad);
    dt_free(d->param_shard);
    dt_free(d->grad_shard);
    dt_free(d->m_shard);
    dt_free(d->v_shard);
    dt_free(d->rs_tmp);
    for (int b = 0; b < 3; b++) dt_comm_free_shared(d->comm, d->gscratch[b]);
    for (int b = 0; b < 4; b++) dt_comm_free_shared(d->comm, d->pgather[b]);
    dt_comm_free_shared(d->comm, d->stage_full);
    free(d->rs_started);
    free(d->P);
    free(d->S);
    free(d->poff);
    free(d->soff);
}

/* ---- ZeRO-3 gathers ---- */

static dt_status finish_prefetch(dt_dp *d) {
    if (!d->prefetch) return DT_OK;
    dt_status s;
    DP_COMM(d, s = dt_wait(d->prefetch));
    d->prefetch = NULL;
    d->held[gbuf_of(d, d->prefetch_unit)] = s == DT_OK ? d->prefetch_unit : -1;
    d->prefetch_unit = -1;
    return s;
}

static dt_status gather_unit(dt_dp *d, int u) {
    if (d->o.gather_once) return DT_OK; /* the whole stage is in place */
    int b = gbuf_of(d, u);
    if (d->prefetch && d->prefetch_unit == u) return finish_prefetch(d);
    if (d->held[b] == u) return DT_OK;
    DT_TRY(finish_prefetch(d)); /* one collective in flight at a time keeps ranks in step */
    d->held[b] = -1;
    dt_status s;
    DP_COMM(d, s = dt_allgather(d->comm, d->param_shard + d->soff[u], d->pgather[b], d->S[u], DT_F32));
    DT_TRY(s);
    d->held[b] = u;
    return DT_OK;
}

static void prefetch_unit(dt_dp *d, int u) {
    if (u < 1 || u > nblocks(d) || d->prefetch || d->o.gather_once) return;
    int b = gbuf_of(d, u);
    if (d->held[b] == u) return;
    d->held[b] = -1;
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

dt_status dt_zero_before_backward(dt_dp *d, int u) {
    if (d->o.zero >= 3) {
        DT_TRY(gather_unit(d, u));
        if (u >= 1 && u <= nblocks(d)) prefetch_unit(d, u - 1);
    }
    if (d->o.zero >= 2) memset(d->m->unit_grads[u], 0, d->P[u] * sizeof(float));
    return DT_OK;
}

/* zero 1: unit u's gradients, reduce-scattered in place: this rank's slice of the unit
 * becomes the sum over ranks, the other slices are left undefined (begin_step zeroes
 * them). Backward never touches a unit again after its after_backward hook. */
static dt_status zero1_reduce_scatter(dt_dp *d, int u, dt_request **req) {
    float *unit = d->grads_pad + d->poff[u];
    if (req) return dt_ireduce_scatter(d->comm, unit, dt_zero_grad_slice(d, u), d->S[u], DT_F32, DT_SUM, req);
    return dt_reduce_scatter(d->comm, unit, dt_zero_grad_slice(d, u), d->S[u], DT_F32, DT_SUM);
}

/* zero 1: unit u's gradients are final (last micro-step): start its reduce-scatter now,
 * overlapping the rest of backward, as DDP does with buckets. A unit whose start fails is
 * reduce-scattered blocking in end_step. */
static dt_status zero1_after_backward(dt_dp *d, int u) {
    if (!d->last_micro || d->N == 1 || d->o.bitwise || !d->o.overlap) return DT_OK;
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
    /* reduce-scatter this unit's gradients now and keep only this rank's slice */
    DP_COMM(d, s = dt_reduce_scatter(d->comm, d->m->unit_grads[u], d->rs_tmp, d->S[u], DT_F32, DT_SUM));
    DT_TRY(s);
    float *dst = d->grad_shard + d->soff[u];
    for (size_t i = 0; i < d->S[u]; i++) dst[i] += d->rs_tmp[i];
    return DT_OK;
}

/* ---- step ---- */

void dt_zero_begin_step(dt_dp *d) {
    if (d->o.zero == 1) memset(d->grads_pad, 0, d->padded_total * sizeof(float));
    else memset(d->grad_shard, 0, d->shard_total * sizeof(float));
}

/* Parameters of this rank's slice of unit u, at unit-relative element x. */
static float *slice_param(dt_dp *d, int u, size_t x) {
    size_t lo = (size_t)d->rank * d->S[u];
    if (d->o.zero <= 2) return d->params_pad + d->poff[u] + x;
    return d->param_shard + d->soff[u] + (x - lo);
}

/* Pipeline: the first and the last stage both hold wte in unit 0, laid out alike on both
 * (gpt.h's tied_gap), so this rank's slice of it is the same elements on both: their sum
 * is the tied gradient (the first stage's wpe meets zeros). */
static dt_status tie_unit0(dt_dp *d) {
    const dt_model_groups *g = &d->o.groups;
    if (!g->emb || !g->pp || dt_comm_size(g->pp) < 2) return DT_OK;
    return dt_allreduce(g->emb, dt_zero_grad_slice(d, 0), d->S[0], DT_F32, DT_SUM);
}

dt_status dt_zero_end_step(dt_dp *d, double lr, double *grad_norm) {
    gpt_model *m = d->m;
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
        if (!shard_segment(d, t, &x0, &n, &k)) continue;
        dt_adamw_range(&d->hp, d->ops, d->step + 1, t->decay, lr, gscale, slice_param(d, t->unit, x0), NULL,
                       slice_grad(d, t->unit, x0), d->m_shard + k, d->v_shard + k, n);
    }
    if (d->o.zero <= 2) {
        /* updated slices to every rank; with overlap they travel while the next forward
         * computes, each unit waited for just before its forward (settle_unit) */
        double t0 = dt_now();
        for (int u = 0; u < m->nunits; u++) {
            float *unit = d->params_pad + d->poff[u];
            float *own = unit + (size_t)d->rank * d->S[u];
            if (d->o.overlap && d->N > 1) DT_TRY(dt_iallgather(d->comm, own, unit, d->S[u], DT_F32, &d->ag_pending[u]));
            else DT_TRY(dt_allgather(d->comm, own, unit, d->S[u], DT_F32));
        }
        d->comm_s += dt_now() - t0;
    } else if (d->o.gather_once) {
        DT_TRY(gather_stage(d));
    } else {
        for (int b = 0; b < 4; b++) d->held[b] = -1; /* parameters changed: gather again */
    }
    return DT_OK;
}

/* ---- full views for init, load, save and digest ---- */

static dt_status gather_all(dt_dp *d, const float *shard, float *full);
/* zero 3, gather_once: the stage's parameters whole, from every rank's updated slices. */
static dt_status gather_stage(dt_dp *d) {
    dt_status s;
    DP_COMM(d, s = gather_all(d, d->param_shard, d->stage_full));
    return s;
}

/* Points the model at a full padded parameter buffer (ZeRO-3 only; others are full). */
static dt_status push_full_view(dt_dp *d) {
    gpt_model *m = d->m;
    DT_TRY(dt_alloc((void **)&d->full_tmp, d->padded_total * sizeof(float), "full parameters"));
    d->saved_view = malloc((size_t)m->nunits * sizeof(float *));
    if (!d->saved_view) return dt_fail(DT_ERUNTIME, "out of memory (views)");
    for (int u = 0; u < m->nunits; u++) {
        d->saved_view[u] = m->unit_params[u];
        m->unit_params[u] = d->full_tmp + d->poff[u];
    }
    return DT_OK;
}

static void pop_full_view(dt_dp *d) {
    if (d->saved_view)
        for (int u = 0; u < d->m->nunits; u++) d->m->unit_params[u] = d->saved_view[u];
    free(d->saved_view);
    d->saved_view = NULL;
    dt_free(d->full_tmp);
    d->full_tmp = NULL;
}

/* Keeps this rank's slices of a full padded buffer. */
static void take_slices(dt_dp *d, const float *full, float *shard) {
    for (int u = 0; u < d->m->nunits; u++)
        memcpy(shard + d->soff[u], full + d->poff[u] + (size_t)d->rank * d->S[u], d->S[u] * sizeof(float));
}

dt_status dt_zero_init_weights(dt_dp *d, uint64_t seed, const char *init_from) {
    if (d->o.zero >= 3) DT_TRY(push_full_view(d));
    dt_status s = DT_OK;
    if (init_from && *init_from) s = dt_ckpt_load_weights(init_from, d->m);
    else gpt_init(d->m, seed);
    if (d->o.zero >= 3) {
        if (s == DT_OK) take_slices(d, d->full_tmp, d->param_shard);
        pop_full_view(d);
    }
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
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", step_dir);
    DT_TRY(dt_zero_init_weights(d, 0, path));
    float *mb = NULL, *vb = NULL, **mv = NULL, **vv = NULL;
    dt_status s = alloc_views(d, &mb, &mv);
    if (s == DT_OK) s = alloc_views(d, &vb, &vv);
    if (s == DT_OK) s = dt_ckpt_load_optimizer(step_dir, d->m, mv, vv);
    if (s == DT_OK) {
        take_slices(d, mb, d->m_shard);
        take_slices(d, vb, d->v_shard);
    }
    if (mv) dt_zero_free_views(mv, vv);
    else {
        dt_free(mb);
        dt_free(vb);
    }
    return s;
}

static dt_status gather_all(dt_dp *d, const float *shard, float *full) {
    for (int u = 0; u < d->m->nunits; u++)
        DT_TRY(dt_allgather(d->comm, shard + d->soff[u], full + d->poff[u], d->S[u], DT_F32));
    return DT_OK;
}

dt_status dt_zero_gather_full(dt_dp *d) {
    if (d->o.zero < 3) return settle_all(d);
    if (d->o.gather_once) return DT_OK; /* gathered since the last update */
    DT_TRY(finish_prefetch(d));
    /* allocated here, so every rank must know before the gathers whether all could */
    DT_TRY(dt_comm_agree(d->comm, push_full_view(d), NULL));
    return gather_all(d, d->param_shard, d->full_tmp);
}

void dt_zero_release_full(dt_dp *d) {
    if (d->o.zero >= 3) pop_full_view(d);
}

dt_status dt_zero_full_moments(dt_dp *d, float ***m_view, float ***v_view) {
    float *mb = NULL, *vb = NULL;
    *m_view = *v_view = NULL;
    dt_status s = alloc_views(d, &mb, m_view);
    if (s == DT_OK) s = alloc_views(d, &vb, v_view);
    DT_TRY(dt_comm_agree(d->comm, s, NULL)); /* before the gathers, as above */
    DT_TRY(gather_all(d, d->m_shard, mb));
    return gather_all(d, d->v_shard, vb);
}

void dt_zero_memory(const dt_dp *d, dt_mem_report *r) {
    size_t f = sizeof(float);
    r->params = (d->o.zero <= 2 ? d->padded_total : d->shard_total) * f;
    r->grads = (d->o.zero == 1 ? d->padded_total : d->shard_total) * f; /* zero 1: reduced in place */
    r->optim = 2 * d->shard_total * f;
    r->workspace = d->workspace_bytes;
}
