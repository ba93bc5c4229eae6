/* ZeRO stages 1-3 (16Ψ -> 4Ψ+12Ψ/N -> 2Ψ+14Ψ/N -> 16Ψ/N with bf16, and the fp32
 * analogues: docs/parallelism.md, "Memory"): what the three stages share. Sharding is per
 * model unit, like FSDP's flat parameters, so every unit's reduce-scatter and all-gather
 * are equal-count collectives (zero_shard.h). With bf16 storage the parameters and
 * gradients are bf16 and each rank keeps fp32 master weights of its slices. A device's
 * state (or bf16's) is staged (staging.h): each collective copies the unit to fp32 host
 * memory and back, gradients reduced in fp32, without overlap for now; or, with a device
 * communicator (comm.backend nccl), the collectives run on device memory, bf16 gradients
 * widened to an fp32 device copy first. */
#include "zero_shard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "staging.h"

int dt_zero_devmem(const dt_dp *d) { return dt_stage_needed(d->ops); }
int dt_zero_staged(const dt_dp *d) { return dt_zero_devmem(d) && !d->o.dcomm; }
int dt_zero_rs_overlap(const dt_dp *d) {
    return d->o.dcomm && !d->ops->bf16 && d->o.overlap && dt_zero_of(d)->stage >= 2;
}
static size_t esz(const dt_dp *d) { return dt_elem_bytes(d->ops); }
static float *at(const dt_dp *d, float *base, size_t n) { return dt_dp_at(d, base, n); }
static dt_dtype storage_dtype(const dt_dp *d) { return d->ops->bf16 ? DT_BF16 : DT_F32; }

/* The part of tensor t inside this rank's slice of its unit: *x0 its offset in the unit,
 * *n its length, *k its offset in the shard buffers; 0 when they do not meet. */
static int shard_segment(const dt_dp *d, const gpt_tensor *t, size_t *x0, size_t *n, size_t *k) {
    const dt_zero *z = dt_zero_of(d);
    int u = t->unit;
    size_t a = t->offset - d->m->units[u].offset, b = a + t->numel;
    size_t lo = dt_zero_lo(d, u), hi = lo + z->S[u];
    size_t s = a > lo ? a : lo, e = b < hi ? b : hi;
    if (s >= e) return 0;
    *x0 = s;
    *n = e - s;
    *k = z->soff[u] + (s - lo);
    return 1;
}

float *dt_zero_grad_slice(const dt_dp *d, int u) {
    const dt_zero *z = dt_zero_of(d);
    if (z->stage == 1) return at(d, z->grads_pad, z->poff[u] + dt_zero_lo(d, u));
    return at(d, z->grad_shard, z->soff[u]);
}

/* Reduced gradient at unit-relative element x of this rank's slice of unit u. */
static float *slice_grad(const dt_dp *d, int u, size_t x) {
    return at(d, dt_zero_grad_slice(d, u), x - dt_zero_lo(d, u));
}

/* Parameters (storage precision) of this rank's slice of unit u, at unit-relative element x. */
static float *slice_param(const dt_dp *d, int u, size_t x) {
    const dt_zero *z = dt_zero_of(d);
    if (z->stage <= 2) return at(d, z->params_pad, z->poff[u] + x);
    return at(d, z->param_shard, z->soff[u] + (x - dt_zero_lo(d, u)));
}

dt_status dt_zero_get_slice(dt_dp *d, int set, int u, float *dst) {
    dt_zero *z = dt_zero_of(d);
    size_t k = z->soff[u], n = z->S[u];
    if (set == 0) /* offloaded parameters: the optimizer's master weights are the weights */
        return dt_optimizer_get_weights(&z->opt, k, n, z->pstore ? NULL : slice_param(d, u, dt_zero_lo(d, u)), dst);
    return dt_optimizer_get_moments(&z->opt, set - 1, k, n, dst);
}

/* The reverse; with_params: the parameters' copy (storage precision) written too, in the
 * model's memory or the offloaded shard. */
static dt_status put_slice(dt_dp *d, int set, int u, const float *src, int with_params) {
    dt_zero *z = dt_zero_of(d);
    size_t k = z->soff[u], n = z->S[u];
    if (set != 0) return dt_optimizer_set_moments(&z->opt, set - 1, k, n, src);
    if (!z->pstore || !with_params)
        return dt_optimizer_set_weights(&z->opt, k, n, src, with_params ? slice_param(d, u, dt_zero_lo(d, u)) : NULL);
    DT_TRY(dt_optimizer_set_weights(&z->opt, k, n, src, NULL));
    DT_TRY(dt_optimizer_put_params(&z->opt, z->ptmp, src, n)); /* params_host: the host copy */
    return dt_store_write(z->pstore, 0, k, n, z->ptmp);
}

int dt_zero_gscratch_of(const dt_dp *d, int u) {
    return u == 0 ? 0 : u == dt_zero_lnf(d) ? 1 : dt_zero_rs_overlap(d) ? 2 + (u - 1) % 2 : 2;
}

/* A buffer the collectives read in place: node-shared on the CPU (collective), else in
 * the backend's memory (rank-local). */
static dt_status alloc_unit(dt_dp *d, size_t bytes, const char *what, float **p) {
    if (dt_zero_devmem(d)) return d->ops->alloc((void **)p, bytes, what);
    return dt_comm_alloc_shared(d->comm, bytes, what, (void **)p);
}
static void free_unit_buffer(dt_dp *d, float *p) {
    if (dt_zero_devmem(d)) d->ops->free(p);
    else dt_comm_free_shared(d->comm, p);
}

/* The rank-local part of the setup: layout and private buffers (no communication). */
static dt_status zero_setup_local(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    gpt_model *m = d->m;
    int U = m->nunits, N = d->N;
    size_t e = esz(d), f = sizeof(float);
    z->rs_pending = -1;
    z->P = calloc((size_t)U, sizeof(size_t));
    z->S = calloc((size_t)U, sizeof(size_t));
    z->poff = calloc((size_t)U, sizeof(size_t));
    z->soff = calloc((size_t)U, sizeof(size_t));
    z->pieces = calloc((size_t)(m->ntensors > U ? m->ntensors : U), sizeof *z->pieces);
    if (!z->P || !z->S || !z->poff || !z->soff || !z->pieces) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    if (d->o.policy) {
        z->repl = calloc((size_t)U, 1);
        z->g3.keep = z->stage == 3 ? calloc((size_t)U, 1) : NULL;
        if (!z->repl || (z->stage == 3 && !z->g3.keep)) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
        DT_TRY(dt_zero_policy_repl(d->o.policy, d->o.policy_zero, m, z->repl, z->g3.keep));
    }
    size_t A = (size_t)N * d->align, maxS = 0;
    for (int u = 0; u < U; u++) {
        z->P[u] = (m->units[u].count + A - 1) / A * A;
        z->S[u] = z->repl && z->repl[u] ? z->P[u] : z->P[u] / (size_t)N; /* replicated: the whole unit */
        z->poff[u] = z->padded_total;
        z->soff[u] = z->shard_total;
        z->padded_total += z->P[u];
        z->shard_total += z->S[u];
        if (z->S[u] > maxS) maxS = z->S[u];
    }
    /* zero 1 reduce-scatters in place into its full gradients: no shard, no staging */
    if (z->stage >= 2) {
        DT_TRY(d->ops->alloc((void **)&z->grad_shard, z->shard_total * e, "gradient shard"));
        DT_TRY(d->ops->alloc((void **)&z->rs_tmp, maxS * e, "reduce-scatter buffer"));
        d->workspace_bytes = maxS * e;
        if (dt_zero_rs_overlap(d)) {
            DT_TRY(d->ops->alloc((void **)&z->rs_alt, maxS * e, "reduce-scatter buffer"));
            d->workspace_bytes += maxS * e;
        }
    }
    dt_optimizer_offload off = d->o.offload;
    off.params_host = z->stage >= 3 && d->o.offload_param.kind;
    /* zero 2/3: each unit's slice is final after its last micro-step's reduce-scatter
     * (zero2.c), a pipeline's tied unit 0 after its sum over the stages, zero 1's slices
     * after their reduce-scatters (dt_zero_norm) */
    off.grads_early = 1;
    dt_opt_range *frozen = malloc((size_t)(m->ntensors + U) * sizeof *frozen); /* they get no moments */
    if (!frozen) return dt_fail(DT_ERUNTIME, "out of memory (frozen ranges)");
    int nf = 0;
    dt_zero_frozen_ranges(m, z->S, z->soff, z->repl, (size_t)d->rank, frozen, &nf);
    dt_status s = dt_optimizer_create(&z->opt, d->ops, &d->hp, z->shard_total, 1, " (shard)", &off, frozen, nf);
    free(frozen);
    DT_TRY(s);
    d->opt = &z->opt;
    if (d->o.replicas && !(z->rep_pending = calloc((size_t)U, sizeof(dt_request *))))
        return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    if (z->stage <= 2) {
        z->ag_pending = calloc((size_t)U, sizeof(dt_request *));
        if (!z->ag_pending) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    } else if (d->o.offload_param.kind) { /* ZeRO-Infinity: fetched a unit at a time (zero3.c) */
        dt_store_opts so = d->o.offload_param;
        so.block_bytes = dt_store_block_for(&so, z->shard_total, e);
        /* the next block's slice read ahead where blocks are prefetched (zero3.c); the block
         * units are alike here (parallel.unit_split is refused with parameter offload) */
        so.fetch_max = !dt_zero_devmem(d) && !d->o.gather_once && d->m->nblocks > 0 ? z->S[1] : 0;
        DT_TRY(dt_store_open(&z->pstore, z->shard_total, 1, e, &so, "parameter shard"));
        if (!(z->ptmp = malloc(maxS * e + 1))) return dt_fail(DT_ERUNTIME, "out of memory (parameter offload)");
    } else {
        DT_TRY(d->ops->alloc((void **)&z->param_shard, z->shard_total * e, "parameter shard"));
    }
    if (z->stage == 1) {
        z->rs_started = calloc((size_t)U, 1);
        if (!z->rs_started) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    }
    if (dt_zero_staged(d)) {
        DT_TRY(dt_alloc((void **)&z->zslice, maxS * f, "ZeRO host staging (slice)"));
        if (!d->ops->on_device) d->workspace_bytes += maxS * f; /* host memory is the state's memory here */
    }
    if (d->o.dcomm && d->ops->bf16) { /* fp32 reductions of bf16 gradients, on the device */
        size_t maxP = 0;
        for (int u = 0; u < U; u++) maxP = z->P[u] > maxP ? z->P[u] : maxP;
        DT_TRY(d->ops->alloc((void **)&z->unit32, maxP * f, "fp32 gradients for the reduction"));
        DT_TRY(d->ops->alloc((void **)&z->slice32, maxS * f, "fp32 reduce-scatter output"));
        d->workspace_bytes += (maxP + maxS) * f;
    }
    return DT_OK;
}

/* The buffers the model's views point at: full parameters (zero 1/2) or gathered ones
 * (zero 3), full gradients (zero 1) or gradient scratch (zero 2/3). */
static dt_status alloc_model_buffers(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    dt_zero3_gathers *g = &z->g3;
    gpt_model *m = d->m;
    int U = m->nunits;
    size_t e = esz(d);
    if (z->stage <= 2) {
        /* node-shared where peers read it: the all-gather into it reads peers' copies in place */
        DT_TRY(alloc_unit(d, z->padded_total * e, "parameters", &z->params_pad));
        for (int u = 0; u < U; u++) m->unit_params[u] = at(d, z->params_pad, z->poff[u]);
    } else if (d->o.gather_once) {
        DT_TRY(alloc_unit(d, z->padded_total * e, "gathered parameters", &g->stage_full));
        d->workspace_bytes += z->padded_total * e;
        for (int u = 0; u < U; u++) m->unit_params[u] = at(d, g->stage_full, z->poff[u]);
    } else {
        size_t sizes[4] = {0}, kept = 0;
        for (int u = 0; u < U; u++) { /* a gather buffer per kind of unit (two for blocks), none for replicated ones */
            int b = dt_zero3_gbuf(d, u) == 3 ? 2 : dt_zero3_gbuf(d, u);
            if (dt_zero_keep(d, u)) kept += z->P[u]; /* a zero2 unit: whole in g3.kept instead */
            else if (!dt_zero_repl(d, u) && z->P[u] > sizes[b]) sizes[b] = z->P[u];
        }
        if (kept) {
            DT_TRY(alloc_unit(d, kept * e, "kept parameters (zero2 units)", &g->kept));
            d->workspace_bytes += kept * e;
        }
        sizes[3] = sizes[2];
        for (int b = 0; b < 4; b++) {
            if (sizes[b]) DT_TRY(alloc_unit(d, sizes[b] * e, "gathered parameters", &g->pgather[b]));
            d->workspace_bytes += sizes[b] * e;
            g->held[b] = -1;
        }
        size_t k = 0;
        for (int u = 0; u < U; u++) /* a replicated unit is used where it lives, a kept one in g3.kept */
            if (dt_zero_keep(d, u)) m->unit_params[u] = at(d, g->kept, k), k += z->P[u];
            else m->unit_params[u] = dt_zero_repl(d, u) ? at(d, z->param_shard, z->soff[u]) : g->pgather[dt_zero3_gbuf(d, u)];
        g->prefetch_unit = -1;
    }
    if (z->stage == 1) {
        DT_TRY(alloc_unit(d, z->padded_total * e, "gradients", &z->grads_pad));
        for (int u = 0; u < U; u++) m->unit_grads[u] = at(d, z->grads_pad, z->poff[u]);
    } else {
        size_t maxB = 0; /* the largest block unit (a split block's halves differ) */
        for (int u = 1; u < dt_zero_lnf(d); u++) maxB = z->P[u] > maxB ? z->P[u] : maxB;
        size_t sizes[4] = {z->P[0], z->P[dt_zero_lnf(d)], maxB, maxB};
        for (int b = 0; b < (dt_zero_rs_overlap(d) ? 4 : 3); b++) {
            DT_TRY(alloc_unit(d, sizes[b] * e, "gradient scratch", &z->gscratch[b]));
            d->workspace_bytes += sizes[b] * e;
        }
        for (int u = 0; u < U; u++) m->unit_grads[u] = z->gscratch[dt_zero_gscratch_of(d, u)];
    }
    return DT_OK;
}

dt_status dt_zero_setup(dt_dp *d, int stage) {
    gpt_model *m = d->m;
    dt_zero *z = calloc(1, sizeof *z);
    if (!z) return dt_fail(DT_ERUNTIME, "out of memory (ZeRO layout)");
    d->priv = z;
    z->stage = stage;
    /* staged, the model's buffers are rank-local; else node-shared, allocated collectively
     * below, so every rank must get there */
    dt_status s = zero_setup_local(d);
    if (s == DT_OK && dt_zero_devmem(d)) s = alloc_model_buffers(d);
    DT_TRY(dt_comm_agree(d->comm, s, NULL));
    if (!dt_zero_devmem(d)) {
        DT_TRY(alloc_model_buffers(d));
    } else if (dt_zero_staged(d)) {
        size_t maxP = 0;
        for (int u = 0; u < m->nunits; u++) maxP = z->P[u] > maxP ? z->P[u] : maxP;
        DT_TRY(dt_comm_alloc_shared(d->comm, maxP * sizeof(float), "ZeRO host staging", (void **)&z->zhost));
        if (!d->ops->on_device) d->workspace_bytes += maxP * sizeof(float);
    }
    m->params = m->grads = NULL; /* no flat layout in ZeRO modes */
    return DT_OK;
}

dt_status dt_zero_settle_unit(dt_dp *d, int u) {
    dt_zero *z = dt_zero_of(d);
    if (!z->ag_pending || !z->ag_pending[u]) return DT_OK;
    dt_status s;
    DP_COMM(d, s = dt_wait(z->ag_pending[u]));
    z->ag_pending[u] = NULL;
    return s;
}

dt_status dt_zero_settle_all(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    dt_status s = DT_OK;
    for (int u = 0; z->ag_pending && u < d->m->nunits; u++) {
        dt_status w = dt_zero_settle_unit(d, u);
        if (s == DT_OK) s = w;
    }
    return s;
}

void dt_zero_free(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    if (!z) return;
    if (z->g3.prefetch) dt_wait(z->g3.prefetch);
    dt_zero_settle_all(d);
    dt_zero_release_full(d);
    free(z->ag_pending);
    free(z->rep_pending);
    /* collective for node-shared buffers: every rank frees in this order */
    free_unit_buffer(d, z->params_pad);
    free_unit_buffer(d, z->grads_pad);
    d->ops->free(z->param_shard);
    dt_store_close(z->pstore);
    free(z->ptmp);
    d->ops->free(z->grad_shard);
    dt_optimizer_free(&z->opt);
    d->ops->free(z->rs_tmp); /* the trainer drained or aborted the device communicator first */
    d->ops->free(z->rs_alt);
    for (int b = 0; b < 4; b++) free_unit_buffer(d, z->gscratch[b]);
    for (int b = 0; b < 4; b++) free_unit_buffer(d, z->g3.pgather[b]);
    free_unit_buffer(d, z->g3.stage_full);
    free_unit_buffer(d, z->g3.kept);
    free(z->g3.keep);
    dt_comm_free_shared(d->comm, z->zhost);
    dt_free(z->zslice);
    d->ops->free(z->unit32);
    d->ops->free(z->slice32);
    free(z->rs_started);
    free(z->P);
    free(z->S);
    free(z->poff);
    free(z->soff);
    free(z->pieces);
    free(z->repl);
    free(z);
    d->priv = NULL;
}

/* ---- staged collectives (staging.h): through host memory, one unit at a time ---- */

/* Unit u all-gathered from every rank's slice own (S[u] elements) into unit (P[u]), both
 * in storage precision in the backend's memory; own may lie inside unit. */
static dt_status staged_gather(dt_dp *d, int u, const float *own, float *unit) {
    dt_zero *z = dt_zero_of(d);
    size_t e = esz(d), S = z->S[u];
    char *h = (char *)z->zhost, *mine = h + (size_t)d->rank * S * e;
    d->ops->download(mine, own, S * e);
    DT_TRY(dt_allgather(d->comm, mine, h, S, storage_dtype(d)));
    d->ops->upload(unit, h, z->P[u] * e);
    return DT_OK;
}

dt_status dt_zero_staged_reduce_scatter(dt_dp *d, int u, const float *unit, float *out) {
    dt_zero *z = dt_zero_of(d);
    dt_stage_widen(d->ops, z->zhost, unit, z->P[u]);
    DT_TRY(dt_reduce_scatter(d->comm, z->zhost, z->zslice, z->S[u], DT_F32, DT_SUM));
    dt_stage_narrow(d->ops, out, z->zslice, z->S[u]);
    return DT_OK;
}

/* ---- device collectives (comm.backend nccl): on device memory ---- */

/* fp32 runs in place on the communicator's stream; bf16 goes through the fp32 device
 * copies, joined before rounding. */
dt_status dt_zero_direct_reduce_scatter(dt_dp *d, int u, const float *unit, float *out, int join) {
    dt_zero *z = dt_zero_of(d);
    dt_dcomm *dc = d->o.dcomm;
    if (!d->ops->bf16) {
        DT_TRY(dt_dcomm_reduce_scatter(dc, unit, out, z->S[u], DT_F32, DT_SUM));
        return join ? dt_dcomm_join(dc) : DT_OK;
    }
    d->ops->from_bf16(z->unit32, unit, z->P[u]);
    DT_TRY(dt_dcomm_reduce_scatter(dc, z->unit32, z->slice32, z->S[u], DT_F32, DT_SUM));
    DT_TRY(dt_dcomm_join(dc));
    d->ops->to_bf16(out, z->slice32, z->S[u]);
    return DT_OK;
}

dt_status dt_zero_gather_one(dt_dp *d, int u, const float *own, float *unit) {
    dt_zero *z = dt_zero_of(d);
    if (dt_zero_repl(d, u)) { /* every rank holds it whole (the policy's refusals: fp32 host memory) */
        if (own != unit) memmove(unit, own, z->P[u] * esz(d));
        return DT_OK;
    }
    if (d->o.dcomm) return dt_dcomm_allgather(d->o.dcomm, own, unit, z->S[u], storage_dtype(d));
    if (dt_zero_staged(d)) return staged_gather(d, u, own, unit);
    return dt_allgather(d->comm, own, unit, z->S[u], DT_F32);
}

dt_status dt_zero3_fetch_own(dt_dp *d, int u, float *unit) {
    dt_zero *z = dt_zero_of(d);
    return dt_store_fetch_take(z->pstore, z->soff[u], z->S[u], at(d, unit, dt_zero_lo(d, u)));
}

dt_status dt_zero3_gather_own(dt_dp *d, int u, float *unit) {
    dt_zero *z = dt_zero_of(d);
    if (d->N > 1) d->param_bytes += (double)z->P[u] * sizeof(float);
    if (!z->pstore) return dt_zero_gather_one(d, u, at(d, z->param_shard, z->soff[u]), unit);
    if (!dt_zero_devmem(d)) { /* host memory: read to its place, gathered in place */
        DT_TRY(dt_zero3_fetch_own(d, u, unit));
        return dt_zero_gather_one(d, u, at(d, unit, (size_t)d->rank * z->S[u]), unit);
    }
    if (d->o.dcomm) { /* a device's, gathered there: read into host memory, uploaded to its place */
        size_t S = z->S[u];
        DT_TRY(dt_store_read(z->pstore, 0, z->soff[u], S, z->ptmp));
        d->ops->upload(at(d, unit, (size_t)d->rank * S), z->ptmp, S * esz(d));
        return dt_zero_gather_one(d, u, at(d, unit, (size_t)d->rank * S), unit); /* queued after the upload */
    }
    /* a device's or bf16's: read to its place in the host staging, gathered there, uploaded */
    size_t e = esz(d), S = z->S[u];
    char *h = (char *)z->zhost;
    DT_TRY(dt_store_read(z->pstore, 0, z->soff[u], S, h + (size_t)d->rank * S * e));
    DT_TRY(dt_allgather(d->comm, h + (size_t)d->rank * S * e, h, S, storage_dtype(d)));
    d->ops->upload(unit, h, z->P[u] * e);
    return DT_OK;
}

dt_status dt_zero_gather_units(dt_dp *d, float *full) {
    dt_zero *z = dt_zero_of(d);
    for (int u = 0; u < d->m->nunits; u++) DT_TRY(dt_zero3_gather_own(d, u, at(d, full, z->poff[u])));
    return d->o.dcomm ? dt_dcomm_join(d->o.dcomm) : DT_OK;
}

/* Every rank's slices of set (dt_zero_get_slice) gathered whole into fp32 host memory full
 * (padded layout): each rank's slice copied to its place, then gathered in place. */
static dt_status gather_units_f32(dt_dp *d, int set, float *full) {
    dt_zero *z = dt_zero_of(d);
    for (int u = 0; u < d->m->nunits; u++) {
        float *mine = full + z->poff[u] + dt_zero_lo(d, u);
        DT_TRY(dt_zero_get_slice(d, set, u, mine));
        if (!dt_zero_repl(d, u)) DT_TRY(dt_allgather(d->comm, mine, full + z->poff[u], z->S[u], DT_F32));
    }
    return DT_OK;
}

/* ---- step ---- */

/* Pipeline (dt_dp_tied): this rank's slice of unit 0 is the same elements on both end
 * stages, so their sum is the tied gradient (the first stage's wpe meets zeros). */
static dt_status tie_unit0(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    const dt_model_groups *g = &d->o.groups;
    if (!dt_dp_tied(d) || d->m->tensors[0].frozen) return DT_OK; /* frozen wte: no share to add (wpe's alone) */
    float *slice = dt_zero_grad_slice(d, 0);
    if (!dt_zero_devmem(d)) return dt_allreduce(g->emb, slice, z->S[0], DT_F32, DT_SUM);
    if (d->o.dcomm) return dt_fail(DT_EINPUT, "comm.backend nccl: pipelines are not carried yet");
    dt_stage_widen(d->ops, z->zslice, slice, z->S[0]);
    DT_TRY(dt_allreduce(g->emb, z->zslice, z->S[0], DT_F32, DT_SUM));
    dt_stage_narrow(d->ops, slice, z->zslice, z->S[0]);
    return DT_OK;
}

/* HSDP: each shard group reduced its own ranks' gradients; the same shard of every group
 * summed across them makes the whole sum (the host's memory: the layout's check). A unit's
 * slice final during backward was posted then, overlapping the backward of the units
 * before it (dt_zero_replicas_post); it is waited on here. */
dt_status dt_zero_replicas_post(dt_dp *d, int u) {
    dt_zero *z = dt_zero_of(d);
    if (!z->rep_pending || dt_comm_size(d->o.replicas) < 2 || d->ops->bf16 || !z->grad_shard ||
        gpt_unit_frozen(d->m, u) || (u == 0 && dt_dp_tied(d)) || !z->S[u])
        return DT_OK; /* summed in the norm (the tied unit 0 after its sum over the stages) */
    d->grad_bytes += (double)z->S[u] * sizeof(float);
    dt_status s;
    DP_COMM(d, s = dt_iallreduce(d->o.replicas, at(d, z->grad_shard, z->soff[u]), z->S[u], DT_F32, DT_SUM,
                                 &z->rep_pending[u]));
    return s;
}

static dt_status sum_replicas(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    if (!d->o.replicas || dt_comm_size(d->o.replicas) < 2) return DT_OK;
    dt_status s = DT_OK;
    int U = d->m->nunits;
    if (z->grad_shard && !d->ops->bf16) { /* the units posted during backward waited; runs of the others not frozen */
        for (int u = 0, v; u < U && s == DT_OK; u = v) {
            if (z->rep_pending && z->rep_pending[u]) {
                DP_COMM(d, s = dt_wait(z->rep_pending[u]));
                z->rep_pending[u] = NULL;
                v = u + 1;
                continue;
            }
            for (v = u; v < U && !gpt_unit_frozen(d->m, v) && !(z->rep_pending && z->rep_pending[v]); v++) {}
            size_t n = v > u ? z->soff[v - 1] + z->S[v - 1] - z->soff[u] : 0;
            if (n) DP_COMM(d, s = dt_allreduce(d->o.replicas, at(d, z->grad_shard, z->soff[u]), n, DT_F32, DT_SUM));
            d->grad_bytes += (double)n * sizeof(float);
            if (v == u) v++;
        }
        return s;
    }
    /* a unit's slice at a time (zero 1's lie apart); bf16 summed in fp32 and rounded once,
     * as the reduce-scatter within the group was */
    for (int u = 0; u < U && s == DT_OK; u++) {
        float *slice = dt_zero_grad_slice(d, u);
        if (gpt_unit_frozen(d->m, u)) continue;
        d->grad_bytes += (double)z->S[u] * sizeof(float);
        if (!d->ops->bf16) {
            DP_COMM(d, s = dt_allreduce(d->o.replicas, slice, z->S[u], DT_F32, DT_SUM));
            continue;
        }
        dt_stage_widen(d->ops, z->zslice, slice, z->S[u]);
        DP_COMM(d, s = dt_allreduce(d->o.replicas, z->zslice, z->S[u], DT_F32, DT_SUM));
        dt_stage_narrow(d->ops, slice, z->zslice, z->S[u]);
    }
    return s;
}

dt_status dt_zero_norm(dt_dp *d, double *norm) {
    dt_zero *z = dt_zero_of(d);
    gpt_model *m = d->m;
    DT_TRY(sum_replicas(d));
    DT_TRY(tie_unit0(d));
    if (dt_dp_tied(d)) /* final now: off the device (offload; the other units went as they became final) */
        dt_optimizer_grads_ready(&z->opt, z->soff[0], dt_zero_grad_slice(d, 0), z->S[0]);
    int np = 0, mp = dt_state_model_parallel(&d->o.groups);
    dt_grad_piece *p = z->pieces;
    if (mp) { /* each tensor's part of the shard in its class (state.h); a replicated unit by rank 0 alone */
        size_t x0, n, k;
        for (int i = 0; i < m->ntensors; i++)
            if ((!z->repl || !z->repl[m->tensors[i].unit] || d->rank == 0) && shard_segment(d, &m->tensors[i], &x0, &n, &k))
                p[np++] = (dt_grad_piece){slice_grad(d, m->tensors[i].unit, x0), n,
                                          dt_state_norm_class(m, &m->tensors[i])};
    } else if (z->repl) { /* a replicated unit is whole on every rank: counted by rank 0 of the sum alone */
        for (int u = 0; u < m->nunits; u++)
            if (!z->repl[u] || d->rank == 0) p[np++] = (dt_grad_piece){dt_zero_grad_slice(d, u), z->S[u], 0};
    } else if (z->grad_shard) {
        p[np++] = (dt_grad_piece){z->grad_shard, z->shard_total, 0};
    } else { /* zero 1: its slices lie apart, one per unit of the full buffer */
        for (int u = 0; u < m->nunits; u++) p[np++] = (dt_grad_piece){dt_zero_grad_slice(d, u), z->S[u], 0};
    }
    return dt_grad_norm_of(d->ops, p, np, mp ? DT_NORM_NCLASSES : 1, dt_dp_norm_over_dp(d), norm);
}

dt_status dt_zero_adamw(dt_dp *d, double lr, double norm) {
    dt_zero *z = dt_zero_of(d);
    gpt_model *m = d->m;
    float gscale = dt_clip_coef(norm, d->hp.grad_clip);
    DT_TRY(dt_optimizer_begin(&z->opt));
    if (z->pstore) DT_TRY(dt_store_pass_begin(z->pstore)); /* the offloaded shard: a pass alongside */
    for (int i = 0; i < m->ntensors; i++) { /* the shard's order: a pass in ascending k */
        const gpt_tensor *t = &m->tensors[i];
        size_t x0, n, k;
        if (t->frozen || !shard_segment(d, t, &x0, &n, &k)) continue;
        for (size_t j = 0, got = n; j < n; j += got) {
            void *param;
            if (z->pstore) DT_TRY(dt_store_pass_range(z->pstore, k + j, n - j, &param, &got));
            else param = slice_param(d, t->unit, x0);
            DT_TRY(dt_optimizer_step_range(&z->opt, d->step + 1, t->decay, lr, gscale, k + j, param,
                                           slice_grad(d, t->unit, x0 + j), got));
        }
    }
    if (z->pstore) DT_TRY(dt_store_pass_end(z->pstore));
    return dt_optimizer_end(&z->opt);
}

/* zero 1/2: the updated slices to every rank (with overlap they travel while the next
 * forward computes, each unit waited for just before its forward). */
static dt_status allgather_params(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    double t0 = dt_now();
    for (int u = 0; u < d->m->nunits; u++) {
        float *unit = at(d, z->params_pad, z->poff[u]);
        float *own = at(d, unit, dt_zero_lo(d, u));
        /* unchanged since init or load, which gathered it; a replicated unit updated whole on every rank */
        if (gpt_unit_frozen(d->m, u) || dt_zero_repl(d, u)) continue;
        if (d->N > 1) d->param_bytes += (double)z->P[u] * sizeof(float);
        if (!dt_zero_devmem(d) && d->o.overlap && d->N > 1)
            DT_TRY(dt_iallgather(d->comm, own, unit, z->S[u], DT_F32, &z->ag_pending[u]));
        else
            DT_TRY(dt_zero_gather_one(d, u, own, unit));
    }
    /* the next forward reads them after this (on a GPU it overlaps nothing yet) */
    if (d->o.dcomm) DT_TRY(dt_dcomm_join(d->o.dcomm));
    d->comm_s += dt_now() - t0;
    return DT_OK;
}

dt_status dt_zero_update_gather(dt_dp *d, double lr, double norm) {
    DT_TRY(dt_zero_adamw(d, lr, norm));
    return allgather_params(d);
}

dt_status dt_zero_redistribute(dt_dp *d) {
    DT_TRY(allgather_params(d));
    return dt_zero_settle_all(d);
}


/* ---- full views for init, load, save, digest and the sample ---- */

/* Points the model at a full padded parameter buffer: fp32 host memory (host), or the
 * model's memory and precision. */
static dt_status push_full_view(dt_dp *d, int host) {
    dt_zero *z = dt_zero_of(d);
    z->full.host = host;
    if (host) DT_TRY(dt_alloc((void **)&z->full.tmp, z->padded_total * sizeof(float), "full parameters"));
    else DT_TRY(d->ops->alloc((void **)&z->full.tmp, z->padded_total * esz(d), "full parameters"));
    return dt_dp_views_push(d, &z->full.view, z->full.tmp, z->poff, host ? sizeof(float) : esz(d));
}

void dt_zero_release_full(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    dt_dp_views_pop(d, &z->full.view);
    if (z->full.host) dt_free(z->full.tmp);
    else d->ops->free(z->full.tmp);
    z->full.tmp = NULL;
}

/* Unit u from dt_dp_by_unit: this rank's slices kept, and zero 1/2's full parameters. */
static dt_status put_unit(dt_dp *d, void *ctx, int u, float *const *sets, int nsets) {
    dt_zero *z = dt_zero_of(d);
    (void)ctx;
    size_t mine = dt_zero_lo(d, u);
    DT_TRY(put_slice(d, 0, u, sets[0] + mine, z->stage >= 3));
    for (int k = 1; k < nsets; k++) DT_TRY(put_slice(d, k, u, sets[k] + mine, 0));
    /* last: with bf16 storage the narrowing rounds in sets[0] */
    if (z->stage <= 2) dt_stage_narrow(d->ops, at(d, z->params_pad, z->poff[u]), sets[0], z->P[u]);
    return DT_OK;
}

dt_status dt_zero_init_weights(dt_dp *d, uint64_t seed, const char *init_from) {
    dt_zero *z = dt_zero_of(d);
    int from = init_from && *init_from;
    /* zero 1/2's parameters in fp32 host memory are the full weights already */
    if (!from && !dt_zero_devmem(d) && z->stage <= 2) {
        gpt_init(d->m, seed);
        return DT_OK;
    }
    return dt_dp_by_unit(d, seed, from ? init_from : NULL, 0, z->P, put_unit, NULL);
}

dt_status dt_zero_load(dt_dp *d, const char *step_dir) {
    return dt_dp_by_unit(d, 0, step_dir, 1, dt_zero_of(d)->P, put_unit, NULL);
}

/* The full parameters as the model's unit views until dt_zero_release_full: in the
 * model's memory and precision (host = 0: for running it), or as fp32 host memory
 * (host = 1: for checkpoints and the digest; with bf16, the master weights; host = 2: the
 * same, and in private memory even where the parameters are whole already, which on the
 * CPU are node-shared: an asynchronous save's fork snapshots private pages only). */
static dt_status gather_host(dt_dp *d, int host) {
    dt_zero *z = dt_zero_of(d);
    int snapshot = host == 2;
    if (!dt_zero_devmem(d)) host = snapshot; /* the model's memory is fp32 host memory */
    DT_TRY(d->mode->drain(d)); /* the last update's parameters in place */
    if (!host && (z->stage <= 2 || d->o.gather_once)) return DT_OK; /* full already */
    /* allocated here, so every rank must know before the gathers whether all could */
    DT_TRY(dt_comm_agree(d->comm, push_full_view(d, host), NULL));
    if (snapshot && !dt_zero_devmem(d) && z->stage <= 2) { /* node-shared: a fork's child would see later steps */
        memcpy(z->full.tmp, z->params_pad, z->padded_total * sizeof(float));
        return DT_OK;
    }
    if (host) return gather_units_f32(d, 0, z->full.tmp);
    return dt_zero_gather_units(d, z->full.tmp);
}

dt_status dt_zero_gather_full(dt_dp *d) { return gather_host(d, 0); }

static dt_status alloc_views(dt_dp *d, float **base, float ***view) {
    dt_zero *z = dt_zero_of(d);
    DT_TRY(dt_alloc((void **)base, z->padded_total * sizeof(float), "full optimizer state"));
    *view = malloc((size_t)d->m->nunits * sizeof(float *));
    if (!*view) {
        dt_free(*base);
        *base = NULL;
        return dt_fail(DT_ERUNTIME, "out of memory (views)");
    }
    for (int u = 0; u < d->m->nunits; u++) (*view)[u] = *base + z->poff[u];
    return DT_OK;
}

static void free_views(float **m_view, float **v_view) {
    if (m_view) dt_free(m_view[0]); /* poff[0] == 0: the first unit starts the buffer */
    if (v_view) dt_free(v_view[0]);
    free(m_view);
    free(v_view);
}

/* Full optimizer moments as unit views (temporary buffers, freed by free_views). */
static dt_status full_moments(dt_dp *d, float ***m_view, float ***v_view) {
    float *mb = NULL, *vb = NULL;
    *m_view = *v_view = NULL;
    dt_status s = alloc_views(d, &mb, m_view);
    if (s == DT_OK) s = alloc_views(d, &vb, v_view);
    DT_TRY(dt_comm_agree(d->comm, s, NULL)); /* before the gathers, as above */
    DT_TRY(gather_units_f32(d, 1, mb));
    return gather_units_f32(d, 2, vb);
}

dt_status dt_zero_open_full(dt_dp *d, int moments, int snapshot, int reader, float ***mv, float ***vv) {
    (void)reader; /* every rank takes part in the gathers and gets the whole state */
    *mv = *vv = NULL;
    DT_TRY(gather_host(d, snapshot ? 2 : 1));
    return moments ? full_moments(d, mv, vv) : DT_OK;
}

dt_status dt_zero_close_full(dt_dp *d, float **mv, float **vv) {
    free_views(mv, vv);
    dt_zero_release_full(d);
    return DT_OK;
}

void dt_zero_memory(const dt_dp *d, dt_mem_report *r) {
    dt_zero *z = dt_zero_of(d);
    size_t f = sizeof(float), e = esz(d);
    r->params = (z->stage <= 2 ? z->padded_total : z->param_shard ? z->shard_total : 0) * e +
                (z->opt.master ? z->shard_total * f : 0);
    r->grads = (z->stage == 1 ? z->padded_total : z->shard_total) * e; /* zero 1: reduced in place */
    r->optim = z->opt.store || z->opt.fmaster ? 0 : dt_optimizer_moment_bytes(&z->opt); /* offloaded: elsewhere */
    r->workspace = d->workspace_bytes;
    dt_optimizer_offload_bytes(&z->opt, &r->offload_host, &r->offload_file);
    if (z->pstore) {
        r->offload_host += dt_store_host_bytes(z->pstore);
        r->offload_file += dt_store_file_bytes(z->pstore);
    }
}
