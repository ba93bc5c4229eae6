/* Recursive halving-doubling all-reduce (Rabenseifner): reduce-scatter by recursive
 * halving (log2 P exchanges of 1/2, 1/4, ... of the buffer), then all-gather by
 * recursive doubling. Few messages (2 log2 P) and the ring's bandwidth term, which
 * suits mid-sized messages and many ranks.
 *
 * N not a power of two: with P the largest power of two <= N and E = N - P, ranks
 * 0..2E-1 pair up first: each even rank sends its whole buffer to the odd rank above
 * it, which adds it and takes part in the P-rank algorithm; the even rank sits it out
 * and receives the final result at the end.
 *
 * Sum order (deterministic, but not rank order): a pairwise tree over the halving
 * partners, e.g. for N = 4 ((x0 + x2) + (x1 + x3)) for a block owned by rank 0. */
#include "comm_internal.h"

enum { TAG_FOLD = 111, TAG_RS = 112, TAG_AG = 113 };

/* start of block k when `count` elements are cut into p nearly equal blocks */
static size_t block_off(size_t count, int p, int k) {
    size_t q = count / (size_t)p, rem = count % (size_t)p;
    return (size_t)k * q + ((size_t)k < rem ? (size_t)k : rem);
}

dt_status dtc_rhd_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale) {
    int n = x->size, r = x->rank;
    size_t es = dt_dtype_size(t);
    char *b = buf;
    if (count == 0) return DT_OK;
    int p = 1;
    while (p * 2 <= n) p *= 2;
    int extra = n - p, nr; /* nr: rank among the P ranks, -1 for a folded-out even rank */
    if (r < 2 * extra) {
        if (r % 2 == 0) {
            /* same segmentation as the receiving side's dtc_sendrecv_reduce */
            DT_TRY(dtc_sendrecv_reduce(x, b, count, r + 1, NULL, NULL, 0, MPI_PROC_NULL, t, op, 1.0, TAG_FOLD));
            nr = -1;
        } else {
            DT_TRY(dtc_sendrecv_reduce(x, NULL, 0, MPI_PROC_NULL, b, b, count, r - 1, t, op, 1.0, TAG_FOLD));
            nr = r / 2;
        }
    } else {
        nr = r - extra;
    }
    if (nr >= 0) {
        int lo = 0; /* this rank's window of blocks is [lo, lo + mask*2) */
        for (int mask = p / 2; mask >= 1; mask /= 2) {
            int pn = nr ^ mask, peer = pn < extra ? 2 * pn + 1 : pn + extra;
            int keep = nr & mask ? lo + mask : lo, give = nr & mask ? lo : lo + mask;
            size_t ko = block_off(count, p, keep), kn = block_off(count, p, keep + mask) - ko;
            size_t go = block_off(count, p, give), gn = block_off(count, p, give + mask) - go;
            DT_TRY(dtc_sendrecv_reduce(x, b + go * es, gn, peer, b + ko * es, b + ko * es, kn, peer, t, op,
                                       mask == 1 ? scale : 1.0, TAG_RS));
            lo = keep;
        }
        /* lo == nr: this rank holds finished block nr; double the window each step */
        for (int mask = 1; mask < p; mask *= 2) {
            int pn = nr ^ mask, peer = pn < extra ? 2 * pn + 1 : pn + extra;
            int plo = lo ^ mask;
            size_t mo = block_off(count, p, lo), mn = block_off(count, p, lo + mask) - mo;
            size_t po = block_off(count, p, plo), pnn = block_off(count, p, plo + mask) - po;
            DT_TRY(dtc_sendrecv(x, b + mo * es, mn, peer, b + po * es, pnn, peer, t, TAG_AG));
            if (plo < lo) lo = plo;
        }
    }
    if (r < 2 * extra) {
        if (r % 2 == 0) DT_TRY(dtc_sendrecv(x, NULL, 0, MPI_PROC_NULL, b, count, r + 1, t, TAG_FOLD));
        else DT_TRY(dtc_sendrecv(x, b, count, r - 1, NULL, 0, MPI_PROC_NULL, t, TAG_FOLD));
    }
    return DT_OK;
}
