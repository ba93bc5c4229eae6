/* DDP (zero 0): gradients all-reduced in buckets, started during backward of the last
 * micro-step as soon as a bucket's gradients are final (overlap); no communication on
 * earlier accumulation micro-steps. A device's or bf16's gradients are reduced in fp32:
 * through the host copy after backward, or on the device communicator a bucket at a time. */
#include "flat.h"

#include <math.h>

static dt_status launch_bucket(dt_dp *d) {
    dt_flat *f = dt_flat_of(d);
    if (f->bucket_hi <= f->bucket_lo) return DT_OK;
    d->grad_bytes += (double)(f->bucket_hi - f->bucket_lo) * sizeof(float); /* reduced in fp32 */
    if (d->o.dcomm) { /* queued on the device communicator's stream; end_step joins */
        size_t n = f->bucket_hi - f->bucket_lo;
        float *g = dt_dp_at(d, f->grads, f->bucket_lo);
        f->bucket_lo = f->bucket_hi = 0;
        if (!f->bucket32) return dt_dcomm_allreduce(d->o.dcomm, g, n, DT_F32, DT_SUM);
        /* bf16: widened into the fp32 bucket, reduced there, rounded back */
        d->ops->from_bf16(f->bucket32, g, n);
        DT_TRY(dt_dcomm_allreduce(d->o.dcomm, f->bucket32, n, DT_F32, DT_SUM));
        DT_TRY(dt_dcomm_join(d->o.dcomm));
        d->ops->to_bf16(g, f->bucket32, n);
        return DT_OK;
    }
    dt_request **slot;
    DT_TRY(dt_dp_inflight_slot(d, &slot));
    float *g = f->grads_host ? f->grads_host : f->grads; /* host staging for device gradients */
    DT_TRY(dt_iallreduce(d->comm, g + f->bucket_lo, f->bucket_hi - f->bucket_lo, DT_F32, DT_SUM, slot));
    d->ninflight++;
    f->bucket_lo = f->bucket_hi = 0;
    return DT_OK;
}

/* Gradient norm of the all-reduced (identical) gradients, each rank summing squares over
 * its 1/N of them; the partials are gathered and added in rank order on every rank, so
 * every replica gets the same bits and applies the same clipping. */
static dt_status gather_in_rank_order(void *ctx, double *part, int nparts, double *norm) {
    dt_dp *d = ctx;
    dt_flat *f = dt_flat_of(d);
    double sum = 0.0;
    (void)nparts; /* one */
    DT_TRY(dt_allgather(d->comm, part, f->norm_parts, 1, DT_F64));
    for (int q = 0; q < d->N; q++) sum += f->norm_parts[q];
    *norm = sqrt(sum);
    return DT_OK;
}

static dt_status ddp_norm(dt_dp *d, double *norm) {
    dt_flat *f = dt_flat_of(d);
    size_t n = d->m->nparams, lo = n * (size_t)d->rank / (size_t)d->N, hi = n * (size_t)(d->rank + 1) / (size_t)d->N;
    dt_grad_piece mine = {dt_dp_at(d, f->grads, lo), hi - lo, 0};
    return dt_grad_norm_of(d->ops, &mine, 1, 1, (dt_norm_reduce){gather_in_rank_order, d}, norm);
}

/* Offload (grads_early): one rank's gradients are final after a unit's backward, except a
 * pipeline end stage's tied unit 0, final after its sum over the stages (reduce); several
 * ranks' after their all-reduce. */
static int final_in_backward(const dt_dp *d, int u) { return d->N == 1 && !(u == 0 && dt_dp_tied(d)); }

/* Unit u's gradients are final for this micro-step. Units arrive in descending
 * offset order, so the bucket stays one contiguous range. */
static dt_status ddp_after_backward(dt_dp *d, int u) {
    dt_flat *f = dt_flat_of(d);
    const gpt_unit *un = &d->m->units[u];
    if (d->last_micro && final_in_backward(d, u) && un->count) /* final: off the device now (offload) */
        dt_optimizer_grads_ready(&f->opt, un->offset, dt_dp_at(d, f->grads, un->offset), un->count);
    /* device gradients are staged to the host once, after backward (end_step), and bf16
     * ones on the device communicator share one fp32 copy; without overlap everything is
     * reduced there */
    if (!d->last_micro || d->N == 1 || f->grads_host || !d->o.overlap || f->bucket32) return DT_OK;
    if (un->count == 0) return DT_OK;
    /* each run of the unit outside frozen tensors (the whole unit when none is), top down;
     * a run below a gap (a frozen tensor; a pipeline's last stage finishes ln_f and wte in
     * its loss, its blocks later) sends the bucket so far first */
    size_t lo, hi;
    for (size_t top = un->offset + un->count; gpt_trainable_run(d->m, un->offset, top, &lo, &hi); top = lo) {
        if (f->bucket_hi > f->bucket_lo && hi != f->bucket_lo) DT_TRY(launch_bucket(d));
        if (f->bucket_hi <= f->bucket_lo) f->bucket_hi = hi;
        f->bucket_lo = lo;
        if ((f->bucket_hi - f->bucket_lo) * sizeof(float) >= d->o.bucket_bytes) DT_TRY(launch_bucket(d));
    }
    return DT_OK;
}

/* The buckets not started during backward (all of them without overlap, or through a
 * host or fp32 copy), in buckets of the same size; then every one finished. */
static dt_status ddp_allreduce(dt_dp *d) {
    dt_flat *f = dt_flat_of(d);
    dt_status s = DT_OK;
    if (f->grads_host) { /* device or bf16 gradients: to fp32 host memory, reduced there, back below */
        f->bucket_lo = 0;
        f->bucket_hi = d->m->nparams;
        DP_COMM(d, dt_flat_grads_to_host(d));
    }
    if (!d->o.overlap || f->bucket32) {
        f->bucket_lo = 0;
        f->bucket_hi = d->m->nparams;
    }
    if (!d->o.overlap || f->grads_host || f->bucket32) { /* each trainable run, in buckets, top down */
        size_t lo, hi, step = d->o.bucket_bytes / sizeof(float) + 1;
        for (size_t run = f->bucket_hi; s == DT_OK && gpt_trainable_run(d->m, f->bucket_lo, run, &lo, &hi); run = lo)
            for (size_t top = hi; top > lo && s == DT_OK;) {
                f->bucket_hi = top;
                f->bucket_lo = top - lo > step ? top - step : lo;
                top = f->bucket_lo;
                s = launch_bucket(d);
            }
    } else {
        s = launch_bucket(d);
    }
    dt_status w = dt_dp_inflight_wait(d);
    if (s == DT_OK) s = w;
    if (s == DT_OK && d->o.dcomm) DP_COMM(d, s = dt_dcomm_join(d->o.dcomm));
    if (s == DT_OK && f->grads_host) {
        dt_flat_grads_from_host(d);
        s = d->ops->sync();
        /* the rounded sums are on the host: the optimizer takes them from there, not
         * off the device again (a tied unit 0 changes still: hand_over_rest) */
        const gpt_unit *u0 = &d->m->units[0];
        size_t e = dt_elem_bytes(d->ops), a = u0->offset, b = a + u0->count, n = d->m->nparams;
        const char *h = (const char *)f->grads_host;
        if (s == DT_OK && !dt_dp_tied(d)) dt_optimizer_grads_ready_host(&f->opt, 0, h, n);
        if (s == DT_OK && dt_dp_tied(d)) {
            dt_optimizer_grads_ready_host(&f->opt, 0, h, a);
            dt_optimizer_grads_ready_host(&f->opt, b, h + b * e, n - b);
        }
    }
    return s;
}

/* After the reduction and the tied embedding's sum: what is not handed over yet. */
static void hand_over_rest(dt_dp *d) {
    dt_flat *f = dt_flat_of(d);
    const gpt_unit *u0 = &d->m->units[0];
    if (d->N > 1 && !f->grads_host) dt_optimizer_grads_ready(&f->opt, 0, f->grads, d->m->nparams);
    else if (dt_dp_tied(d)) dt_optimizer_grads_ready(&f->opt, u0->offset, dt_dp_at(d, f->grads, u0->offset), u0->count);
}

static dt_status ddp_reduce(dt_dp *d, double *norm) {
    if (d->N == 1) {
        DT_TRY(dt_flat_local_norm(d, norm));
    } else {
        DT_TRY(ddp_allreduce(d));
        DT_TRY(dt_state_model_parallel(&d->o.groups) ? dt_flat_layout_norm(d, norm) : ddp_norm(d, norm));
    }
    hand_over_rest(d);
    return DT_OK;
}

static dt_status ddp_setup(dt_dp *d) { return dt_flat_setup(d, !d->o.no_update); }

const dt_dp_strategy dt_dp_ddp = {
    DT_FLAT_SHARED_OPS,
    .name = "ddp",
    .grads = DT_GRADS_FLAT,
    .setup = ddp_setup,
    .after_backward = ddp_after_backward,
    .reduce = ddp_reduce,
    .update = dt_flat_update,
    .formula = {"16psi", "16psi", 16, 0, {0, 0, 0}, 0, 0},
};
