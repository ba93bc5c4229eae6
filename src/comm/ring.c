/* Ring algorithms over point-to-point. All-reduce = reduce-scatter + all-gather: the
 * buffer is cut into N chunks (sizes differ by at most one element when N does not
 * divide the count; chunks may be empty); in N-1 steps each rank sends one chunk to
 * its right neighbour and adds the chunk arriving from its left, so each rank sends
 * 2(N-1)/N of the buffer in all, independent of N.
 *
 * Sum order (deterministic, but not rank order): chunk k starts at rank k+1 and is
 * accumulated along the ring, ((x[k+1] + x[k+2]) + ...) + x[k]; every rank then gets
 * that same sum. */
#include <string.h>

#include "comm_internal.h"

enum { TAG_RS = 101, TAG_AG = 102 };

static size_t chunk_off(size_t count, int n, int k) {
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)k * q + ((size_t)k < rem ? (size_t)k : rem);
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

dt_status dtc_ring_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale) {
    int n = x->size, r = x->rank, right = mod(r + 1, n), left = mod(r - 1, n);
    size_t es = dt_dtype_size(t);
    char *b = buf;
    if (count == 0) return DT_OK;
    for (int s = 0; s < n - 1; s++) {
        int ks = mod(r - s - 1, n), kr = mod(r - s - 2, n);
        size_t so = chunk_off(count, n, ks), sn = chunk_off(count, n, ks + 1) - so;
        size_t ro = chunk_off(count, n, kr), rn = chunk_off(count, n, kr + 1) - ro;
        DT_TRY(dtc_sendrecv_reduce(x, b + so * es, sn, right, b + ro * es, b + ro * es, rn, left, t, op,
                                   s == n - 2 ? scale : 1.0, TAG_RS));
    }
    /* rank r now holds the finished chunk r; pass the finished chunks around */
    for (int s = 0; s < n - 1; s++) {
        int ks = mod(r - s, n), kr = mod(r - s - 1, n);
        size_t so = chunk_off(count, n, ks), sn = chunk_off(count, n, ks + 1) - so;
        size_t ro = chunk_off(count, n, kr), rn = chunk_off(count, n, kr + 1) - ro;
        DT_TRY(dtc_sendrecv(x, b + so * es, sn, right, b + ro * es, rn, left, t, TAG_AG));
    }
    return DT_OK;
}

dt_status dtc_ring_reduce_scatter(dtc_ctx *x, const void *send, void *recv, size_t cnt, dt_dtype t, dt_redop op,
                                  double scale) {
    int n = x->size, r = x->rank, right = mod(r + 1, n), left = mod(r - 1, n);
    size_t es = dt_dtype_size(t);
    const char *in = send;
    if (cnt == 0) return DT_OK;
    if (in + (size_t)r * cnt * es == (const char *)recv) {
        /* in place (comm.h): recv's own block must stay intact until the last step adds it,
         * so each partial sum goes where its rank's block was, as in the all-reduce's first
         * half; the same messages and additions, so the same bits as out of place */
        char *b = (char *)recv - (size_t)r * cnt * es;
        for (int s = 0; s < n - 1; s++) {
            int ks = mod(r - s - 1, n), kr = mod(r - s - 2, n);
            char *acc = b + (size_t)kr * cnt * es;
            DT_TRY(dtc_sendrecv_reduce(x, b + (size_t)ks * cnt * es, cnt, right, acc, acc, cnt, left, t, op,
                                       s == n - 2 ? scale : 1.0, TAG_RS));
        }
        return DT_OK;
    }
    /* the running partial sum lives in recv: step s sends the chunk finished at step s-1
     * and overwrites it segment by segment with the next (safe, see dtc_sendrecv_reduce) */
    for (int s = 0; s < n - 1; s++) {
        int ks = mod(r - s - 1, n), kr = mod(r - s - 2, n);
        const void *sp = s == 0 ? in + (size_t)ks * cnt * es : recv;
        DT_TRY(dtc_sendrecv_reduce(x, sp, cnt, right, in + (size_t)kr * cnt * es, recv, cnt, left, t, op,
                                   s == n - 2 ? scale : 1.0, TAG_RS));
    }
    return DT_OK;
}

dt_status dtc_ring_allgather(dtc_ctx *x, const void *send, void *recv, size_t cnt, dt_dtype t) {
    int n = x->size, r = x->rank, right = mod(r + 1, n), left = mod(r - 1, n);
    size_t es = dt_dtype_size(t), bytes = cnt * es;
    char *out = recv;
    if (cnt == 0) return DT_OK;
    if (send != out + (size_t)r * bytes) memmove(out + (size_t)r * bytes, send, bytes);
    for (int s = 0; s < n - 1; s++) {
        int ks = mod(r - s, n), kr = mod(r - s - 1, n);
        DT_TRY(dtc_sendrecv(x, out + (size_t)ks * bytes, cnt, right, out + (size_t)kr * bytes, cnt, left, t, TAG_AG));
    }
    return DT_OK;
}
