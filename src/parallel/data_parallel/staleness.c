#include "staleness.h"

#include <stdlib.h>

struct dt_stale {
    const dt_ops *ops;
    size_t bytes;
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
