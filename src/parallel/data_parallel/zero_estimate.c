/* The ZeRO stages on paper (strategy.h's estimate): a stage's units padded and sharded as
 * zero_shard.c lays them out, and the per-rank bytes of what a stage keeps whole or
 * sharded, for `dtrain estimate` and the planner (no engine). */
#include <math.h>

#include <stdlib.h>

#include "zero_shard.h"

#include <string.h>

#include "../layout/policy.h"

double dt_dp_frozen_flat(const dt_dp_stage *s) {
    gpt_model m;
    if (!s->L->cfg.train.freeze[0]) return 0;
    if (gpt_table_layout(&m, &s->L->shape, s->lay, s->L->cfg.train.freeze) != DT_OK) {
        dt_error_clear(); /* a layout the check refuses: it says so */
        return 0;
    }
    double n = (double)gpt_frozen_count(&m);
    gpt_destroy(&m);
    return n;
}

dt_status dt_zero_policy_repl(const char *policy, int zero, const gpt_model *m, unsigned char *repl,
                              unsigned char *keep) {
    memset(repl, 0, (size_t)m->nunits);
    if (keep) memset(keep, 0, (size_t)m->nunits);
    if (!policy || !policy[0]) return DT_OK;
    signed char *mode = malloc((size_t)m->nunits);
    if (!mode) return dt_fail(DT_ERUNTIME, "out of memory (parallel.policy)");
    dt_status s = dt_policy_units(policy, zero, m, mode);
    int three = 0;
    for (int u = 0; s == DT_OK && u < m->nunits; u++) three |= mode[u] == 3 && m->units[u].count > 0;
    for (int u = 0; s == DT_OK && u < m->nunits; u++) {
        repl[u] = mode[u] == 0;
        if (keep) keep[u] = three && mode[u] == 2;
    }
    free(mode);
    return s;
}

double dt_zero_frozen_ranges(const gpt_model *m, const size_t *S, const size_t *soff, const unsigned char *repl,
                             size_t r, dt_opt_range *out, int *nout) {
    double f = 0;
    int n = 0;
    for (int u = 0, i = 0; u < m->nunits; u++) {
        size_t lo = repl && repl[u] ? 0 : r * S[u], hi = lo + S[u];
        int whole = gpt_unit_frozen(m, u);
        if (whole && S[u]) {
            if (out) out[n] = (dt_opt_range){soff[u], S[u]};
            n++, f += (double)S[u];
        }
        for (; i < m->ntensors && m->tensors[i].unit == u; i++) {
            const gpt_tensor *t = &m->tensors[i];
            size_t a = t->offset - m->units[u].offset, b = a + t->numel, x = a > lo ? a : lo, y = b < hi ? b : hi;
            if (whole || !t->frozen || x >= y) continue;
            if (out) out[n] = (dt_opt_range){soff[u] + (x - lo), y - x};
            n++, f += (double)(y - x);
        }
    }
    if (nout) *nout = n;
    return f;
}

double dt_dp_frozen_shard(const dt_dp_stage *s) {
    gpt_model m;
    if (!s->L->cfg.train.freeze[0]) return 0;
    if (gpt_table_layout(&m, &s->L->shape, s->lay, s->L->cfg.train.freeze) != DT_OK) {
        dt_error_clear();
        return 0;
    }
    size_t N = (size_t)s->shards, A = N * s->align, *S = calloc((size_t)m.nunits * 2, sizeof(size_t)), at = 0;
    unsigned char *repl = calloc((size_t)m.nunits, 1);
    double fewest = -1;
    if (repl && s->L->replicated &&
        dt_zero_policy_repl(s->L->cfg.parallel.policy, s->L->cfg.parallel.zero, &m, repl, NULL))
        dt_error_clear(); /* a policy the check refuses: it says so */
    for (int u = 0; S && repl && u < m.nunits; u++) { /* as zero_shard.c lays the units out */
        S[u] = (m.units[u].count + A - 1) / A * A / (repl[u] ? 1 : N);
        S[m.nunits + u] = at;
        at += S[u];
    }
    for (size_t r = 0; S && repl && r < N; r++) {
        double f = dt_zero_frozen_ranges(&m, S, S + m.nunits, repl, r, NULL, NULL);
        if (fewest < 0 || f < fewest) fewest = f;
    }
    free(S);
    free(repl);
    gpt_destroy(&m);
    return fewest < 0 ? 0 : fewest;
}

dt_zero_units dt_zero_units_of(const dt_dp_stage *s) {
    dt_zero_units u;
    size_t cnt[3], half[2];
    gpt_unit_counts_layout(&s->L->shape, s->lay, &cnt[0], half, &cnt[2], &u.nb);
    cnt[1] = half[0] > half[1] ? half[0] : half[1]; /* the largest block unit (a split block's larger half) */
    double A = (double)s->shards * (double)s->align, hP[2], hS[2];
    for (int k = 0; k < 3; k++) {
        u.cnt[k] = (double)cnt[k];
        u.P[k] = ceil(u.cnt[k] / A) * A;
        u.S[k] = u.P[k] / s->shards;
    }
    for (int k = 0; k < 2; k++) { /* a block's units, padded apart */
        hP[k] = ceil((double)half[k] / A) * A;
        hS[k] = hP[k] / s->shards;
    }
    u.flat = u.cnt[0] + u.nb * (double)(half[0] + half[1]) + u.cnt[2];
    u.padded = u.P[0] + u.nb * (hP[0] + hP[1]) + u.P[2];
    u.shard = u.S[0] + u.nb * (hS[0] + hS[1]) + u.S[2];
    u.maxS = fmax(u.S[0], fmax(u.S[1], u.S[2]));
    u.gather = u.P[0] + u.P[2] + 2 * u.P[1];
    if (!s->L->replicated) return u;
    /* parallel.policy's replicated units: whole on every rank (S = P), not gathered */
    gpt_model m;
    if (gpt_table_layout(&m, &s->L->shape, s->lay, NULL) != DT_OK) {
        dt_error_clear(); /* a layout the check refuses: it says so */
        return u;
    }
    unsigned char *repl = malloc((size_t)m.nunits * 2), *keep = repl ? repl + m.nunits : NULL;
    if (repl && dt_zero_policy_repl(s->L->cfg.parallel.policy, s->L->cfg.parallel.zero, &m, repl, keep) == DT_OK) {
        int last = m.nunits - 1;
        if (!s->mode->params_shard) memset(keep, 0, (size_t)m.nunits); /* zero2 units matter among zero3's */
        /* ZeRO-3's buffers: a gather buffer for the embeddings and ln_f, two of the largest
         * block unit gathered, and the zero2 units whole (zero_shard.c) */
        double sharded_block = 0, kept = 0;
        for (int k = 0; k < m.nunits; k++) {
            double P = ceil((double)m.units[k].count / A) * A;
            if (keep[k]) kept += P;
            else if (!repl[k] && k > 0 && k < last) sharded_block = fmax(sharded_block, P);
            if (!repl[k] || m.units[k].count == 0) continue;
            u.shard += P - P / s->shards;
            u.maxS = fmax(u.maxS, P);
        }
        u.gather = (repl[0] || keep[0] ? 0 : u.P[0]) + (repl[last] || keep[last] ? 0 : u.P[2]) + 2 * sharded_block +
                   kept;
        if (repl[0]) u.S[0] = u.P[0];
        if (repl[last]) u.S[2] = u.P[2];
    } else {
        dt_error_clear();
    }
    free(repl);
    gpt_destroy(&m);
    return u;
}

/* Parameters and gradients (padded, or the shard), the moments of the shard; with a
 * gradient shard its scratch (embedding, ln_f, one block) and reduce-scatter buffer; with
 * a parameter shard the gathered parameters (embedding, ln_f and two blocks, or under a pipeline the
 * whole stage). bf16: parameters and gradients in bf16, fp32 master weights of the slices,
 * and on the CPU the fp32 host staging of the reductions (the largest unit and slice; on
 * a device that is host memory, left out as the memory report does), or with device
 * collectives fp32 device copies of the same sizes. Offload moves the shard's moments (and
 * bf16's master weights) off the device, and with a parameter shard (ZeRO-3) that shard,
 * fetched for forward and backward of each micro-step (once a step under a pipeline,
 * which gathers the stage once). */
void dt_zero_estimate(const dt_dp_stage *s, double *state, double *work) {
    (void)work;
    const dt_layout *L = s->L;
    int params_shard = s->mode->params_shard, grads_shard = s->mode->grads == DT_GRADS_SHARD;
    dt_zero_units u = dt_zero_units_of(s);
    int bf16 = dt_layout_bf16(L);
    double maxS = u.maxS, maxP = fmax(u.P[0], fmax(u.P[1], u.P[2]));
    double f = sizeof(float), e = bf16 ? 2 : f;
    double fz = dt_dp_frozen_shard(s); /* no moments for them */
    double b = ((params_shard ? u.shard : u.padded) + (grads_shard ? u.shard : u.padded)) * e + 2 * (u.shard - fz) * f;
    if (bf16) b += u.shard * f;
    if (grads_shard) b += (maxS + u.P[0] + u.P[2] + u.P[1]) * e;
    if (params_shard) b += (L->pp > 1 ? u.padded : u.gather) * e;
    if (bf16 && L->backend == DT_BACKEND_CPU) b += (maxP + maxS) * f;
    if (bf16 && dt_layout_nccl(L)) b += (maxP + maxS) * f; /* the fp32 device copies */
    /* fp32 on the device communicator: a second block scratch and reduce-scatter buffer,
     * so each unit's reduce-scatter overlaps the next unit's backward */
    if (!bf16 && grads_shard && L->cfg.parallel.overlap && dt_layout_nccl(L)) b += (maxS + u.P[1]) * f;
    if (L->offload_optimizer != DT_OFFLOAD_NONE) {
        b -= 2 * (u.shard - fz) * f + (bf16 ? u.shard * f : 0);
        if (s->off) s->off->optim_n = u.shard - fz, s->off->optim_frozen = fz;
        if (s->off) s->off->optim_fields = dt_layout_offload_master(L) ? 3 : 2;
        if (s->off) s->off->grads_early = 1;
    }
    if (L->offload_param != DT_OFFLOAD_NONE && params_shard) {
        b -= u.shard * e;
        if (s->off) s->off->param_n = u.shard, s->off->param_elem = e, s->off->param_reads = L->pp > 1 ? 1 : 2.0 * L->m;
        /* the next block's slice read ahead where blocks are prefetched (fp32 host memory, no pipeline) */
        if (s->off && !bf16 && L->backend == DT_BACKEND_CPU && L->pp == 1 && u.nb > 0) s->off->param_fetch = u.S[1];
    }
    *state = b;
}
