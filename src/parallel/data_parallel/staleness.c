#include "staleness.h"

#include <stdio.h>
#include <stdlib.h>

#include "../../ckpt/rank_state.h"
#include "staging.h"

struct dt_stale {
    const dt_ops *ops;
    size_t n, bytes;
    int s;
    void **slot;   /* s + 1: step t's gradients in slot t mod (s + 1) */
    double *norm;
};

dt_status dt_stale_create(dt_stale **out, const dt_ops *ops, size_t n, int s) {
    dt_stale *q = calloc(1, sizeof *q);
    *out = q;
    if (!q) return dt_fail(DT_ERUNTIME, "out of memory (stale gradients)");
    q->ops = ops;
    q->s = s;
    q->n = n;
    q->bytes = n * dt_elem_bytes(ops);
    q->slot = calloc((size_t)s + 1, sizeof *q->slot);
    q->norm = calloc((size_t)s + 1, sizeof *q->norm);
    if (!q->slot || !q->norm) return dt_fail(DT_ERUNTIME, "out of memory (stale gradients)");
    for (int i = 0; i <= s; i++) DT_TRY(ops->alloc(&q->slot[i], q->bytes, "stale gradients (parallel.staleness)"));
    return DT_OK;
}

void dt_stale_free(dt_stale *q) {
    if (!q) return;
    for (int i = 0; q->slot && i <= q->s; i++) q->ops->free(q->slot[i]);
    free(q->slot);
    free(q->norm);
    free(q);
}

int dt_stale_exchange(dt_stale *q, long long t, void *grads, double *norm) {
    long long k = (long long)q->s + 1;
    q->ops->copy(q->slot[t % k], grads, q->bytes);
    q->norm[t % k] = *norm;
    if (t < q->s) return 0;
    q->ops->copy(grads, q->slot[(t - q->s) % k], q->bytes);
    *norm = q->norm[(t - q->s) % k];
    return 1;
}

size_t dt_stale_bytes(const dt_stale *q) { return q ? (size_t)(q->s + 1) * q->bytes : 0; }

/* Tensors "grads.I" and "norm.I" for I = 0 .. s - 1, step steps - s + I (those >= 0). */
dt_status dt_stale_save(dt_stale *q, long long steps, const char *dir, int rank, const char *layout) {
    int s = q->s, n = 0;
    long long k = (long long)s + 1;
    float *host = malloc((size_t)s * q->n * sizeof(float) + 1);
    double *norms = malloc((size_t)s * sizeof(double) + 1);
    st_tensor_ref *t = calloc(2 * (size_t)s + 1, sizeof *t);
    char (*names)[32] = calloc(2 * (size_t)s + 1, sizeof *names);
    dt_status st = host && norms && t && names ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (saving stale gradients)");
    for (int i = 0; st == DT_OK && i < s; i++) {
        long long step = steps - s + i;
        if (step < 0) continue;
        float *h = host + (size_t)i * q->n;
        dt_stage_widen(q->ops, h, q->slot[step % k], q->n); /* fp32 on the host, bf16 widened exactly */
        norms[i] = q->norm[step % k];
        snprintf(names[n], sizeof names[n], "grads.%d", i);
        t[n] = (st_tensor_ref){names[n], ST_F32, 1, {(int64_t)q->n}, h};
        n++;
        snprintf(names[n], sizeof names[n], "norm.%d", i);
        t[n] = (st_tensor_ref){names[n], ST_F64, 1, {1}, &norms[i]};
        n++;
    }
    if (st == DT_OK) st = dt_rank_state_save(dir, steps, rank, layout, t, n);
    free(host);
    free(norms);
    free(t);
    free(names);
    return st;
}

dt_status dt_stale_load(dt_stale *q, long long steps, const char *step_dir, int rank, const char *layout) {
    st_file f = {0};
    DT_TRY(dt_rank_state_open(step_dir, steps, rank, layout, &f));
    long long k = (long long)q->s + 1;
    float *h = malloc(q->n * sizeof(float) + 1);
    dt_status st = h ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (loading stale gradients)");
    for (int i = 0; st == DT_OK && i < q->s; i++) {
        long long step = steps - q->s + i;
        if (step < 0) continue;
        char name[32];
        double norm;
        snprintf(name, sizeof name, "grads.%d", i);
        st = dt_rank_state_read(&f, name, h, q->n);
        snprintf(name, sizeof name, "norm.%d", i);
        if (st == DT_OK) st = dt_rank_state_read_f64(&f, name, &norm, 1);
        if (st != DT_OK) break;
        dt_stage_narrow(q->ops, q->slot[step % k], h, q->n);
        q->norm[step % k] = norm;
    }
    free(h);
    st_close(&f);
    return st;
}
