#include "canonical.h"

#include <stdlib.h>
#include <string.h>

#include "../../core/bf16.h"
#include "../../core/mem.h"

static size_t block_start(size_t count, int N, int b) { return count * (size_t)b / (size_t)N; }

/* Pairwise exchange without deadlock: the lower rank sends first. */
static dt_status exchange(dt_comm *c, int partner, const float *send, size_t ns, float *recv, size_t nr) {
    int me = dt_comm_rank(c);
    if (me < partner) {
        DT_TRY(dt_send(c, send, ns, DT_F32, partner, 7));
        return dt_recv(c, recv, nr, DT_F32, partner, 7);
    }
    DT_TRY(dt_recv(c, recv, nr, DT_F32, partner, 7));
    return dt_send(c, send, ns, DT_F32, partner, 7);
}

static dt_status tree(dt_comm *c, float *buf, size_t count, float *tmp, int bf16) {
    int N = dt_comm_size(c), r = dt_comm_rank(c), steps = 0;
    if (N == 1) return DT_OK;
    if (N & (N - 1)) return dt_fail(DT_EINPUT, "bitwise reduction needs a power-of-two number of ranks (got %d)", N);
    while ((1 << steps) < N) steps++;
    int lo = 0, hi = N; /* blocks this rank still reduces */
    for (int s = 0; s < steps; s++) {
        int partner = r ^ (1 << s), mid = (lo + hi) / 2;
        int keep_hi = (r >> s) & 1;
        int klo = keep_hi ? mid : lo, khi = keep_hi ? hi : mid, slo = keep_hi ? lo : mid, shi = keep_hi ? mid : hi;
        size_t k0 = block_start(count, N, klo), k1 = block_start(count, N, khi);
        size_t s0 = block_start(count, N, slo), s1 = block_start(count, N, shi);
        DT_TRY(exchange(c, partner, buf + s0, s1 - s0, tmp, k1 - k0));
        for (size_t i = 0; i < k1 - k0; i++) buf[k0 + i] += tmp[i];
        for (size_t i = 0; bf16 && i < k1 - k0; i++) buf[k0 + i] = dt_bf16_to_f32(dt_f32_to_bf16(buf[k0 + i]));
        lo = klo;
        hi = khi;
    }
    for (int s = steps - 1; s >= 0; s--) { /* all-gather back, mirror order */
        int partner = r ^ (1 << s), width = hi - lo;
        int plo = ((r >> s) & 1) ? lo - width : lo + width;
        size_t m0 = block_start(count, N, lo), m1 = block_start(count, N, hi);
        size_t p0 = block_start(count, N, plo), p1 = block_start(count, N, plo + width);
        DT_TRY(exchange(c, partner, buf + m0, m1 - m0, buf + p0, p1 - p0));
        if (plo < lo) lo = plo;
        else hi = plo + width;
    }
    return DT_OK;
}

dt_status dt_tree_allreduce(dt_comm *c, float *buf, size_t count, float *tmp) { return tree(c, buf, count, tmp, 0); }
dt_status dt_tree_allreduce_bf16(dt_comm *c, float *buf, size_t count, float *tmp) { return tree(c, buf, count, tmp, 1); }

dt_status dt_fold_create(dt_fold *f, size_t n, int leaves, int nparts, const size_t *off, const size_t *len) {
    memset(f, 0, sizeof *f);
    int h = 0;
    while ((1 << h) < leaves) h++;
    f->n = n;
    f->cap = h + 1;
    f->nparts = nparts > 0 ? nparts : 1;
    size_t P = (size_t)f->nparts, S = (size_t)f->cap + 1;
    f->buf = calloc(S, sizeof(float *));
    f->off = calloc(P, sizeof(size_t));
    f->len = calloc(P, sizeof(size_t));
    f->perm = calloc(P * S, sizeof(int));
    f->height = calloc(P * S, sizeof(int));
    f->sp = calloc(P, sizeof(int));
    f->count = calloc(P, sizeof(int));
    f->leaves = leaves;
    if (!f->buf || !f->off || !f->len || !f->perm || !f->height || !f->sp || !f->count)
        return dt_fail(DT_ERUNTIME, "out of memory (bitwise reduction)");
    for (int i = 0; i < f->nparts; i++) {
        f->off[i] = nparts > 0 ? off[i] : 0;
        f->len[i] = nparts > 0 ? len[i] : n;
        if (f->off[i] + f->len[i] > n) return dt_fail(DT_ERUNTIME, "bitwise reduction: part %d out of range", i);
    }
    for (int i = 0; i <= f->cap; i++) DT_TRY(dt_alloc((void **)&f->buf[i], n * sizeof(float), "bitwise reduction"));
    dt_fold_reset(f);
    return DT_OK;
}

void dt_fold_destroy(dt_fold *f) {
    if (f->buf)
        for (int i = 0; i <= f->cap; i++) dt_free(f->buf[i]);
    free(f->buf);
    free(f->off);
    free(f->len);
    free(f->perm);
    free(f->height);
    free(f->sp);
    free(f->count);
    memset(f, 0, sizeof *f);
}

void dt_fold_reset(dt_fold *f) {
    size_t S = (size_t)f->cap + 1;
    for (int p = 0; p < f->nparts; p++) { /* stack slots 0..sp; the leaf lives in slot cap */
        f->sp[p] = f->count[p] = 0;
        for (size_t i = 0; i < S; i++) f->perm[p * S + i] = (int)i;
    }
}

float *dt_fold_next(dt_fold *f, int part) {
    float *b = f->buf[f->perm[(size_t)part * (f->cap + 1) + f->cap]];
    memset(b + f->off[part], 0, f->len[part] * sizeof(float));
    return b;
}

void dt_fold_push(dt_fold *f, int part) {
    /* the leaf's buffer becomes stack slot sp; the freed buffer takes the next leaf */
    int *perm = f->perm + (size_t)part * (f->cap + 1), *height = f->height + (size_t)part * (f->cap + 1);
    int *sp = &f->sp[part], t = perm[f->cap];
    perm[f->cap] = perm[*sp];
    perm[*sp] = t;
    height[*sp] = 0;
    (*sp)++;
    f->count[part]++;
    size_t o = f->off[part], n = f->len[part];
    while (*sp >= 2 && height[*sp - 1] == height[*sp - 2]) {
        float *left = f->buf[perm[*sp - 2]] + o;
        const float *right = f->buf[perm[*sp - 1]] + o;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) left[i] += right[i];
        height[*sp - 2]++;
        (*sp)--;
    }
}

float *dt_fold_root(dt_fold *f) {
    int at = -1;
    for (int p = 0; p < f->nparts; p++) {
        if (f->len[p] == 0) continue;
        int b = f->perm[(size_t)p * (f->cap + 1)];
        if (f->sp[p] != 1 || f->count[p] != f->leaves || (at >= 0 && b != at)) return NULL;
        at = b;
    }
    return f->buf[at >= 0 ? at : 0];
}

size_t dt_fold_bytes(const dt_fold *f) { return (size_t)(f->cap + 1) * f->n * sizeof(float); }
