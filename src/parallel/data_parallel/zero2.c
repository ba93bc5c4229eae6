/* ZeRO-2: gradients partitioned too. Each unit's gradients are produced in a scratch
 * buffer, reduce-scattered as soon as the unit's backward is done and accumulated into
 * the rank's gradient shard; no full-size gradient buffer exists. Each rank updates its
 * slice and the parameters are all-gathered, as in ZeRO-1 (zero_shard.h). ZeRO-3 shares
 * the gradient side (dt_zero2_*). */
#include "zero_shard.h"

static dt_status zero2_setup(dt_dp *d) { return dt_zero_setup(d, 2); }

void dt_zero2_begin_step(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    d->ops->zero(z->grad_shard, z->shard_total * dt_elem_bytes(d->ops));
}

/* Unit u's slice is final (last micro-step): off the device now (offload); a pipeline's
 * tied unit 0 after its sum over the stages (dt_zero_norm) */
static dt_status hand_over(dt_dp *d, int u, int last_micro) {
    dt_zero *z = dt_zero_of(d);
    if (last_micro && !(u == 0 && dt_dp_tied(d)))
        dt_optimizer_grads_ready(&z->opt, z->soff[u], dt_dp_at(d, z->grad_shard, z->soff[u]), z->S[u]);
    return last_micro ? dt_zero_replicas_post(d, u) : DT_OK;
}

dt_status dt_zero2_finish_pending(dt_dp *d) {
    dt_zero *z = dt_zero_of(d);
    if (z->rs_pending < 0) return DT_OK;
    int p = z->rs_pending;
    z->rs_pending = -1;
    dt_status s;
    DP_COMM(d, s = dt_dcomm_join(d->o.dcomm));
    DT_TRY(s);
    float *dst = dt_dp_at(d, z->grad_shard, z->soff[p]);
    d->ops->add(dst, dst, z->rs_alt, z->S[p]);
    DT_TRY(hand_over(d, p, z->rs_pending_final));
    return DT_OK;
}

dt_status dt_zero2_before_backward(dt_dp *d, int u) {
    dt_zero *z = dt_zero_of(d);
    if (u == GPT_HEAD_PART) return DT_OK;
    /* a reduce-scatter still reading this scratch (unit 0's, from the last micro-step) ends first */
    if (z->rs_pending >= 0 && dt_zero_gscratch_of(d, z->rs_pending) == dt_zero_gscratch_of(d, u))
        DT_TRY(dt_zero2_finish_pending(d));
    d->ops->zero(d->m->unit_grads[u], z->P[u] * dt_elem_bytes(d->ops));
    return DT_OK;
}

dt_status dt_zero2_after_backward(dt_dp *d, int u) {
    dt_zero *z = dt_zero_of(d);
    dt_status s;
    if (gpt_unit_frozen(d->m, u)) { /* no gradient: its slice of the shard stays zero (begin_step) */
        return hand_over(d, u, d->last_micro);
    }
    if (d->N > 1) d->grad_bytes += (double)z->P[u] * sizeof(float); /* the reduce-scatter's input */
    if (dt_zero_rs_overlap(d)) { /* the previous unit's slice added, this unit's queued behind its backward */
        DT_TRY(dt_zero2_finish_pending(d));
        DP_COMM(d, s = dt_zero_direct_reduce_scatter(d, u, d->m->unit_grads[u], z->rs_tmp, 0));
        DT_TRY(s);
        float *t = z->rs_tmp; /* in flight into rs_alt now; the next one goes to the other buffer */
        z->rs_tmp = z->rs_alt;
        z->rs_alt = t;
        z->rs_pending = u;
        z->rs_pending_final = d->last_micro;
        return DT_OK;
    }
    /* reduce-scatter this unit's gradients now and keep only this rank's slice; a replicated
     * unit (parallel.policy's ddp) all-reduced in its scratch and kept whole */
    if (dt_zero_repl(d, u)) {
        DP_COMM(d, s = dt_allreduce(d->comm, d->m->unit_grads[u], z->P[u], DT_F32, DT_SUM));
        DT_TRY(s);
        float *dst = dt_dp_at(d, z->grad_shard, z->soff[u]);
        d->ops->add(dst, dst, d->m->unit_grads[u], z->S[u]);
        return hand_over(d, u, d->last_micro);
    }
    if (d->o.dcomm) DP_COMM(d, s = dt_zero_direct_reduce_scatter(d, u, d->m->unit_grads[u], z->rs_tmp, 1));
    else if (dt_zero_staged(d)) DP_COMM(d, s = dt_zero_staged_reduce_scatter(d, u, d->m->unit_grads[u], z->rs_tmp));
    else DP_COMM(d, s = dt_reduce_scatter(d->comm, d->m->unit_grads[u], z->rs_tmp, z->S[u], DT_F32, DT_SUM));
    DT_TRY(s);
    float *dst = dt_dp_at(d, z->grad_shard, z->soff[u]);
    d->ops->add(dst, dst, z->rs_tmp, z->S[u]);
    return hand_over(d, u, d->last_micro);
}

/* the shard is reduced already (each unit as its backward ended) */
dt_status dt_zero2_reduce(dt_dp *d, double *norm) { return dt_zero_norm(d, norm); }

static dt_status zero2_drain(dt_dp *d) {
    DT_TRY(dt_zero2_finish_pending(d));
    return dt_zero_settle_all(d);
}

const dt_dp_strategy dt_dp_zero2 = {
    DT_ZERO_SHARED_OPS,
    .name = "zero2",
    .grads = DT_GRADS_SHARD,
    .setup = zero2_setup,
    .begin_step = dt_zero2_begin_step,
    .before_forward = dt_zero_settle_unit, /* the update's all-gather of this unit */
    .before_backward = dt_zero2_before_backward,
    .after_backward = dt_zero2_after_backward,
    .drain = zero2_drain,
    .reduce = dt_zero2_reduce,
    .update = dt_zero_update_gather,
    .init_weights = dt_zero_init_weights,
    .load = dt_zero_load,
    .redistribute = dt_zero_redistribute,
    .ring = {{1, 1}, {1, 1}}, /* a reduce-scatter per micro-batch, the update's all-gather */
    .formula = {"2psi+14psi/N", "4psi+12psi/N", 2, 14, {0, 1, 1}, 0, 0},
};
