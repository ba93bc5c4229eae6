/* The central rank (dp_mode ps; docs/parallelism.md, "Data-parallel modes"): gradients reduced to rank 0, which
 * updates and broadcasts the parameters; only it keeps optimizer state. The baseline
 * DDP beats. A device's or bf16's state goes through the fp32 host copy, in and out
 * (bf16: the root's fp32 master weights stay there, the others get the model's bf16 copy). */
#include "flat.h"

static dt_status ps_setup(dt_dp *d) { return dt_flat_setup(d, d->rank == 0); }

static dt_status ps_reduce(dt_dp *d, double *norm) {
    if (d->N == 1) return dt_flat_local_norm(d, norm);
    dt_flat *f = dt_flat_of(d);
    dt_status s = DT_OK;
    double sum = 0.0;
    float *g = f->grads_host ? f->grads_host : f->grads;
    if (f->grads_host) DP_COMM(d, dt_flat_grads_to_host(d));
    size_t lo, hi; /* the runs outside frozen tensors (all of it when none is) */
    for (size_t top = d->m->nparams; s == DT_OK && gpt_trainable_run(d->m, 0, top, &lo, &hi); top = lo) {
        DP_COMM(d, s = dt_reduce(d->comm, g + lo, hi - lo, DT_F32, DT_SUM, 0));
        d->grad_bytes += (double)(hi - lo) * sizeof(float);
    }
    if (s == DT_OK && d->rank == 0 && f->grads_host) dt_flat_grads_from_host(d);
    /* the roots of the model-parallel groups are such groups themselves */
    if (s == DT_OK && d->rank == 0) s = dt_flat_local_norm(d, &sum);
    if (s == DT_OK) s = dt_bcast(d->comm, &sum, 1, DT_F64, 0);
    *norm = sum;
    return s;
}

static dt_status ps_update(dt_dp *d, double lr, double norm) {
    dt_flat *f = dt_flat_of(d);
    size_t n = d->m->nparams;
    dt_status s = DT_OK;
    if (d->rank == 0) s = dt_flat_update(d, lr, norm);
    if (d->N == 1 || s != DT_OK) return s;
    if (f->grads_host) { /* the updated parameters, from the root's device */
        size_t bytes = n * dt_elem_bytes(d->ops);
        if (d->rank == 0) d->ops->download(f->grads_host, f->params, bytes);
        DP_COMM(d, s = dt_bcast(d->comm, f->grads_host, n, d->ops->bf16 ? DT_BF16 : DT_F32, 0));
        if (s == DT_OK && d->rank != 0) d->ops->upload(f->params, f->grads_host, bytes);
        return s;
    }
    DP_COMM(d, s = dt_bcast(d->comm, f->params, n, DT_F32, 0));
    return s;
}

const dt_dp_strategy dt_dp_ps = {
    DT_FLAT_SHARED_OPS,
    .name = "ps",
    .grads = DT_GRADS_FLAT,
    .setup = ps_setup,
    .reduce = ps_reduce,
    .update = ps_update,
    .formula = {NULL, NULL, 0, 0, {0, 0, 0}, 16, 8}, /* the root: 16psi, the others 8psi */
};
