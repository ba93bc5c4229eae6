/* Communicator: every collective under every algorithm that implements it, every dtype
 * (f32, f64, bf16) and reduction (sum, mean, max), many counts, blocking and non-blocking,
 * against serial references every rank computes locally (rank q's input element i is a
 * fixed function of (q, i); bf16 inputs are small integers, so bf16 sums are exact in any
 * order and every algorithm must match the reference bitwise). Also: bitwise
 * repeatability, shm's rank-order sums, bf16 rounding to nearest-even, order-free max of
 * NaN and signed zeros, in-place reduce-scatter, overlapping non-blocking operations,
 * split (with ranks in no group), gather, non-blocking point-to-point, and shm on
 * node-shared (registered) buffers: the same bits as on ordinary ones.
 * Across several nodes (tests/test_multinode.sh, with DT_TEST_RANKS_PER_NODE set and ranks
 * placed by node) shm must refuse the world and run on each node's communicator.
 * Usage: mpirun -np N mpi_test_comm [SOURCE_DIR] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/status.h"

static int g_pass, g_fail, g_rank, g_printed, g_one_node;
#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (cond) g_pass++;                                                           \
        else {                                                                        \
            g_fail++;                                                                 \
            if (g_printed++ < 30) {                                                   \
                fprintf(stderr, "rank %d: FAIL %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                         \
                fprintf(stderr, "\n");                                                \
            }                                                                         \
        }                                                                             \
    } while (0)
#define OK(expr, what) CHECK((expr) == DT_OK, "%s: %s", what, dt_error_message())

static int g_size;
static size_t g_big; /* the largest count, set in main */

/* bf16 of a float, to nearest-even, worked out from the two neighbours (not with the
 * library's bit trick); bf16 to double is exact. */
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return 0x7fc0;
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    double dl = fabs((double)f - flo), dh = fabs((double)fhi - f);
    if (dl < dh || (dl == dh && !((lo >> 16) & 1))) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}
static double bf16_val(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* rank q's input element i: in [1, 2), so sums do not cancel and a relative tolerance holds;
 * for bf16 an integer in [0, 256/size), so any sum over ranks is exact in bf16 */
static double val(int q, size_t i) { return 1.0 + (double)((q * 7919u + i * 31u) % 1009u) / 1009.0; }
static double valt(int q, size_t i, dt_dtype t) {
    if (t == DT_BF16) {
        unsigned k = g_size < 256 ? 256u / (unsigned)g_size : 1u;
        return (double)((q * 7919u + i * 31u) % k);
    }
    return t == DT_F32 ? (double)(float)val(q, i) : val(q, i);
}

static double getv(const void *p, size_t i, dt_dtype t) {
    if (t == DT_BF16) return bf16_val(((const uint16_t *)p)[i]);
    return t == DT_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
static void setv(void *p, size_t i, dt_dtype t, double v) {
    if (t == DT_F32) ((float *)p)[i] = (float)v;
    else if (t == DT_BF16) ((uint16_t *)p)[i] = bf16_of((float)v);
    else ((double *)p)[i] = v;
}
static void fill(void *p, size_t n, dt_dtype t, int q, size_t base) {
    for (size_t i = 0; i < n; i++) setv(p, i, t, valt(q, base + i, t));
}

/* The reduction over the member ranks: the maximum, or the sum in rank order in the
 * dtype's precision (then the mean's scale; bf16: the exact sum, scaled in fp32). */
static double ref_sum(const int *mem, int m, size_t g, dt_dtype t, dt_redop op) {
    if (op == DT_MAX) {
        double s = valt(mem[0], g, t);
        for (int k = 1; k < m; k++) s = fmax(s, valt(mem[k], g, t));
        return s;
    }
    if (t == DT_F32 || t == DT_BF16) {
        float s = (float)valt(mem[0], g, t);
        for (int k = 1; k < m; k++) s += (float)valt(mem[k], g, t);
        if (op == DT_AVG) s *= (float)(1.0 / m);
        return t == DT_BF16 ? bf16_val(bf16_of(s)) : s;
    }
    double s = val(mem[0], g);
    for (int k = 1; k < m; k++) s += val(mem[k], g);
    if (op == DT_AVG) s *= 1.0 / m;
    return s;
}

/* got[i] against the reduction of global element base+i; exact for rank-order sums, for
 * maxima and for bf16 */
static void check_reduced(const char *what, const void *got, size_t n, dt_dtype t, const int *mem, int m, size_t base,
                          dt_redop op, int exact) {
    size_t bad = 0, first = 0;
    double fg = 0, fr = 0;
    exact = exact || op == DT_MAX || t == DT_BF16;
    for (size_t i = 0; i < n; i++) {
        double g = getv(got, i, t), r = ref_sum(mem, m, base + i, t, op);
        int ok = exact ? g == r : fabs(g - r) <= 1e-6 * fabs(r);
        if (!ok && bad++ == 0) {
            first = i;
            fg = g;
            fr = r;
        }
    }
    CHECK(bad == 0, "%s: %zu of %zu wrong, first at %zu: got %.10g want %.10g", what, bad, n, first, fg, fr);
}

/* got[i] == rank q's element base+i exactly */
static void check_copy(const char *what, const void *got, size_t n, dt_dtype t, int q, size_t base) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double want = valt(q, base + i, t);
        if (getv(got, i, t) != want && bad++ == 0) first = i;
    }
    CHECK(bad == 0, "%s: %zu of %zu differ from rank %d's data, first at %zu", what, bad, n, q, first);
}

static dt_comm *g_world;
static int g_all[64];
static void *A, *B, *C; /* max-size buffers, allocated once */

static const char *opname(dt_redop op) { return op == DT_AVG ? "avg" : op == DT_MAX ? "max" : "sum"; }

static void set_algo(dt_comm *c, dt_coll coll, dt_algo a) {
    OK(dt_comm_set_algo(c, coll, a), "set_algo");
}

static void wait_polling(dt_request *r, const char *what) {
    int done = 0;
    dt_status st = DT_OK;
    for (long i = 0; !done && !st && i < 100000000L; i++) st = dt_test(r, &done);
    CHECK(st == DT_OK && done, "%s: dt_test: status %d, done %d: %s", what, st, done, dt_error_message());
    OK(dt_wait(r), what);
}

static void test_allreduce(dt_comm *c, const int *mem, dt_algo a, dt_dtype t, size_t n, dt_redop op) {
    char what[160];
    int m = dt_comm_size(c), r = mem[dt_comm_rank(c)];
    size_t es = dt_dtype_size(t);
    snprintf(what, sizeof what, "allreduce %s %s n=%zu %s size=%d", dt_algo_name(a), dt_dtype_name(t), n, opname(op),
             m);
    set_algo(c, DT_COLL_ALLREDUCE, a);
    fill(A, n, t, r, 0);
    OK(dt_allreduce(c, A, n, t, op), what);
    check_reduced(what, A, n, t, mem, m, 0, op, a == DT_ALGO_SHM);
    fill(B, n, t, r, 0);
    OK(dt_allreduce(c, B, n, t, op), what);
    CHECK(memcmp(A, B, n * es) == 0, "%s: two runs differ", what);
}

static void test_iallreduce(dt_algo a, dt_dtype t, size_t n, dt_redop op) {
    char what[160];
    snprintf(what, sizeof what, "iallreduce %s %s n=%zu %s", dt_algo_name(a), dt_dtype_name(t), n, opname(op));
    set_algo(g_world, DT_COLL_ALLREDUCE, a);
    fill(A, n, t, g_rank, 0);
    dt_request *req = NULL;
    OK(dt_iallreduce(g_world, A, n, t, op, &req), what);
    if (req) wait_polling(req, what);
    check_reduced(what, A, n, t, g_all, g_size, 0, op, a == DT_ALGO_SHM);
}

static void test_reduce_scatter(dt_algo a, dt_dtype t, size_t n, dt_redop op, int nonblocking) {
    char what[160];
    size_t es = dt_dtype_size(t);
    snprintf(what, sizeof what, "%sreduce_scatter %s %s n=%zu %s", nonblocking ? "i" : "", dt_algo_name(a),
             dt_dtype_name(t), n, opname(op));
    set_algo(g_world, DT_COLL_REDUCE_SCATTER, a);
    fill(A, (size_t)g_size * n, t, g_rank, 0);
    if (nonblocking) {
        dt_request *req = NULL;
        OK(dt_ireduce_scatter(g_world, A, B, n, t, op, &req), what);
        if (req) OK(dt_wait(req), what);
    } else {
        OK(dt_reduce_scatter(g_world, A, B, n, t, op), what);
    }
    check_reduced(what, B, n, t, g_all, g_size, (size_t)g_rank * n, op, a == DT_ALGO_SHM);
    if (!nonblocking) {
        OK(dt_reduce_scatter(g_world, A, C, n, t, op), what);
        CHECK(memcmp(B, C, n * es) == 0, "%s: two runs differ", what);
        check_copy(what, A, (size_t)g_size * n, t, g_rank, 0); /* send untouched */
    }
}

/* In place (recv = this rank's block of send): the reduced block lands there; ours
 * (ring, shm) give the same bits as out of place, MPI's may sum in another order. */
static void test_reduce_scatter_inplace(dt_algo a, dt_dtype t, size_t n, dt_redop op, int nonblocking) {
    char what[160];
    size_t es = dt_dtype_size(t);
    snprintf(what, sizeof what, "%sreduce_scatter in place %s %s n=%zu %s", nonblocking ? "i" : "", dt_algo_name(a),
             dt_dtype_name(t), n, opname(op));
    set_algo(g_world, DT_COLL_REDUCE_SCATTER, a);
    fill(A, (size_t)g_size * n, t, g_rank, 0);
    OK(dt_reduce_scatter(g_world, A, C, n, t, op), what);
    fill(B, (size_t)g_size * n, t, g_rank, 0);
    char *mine = (char *)B + (size_t)g_rank * n * es;
    if (nonblocking) {
        dt_request *req = NULL;
        OK(dt_ireduce_scatter(g_world, B, mine, n, t, op, &req), what);
        if (req) wait_polling(req, what); /* dt_test finishes MPI's request: the move into place */
    } else {
        OK(dt_reduce_scatter(g_world, B, mine, n, t, op), what);
    }
    check_reduced(what, mine, n, t, g_all, g_size, (size_t)g_rank * n, op, a == DT_ALGO_SHM);
    int ours = a == DT_ALGO_RING || a == DT_ALGO_SHM || (a == DT_ALGO_AUTO && g_one_node);
    if (ours) CHECK(n == 0 || memcmp(mine, C, n * es) == 0, "%s: differs from out of place", what);
}

static void test_allgather(dt_algo a, dt_dtype t, size_t n, int inplace, int nonblocking) {
    char what[160];
    size_t es = dt_dtype_size(t);
    snprintf(what, sizeof what, "%sallgather %s %s n=%zu%s", nonblocking ? "i" : "", dt_algo_name(a), dt_dtype_name(t),
             n, inplace ? " in place" : "");
    set_algo(g_world, DT_COLL_ALLGATHER, a);
    void *send = inplace ? (char *)B + (size_t)g_rank * n * es : A;
    for (size_t i = 0; i < (size_t)g_size * n; i++) setv(B, i, t, -1.0);
    fill(send, n, t, g_rank, 0);
    if (nonblocking) {
        dt_request *req = NULL;
        OK(dt_iallgather(g_world, send, B, n, t, &req), what);
        if (req) OK(dt_wait(req), what);
    } else {
        OK(dt_allgather(g_world, send, B, n, t), what);
    }
    for (int q = 0; q < g_size; q++) check_copy(what, (char *)B + (size_t)q * n * es, n, t, q, 0);
}

static void test_bcast(dt_algo a, dt_dtype t, size_t n, int root) {
    char what[160];
    snprintf(what, sizeof what, "bcast %s %s n=%zu root=%d", dt_algo_name(a), dt_dtype_name(t), n, root);
    set_algo(g_world, DT_COLL_BCAST, a);
    if (g_rank == root) fill(A, n, t, root, 0);
    else
        for (size_t i = 0; i < n; i++) setv(A, i, t, -1.0);
    OK(dt_bcast(g_world, A, n, t, root), what);
    check_copy(what, A, n, t, root, 0);
}

static void test_reduce(dt_algo a, dt_dtype t, size_t n, dt_redop op, int root) {
    char what[160];
    size_t es = dt_dtype_size(t);
    snprintf(what, sizeof what, "reduce (allreduce algo %s) %s n=%zu root=%d %s", dt_algo_name(a), dt_dtype_name(t),
             n, root, opname(op));
    set_algo(g_world, DT_COLL_ALLREDUCE, a);
    fill(A, n, t, g_rank, 0);
    OK(dt_reduce(g_world, A, n, t, op, root), what);
    if (g_rank == root) check_reduced(what, A, n, t, g_all, g_size, 0, op, 0);
    else check_copy(what, A, n, t, g_rank, 0);
    fill(B, n, t, g_rank, 0);
    OK(dt_reduce(g_world, B, n, t, op, root), what);
    CHECK(memcmp(A, B, n * es) == 0, "%s: two runs differ", what);
}

/* Two non-blocking all-reduces in flight at once, a blocking one between them, waited
 * in reverse order. */
static void test_overlap(dt_algo a, dt_dtype t, size_t n1, size_t n2) {
    char what[160];
    snprintf(what, sizeof what, "overlapping iallreduce %s %s n=%zu,%zu", dt_algo_name(a), dt_dtype_name(t), n1, n2);
    set_algo(g_world, DT_COLL_ALLREDUCE, a);
    fill(A, n1, t, g_rank, 0);
    fill(B, n2, t, g_rank, 7);
    fill(C, n2, t, g_rank, 3);
    dt_request *r1 = NULL, *r2 = NULL;
    OK(dt_iallreduce(g_world, A, n1, t, DT_SUM, &r1), what);
    OK(dt_iallreduce(g_world, B, n2, t, DT_AVG, &r2), what);
    OK(dt_allreduce(g_world, C, n2, t, DT_SUM), what);
    if (r2) OK(dt_wait(r2), what);
    if (r1) OK(dt_wait(r1), what);
    check_reduced(what, A, n1, t, g_all, g_size, 0, DT_SUM, a == DT_ALGO_SHM);
    check_reduced(what, B, n2, t, g_all, g_size, 7, DT_AVG, a == DT_ALGO_SHM);
    check_reduced(what, C, n2, t, g_all, g_size, 3, DT_SUM, a == DT_ALGO_SHM);
}

/* Registered buffers (dt_comm_alloc_shared) at offset `off` elements: exact rank-order
 * results, bitwise equal to shm on ordinary memory, blocking and non-blocking. */
static void test_registered_once(void *RA, dt_dtype t, size_t n, size_t off) {
    char what[160];
    size_t es = dt_dtype_size(t);
    char *ra = (char *)RA + off * es;
    snprintf(what, sizeof what, "registered shm %s n=%zu off=%zu", dt_dtype_name(t), n, off);
    set_algo(g_world, DT_COLL_ALLREDUCE, DT_ALGO_SHM);
    set_algo(g_world, DT_COLL_REDUCE_SCATTER, DT_ALGO_SHM);
    set_algo(g_world, DT_COLL_ALLGATHER, DT_ALGO_SHM);
    /* all-reduce vs the same on ordinary memory */
    fill(ra, n, t, g_rank, 0);
    fill(A, n, t, g_rank, 0);
    OK(dt_allreduce(g_world, ra, n, t, DT_AVG), what);
    OK(dt_allreduce(g_world, A, n, t, DT_AVG), what);
    check_reduced(what, ra, n, t, g_all, g_size, 0, DT_AVG, 1);
    CHECK(n == 0 || memcmp(ra, A, n * es) == 0, "%s: all-reduce differs from ordinary memory", what);
    fill(ra, n, t, g_rank, 5);
    dt_request *req = NULL;
    OK(dt_iallreduce(g_world, ra, n, t, DT_SUM, &req), what);
    if (req) wait_polling(req, what);
    check_reduced(what, ra, n, t, g_all, g_size, 5, DT_SUM, 1);
    fill(ra, n, t, g_rank, 2);
    OK(dt_allreduce(g_world, ra, n, t, DT_MAX), what);
    check_reduced(what, ra, n, t, g_all, g_size, 2, DT_MAX, 1);
    /* reduce-scatter from a registered send buffer, which stays untouched */
    fill(ra, (size_t)g_size * n, t, g_rank, 0);
    OK(dt_reduce_scatter(g_world, ra, B, n, t, DT_SUM), what);
    check_reduced(what, B, n, t, g_all, g_size, (size_t)g_rank * n, DT_SUM, 1);
    check_copy(what, ra, (size_t)g_size * n, t, g_rank, 0);
    OK(dt_ireduce_scatter(g_world, ra, C, n, t, DT_SUM, &req), what);
    if (req) OK(dt_wait(req), what);
    CHECK(n == 0 || memcmp(B, C, n * es) == 0, "%s: non-blocking reduce-scatter differs", what);
    /* in place in the registered buffer (ZeRO-1's gradients): the same bits */
    char *own = ra + (size_t)g_rank * n * es;
    for (int nb = 0; nb < 2; nb++) {
        fill(ra, (size_t)g_size * n, t, g_rank, 0);
        if (nb) {
            OK(dt_ireduce_scatter(g_world, ra, own, n, t, DT_SUM, &req), what);
            if (req) OK(dt_wait(req), what);
        } else {
            OK(dt_reduce_scatter(g_world, ra, own, n, t, DT_SUM), what);
        }
        CHECK(n == 0 || memcmp(own, B, n * es) == 0, "%s: %sreduce-scatter in place differs", what, nb ? "i" : "");
    }
    /* all-gather into a registered buffer, from elsewhere and in place */
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < (size_t)g_size * n; i++) setv(ra, i, t, -1.0);
        void *send = inplace ? ra + (size_t)g_rank * n * es : A;
        fill(send, n, t, g_rank, 0);
        if (inplace) {
            OK(dt_iallgather(g_world, send, ra, n, t, &req), what);
            if (req) OK(dt_wait(req), what);
        } else {
            OK(dt_allgather(g_world, send, ra, n, t), what);
        }
        for (int q = 0; q < g_size; q++) check_copy(what, ra + (size_t)q * n * es, n, t, q, 0);
    }
}

/* On the communicator of this rank's node (ranks are placed node by node, so the first
 * rank of the node names it); the tests above use g_world, g_rank, g_size and g_all,
 * which point at the node communicator meanwhile. */
static void test_registered_world(void);
static void test_registered(void) {
    if (g_one_node) {
        test_registered_world();
        return;
    }
    dt_comm *node = NULL, *world = g_world;
    int rank = g_rank, size = g_size, all[64];
    memcpy(all, g_all, sizeof all);
    OK(dt_comm_split(g_world, g_rank - dt_comm_local_rank(g_world), g_rank, &node), "split by node");
    if (!node) return;
    CHECK(dt_comm_local_size(node) == dt_comm_size(node), "node communicator spans nodes");
    g_world = node;
    g_rank = dt_comm_rank(node);
    g_size = dt_comm_size(node);
    for (int q = 0; q < g_size; q++) g_all[q] = q; /* inputs are functions of the node rank */
    test_registered_world();
    g_world = world;
    g_rank = rank;
    g_size = size;
    memcpy(g_all, all, sizeof all);
    dt_comm_free(node);
}

static void test_registered_world(void) {
    const size_t cap = (size_t)4 << 20; /* elements of f64 */
    void *RA = NULL, *RB = NULL;
    OK(dt_comm_alloc_shared(g_world, cap * sizeof(double), "test", &RA), "alloc_shared");
    OK(dt_comm_alloc_shared(g_world, 3000 * sizeof(double), "test", &RB), "alloc_shared");
    if (!RA || !RB) return;
    CHECK(((const double *)RA)[cap - 1] == 0.0 && ((const double *)RB)[0] == 0.0, "shared buffers not zeroed");
    size_t counts[] = {0, 1, 7, 1021, (size_t)g_size * 1000 + 1, g_big};
    for (int t = 0; t < 3; t++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            if ((size_t)g_size * (counts[k] + 3) > cap) continue;
            test_registered_once(RA, (dt_dtype)t, counts[k], 0);
            test_registered_once(RA, (dt_dtype)t, counts[k], 3); /* not cache-line aligned */
        }
    /* two registered all-reduces in flight and a blocking one on another buffer */
    {
        const char *what = "overlapping registered iallreduce";
        float *x = RA, *y = (float *)RA + 200000;
        fill(x, 100003, DT_F32, g_rank, 0);
        fill(y, 5000, DT_F32, g_rank, 7);
        fill(RB, 3000, DT_F64, g_rank, 3);
        dt_request *r1 = NULL, *r2 = NULL;
        OK(dt_iallreduce(g_world, x, 100003, DT_F32, DT_SUM, &r1), what);
        OK(dt_iallreduce(g_world, y, 5000, DT_F32, DT_AVG, &r2), what);
        OK(dt_allreduce(g_world, RB, 3000, DT_F64, DT_SUM), what);
        if (r2) OK(dt_wait(r2), what);
        if (r1) OK(dt_wait(r1), what);
        check_reduced(what, x, 100003, DT_F32, g_all, g_size, 0, DT_SUM, 1);
        check_reduced(what, y, 5000, DT_F32, g_all, g_size, 7, DT_AVG, 1);
        check_reduced(what, RB, 3000, DT_F64, g_all, g_size, 3, DT_SUM, 1);
    }
    /* ranks passing different offsets: an error on every rank, not a hang or garbage */
    if (g_size > 1) {
        dt_error_clear();
        float *x = (float *)RA + (g_rank == 0 ? 0 : 64);
        dt_status st = dt_allreduce(g_world, x, 1000, DT_F32, DT_SUM);
        CHECK(st == DT_EINPUT && strstr(dt_error_message(), "different shared buffers"),
              "offset mismatch: status %d: %s", st, dt_error_message());
        dt_error_clear();
        void *bad = NULL;
        st = dt_comm_alloc_shared(g_world, 4096 + (size_t)g_rank * 64, "test", &bad);
        CHECK(st == DT_EINPUT && !bad && strstr(dt_error_message(), "different sizes"),
              "size mismatch: status %d: %s", st, dt_error_message());
        dt_error_clear();
    }
    dt_comm_free_shared(g_world, RB);
    /* a slot freed and reused */
    OK(dt_comm_alloc_shared(g_world, 3000 * sizeof(double), "test", &RB), "alloc_shared again");
    if (RB) {
        fill(RB, 3000, DT_F64, g_rank, 9);
        OK(dt_allreduce(g_world, RB, 3000, DT_F64, DT_SUM), "reused slot");
        check_reduced("reused slot", RB, 3000, DT_F64, g_all, g_size, 9, DT_SUM, 1);
    }
    dt_comm_free_shared(g_world, RB);
    dt_comm_free_shared(g_world, RA);
}

static void test_split(void) {
    dt_comm *sub = NULL;
    OK(dt_comm_split(g_world, g_rank % 2, g_rank, &sub), "split");
    if (!sub) return;
    int mem[64], m = 0;
    for (int q = g_rank % 2; q < g_size; q += 2) mem[m++] = q;
    CHECK(dt_comm_size(sub) == m, "split: size %d, want %d", dt_comm_size(sub), m);
    CHECK(dt_comm_rank(sub) == g_rank / 2, "split: rank %d, want %d", dt_comm_rank(sub), g_rank / 2);
    for (int a = 0; a < DT_ALGO_N; a++)
        for (int t = 0; t < 3; t++) {
            if (a == DT_ALGO_SHM && dt_comm_local_size(sub) != dt_comm_size(sub)) continue;
            size_t ns[] = {1, 13, 1021, 100003};
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                test_allreduce(sub, mem, (dt_algo)a, (dt_dtype)t, ns[k], (dt_redop)((k + (size_t)t) % 3));
        }
    /* the world is unaffected by traffic on the sub-communicator */
    set_algo(g_world, DT_COLL_ALLREDUCE, DT_ALGO_RING);
    fill(A, 1000, DT_F32, g_rank, 0);
    OK(dt_allreduce(g_world, A, 1000, DT_F32, DT_SUM), "world after split");
    check_reduced("world after split", A, 1000, DT_F32, g_all, g_size, 0, DT_SUM, 0);
    dt_comm_free(sub);
    /* ranks in no group: NULL for them, the others' group without them */
    sub = NULL;
    OK(dt_comm_split(g_world, g_rank % 3 == 1 ? DT_COMM_NO_GROUP : 0, g_rank, &sub), "split with no group");
    m = 0;
    for (int q = 0; q < g_size; q++)
        if (q % 3 != 1) mem[m++] = q;
    if (g_rank % 3 == 1) {
        CHECK(sub == NULL, "split: a rank in no group got a communicator");
    } else if (sub) {
        CHECK(dt_comm_size(sub) == m, "split with no group: size %d, want %d", dt_comm_size(sub), m);
        test_allreduce(sub, mem, DT_ALGO_RING, DT_F64, 1021, DT_SUM);
    }
    if (sub) dt_comm_free(sub);
    dt_error_clear();
    CHECK(dt_comm_split(g_world, -2, 0, &sub) == DT_EINPUT && !sub, "split: color -2 accepted");
    dt_error_clear();
}

static void test_errors(void) {
    dt_algo a;
    dt_error_clear();
    CHECK(dt_algo_parse("bogus", &a) == DT_EINPUT, "parse accepted bogus");
    CHECK(strstr(dt_error_message(), "bogus") != NULL, "message: %s", dt_error_message());
    dt_error_clear();
    CHECK(dt_algo_parse("shm", &a) == DT_OK && a == DT_ALGO_SHM, "parse shm");
    CHECK(dt_comm_set_algo(g_world, DT_COLL_BCAST, DT_ALGO_RHD) == DT_EINPUT, "rhd bcast accepted");
    CHECK(dt_comm_set_algo(g_world, DT_COLL_BCAST, DT_ALGO_RING) == DT_EINPUT, "ring bcast accepted");
    CHECK(dt_comm_set_algo(g_world, DT_COLL_REDUCE_SCATTER, DT_ALGO_TREE) == DT_EINPUT, "tree rs accepted");
    dt_error_clear();
    CHECK(dt_bcast(g_world, A, 1, DT_F32, g_size) == DT_EINPUT, "bcast root out of range accepted");
    CHECK(strstr(dt_error_message(), "broadcast") != NULL, "message does not name the operation: %s",
          dt_error_message());
    dt_error_clear();
    const char *rpn_env = getenv("DT_TEST_RANKS_PER_NODE");
    int rpn = rpn_env ? atoi(rpn_env) : g_size;
    CHECK(dt_comm_local_size(g_world) == rpn, "local size %d, want %d", dt_comm_local_size(g_world), rpn);
    CHECK(dt_comm_local_rank(g_world) == g_rank % rpn, "local rank %d, rank %d", dt_comm_local_rank(g_world), g_rank);
    if (!g_one_node) { /* shm refuses a communicator that spans nodes, naming why */
        CHECK(dt_comm_set_algo(g_world, DT_COLL_ALLREDUCE, DT_ALGO_SHM) == DT_EINPUT &&
                  strstr(dt_error_message(), "one node"),
              "shm accepted across nodes: %s", dt_error_message());
        dt_error_clear();
        void *p = NULL; /* no window across nodes: ordinary memory */
        OK(dt_comm_alloc_shared(g_world, 4096, "test", &p), "alloc_shared across nodes");
        dt_comm_free_shared(g_world, p);
    }
}

static void test_p2p(void) {
    if (g_size < 2) return;
    double x[3] = {1, 2, 3};
    if (g_rank == 0) {
        OK(dt_send(g_world, x, 3, DT_F64, 1, 5), "send");
    } else if (g_rank == 1) {
        double y[3] = {0};
        OK(dt_recv(g_world, y, 3, DT_F64, 0, 5), "recv");
        CHECK(y[0] == 1 && y[1] == 2 && y[2] == 3, "recv: got %g %g %g", y[0], y[1], y[2]);
    }
    OK(dt_barrier(g_world), "barrier");
}

/* bf16 sums round to nearest-even: 256 + 1 -> 256, 256 + 3 -> 260, 256 + 1.5 -> 258 (only
 * ranks 0 and 1 contribute, so every summation order gives these). Our maxima give the
 * same bits on every rank for signed zeros (+0 wins) and NaN (NaN wins); MPI's are Open
 * MPI's (and auto may be MPI's), so those two are not checked there. */
static void test_special(dt_algo a) {
    char what[96];
    snprintf(what, sizeof what, "bf16 rounding %s", dt_algo_name(a));
    set_algo(g_world, DT_COLL_ALLREDUCE, a);
    const float r1[3] = {1, 3, 1.5f};
    uint16_t h[3];
    for (int i = 0; i < 3; i++) h[i] = bf16_of(g_rank == 0 ? 256.0f : g_rank == 1 ? r1[i] : 0.0f);
    OK(dt_allreduce(g_world, h, 3, DT_BF16, DT_SUM), what);
    CHECK(bf16_val(h[0]) == 256 && bf16_val(h[1]) == 260 && bf16_val(h[2]) == 258, "%s: got %g %g %g", what,
          bf16_val(h[0]), bf16_val(h[1]), bf16_val(h[2]));
    if (a == DT_ALGO_MPI || a == DT_ALGO_AUTO) return;
    for (int ti = 0; ti < 3; ti++) {
        dt_dtype t = (dt_dtype)ti;
        size_t es = dt_dtype_size(t);
        snprintf(what, sizeof what, "max of signed zeros and NaN %s %s", dt_algo_name(a), dt_dtype_name(t));
        /* 0: -0 on rank 0, +0 elsewhere; 1: +0 on rank 0, -0 elsewhere; 2: -0 everywhere;
         * 3: NaN on the last rank, 1 elsewhere */
        double in[4] = {g_rank == 0 ? -0.0 : 0.0, g_rank == 0 ? 0.0 : -0.0, -0.0, g_rank == g_size - 1 ? NAN : 1.0};
        for (int i = 0; i < 4; i++) setv(A, (size_t)i, t, in[i]);
        OK(dt_allreduce(g_world, A, 4, t, DT_MAX), what);
        double g[4];
        for (int i = 0; i < 4; i++) g[i] = getv(A, (size_t)i, t);
        CHECK(g[0] == 0 && !signbit(g[0]) && g[1] == 0 && !signbit(g[1]) && g[2] == 0 && signbit(g[2]) && isnan(g[3]),
              "%s: got %g %g %g %g", what, g[0], g[1], g[2], g[3]);
        /* the same bits on every rank */
        set_algo(g_world, DT_COLL_ALLGATHER, DT_ALGO_MPI);
        OK(dt_allgather(g_world, A, B, 4, t), what);
        int same = 1;
        for (int q = 0; q < g_size; q++) same &= memcmp((char *)B + (size_t)q * 4 * es, A, 4 * es) == 0;
        CHECK(same, "%s: ranks got different bits", what);
    }
}

/* Gather to the first and the last rank, from elsewhere and in place; recv is NULL or
 * left untouched on the other ranks. */
static void test_gather(dt_dtype t, size_t n) {
    size_t es = dt_dtype_size(t);
    for (int ri = 0; ri < 2; ri++)
        for (int inplace = 0; inplace < 2; inplace++) {
            int root = ri ? g_size - 1 : 0;
            char what[128];
            snprintf(what, sizeof what, "gather %s n=%zu root=%d%s", dt_dtype_name(t), n, root,
                     inplace ? " in place" : "");
            for (size_t i = 0; i < (size_t)g_size * n; i++) setv(B, i, t, -1.0);
            void *send = inplace && g_rank == root ? (char *)B + (size_t)root * n * es : A;
            fill(send, n, t, g_rank, 0);
            void *recv = g_rank == root || inplace ? B : NULL;
            OK(dt_gather(g_world, send, recv, n, t, root), what);
            if (g_rank == root) {
                for (int q = 0; q < g_size; q++) check_copy(what, (char *)B + (size_t)q * n * es, n, t, q, 0);
            } else if (recv) {
                size_t bad = 0;
                for (size_t i = 0; i < (size_t)g_size * n; i++) bad += getv(B, i, t) != -1.0;
                CHECK(bad == 0, "%s: recv changed on a rank that is not the root", what);
            }
        }
}

/* dt_isend/dt_irecv: around the ring (waited in either order, or polled), to self, in
 * order with one tag and mixed with blocking calls, and refused arguments. */
static void test_isend_irecv(void) {
    int right = (g_rank + 1) % g_size, left = (g_rank + g_size - 1) % g_size;
    size_t ns[] = {0, 1, 1021, g_big};
    char what[128];
    for (int ti = 0; ti < 3; ti++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            dt_dtype t = (dt_dtype)ti;
            size_t n = ns[k];
            snprintf(what, sizeof what, "isend/irecv ring %s n=%zu", dt_dtype_name(t), n);
            fill(A, n, t, g_rank, 0);
            for (size_t i = 0; i < n; i++) setv(B, i, t, -1.0);
            dt_request *rs = NULL, *rr = NULL;
            OK(dt_irecv(g_world, B, n, t, left, 11, &rr), what);
            OK(dt_isend(g_world, A, n, t, right, 11, &rs), what);
            if (!rs || !rr) continue;
            if (k % 2) {
                wait_polling(rr, what);
                OK(dt_wait(rs), what);
            } else {
                OK(dt_wait(rs), what);
                OK(dt_wait(rr), what);
            }
            check_copy(what, B, n, t, left, 0);
        }
    /* to self, the receive posted second */
    {
        dt_request *rs = NULL, *rr = NULL;
        fill(A, 1021, DT_F32, g_rank, 3);
        for (size_t i = 0; i < 1021; i++) setv(B, i, DT_F32, -1.0);
        OK(dt_isend(g_world, A, 1021, DT_F32, g_rank, 12, &rs), "isend to self");
        OK(dt_irecv(g_world, B, 1021, DT_F32, g_rank, 12, &rr), "irecv from self");
        if (rr) OK(dt_wait(rr), "irecv from self");
        if (rs) OK(dt_wait(rs), "isend to self");
        check_copy("isend to self", B, 1021, DT_F32, g_rank, 3);
    }
    /* three messages with one tag arrive in order: rank 0 sends two non-blocking and one
     * blocking, rank 1 receives one blocking and two non-blocking, waited in reverse */
    if (g_size >= 2 && g_rank < 2) {
        const size_t m = 1000;
        dt_request *r[2] = {NULL, NULL};
        if (g_rank == 0) {
            for (int i = 0; i < 3; i++) fill((double *)A + (size_t)i * m, m, DT_F64, 0, (size_t)i * m);
            OK(dt_isend(g_world, A, m, DT_F64, 1, 13, &r[0]), "isend in order");
            OK(dt_isend(g_world, (double *)A + m, m, DT_F64, 1, 13, &r[1]), "isend in order");
            OK(dt_send(g_world, (double *)A + 2 * m, m, DT_F64, 1, 13), "send in order");
        } else {
            OK(dt_recv(g_world, B, m, DT_F64, 0, 13), "recv in order");
            OK(dt_irecv(g_world, (double *)B + m, m, DT_F64, 0, 13, &r[0]), "irecv in order");
            OK(dt_irecv(g_world, (double *)B + 2 * m, m, DT_F64, 0, 13, &r[1]), "irecv in order");
        }
        for (int i = 1; i >= 0; i--)
            if (r[i]) OK(dt_wait(r[i]), "wait in order");
        if (g_rank == 1) check_copy("messages in order", B, 3 * m, DT_F64, 0, 0);
    }
    dt_request *r = NULL;
    dt_error_clear();
    CHECK(dt_isend(g_world, A, 1, DT_F32, g_size, 1, &r) == DT_EINPUT && !r, "isend to rank %d accepted", g_size);
    CHECK(dt_irecv(g_world, A, 1, DT_F32, left, -1, &r) == DT_EINPUT && !r, "irecv with tag -1 accepted");
    CHECK(dt_isend(g_world, A, 1, (dt_dtype)7, right, 1, &r) == DT_EINPUT && !r, "isend of dtype 7 accepted");
    dt_error_clear();
    OK(dt_barrier(g_world), "barrier");
}

int main(int argc, char **argv) {
    if (dt_comm_init(&g_world, &argc, &argv) != DT_OK) {
        fprintf(stderr, "mpi_test_comm: %s\n", dt_error_message());
        return 1;
    }
    g_rank = dt_comm_rank(g_world);
    g_size = dt_comm_size(g_world);
    if (g_size > 64) {
        fprintf(stderr, "mpi_test_comm: at most 64 ranks\n");
        dt_comm_finalize(g_world);
        return 77;
    }
    for (int q = 0; q < g_size; q++) g_all[q] = q;
    g_one_node = dt_comm_local_size(g_world) == g_size;
    /* the largest count spans several of the algorithms' 256 KB segments in every type;
     * the ASan pass (DT_TEST_TIER=asan) takes a third of it, still several segments */
    const char *tier = getenv("DT_TEST_TIER");
    const size_t big = g_big = tier && !strcmp(tier, "asan") ? (size_t)3 << 17 : (size_t)1 << 20;
    size_t bytes = (size_t)g_size * (big + 8) * sizeof(double);
    A = calloc(1, bytes), B = calloc(1, bytes), C = calloc(1, bytes);
    if (!A || !B || !C) {
        fprintf(stderr, "mpi_test_comm: out of memory\n");
        return 1;
    }
    size_t counts[] = {0, 1, 2, 7, 13, 1021, (size_t)g_size * 1000 + 1, big};
    size_t ncounts = sizeof counts / sizeof counts[0];

    test_errors();
    test_p2p();
    for (int ai = 0; ai < DT_ALGO_N; ai++) {
        dt_algo a = (dt_algo)ai;
        if (a == DT_ALGO_SHM && !g_one_node) continue; /* see test_errors and test_registered */
        for (int ti = 0; ti < 3; ti++) {
            dt_dtype t = (dt_dtype)ti;
            for (size_t k = 0; k < ncounts; k++) {
                size_t n = counts[k];
                if (dt_algo_supports(a, DT_COLL_ALLREDUCE)) {
                    test_allreduce(g_world, g_all, a, t, n, DT_SUM);
                    test_allreduce(g_world, g_all, a, t, n, DT_AVG);
                    /* max at the largest count: f32 only (saves time under the sanitizers) */
                    if (n < big || t == DT_F32) test_allreduce(g_world, g_all, a, t, n, DT_MAX);
                    test_iallreduce(a, t, n, (dt_redop)(k % 3));
                }
                if (dt_algo_supports(a, DT_COLL_REDUCE_SCATTER)) {
                    test_reduce_scatter(a, t, n, DT_SUM, 0);
                    test_reduce_scatter(a, t, n, DT_AVG, 0);
                    if (n < big || t == DT_F32) test_reduce_scatter(a, t, n, DT_MAX, 0);
                    test_reduce_scatter(a, t, n, (dt_redop)(k % 3), 1);
                    test_reduce_scatter_inplace(a, t, n, (dt_redop)((k + 1) % 3), 0);
                    test_reduce_scatter_inplace(a, t, n, (dt_redop)(k % 3), 1);
                }
                if (dt_algo_supports(a, DT_COLL_ALLGATHER)) {
                    test_allgather(a, t, n, 0, 0);
                    test_allgather(a, t, n, 1, 0);
                    test_allgather(a, t, n, k % 2, 1);
                }
                if (dt_algo_supports(a, DT_COLL_BCAST)) {
                    test_bcast(a, t, n, 0);
                    test_bcast(a, t, n, g_size - 1);
                }
            }
        }
        test_overlap(a, DT_F32, 100003, 5000);
        test_overlap(a, DT_F64, big, 1021);
        if (dt_algo_supports(a, DT_COLL_ALLREDUCE)) test_special(a);
    }
    for (int ti = 0; ti < 3; ti++)
        for (size_t k = 0; k < ncounts; k++) {
            test_reduce(DT_ALGO_MPI, (dt_dtype)ti, counts[k], DT_SUM, 0);
            test_reduce(DT_ALGO_MPI, (dt_dtype)ti, counts[k], DT_MAX, g_size - 1);
            test_reduce(DT_ALGO_TREE, (dt_dtype)ti, counts[k], DT_AVG, g_size - 1);
            test_reduce(DT_ALGO_TREE, (dt_dtype)ti, counts[k], DT_SUM, 0);
            test_reduce(DT_ALGO_TREE, (dt_dtype)ti, counts[k], DT_MAX, 0);
            if (k < ncounts - 1) test_gather((dt_dtype)ti, counts[k]);
        }
    test_isend_irecv();
    test_split();
    test_registered();

    /* totals over ranks, exchanged with MPI's own all-reduce */
    set_algo(g_world, DT_COLL_ALLREDUCE, DT_ALGO_MPI);
    double tot[2] = {g_pass, g_fail};
    if (dt_allreduce(g_world, tot, 2, DT_F64, DT_SUM) != DT_OK) {
        fprintf(stderr, "rank %d: %s\n", g_rank, dt_error_message());
        tot[1] += 1;
    }
    if (g_rank == 0) printf("%.0f passed, %.0f failed (%d ranks)\n", tot[0], tot[1], g_size);
    free(A);
    free(B);
    free(C);
    dt_comm_finalize(g_world);
    return tot[1] > 0 ? 1 : 0;
}
