/* Bitwise mode of the data-parallel engine (parallel.determinism = bitwise; the canonical
 * sum is canonical.h's): each unit's gradient of each micro-batch is its own leaf, folded
 * per unit (a pipeline stage finishes units of different micro-batches out of step), and
 * the tied wte gradient is the sum of two folds, the head's share and the embedding's, on
 * one rank as on a pipeline's last and first stage. The norm sums fixed 1024-element
 * chunks of the whole model in its unit order, whichever ranks hold them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "dp_internal.h"
#include "state.h"

static int is_zero(const dt_dp *d) { return !d->o.ps && d->o.zero > 0; }
static int sharded(const dt_dp *d) { return is_zero(d) && d->o.zero >= 2; }
static int has_pp(const dt_dp *d) { return d->o.groups.pp && dt_comm_size(d->o.groups.pp) > 1; }
/* The head's share of wte is kept apart on a model holding both ends. */
static int head_apart(const dt_dp *d) { return d->m->has_embed && d->m->has_head; }
static size_t wte_numel(const dt_dp *d) { return d->m->tensors[0].numel; }
/* The head part's index among the fold's parts (after the units). */
static int head_part(const dt_dp *d) { return d->m->nunits; }

dt_status dt_bw_setup(dt_dp *d) {
    if (!d->o.bitwise) return DT_OK;
    gpt_model *m = d->m;
    int nu = m->nunits, parts = nu + head_apart(d), keys = m->shape.n_layer + 2;
    size_t *off = calloc((size_t)parts, sizeof(size_t)), *len = calloc((size_t)parts, sizeof(size_t)), n = 0;
    d->bw_open = calloc((size_t)parts, 1);
    d->bw_key = calloc((size_t)nu, sizeof(int));
    d->bw_cnt = calloc((size_t)keys, sizeof(double));
    d->bw_first = calloc((size_t)nu, sizeof(size_t));
    d->bw_num = calloc((size_t)nu, sizeof(size_t));
    dt_status s = DT_OK;
    if (!off || !len || !d->bw_open || !d->bw_key || !d->bw_cnt || !d->bw_first || !d->bw_num)
        s = dt_fail(DT_ERUNTIME, "out of memory (bitwise reduction)");
    for (int u = 0; s == DT_OK && u < nu; u++) { /* the leaf layout: flat, padded (zero 1) or shard (zero 2/3) */
        off[u] = !is_zero(d) ? m->units[u].offset : d->o.zero == 1 ? d->poff[u] : d->soff[u];
        len[u] = !is_zero(d) ? m->units[u].count : d->o.zero == 1 ? d->P[u] : d->S[u];
        n = off[u] + len[u] > n ? off[u] + len[u] : n;
    }
    size_t maxunit = 0;
    for (int u = 0; s == DT_OK && u < nu; u++) {
        size_t c = is_zero(d) ? d->P[u] : m->units[u].count;
        if (c > maxunit) maxunit = c;
    }
    if (s == DT_OK && head_apart(d)) { /* the head part: wte in full, or this rank's slice of unit 0 (zero 2/3) */
        off[nu] = n;
        len[nu] = sharded(d) ? d->S[0] : wte_numel(d);
        n += len[nu];
        if (sharded(d)) {
            s = dt_alloc((void **)&d->bw_head, wte_numel(d) * sizeof(float), "bitwise head gradient");
            d->workspace_bytes += wte_numel(d) * sizeof(float);
        }
        if (wte_numel(d) > maxunit) maxunit = wte_numel(d);
    }
    if (s == DT_OK) s = dt_fold_create(&d->fold, n, d->o.leaves, parts, off, len);
    free(off);
    free(len);
    DT_TRY(s);
    /* a unit's key in the whole model's order (-1: not counted here: the last stage's copy of wte) */
    for (int u = 0; u < nu; u++) {
        d->bw_key[u] = -1;
        if (m->units[u].count == 0) continue;
        if (u == 0) d->bw_key[u] = m->has_embed ? 0 : -1;
        else if (u == nu - 1) d->bw_key[u] = m->shape.n_layer + 1;
        else
            for (int i = 0; i < m->ntensors; i++)
                if (m->tensors[i].unit == u) {
                    d->bw_key[u] = 1 + m->tensors[i].layer;
                    break;
                }
    }
    size_t tmp = maxunit / 2 + 1;
    DT_TRY(dt_alloc((void **)&d->tree_tmp, tmp * sizeof(float), "bitwise exchange buffer"));
    size_t parts_n = 0;
    for (int u = 0; u < nu; u++) parts_n += ((is_zero(d) ? d->P[u] : m->units[u].count) + DT_CANON_CHUNK - 1) /
                                            DT_CANON_CHUNK;
    DT_TRY(dt_alloc((void **)&d->canon_part, (parts_n + 1) * sizeof(double), "gradient norm partials"));
    d->workspace_bytes += dt_fold_bytes(&d->fold) + tmp * sizeof(float);
    /* re-pointed per micro-batch; until then at the head part's own range */
    if (head_apart(d) && !sharded(d)) m->head_grad = d->fold.buf[0] + d->fold.off[head_part(d)];
    if (head_apart(d) && sharded(d)) m->head_grad = d->bw_head;
    return DT_OK;
}

void dt_bw_free(dt_dp *d) {
    dt_fold_destroy(&d->fold);
    dt_free(d->tree_tmp);
    dt_free(d->canon_part);
    dt_free(d->bw_head);
    free(d->canon_global);
    free(d->bw_open);
    free(d->bw_key);
    free(d->bw_cnt);
    free(d->bw_first);
    free(d->bw_num);
    d->m->head_grad = NULL;
}

void dt_bw_begin_step(dt_dp *d) {
    dt_fold_reset(&d->fold);
    memset(d->bw_open, 0, (size_t)(d->m->nunits + head_apart(d)));
}

/* Unit u's (or the head part's) gradient of a micro-batch is about to be written: flat
 * and zero-1 layouts write it into the part's next leaf directly; zero 2/3 into their
 * scratch (zeroed by zero.c, the head's here), reduced when final. */
dt_status dt_bw_before_backward(dt_dp *d, int u) {
    gpt_model *m = d->m;
    int part = u == GPT_HEAD_PART ? head_part(d) : u;
    if (u == GPT_HEAD_PART && sharded(d)) {
        memset(d->bw_head, 0, wte_numel(d) * sizeof(float));
        return DT_OK;
    }
    if (sharded(d) || d->bw_open[part] || d->fold.len[part] == 0) return DT_OK;
    float *at = dt_fold_next(&d->fold, part) + d->fold.off[part];
    if (u == GPT_HEAD_PART) m->head_grad = at;
    else m->unit_grads[u] = at;
    d->bw_open[part] = 1; /* a split backward asks again before its W: the same leaf */
    return DT_OK;
}

/* The part's leaf is final: summed over the data-parallel ranks by the canonical tree
 * (zero 2/3: then this rank's slice kept), folded. */
dt_status dt_bw_after_backward(dt_dp *d, int u) {
    int part = u == GPT_HEAD_PART ? head_part(d) : u;
    if (d->fold.len[part] == 0) return DT_OK;
    dt_status s = DT_OK;
    if (sharded(d)) {
        float *full = u == GPT_HEAD_PART ? d->bw_head : d->m->unit_grads[u];
        size_t count = u == GPT_HEAD_PART ? wte_numel(d) : d->P[u], S = d->S[u == GPT_HEAD_PART ? 0 : u];
        DP_COMM(d, s = dt_tree_allreduce(d->comm, full, count, d->tree_tmp));
        DT_TRY(s);
        float *leaf = dt_fold_next(&d->fold, part) + d->fold.off[part];
        size_t lo = (size_t)d->rank * S, n = lo >= count ? 0 : count - lo < S ? count - lo : S;
        memcpy(leaf, full + lo, n * sizeof(float));
    } else {
        if (!d->bw_open[part]) return DT_OK;
        float *leaf = d->fold.buf[d->fold.perm[(size_t)part * (d->fold.cap + 1) + d->fold.cap]] + d->fold.off[part];
        DP_COMM(d, s = dt_tree_allreduce(d->comm, leaf, d->fold.len[part], d->tree_tmp));
        DT_TRY(s);
        d->bw_open[part] = 0;
    }
    dt_fold_push(&d->fold, part);
    return DT_OK;
}

/* Sums of squares of unit u's final gradient in 1024-element chunks, in order, over the
 * data-parallel ranks (a ZeRO slice holds whole chunks: every rank's partials gathered). */
static dt_status unit_partials(dt_dp *d, int u, double *out, size_t *count) {
    if (!is_zero(d)) {
        dt_chunk_sumsq(d->grads + d->m->units[u].offset, d->m->units[u].count, out);
        *count = (d->m->units[u].count + DT_CANON_CHUNK - 1) / DT_CANON_CHUNK;
        return DT_OK;
    }
    size_t per = d->S[u] / DT_CANON_CHUNK;
    double *mine = out + (size_t)d->rank * per;
    dt_chunk_sumsq(dt_zero_grad_slice(d, u), d->S[u], mine);
    *count = per * (size_t)d->N;
    return dt_allgather(d->comm, mine, out, per, DT_F64);
}

/* The canonical norm: the partials of the whole model's units in its order (unit 0, the
 * blocks, ln_f), summed in that order in double. With a pipeline every stage places its
 * units' partials at their place in the whole list and the lists are summed over the
 * stages (each entry has one non-zero contributor, so the sum is exact), then added up
 * alike on every rank. Zero partials (ZeRO's padding) leave the sum unchanged. */
static dt_status bw_norm(dt_dp *d, double *norm) {
    gpt_model *m = d->m;
    int nu = m->nunits, keys = m->shape.n_layer + 2;
    size_t k = 0;
    if (!has_pp(d)) {
        for (int u = 0; u < nu; u++) {
            size_t c;
            DT_TRY(unit_partials(d, u, d->canon_part + k, &c));
            k += c;
        }
        double sum = 0.0;
        for (size_t i = 0; i < k; i++) sum += d->canon_part[i];
        *norm = sqrt(sum);
        return DT_OK;
    }
    double *cnt = d->bw_cnt;
    size_t *first = d->bw_first, *num = d->bw_num;
    memset(cnt, 0, (size_t)keys * sizeof(double));
    dt_status s = DT_OK;
    for (int u = 0; s == DT_OK && u < nu; u++) {
        first[u] = k;
        s = unit_partials(d, u, d->canon_part + k, &num[u]);
        k += num[u];
        if (d->bw_key[u] >= 0) cnt[d->bw_key[u]] = (double)num[u];
    }
    if (s == DT_OK) s = dt_allreduce(d->o.groups.pp, cnt, (size_t)keys, DT_F64, DT_SUM);
    size_t total = 0;
    for (int q = 0; q < keys; q++) total += (size_t)cnt[q];
    if (s == DT_OK && total > d->canon_global_n) {
        free(d->canon_global); /* sized once: the whole model's partials do not change */
        d->canon_global = malloc(total * sizeof(double));
        d->canon_global_n = d->canon_global ? total : 0;
        if (!d->canon_global) s = dt_fail(DT_ERUNTIME, "out of memory (gradient norm)");
    }
    if (s == DT_OK) {
        memset(d->canon_global, 0, total * sizeof(double));
        for (int u = 0; u < nu; u++) {
            if (d->bw_key[u] < 0) continue;
            size_t pos = 0;
            for (int q = 0; q < d->bw_key[u]; q++) pos += (size_t)cnt[q];
            memcpy(d->canon_global + pos, d->canon_part + first[u], num[u] * sizeof(double));
        }
        s = dt_allreduce(d->o.groups.pp, d->canon_global, total, DT_F64, DT_SUM);
    }
    double sum = 0.0;
    for (size_t i = 0; s == DT_OK && i < total; i++) sum += d->canon_global[i];
    *norm = sqrt(sum);
    return s;
}

/* wte's elements in this rank's gradient: the flat wte, or its part of unit 0's slice. */
static float *wte_grads(dt_dp *d, size_t *n) {
    if (!is_zero(d)) {
        *n = wte_numel(d);
        return d->grads + d->m->tensors[0].offset;
    }
    size_t lo = (size_t)d->rank * d->S[0], w = wte_numel(d);
    *n = lo >= w ? 0 : w - lo < d->S[0] ? w - lo : d->S[0];
    return dt_zero_grad_slice(d, 0);
}

dt_status dt_bw_finish(dt_dp *d, double *norm) {
    gpt_model *m = d->m;
    const float *root = dt_fold_root(&d->fold);
    if (!root) return dt_fail(DT_ERUNTIME, "bitwise reduction: a unit's micro-batch gradients are missing");
    if (!is_zero(d)) memcpy(d->grads, root, m->nparams * sizeof(float));
    else if (d->o.zero == 1) /* the root is the full reduced gradient: this rank's slices */
        for (int u = 0; u < m->nunits; u++)
            memcpy(dt_zero_grad_slice(d, u), root + d->poff[u] + (size_t)d->rank * d->S[u], d->S[u] * sizeof(float));
    else
        memcpy(d->grad_shard, root, d->shard_total * sizeof(float));
    size_t n;
    float *wte = wte_grads(d, &n);
    if (head_apart(d)) { /* wte = the embedding's share + the head's */
        const float *h = root + d->fold.off[head_part(d)] + (d->o.zero == 1 ? (size_t)d->rank * d->S[0] : 0);
        for (size_t i = 0; i < n; i++) wte[i] += h[i];
    }
    /* a pipeline: the first stage holds the embedding's share, the last the head's; one
     * addition, the same on both (wte only: where the first stage has wpe, the last a gap) */
    if (has_pp(d) && d->o.groups.emb && n > 0) DT_TRY(dt_allreduce(d->o.groups.emb, wte, n, DT_F32, DT_SUM));
    return bw_norm(d, norm);
}
