/* ZeRO-1: optimizer state partitioned. Full parameters and gradients; after accumulation
 * each unit's gradients are reduce-scattered in place (the rank's reduced slice replaces
 * its own slice of the full buffer, so there is no separate gradient shard: 8Ψ+8Ψ/N in
 * fp32), started during backward of the last micro-step as DDP's buckets are; each rank
 * updates its slice, and the parameters are all-gathered (zero_shard.h). */
#include "zero_shard.h"

static dt_status zero1_setup(dt_dp *d) { return dt_zero_setup(d, 1); }

static void zero1_begin_step(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    d->ops->zero(z->grads_pad, z->padded_total * dt_elem_bytes(d->ops));
}

/* Unit u's gradients, reduce-scattered in place: this rank's slice of the unit becomes
 * the sum over ranks, the other slices are left undefined (begin_step zeroes them).
 * Backward never touches a unit again after its after_backward hook. */
static dt_status reduce_scatter(dt_dp *d, int u, dt_request **req) {
    dt_zero *z = dt_zero_of(d);
    if (gpt_unit_frozen(d->m, u)) return DT_OK; /* zeros (begin_step) that no one needs summed */
    if (d->N > 1) d->grad_bytes += (double)z->P[u] * sizeof(float); /* the reduce-scatter's input */
    float *unit = dt_dp_at(d, z->grads_pad, z->poff[u]);
    if (dt_zero_repl(d, u)) { /* parallel.policy's ddp unit: all-reduced in place, whole on every rank */
        if (req) return dt_iallreduce(d->comm, unit, z->P[u], DT_F32, DT_SUM, req);
        return dt_allreduce(d->comm, unit, z->P[u], DT_F32, DT_SUM);
    }
    if (d->o.dcomm) return dt_zero_direct_reduce_scatter(d, u, unit, dt_zero_grad_slice(d, u), 0); /* end_step joins */
    if (dt_zero_staged(d)) return dt_zero_staged_reduce_scatter(d, u, unit, dt_zero_grad_slice(d, u));
    if (req) return dt_ireduce_scatter(d->comm, unit, dt_zero_grad_slice(d, u), z->S[u], DT_F32, DT_SUM, req);
    return dt_reduce_scatter(d->comm, unit, dt_zero_grad_slice(d, u), z->S[u], DT_F32, DT_SUM);
}

/* Unit u's gradients are final (last micro-step): start its reduce-scatter now,
 * overlapping the rest of backward, as DDP does with buckets. A unit whose start fails is
 * reduce-scattered blocking in end_step (staged ones all are, and bf16's on the device
 * communicator, which share its fp32 copy). On the device communicator the collective is
 * queued on its stream, and end_step joins it. */
static dt_status zero1_after_backward(dt_dp *d, int u) {
    dt_zero *z = dt_zero_of(d);
    if (!d->last_micro || d->N == 1 || !d->o.overlap || dt_zero_staged(d) || gpt_unit_frozen(d->m, u)) return DT_OK;
    if (d->o.dcomm) {
        if (d->ops->bf16) return DT_OK;
        DT_TRY(reduce_scatter(d, u, NULL));
        z->rs_started[u] = 1;
        return DT_OK;
    }
    dt_request **slot;
    DT_TRY(dt_dp_inflight_slot(d, &slot));
    DT_TRY(reduce_scatter(d, u, slot));
    d->ninflight++;
    z->rs_started[u] = 1;
    return DT_OK;
}

/* Unit u's slice is final: off the device now (offload), from the host copy the staged
 * reduction left it in when there is one; a pipeline's tied unit 0 after its sum over the
 * stages (dt_zero_norm). */
static void hand_over(dt_dp *d, int u, const void *host) {
    dt_zero *z = dt_zero_of(d);
    if (u == 0 && dt_dp_tied(d)) return;
    if (host) dt_optimizer_grads_ready_host(&z->opt, z->soff[u], host, z->S[u]);
    else dt_optimizer_grads_ready(&z->opt, z->soff[u], dt_zero_grad_slice(d, u), z->S[u]);
}

/* Each unit's slice goes to the optimizer as soon as its reduce-scatter is done, so the
 * copies overlap the reduce-scatters still to come; on the device communicator, after
 * they are joined. */
static dt_status zero1_reduce(dt_dp *d, double *norm) {
    dt_zero *z = dt_zero_of(d);
    int nu = d->m->nunits, dc = d->o.dcomm != NULL, staged = dt_zero_staged(d);
    DT_TRY(dt_dp_inflight_wait(d)); /* the units started during backward */
    double t0 = dt_now();
    for (int u = 0; u < nu && !dc; u++)
        if (z->rs_started[u]) hand_over(d, u, NULL);
    for (int u = 0; u < nu; u++) {
        if (!z->rs_started[u]) {
            DT_TRY(reduce_scatter(d, u, NULL));
            if (!dc) hand_over(d, u, staged ? z->zslice : NULL); /* staged: the slice, rounded, on the host */
        }
        z->rs_started[u] = 0;
    }
    if (dc) DT_TRY(dt_dcomm_join(d->o.dcomm));
    for (int u = 0; u < nu && dc; u++) hand_over(d, u, NULL);
    d->comm_s += dt_now() - t0;
    return dt_zero_norm(d, norm);
}

const dt_dp_strategy dt_dp_zero1 = {
    DT_ZERO_SHARED_OPS,
    .name = "zero1",
    .grads = DT_GRADS_PADDED,
    .setup = zero1_setup,
    .begin_step = zero1_begin_step,
    .before_forward = dt_zero_settle_unit, /* the update's all-gather of this unit */
    .after_backward = zero1_after_backward,
    .drain = dt_zero_settle_all,
    .reduce = zero1_reduce,
    .update = dt_zero_update_gather,
    .init_weights = dt_zero_init_weights,
    .load = dt_zero_load,
    .redistribute = dt_zero_redistribute,
    .ring = {{2, 0}, {2, 0}}, /* the gradients' reduce-scatter, the parameters' all-gather */
    .formula = {"4psi+12psi/N", "8psi+8psi/N", 4, 12, {0, 0, 1}, 0, 0},
};
