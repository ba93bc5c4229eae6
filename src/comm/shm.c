/* Intra-node collectives through an MPI-3 shared-memory window (MPI_Win_allocate_shared
 * on the node communicator): every rank maps every other rank's segment, so data moves
 * with plain loads and stores instead of MPI messages. Valid only when the whole
 * communicator is on one node (dt_comm_set_algo checks).
 *
 * Each rank's segment holds a sync counter and two buffers of `cap` bytes. Messages are
 * processed in chunks that fit a buffer; successive chunks (across calls too) alternate
 * buffers, so a chunk's buffer is rewritten only after every rank has passed the next
 * chunk's first sync, i.e. finished reading it. Small chunks keep the data in cache
 * between the copy-in, the reduction and the copy-out.
 *
 * All-reduce chunk: each rank copies its input into its buffer (except its own slice,
 * which only it reads, straight from its input); sync; rank r sums slice r over all
 * ranks in rank order 0..N-1 into its buffer and its output; sync; each copies the
 * other slices out. With two ranks both add the whole chunk instead (see below). Sum
 * order: rank order, x0 + x1 + ... + x(N-1), for every element.
 *
 * Registered buffers (the *_reg functions, bottom): when the user's buffer itself lives in
 * a node-shared window (dt_comm_alloc_shared), peers read it in place, so there is no
 * staging copy and no chunking: one sync when every rank's data is ready, one when every
 * rank is done with the others' buffers. */
#include <linux/futex.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm_internal.h"

#define HDR_BYTES 4096
#define CAP_MIN ((size_t)64 << 10)
/* Per-rank chunk buffer: large enough that syncs are rare, small enough that a chunk
 * stays in cache from copy-in to copy-out (two buffers = a 1 MiB L2; with 1 MiB
 * buffers all-gather ran at a third of the speed). */
#define CAP_MAX ((size_t)512 << 10)
#define CHUNK2 ((size_t)256 << 10) /* all-reduce chunk with two ranks */
#define BLK 2048 /* elements per reduction block: a few KiB, stays in L1 across passes */
#define MAX_SRC 256

/* Header of rank q's segment: its sync counter (whose low 32 bits are also the futex word
 * waiters sleep on; little-endian), and how many peers sleep on it. */
static _Atomic uint64_t *counter(const dtc_shm *s, int q) { return (_Atomic uint64_t *)(void *)s->seg[q]; }
static _Atomic uint32_t *sleepers(const dtc_shm *s, int q) { return (_Atomic uint32_t *)(void *)(s->seg[q] + 8); }
/* Rank q's description of the registered buffer of the current call: offset, bytes (own
 * cache line, after the counter's). */
static uint64_t *reg_tag(const dtc_shm *s, int q) { return (uint64_t *)(void *)(s->seg[q] + 64); }
static char *slot(const dtc_shm *s, int q, int b) { return s->seg[q] + HDR_BYTES + (size_t)b * s->cap; }

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Process-shared futex (not FUTEX_PRIVATE: the word lives in another process's pages). */
static void futex_wait(_Atomic uint64_t *word, uint32_t seen) {
    struct timespec ts = {0, 50 * 1000 * 1000}; /* a bound, in case a wake-up is ever missed */
    syscall(SYS_futex, (uint32_t *)(void *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}
static void futex_wake(_Atomic uint64_t *word) {
    syscall(SYS_futex, (uint32_t *)(void *)word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* Barrier over the node: publish this rank's count, wait for everyone else's. The
 * release/acquire pair makes the buffers written before the sync visible after it.
 * A waiter spins briefly (the peer is usually microseconds away), then sleeps on the
 * peer's counter: a spinning communication thread would take the core from the compute
 * thread it overlaps with, and oversubscribed ranks from each other. The sleeper count
 * and the counter are both seq_cst, so either the waker sees the sleeper or the sleeper
 * sees the new count (and the futex rechecks the word itself). */
static void shm_sync(dtc_ctx *x) {
    dtc_shm *s = &x->shm;
    uint64_t v = ++s->seq;
    atomic_store(counter(s, x->rank), v);
    if (atomic_load(sleepers(s, x->rank)) > 0) futex_wake(counter(s, x->rank));
    for (int q = 0; q < x->size; q++) {
        if (q == x->rank) continue;
        _Atomic uint64_t *c = counter(s, q);
        unsigned spins = 0;
        uint64_t seen;
        while ((seen = atomic_load_explicit(c, memory_order_acquire)) < v) {
            if (++spins < 2048) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(sleepers(s, q), 1);
            if ((seen = atomic_load(c)) < v) futex_wait(c, (uint32_t)seen);
            atomic_fetch_sub(sleepers(s, q), 1);
        }
    }
}

void dtc_shm_free(dtc_ctx *x) {
    if (!x->shm.have) return;
    shm_sync(x); /* nobody reads the window any more */
    MPI_Win_free(&x->shm.win);
    x->shm.have = 0;
    x->shm.cap = 0;
}

/* Makes the window's buffers at least min(want, CAP_MAX) bytes. Collective over the
 * node, but only when it grows, which all ranks decide alike from the same counts. */
static dt_status shm_reserve(dtc_ctx *x, size_t want) {
    size_t cap = CAP_MIN;
    while (cap < want && cap < CAP_MAX) cap *= 2;
    if (x->shm.have && x->shm.cap >= cap) return DT_OK;
    if (x->node == MPI_COMM_NULL) return dtc_fail(x, DT_EINPUT, "shm needs MPI");
    if (x->size > MAX_SRC) return dtc_fail(x, DT_EINPUT, "shm supports at most %d ranks", MAX_SRC);
    dtc_shm_free(x);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true"); /* each segment local to its rank */
    char *base = NULL;
    int rc = MPI_Win_allocate_shared((MPI_Aint)(HDR_BYTES + 2 * cap), 1, info, x->node, &base, &x->shm.win);
    MPI_Info_free(&info);
    DT_TRY(dtc_mpi(x, rc, "MPI_Win_allocate_shared (%zu bytes)", HDR_BYTES + 2 * cap));
    MPI_Win_set_errhandler(x->shm.win, MPI_ERRORS_RETURN);
    x->shm.have = 1;
    x->shm.cap = cap;
    for (int q = 0; q < x->size; q++) {
        MPI_Aint sz;
        int du;
        void *p;
        DT_TRY(dtc_mpi(x, MPI_Win_shared_query(x->shm.win, q, &sz, &du, &p), "MPI_Win_shared_query"));
        x->shm.seg[q] = p;
    }
    atomic_store_explicit(counter(&x->shm, x->rank), 0, memory_order_relaxed);
    atomic_store_explicit(sleepers(&x->shm, x->rank), 0, memory_order_relaxed);
    memset(base + HDR_BYTES, 0, 2 * cap); /* fault the pages in now, not in the first chunks */
    x->shm.seq = 0;
    x->shm.chunks = 0;
    /* every counter is zero before anyone syncs */
    return dtc_mpi(x, MPI_Barrier(x->node), "MPI_Barrier");
}

/* dst[i] = (src[0][i] + src[1][i] + ... + src[ns-1][i]) * scale for m elements (one
 * block), summed in that order (or their maximum); the scale applies on the last pass
 * only. dst must not overlap any source; ns >= 2. */
static void reduce_block(void *dst, const char *const *src, int ns, size_t ob, size_t m, dt_dtype t, dt_redop op,
                         double scale) {
    dtc_combine(dst, src[0] + ob, src[1] + ob, m, t, op, ns == 2 ? scale : 1.0);
    for (int q = 2; q < ns; q++) dtc_combine(dst, dst, src[q] + ob, m, t, op, q == ns - 1 ? scale : 1.0);
}

/* reduce_block over n elements, block by block so dst stays in L1 across the passes;
 * each finished block is also copied to `copy` when given. */
static void reduce_n(void *dst, void *copy, const char *const *src, int ns, size_t n, dt_dtype t, dt_redop op,
                     double scale) {
    size_t es = dt_dtype_size(t);
    for (size_t o = 0; o < n; o += BLK) {
        size_t m = n - o < BLK ? n - o : BLK, ob = o * es;
        char *d = (char *)dst + ob;
        reduce_block(d, src, ns, ob, m, t, op, scale);
        if (copy) memcpy((char *)copy + ob, d, m * es);
    }
}

/* reduce_n for a dst that may be one of the sources (an in-place reduce-scatter) or a
 * peer's copy: each block is reduced into tmp, all its sources read, then copied out. */
static void reduce_via_tmp(void *dst, const char *const *src, int ns, size_t n, dt_dtype t, dt_redop op,
                           double scale) {
    size_t es = dt_dtype_size(t);
    _Alignas(64) char tmp[BLK * sizeof(double)];
    for (size_t o = 0; o < n; o += BLK) {
        size_t m = n - o < BLK ? n - o : BLK, ob = o * es;
        reduce_block(tmp, src, ns, ob, m, t, op, scale);
        memcpy((char *)dst + ob, tmp, m * es);
    }
}

dt_status dtc_shm_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale) {
    int n = x->size, me = x->rank;
    size_t es = dt_dtype_size(t), al = 64 / es; /* slices start on cache lines */
    if (count == 0) return DT_OK;
    DT_TRY(shm_reserve(x, count * es));
    dtc_shm *s = &x->shm;
    size_t cmax = s->cap / es;
    const char *src[MAX_SRC];
    if (n == 2) {
        /* Two ranks: each must read the peer's whole chunk either way, so both add the
         * peer's chunk to their own in place: one sync per chunk and no copy-out.
         * x0 + x1 == x1 + x0 bitwise (and max is made order-free, see dtc_combine), so
         * both ranks get the rank-order result. Adding into
         * the output in place (rather than summing both buffers into it) measured ~1.4x
         * faster; chunks of 256 KiB keep the working set in a 1 MiB L2. */
        size_t c2 = cmax < CHUNK2 / es ? cmax : CHUNK2 / es;
        for (size_t e = 0; e < count; e += c2) {
            size_t c = count - e < c2 ? count - e : c2;
            int b = (int)(s->chunks++ & 1);
            char *u = (char *)buf + e * es;
            memcpy(slot(s, me, b), u, c * es);
            shm_sync(x);
            const void *peer = slot(s, 1 - me, b);
            dtc_combine(u, u, peer, c, t, op, scale);
        }
        return DT_OK;
    }
    for (size_t e = 0; e < count; e += cmax) {
        size_t c = count - e < cmax ? count - e : cmax;
        size_t sl = ((c + (size_t)n - 1) / (size_t)n + al - 1) / al * al;
        size_t lo = (size_t)me * sl < c ? (size_t)me * sl : c, hi = lo + sl < c ? lo + sl : c;
        int b = (int)(s->chunks++ & 1);
        char *mine = slot(s, me, b), *u = (char *)buf + e * es;
        memcpy(mine, u, lo * es);
        memcpy(mine + hi * es, u + hi * es, (c - hi) * es);
        shm_sync(x);
        if (hi > lo) {
            for (int q = 0; q < n; q++) src[q] = (q == me ? u : slot(s, q, b)) + lo * es;
            reduce_n(mine + lo * es, u + lo * es, src, n, hi - lo, t, op, scale);
        }
        shm_sync(x);
        for (int q = 0; q < n; q++) {
            size_t ql = (size_t)q * sl < c ? (size_t)q * sl : c, qh = ql + sl < c ? ql + sl : c;
            if (q != me && qh > ql) memcpy(u + ql * es, slot(s, q, b) + ql * es, (qh - ql) * es);
        }
    }
    return DT_OK;
}

dt_status dtc_shm_reduce_scatter(dtc_ctx *x, const void *send, void *recv, size_t cnt, dt_dtype t, dt_redop op,
                                 double scale) {
    int n = x->size, me = x->rank;
    size_t es = dt_dtype_size(t);
    if (cnt == 0) return DT_OK;
    DT_TRY(shm_reserve(x, (size_t)n * cnt * es));
    dtc_shm *s = &x->shm;
    size_t cmax = s->cap / ((size_t)n * es); /* elements of each block per chunk */
    const char *in = send, *src[MAX_SRC];
    int inplace = in + (size_t)me * cnt * es == (const char *)recv; /* src[me] is then recv */
    for (size_t e = 0; e < cnt; e += cmax) {
        size_t c = cnt - e < cmax ? cnt - e : cmax;
        int b = (int)(s->chunks++ & 1);
        char *mine = slot(s, me, b);
        for (int p = 0; p < n; p++)
            if (p != me) memcpy(mine + (size_t)p * c * es, in + ((size_t)p * cnt + e) * es, c * es);
        shm_sync(x);
        for (int q = 0; q < n; q++)
            src[q] = q == me ? in + ((size_t)me * cnt + e) * es : slot(s, q, b) + (size_t)me * c * es;
        if (inplace) reduce_via_tmp((char *)recv + e * es, src, n, c, t, op, scale);
        else reduce_n((char *)recv + e * es, NULL, src, n, c, t, op, scale);
    }
    return DT_OK;
}

/* Publishes and reads cnt elements chunk by chunk: rank `from` (every rank when from < 0)
 * copies its chunk of `mine` into its buffer; sync; every other rank copies each
 * publisher q's chunk to out + (q·stride + e) elements. All-gather and broadcast. */
static dt_status publish_read(dtc_ctx *x, int from, const char *mine, char *out, size_t stride, size_t cnt,
                              size_t es) {
    int me = x->rank, q0 = from < 0 ? 0 : from, q1 = from < 0 ? x->size : from + 1;
    if (cnt == 0) return DT_OK;
    DT_TRY(shm_reserve(x, cnt * es));
    dtc_shm *s = &x->shm;
    size_t cmax = s->cap / es;
    for (size_t e = 0; e < cnt; e += cmax) {
        size_t c = cnt - e < cmax ? cnt - e : cmax;
        int b = (int)(s->chunks++ & 1);
        if (from < 0 || me == from) memcpy(slot(s, me, b), mine + e * es, c * es);
        shm_sync(x);
        for (int q = q0; q < q1; q++)
            if (q != me) memcpy(out + ((size_t)q * stride + e) * es, slot(s, q, b), c * es);
    }
    return DT_OK;
}

dt_status dtc_shm_allgather(dtc_ctx *x, const void *send, void *recv, size_t cnt, dt_dtype t) {
    size_t es = dt_dtype_size(t);
    char *out = recv, *own = out + (size_t)x->rank * cnt * es;
    if (send != own) memmove(own, send, cnt * es);
    return publish_read(x, -1, own, out, cnt, cnt, es);
}

dt_status dtc_shm_bcast(dtc_ctx *x, void *buf, size_t count, dt_dtype t, int root) {
    return publish_read(x, root, buf, buf, 0, count, dt_dtype_size(t));
}

/* ---- registered buffers ---- */

/* Publishes this call's (offset, bytes), syncs, and checks every rank passed the same:
 * all ranks see all tags, so a mismatch fails everywhere at the same point. Fills
 * x->peer with every rank's copy of the buffer. */
static dt_status reg_begin(dtc_ctx *x, const dtc_region *r, size_t off, size_t bytes) {
    DT_TRY(shm_reserve(x, 0));
    dtc_shm *s = &x->shm;
    reg_tag(s, x->rank)[0] = off;
    reg_tag(s, x->rank)[1] = bytes;
    shm_sync(x); /* also: every rank's data is final */
    for (int q = 0; q < x->size; q++) {
        const uint64_t *g = reg_tag(s, q);
        if (g[0] != off || g[1] != bytes)
            return dtc_fail(x, DT_EINPUT,
                            "ranks passed different shared buffers (rank %d: offset %llu, %llu bytes; rank %d: "
                            "offset %zu, %zu bytes)",
                            q, (unsigned long long)g[0], (unsigned long long)g[1], x->rank, off, bytes);
        x->peer[q] = r->base[q] + off;
    }
    return DT_OK;
}

dt_status dtc_shm_allreduce_reg(dtc_ctx *x, const dtc_region *r, size_t off, size_t count, dt_dtype t, dt_redop op,
                                double scale) {
    int n = x->size, me = x->rank;
    size_t es = dt_dtype_size(t), al = 64 / es;
    if (count == 0) return DT_OK;
    DT_TRY(reg_begin(x, r, off, count * es));
    /* rank me reduces slice me of every copy and writes the sum into every copy: each
     * rank reads and writes the message once, in total */
    size_t sl = ((count + (size_t)n - 1) / (size_t)n + al - 1) / al * al;
    size_t lo = (size_t)me * sl < count ? (size_t)me * sl : count, hi = lo + sl < count ? lo + sl : count;
    _Alignas(64) char tmp[BLK * sizeof(double)];
    for (size_t o = lo; o < hi; o += BLK) {
        size_t m = hi - o < BLK ? hi - o : BLK, ob = o * es;
        reduce_block(tmp, (const char *const *)x->peer, n, ob, m, t, op, scale);
        for (int q = 0; q < n; q++) memcpy(x->peer[(me + q) % n] + ob, tmp, m * es);
    }
    shm_sync(x); /* nobody touches its copy again before every slice is written */
    return DT_OK;
}

dt_status dtc_shm_reduce_scatter_reg(dtc_ctx *x, const dtc_region *r, size_t off, void *recv, size_t cnt, dt_dtype t,
                                     dt_redop op, double scale) {
    int n = x->size, me = x->rank;
    size_t es = dt_dtype_size(t);
    if (cnt == 0) return DT_OK;
    DT_TRY(reg_begin(x, r, off, (size_t)n * cnt * es));
    const char *src[MAX_SRC];
    for (int q = 0; q < n; q++) src[q] = x->peer[q] + (size_t)me * cnt * es;
    /* through tmp: recv may be anywhere, even in a copy; in place it is src[me], which only
     * this rank reads (rank q reads block q of every copy) */
    reduce_via_tmp(recv, src, n, cnt, t, op, scale);
    shm_sync(x); /* peers are done reading this rank's send buffer */
    return DT_OK;
}

dt_status dtc_shm_allgather_reg(dtc_ctx *x, const void *send, const dtc_region *r, size_t off, size_t cnt,
                                dt_dtype t) {
    int n = x->size, me = x->rank;
    size_t es = dt_dtype_size(t), blk = cnt * es;
    if (cnt == 0) return DT_OK;
    char *own = r->base[me] + off + (size_t)me * blk;
    if (send != own) memmove(own, send, blk); /* before the sync: peers read it after */
    DT_TRY(reg_begin(x, r, off, (size_t)n * blk));
    for (int k = 1; k < n; k++) {
        int q = (me + k) % n; /* staggered, so ranks do not all read one peer at once */
        memcpy(x->peer[me] + (size_t)q * blk, x->peer[q] + (size_t)q * blk, blk);
    }
    shm_sync(x); /* peers are done reading this rank's block */
    return DT_OK;
}
