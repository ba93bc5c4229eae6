/* Bitwise mode (parallel.determinism = bitwise; the canonical sum is canonical.h's), a
 * wrapper around any strategy: each unit's gradient of each micro-batch is its own leaf,
 * summed over the data-parallel ranks by the canonical tree and folded per unit (a
 * pipeline stage finishes units of different micro-batches out of step); the fold's root
 * replaces the mode's reduction, and the mode's own update follows. The tied wte gradient
 * is the sum of two folds, the head's share and the embedding's, on one rank as on a
 * pipeline's last and first stage. The norm sums fixed 1024-element chunks of the whole
 * model in its unit order, whichever ranks hold them. The leaves lie in the mode's
 * gradient layout (strategy.h: flat, padded or shard). Under HSDP (parallel.dp_shard) the
 * tree runs over the shard group (consecutive dp ranks: the tree's lower levels) and then
 * over the replicas (the same slot of every group: its upper levels), which is the same
 * tree over all the data-parallel ranks, so the same bits. Where the model's gradients
 * are not fp32 host memory (bf16 storage, a device's: staging.h) the model writes them
 * where the mode keeps them and each leaf is their fp32 widening; the root, rounded to
 * the storage precision, is what the mode updates from, and the norm reads it widened
 * back: the same arithmetic for every layout, so bf16 and the emulated device keep the
 * guarantee. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "canonical.h"
#include "flat.h"
#include "staging.h"
#include "state.h"
#include "zero_shard.h"

typedef struct {
    dt_fold fold;       /* over the mode's gradient layout, one part per unit, and the head's share of
                           wte on a model with both ends */
    unsigned char *open; /* per part: its leaf of this micro-batch is being written */
    int *key;           /* per unit: its place in the whole model's order (-1: not counted here) */
    float *head;        /* shard layout: the head's share of wte in full, reduced when final */
    float *tree_tmp;    /* dt_tree_allreduce exchange buffer */
    int staged;         /* the model's gradients are bf16 or a device's: written there, widened into leaves */
    float *hbuf;        /* staged, the head apart: the head's share of wte in the model's memory and precision */
    float *wide;        /* staged shard layout: a unit's (or the head's) whole gradient widened, fp32 host */
} dt_bw;

static dt_bw *bw_of(const dt_dp *d) { return d->wrap; }
static int flat(const dt_dp *d) { return d->mode->grads == DT_GRADS_FLAT; }
static int sharded(const dt_dp *d) { return d->mode->grads == DT_GRADS_SHARD; }
/* HSDP: the same shard of the other shard groups (NULL: none) */
static dt_comm *replicas(const dt_dp *d) {
    return d->o.replicas && dt_comm_size(d->o.replicas) > 1 ? d->o.replicas : NULL;
}
/* The canonical tree over every data-parallel rank: over the shard group, then (HSDP) over
 * the replicas; the tree's nodes are summed alike whichever rank holds them, so a slice
 * (lo, n) of the group's result is all the replicas need to sum. */
static dt_status tree_all(dt_dp *d, float *buf, size_t count, size_t lo, size_t n, float *tmp) {
    DT_TRY(dt_tree_allreduce(d->comm, buf, count, tmp));
    if (replicas(d) && n) {
        DT_TRY(dt_tree_allreduce(replicas(d), buf + lo, n, tmp));
        d->grad_bytes += (double)n * sizeof(float);
    }
    return DT_OK;
}
static int has_pp(const dt_dp *d) { return d->o.groups.pp && dt_comm_size(d->o.groups.pp) > 1; }
/* The head's share of wte is kept apart on a model holding both ends. */
static int head_apart(const dt_dp *d) { return d->m->has_embed && d->m->has_head && d->m->shape.tie; }
static size_t wte_numel(const dt_dp *d) { return d->m->tensors[0].numel; }
/* The head part's index among the fold's parts (after the units). */
static int head_part(const dt_dp *d) { return d->m->nunits; }
/* Unit u's whole length in the mode's layout (ZeRO's padded). */
static size_t unit_len(const dt_dp *d, int u) { return flat(d) ? d->m->units[u].count : dt_zero_of(d)->P[u]; }

static dt_status bw_setup_fold(dt_dp *d) {
    dt_bw *b = calloc(1, sizeof *b);
    if (!b) return dt_fail(DT_ERUNTIME, "out of memory (bitwise reduction)");
    d->wrap = b;
    gpt_model *m = d->m;
    const dt_zero *z = flat(d) ? NULL : dt_zero_of(d);
    int nu = m->nunits, parts = nu + head_apart(d);
    size_t *off = calloc((size_t)parts, sizeof(size_t)), *len = calloc((size_t)parts, sizeof(size_t)), n = 0;
    b->open = calloc((size_t)parts, 1);
    b->key = calloc((size_t)nu, sizeof(int));
    dt_status s = DT_OK;
    if (!off || !len || !b->open || !b->key)
        s = dt_fail(DT_ERUNTIME, "out of memory (bitwise reduction)");
    for (int u = 0; s == DT_OK && u < nu; u++) { /* the leaf layout: flat, padded (zero 1) or shard (zero 2/3) */
        off[u] = flat(d) ? m->units[u].offset : sharded(d) ? z->soff[u] : z->poff[u];
        len[u] = flat(d) ? m->units[u].count : sharded(d) ? z->S[u] : z->P[u];
        n = off[u] + len[u] > n ? off[u] + len[u] : n;
    }
    size_t maxunit = 0;
    for (int u = 0; s == DT_OK && u < nu; u++)
        if (unit_len(d, u) > maxunit) maxunit = unit_len(d, u);
    b->staged = dt_stage_needed(d->ops);
    if (s == DT_OK && head_apart(d)) { /* the head part: wte in full, or this rank's slice of unit 0 (zero 2/3) */
        off[nu] = n;
        len[nu] = sharded(d) ? z->S[0] : wte_numel(d);
        n += len[nu];
        if (b->staged) { /* the model writes it in its own memory and precision */
            s = d->ops->alloc((void **)&b->hbuf, wte_numel(d) * dt_elem_bytes(d->ops), "bitwise head gradient");
            d->workspace_bytes += wte_numel(d) * dt_elem_bytes(d->ops);
        } else if (sharded(d)) {
            s = dt_alloc((void **)&b->head, wte_numel(d) * sizeof(float), "bitwise head gradient");
            d->workspace_bytes += wte_numel(d) * sizeof(float);
        }
        if (wte_numel(d) > maxunit) maxunit = wte_numel(d);
    }
    if (s == DT_OK) s = dt_fold_create(&b->fold, n, d->o.leaves, parts, off, len);
    free(off);
    free(len);
    DT_TRY(s);
    /* a unit's key in the whole model's order (-1: not counted here: the last stage's copy of wte) */
    for (int u = 0; u < nu; u++) {
        b->key[u] = -1;
        if (m->units[u].count == 0) continue;
        if (u == 0) b->key[u] = m->has_embed ? 0 : -1;
        else if (u == nu - 1) b->key[u] = m->shape.n_layer + 1;
        else
            for (int i = 0; i < m->ntensors; i++)
                if (m->tensors[i].unit == u) {
                    b->key[u] = 1 + m->tensors[i].layer;
                    break;
                }
    }
    size_t tmp = maxunit / 2 + 1;
    DT_TRY(dt_alloc((void **)&b->tree_tmp, tmp * sizeof(float), "bitwise exchange buffer"));
    if (b->staged && sharded(d)) {
        DT_TRY(dt_alloc((void **)&b->wide, maxunit * sizeof(float), "bitwise widened gradient"));
        d->workspace_bytes += maxunit * sizeof(float);
    }
    d->workspace_bytes += dt_fold_bytes(&b->fold) + tmp * sizeof(float);
    /* re-pointed per micro-batch; until then at the head part's own range */
    if (head_apart(d)) m->head_grad = b->staged ? b->hbuf : sharded(d) ? b->head : b->fold.buf[0] + b->fold.off[head_part(d)];
    return DT_OK;
}

static dt_status bw_setup(dt_dp *d) {
    int R = replicas(d) ? dt_comm_size(d->o.replicas) : 1;
    if ((d->N & (d->N - 1)) || (R & (R - 1)))
        return dt_fail(DT_EINPUT, "parallel.determinism=bitwise needs a power-of-two data-parallel size (got %d)",
                       d->N * R);
    if (d->o.leaves < 1 || (d->o.leaves & (d->o.leaves - 1)))
        return dt_fail(DT_EINPUT,
                       "parallel.determinism=bitwise needs a power-of-two number of accumulation steps (got %d)",
                       d->o.leaves);
    d->align = DT_CANON_CHUNK; /* shard boundaries never split a chunk of the norm */
    DT_TRY(d->mode->setup(d));
    return bw_setup_fold(d);
}

static void bw_free(dt_dp *d) {
    dt_bw *b = bw_of(d);
    if (b) {
        dt_fold_destroy(&b->fold);
        dt_free(b->tree_tmp);
        dt_free(b->head);
        dt_free(b->wide);
        if (b->hbuf) d->ops->free(b->hbuf);
        free(b->open);
        free(b->key);
        free(b);
        d->wrap = NULL;
        d->m->head_grad = NULL;
    }
    d->mode->free(d);
}

static void bw_begin_step(dt_dp *d) {
    dt_bw *b = bw_of(d);
    d->mode->begin_step(d);
    dt_fold_reset(&b->fold);
    memset(b->open, 0, (size_t)(d->m->nunits + head_apart(d)));
}

/* Unit u's (or the head part's) gradient of a micro-batch is about to be written: flat
 * and padded layouts write it into the part's next leaf directly; the shard layout into
 * the mode's scratch (zeroed there, the head's here), reduced when final. */
static dt_status bw_before_backward(dt_dp *d, int u) {
    dt_bw *b = bw_of(d);
    gpt_model *m = d->m;
    if (u != GPT_HEAD_PART && d->mode->before_backward) DT_TRY(d->mode->before_backward(d, u));
    int part = u == GPT_HEAD_PART ? head_part(d) : u;
    if (u == GPT_HEAD_PART && sharded(d)) {
        if (b->staged) d->ops->zero(b->hbuf, wte_numel(d) * dt_elem_bytes(d->ops));
        else memset(b->head, 0, wte_numel(d) * sizeof(float));
        return DT_OK;
    }
    if (sharded(d) || b->open[part] || b->fold.len[part] == 0) return DT_OK;
    float *at = dt_fold_next(&b->fold, part) + b->fold.off[part];
    if (b->staged) /* written where the model keeps it, widened into the leaf when final */
        d->ops->zero(u == GPT_HEAD_PART ? b->hbuf : m->unit_grads[u], b->fold.len[part] * dt_elem_bytes(d->ops));
    else if (u == GPT_HEAD_PART) m->head_grad = at;
    else m->unit_grads[u] = at;
    b->open[part] = 1; /* a split backward asks again before its W: the same leaf */
    return DT_OK;
}

/* The part's leaf is final: summed over the data-parallel ranks by the canonical tree
 * (shard layout: then this rank's slice kept), folded. Replaces the mode's reduction. */
static dt_status bw_after_backward(dt_dp *d, int u) {
    dt_bw *b = bw_of(d);
    int part = u == GPT_HEAD_PART ? head_part(d) : u;
    if (b->fold.len[part] == 0) return DT_OK;
    dt_status s = DT_OK;
    /* frozen: the leaf is zeros on every rank (its sum too), nothing to exchange */
    int frozen = u == GPT_HEAD_PART ? d->m->tensors[0].frozen : gpt_unit_frozen(d->m, u);
    if (sharded(d)) {
        size_t S = dt_zero_of(d)->S[u == GPT_HEAD_PART ? 0 : u];
        float *full = u == GPT_HEAD_PART ? b->head : d->m->unit_grads[u];
        size_t count = u == GPT_HEAD_PART ? wte_numel(d) : dt_zero_of(d)->P[u];
        if (b->staged) {
            dt_stage_widen(d->ops, b->wide, u == GPT_HEAD_PART ? b->hbuf : d->m->unit_grads[u], count);
            full = b->wide;
        }
        size_t lo = dt_zero_lo(d, u == GPT_HEAD_PART ? 0 : u), n = lo >= count ? 0 : count - lo < S ? count - lo : S;
        if (!frozen) DP_COMM(d, s = tree_all(d, full, count, lo, n, b->tree_tmp));
        if (!frozen && d->N > 1) d->grad_bytes += (double)count * sizeof(float);
        DT_TRY(s);
        float *leaf = dt_fold_next(&b->fold, part) + b->fold.off[part];
        memcpy(leaf, full + lo, n * sizeof(float));
    } else {
        if (!b->open[part]) return DT_OK;
        float *leaf = b->fold.buf[b->fold.perm[(size_t)part * (b->fold.cap + 1) + b->fold.cap]] + b->fold.off[part];
        if (b->staged)
            dt_stage_widen(d->ops, leaf, u == GPT_HEAD_PART ? b->hbuf : d->m->unit_grads[u], b->fold.len[part]);
        /* ZeRO-1 (HSDP): the replicas sum the whole padded unit, each element of it alike */
        if (!frozen) DP_COMM(d, s = tree_all(d, leaf, b->fold.len[part], 0, b->fold.len[part], b->tree_tmp));
        if (!frozen && d->N > 1) d->grad_bytes += (double)b->fold.len[part] * sizeof(float);
        DT_TRY(s);
        b->open[part] = 0;
    }
    dt_fold_push(&b->fold, part);
    return DT_OK;
}

/* Where unit u's final gradient (this rank's slice of it under ZeRO) lies in the root,
 * which has the mode's gradient layout: flat, padded or shard. */
static float *root_unit(const dt_dp *d, float *root, int u) {
    if (flat(d)) return root + d->m->units[u].offset;
    const dt_zero *z = dt_zero_of(d);
    return sharded(d) ? root + z->soff[u] : root + z->poff[u] + dt_zero_lo(d, u);
}

/* The canonical norm, exact in any layout: every gradient element is counted once (a
 * ZeRO slice by its rank, a flat layout's 1/N by each rank, a tensor replicated over tp
 * by tp rank 0, a policy's replicated unit by dp rank 0, wte by the first stage), each
 * square (exact in double) rounded to an integer multiple of 2^e0 and the integers
 * summed exactly: e0 = 2E - 52 from the largest |g| of all (2^E above it), so every term
 * is below 2^52 and what the rounding moves is at most 2^-53 of the largest square per
 * element. Integer sums do not depend on the order, so any split over ranks, tensor
 * pieces, slices and threads gives the same bits: what tp needs, its pieces of a tensor
 * being strided in the whole. Below 2^52 the rounding is one double addition (of 2^52,
 * whose bits then hold the integer) and the sums are u64 lanes over blocks of 2048
 * terms: a loop the compiler vectorises. */
__extension__ typedef unsigned __int128 dt_u128;

/* Per tensor of unit u: the part of [lo, hi) (unit-relative) this rank counts, at base
 * (the unit's first element in the root), passed to fn. */
typedef void (*norm_fn)(const float *x, size_t n, void *acc);
static void unit_ranges(const dt_dp *d, int u, const float *base, size_t lo, size_t hi, norm_fn fn, void *acc) {
    const gpt_model *m = d->m;
    size_t u0 = m->units[u].offset;
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        if (t->unit != u || t->numel == 0) continue;
        if (t->shard.dim < 0 && m->tp_rank != 0) continue; /* replicated over tp: tp rank 0 counts it */
        if (t->shard.replicas > 1 && t->shard.replica != 0) continue;
        size_t a = t->offset - u0, b = a + t->numel;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (a < b) fn(base + (a - lo), b - a, acc);
    }
}

/* Each unit's counted elements of the root (see above) to fn. */
static void counted(dt_dp *d, float *root, norm_fn fn, void *acc) {
    dt_bw *b = bw_of(d);
    const gpt_model *m = d->m;
    for (int u = 0; u < m->nunits; u++) {
        if (b->key[u] < 0) continue; /* a last stage's copy of wte */
        size_t n = m->units[u].count;
        if (flat(d)) { /* every rank holds all: rank r counts its 1/N */
            size_t lo = n * (size_t)d->rank / (size_t)d->N, hi = n * (size_t)(d->rank + 1) / (size_t)d->N;
            unit_ranges(d, u, root_unit(d, root, u) + lo, lo, hi, fn, acc);
        } else if (dt_zero_repl(d, u)) { /* parallel.policy's ddp unit: whole on every rank */
            if (d->rank == 0) unit_ranges(d, u, root_unit(d, root, u), 0, n, fn, acc);
        } else {
            size_t lo = dt_zero_lo(d, u), hi = lo + dt_zero_of(d)->S[u];
            unit_ranges(d, u, root_unit(d, root, u), lo, hi < n ? hi : n, fn, acc);
        }
    }
}

/* Both passes over threads: a maximum and integer sums do not depend on the order, so
 * the threads change nothing. */
enum { PAR_MIN = 1 << 12 };
static void max_of(const float *x, size_t n, void *acc) {
    double *mx = acc;
    uint32_t mu = 0; /* |x|'s bits: ordered as the values are, Inf and NaN above every finite one */
#pragma omp parallel for schedule(static) reduction(max : mu) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= 0x7fffffffu;
        mu = u > mu ? u : mu;
    }
    float m;
    memcpy(&m, &mu, sizeof m);
    *mx = mu >= 0x7f800000u ? INFINITY : (m > *mx ? m : *mx); /* NaN and Inf: the norm is not finite */
}

typedef struct {
    double scale;
    dt_u128 sum;
} sum_acc;
/* x^2 scale (below 2^52) rounded to an integer: 2^52 added, the sum's low mantissa bits */
static inline uint64_t square_units(float x, double scale) {
    double v = (double)x * (double)x * scale + 0x1p52;
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u - 0x4330000000000000ull; /* the bits of 2^52 */
}
enum { SUM_BLOCK = 2048 }; /* 2048 terms below 2^52: below 2^63 */
static void sum_of(const float *x, size_t n, void *acc) {
    sum_acc *s = acc;
    dt_u128 total = 0;
    double scale = s->scale;
    size_t nb = (n + SUM_BLOCK - 1) / SUM_BLOCK;
#pragma omp parallel if (n >= PAR_MIN)
    {
        dt_u128 t = 0;
#pragma omp for schedule(static) nowait
        for (size_t b = 0; b < nb; b++) {
            size_t lo = b * SUM_BLOCK, hi = lo + SUM_BLOCK < n ? lo + SUM_BLOCK : n;
            uint64_t u = 0;
            for (size_t i = lo; i < hi; i++) u += square_units(x[i], scale);
            t += u;
        }
#pragma omp critical
        total += t;
    }
    s->sum += total;
}

/* over this rank's data-parallel, tensor-parallel and pipeline groups */
static dt_status over_groups(dt_dp *d, double *v, size_t n, dt_redop op) {
    DT_TRY(dt_allreduce(d->comm, v, n, DT_F64, op));
    if (d->o.groups.tp && dt_comm_size(d->o.groups.tp) > 1) DT_TRY(dt_allreduce(d->o.groups.tp, v, n, DT_F64, op));
    if (has_pp(d)) DT_TRY(dt_allreduce(d->o.groups.pp, v, n, DT_F64, op));
    return DT_OK;
}

static dt_status bw_norm(dt_dp *d, float *root, double *norm) {
    double mx = 0.0;
    counted(d, root, max_of, &mx);
    DT_TRY(over_groups(d, &mx, 1, DT_MAX));
    if (!isfinite(mx) || mx == 0.0) {
        *norm = mx == 0.0 ? 0.0 : NAN;
        return DT_OK;
    }
    int E;
    frexp(mx, &E); /* mx < 2^E */
    int e0 = 2 * E - 52;
    sum_acc s = {ldexp(1.0, -e0), 0};
    counted(d, root, sum_of, &s);
    double limb[4]; /* 32-bit limbs: their sums over the ranks stay exact in double */
    for (int k = 0; k < 4; k++) limb[k] = (double)(uint32_t)(s.sum >> (32 * k));
    DT_TRY(over_groups(d, limb, 4, DT_SUM));
    dt_u128 total = 0;
    for (int k = 3; k >= 0; k--) total = (total << 32) + (dt_u128)(uint64_t)limb[k];
    *norm = sqrt(ldexp((double)total, e0));
    return DT_OK;
}

/* n floats of the root at src into the mode's storage at dst: copied, or (staged) rounded
 * to the storage precision there and widened back into src, so src holds what the mode
 * updates from. */
static void store(dt_dp *d, void *dst, float *src, size_t n) {
    if (!bw_of(d)->staged) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    dt_stage_narrow(d->ops, dst, src, n);
    dt_stage_widen(d->ops, src, dst, n);
}

/* After the step's micro-batches: the tied wte's shares added in the root, the root into
 * the mode's gradients (flat, padded slices or shard), and the canonical norm. */
static dt_status bw_reduce(dt_dp *d, double *norm) {
    dt_bw *b = bw_of(d);
    gpt_model *m = d->m;
    float *root = dt_fold_root(&b->fold);
    if (!root) return dt_fail(DT_ERUNTIME, "bitwise reduction: a unit's micro-batch gradients are missing");
    const dt_zero *z = flat(d) ? NULL : dt_zero_of(d);
    /* wte's elements among this rank's gradients: the flat wte, or its part of unit 0's slice */
    size_t lo = flat(d) ? 0 : dt_zero_lo(d, 0), w = wte_numel(d);
    size_t n = flat(d) ? w : lo >= w ? 0 : w - lo < z->S[0] ? w - lo : z->S[0];
    float *wte = flat(d) ? root + m->tensors[0].offset : root_unit(d, root, 0);
    if (head_apart(d)) { /* wte = the embedding's share + the head's */
        const float *h = root + b->fold.off[head_part(d)] + (d->mode->grads == DT_GRADS_PADDED ? lo : 0);
        for (size_t i = 0; i < n; i++) wte[i] += h[i];
    }
    /* a pipeline: the first stage holds the embedding's share, the last the head's; one
     * addition, the same on both (wte only: where the first stage has wpe, the last a gap) */
    if (has_pp(d) && d->o.groups.emb && n > 0) DT_TRY(dt_allreduce(d->o.groups.emb, wte, n, DT_F32, DT_SUM));
    if (flat(d)) store(d, dt_flat_of(d)->grads, root, m->nparams);
    else if (sharded(d)) store(d, z->grad_shard, root, z->shard_total);
    else /* padded: the root is the full reduced gradient: this rank's slices */
        for (int u = 0; u < m->nunits; u++) store(d, dt_zero_grad_slice(d, u), root_unit(d, root, u), z->S[u]);
    return bw_norm(d, root, norm);
}

/* The mode's bytes with units padded to the canonical chunk (bw_setup's alignment), plus
 * the reduction's workspace: the fold's ceil(log2 m) + 2 buffers over the leaf layout (the
 * flat units; ZeRO-1's padded ones; ZeRO-2/3's shard), plus the head's share of wte where
 * one rank holds both ends of the tie; the exchange buffer (half the largest unit); with both ends,
 * the head's wte gradient (fp32, with a gradient shard; staged: in the storage precision,
 * every layout); staged with a gradient shard, the largest unit widened. */
static void bw_estimate(const dt_dp_stage *s, double *state, double *work) {
    dt_dp_stage c = *s;
    c.align = DT_CANON_CHUNK;
    s->mode->estimate(&c, state, work);
    const gpt_shape *sh = &s->L->shape;
    dt_zero_units u = dt_zero_units_of(&c);
    int lay = s->mode->grads;
    const double *unit = lay != DT_GRADS_FLAT ? u.P : u.cnt;
    double maxunit = fmax(unit[0], fmax(unit[1], unit[2]));
    double n = lay == DT_GRADS_FLAT ? u.flat : lay == DT_GRADS_PADDED ? u.padded : u.shard;
    double wte = (double)sh->padded_vocab / s->L->tp * sh->n_embd, head = 0; /* this rank's vocabulary rows */
    int apart = s->L->pp <= 1 && sh->tie; /* one rank holds both ends of the tie: the head's share of wte apart */
    if (apart) {
        n += lay == DT_GRADS_SHARD ? u.S[0] : wte;
        maxunit = fmax(maxunit, wte);
        if (lay == DT_GRADS_SHARD) head = wte;
    }
    int staged = dt_layout_bf16(s->L) || s->L->backend != DT_BACKEND_CPU, h = 0;
    double wide = staged && lay == DT_GRADS_SHARD ? maxunit : 0;
    if (staged && apart) head = wte * (dt_layout_bf16(s->L) ? 0.5 : 1.0); /* in floats */
    while ((1 << h) < s->L->m) h++; /* the leaves: one per micro-step */
    *work += ((h + 2) * n + floor(maxunit / 2) + 1 + head + wide) * sizeof(float);
}

void dt_bitwise_wrap(dt_dp_strategy *s) {
    s->estimate = bw_estimate;
    s->setup = bw_setup;
    s->free = bw_free;
    s->begin_step = bw_begin_step;
    s->before_backward = bw_before_backward;
    s->after_backward = bw_after_backward;
    s->reduce = bw_reduce;
}
