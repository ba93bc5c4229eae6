/* World setup, communicators, algorithm choice and dispatch, the reduction kernels,
 * point-to-point, and the non-blocking machinery (MPI's own non-blocking collectives and
 * point-to-point, or a per-communicator thread that runs our algorithms in issue order). */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mem.h"
#include "comm.h"
#include "comm_internal.h"

/* MPI counts are int: larger messages go in pieces of this many elements. */
#define DTC_PIECE ((size_t)1 << 30)
#define DTC_MAX_MREQ 8
/* Registered (node-shared) buffers per communicator; more are plain memory. */
#define DTC_MAX_REGIONS 64

/* REQ_SELF: a send to or receive from self in a world without MPI, not yet matched */
enum { REQ_DONE, REQ_MPI, REQ_THREAD, REQ_SELF };

struct dt_request {
    dt_comm *c;
    int kind;
    /* REQ_MPI: MPI's requests, then an optional scale (DT_AVG) when they complete */
    int nmreq;
    MPI_Request mreq[DTC_MAX_MREQ];
    void *scale_buf;
    size_t scale_n;
    double scale;
    /* in-place reduce-scatter: MPI left the result at move_src, it belongs at move_dst */
    void *move_src, *move_dst;
    /* REQ_THREAD: the queued operation */
    dt_coll coll;
    dt_algo algo;
    const void *send;
    void *recv;
    size_t count;
    dt_dtype t;
    dt_redop op;
    const dtc_region *reg; /* registered buffer of the call (NULL: none) */
    size_t reg_off;
    uint64_t fid; /* its flight record (0: none) */
    int done; /* under c->mu */
    dt_status st;
    char err[768];
    dt_request *next; /* REQ_THREAD: the thread's queue; REQ_SELF: c->self_q */
    /* REQ_SELF (and the send/recv, count, t above) */
    int is_send, tag;
};

struct dt_comm {
    int mpi;       /* backed by MPI (else a world of one without any MPI calls) */
    int owns_mpi;  /* world that called MPI_Init_thread: finalizes */
    int threads;   /* MPI_THREAD_MULTIPLE: the communication thread may call MPI */
    MPI_Comm user; /* dt_send/dt_recv/dt_barrier and MPI's own collectives */
    dtc_ctx fg;    /* our algorithms, called from the caller's thread */
    dtc_ctx *bg;   /* our algorithms on the communication thread (made at first use) */
    int rank, size, local_rank, local_size;
    dt_algo algo[DT_COLL_N];
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t thr;
    int thr_on, stop;
    dt_request *head, *tail;
    dtc_region reg[DTC_MAX_REGIONS];
    int nreg;
    dt_request *self_q; /* unmatched REQ_SELF requests, in posting order */
    /* the flight recorder's view (watchdog.h): name, agreed slot, sequence numbers, and
     * the members as world ranks */
    char name[DT_FLIGHT_GROUP_LEN];
    dt_flight_comm fl;
    int *world_of;
};

/* Next communicator slot of the flight recorder in this process (0 is the world's). */
static int g_next_slot = 1;

static uint64_t rec_begin(dt_comm *c, dt_fop op, size_t bytes, int peer, int waiting) {
    return dtc_watch_begin(&c->fl, op, bytes, peer >= 0 ? c->world_of[peer] : -1, waiting);
}

/* MPI has no bf16: sums and maxima of bf16 (as MPI_UINT16_T) use these user-defined ops,
 * made by dt_comm_init (MPI_OP_NULL until then). [0]: sum, [1]: max. */
static MPI_Op g_bf16_op[2] = {MPI_OP_NULL, MPI_OP_NULL};

/* ---- lane helpers shared by the algorithm files ---- */

dt_status dtc_fail(dtc_ctx *x, dt_status code, const char *fmt, ...) {
    if (!x->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->err, sizeof x->err, fmt, ap);
        va_end(ap);
    }
    return code;
}

dt_status dtc_mpi(dtc_ctx *x, int rc, const char *fmt, ...) {
    if (rc == MPI_SUCCESS) return DT_OK;
    if (!x->err[0]) {
        char what[192], msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
        snprintf(x->err, sizeof x->err, "%s: %s", what, msg);
    }
    return DT_ERUNTIME;
}

dt_status dtc_scratch(dtc_ctx *x, size_t bytes, void **out) {
    if (x->scratch_cap < bytes) {
        free(x->scratch);
        x->scratch = NULL;
        x->scratch_cap = 0;
        void *p = NULL;
        if (posix_memalign(&p, 4096, bytes) != 0 || !p)
            return dtc_fail(x, DT_ERUNTIME, "out of memory allocating %zu bytes of communication scratch", bytes);
        memset(p, 0, bytes); /* fault the pages in now, once */
        x->scratch = p;
        x->scratch_cap = bytes;
    }
    *out = x->scratch;
    return DT_OK;
}

MPI_Datatype dtc_mpi_type(dt_dtype t) { return t == DT_F64 ? MPI_DOUBLE : t == DT_BF16 ? MPI_UINT16_T : MPI_FLOAT; }

static MPI_Op mpi_op(dt_dtype t, dt_redop op) {
    if (t == DT_BF16) return g_bf16_op[op == DT_MAX];
    return op == DT_MAX ? MPI_MAX : MPI_SUM;
}

/* restrict lets these vectorise without runtime overlap checks; dtc_add picks the one
 * whose operands do not alias (acc == a is the common in-place case). */
static void add_to_f32(float *restrict o, const float *restrict y, size_t n, float s, int scaled) {
    if (scaled)
        for (size_t i = 0; i < n; i++) o[i] = (o[i] + y[i]) * s;
    else
        for (size_t i = 0; i < n; i++) o[i] = o[i] + y[i];
}
static void add3_f32(float *restrict o, const float *restrict x, const float *restrict y, size_t n, float s,
                     int scaled) {
    if (scaled)
        for (size_t i = 0; i < n; i++) o[i] = (x[i] + y[i]) * s;
    else
        for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}
static void add_to_f64(double *restrict o, const double *restrict y, size_t n, double s, int scaled) {
    if (scaled)
        for (size_t i = 0; i < n; i++) o[i] = (o[i] + y[i]) * s;
    else
        for (size_t i = 0; i < n; i++) o[i] = o[i] + y[i];
}
static void add3_f64(double *restrict o, const double *restrict x, const double *restrict y, size_t n, double s,
                     int scaled) {
    if (scaled)
        for (size_t i = 0; i < n; i++) o[i] = (x[i] + y[i]) * s;
    else
        for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}

/* bf16: each element converted to fp32, added (and scaled) there, rounded back once.
 * Element-wise read-before-write, so o may equal x or y. */
static void add_bf16(uint16_t *o, const uint16_t *x, const uint16_t *y, size_t n, float s, int scaled) {
    if (scaled)
        for (size_t i = 0; i < n; i++) o[i] = dtc_f32_to_bf16((dtc_bf16_to_f32(x[i]) + dtc_bf16_to_f32(y[i])) * s);
    else
        for (size_t i = 0; i < n; i++) o[i] = dtc_f32_to_bf16(dtc_bf16_to_f32(x[i]) + dtc_bf16_to_f32(y[i]));
}

/* Maxima whose bits do not depend on operand order (the two-rank shm path has each rank
 * compute max(own, peer)): a > b ? a : b would return either zero of max(-0, +0) and
 * either operand when one is NaN. */
static inline double max_f64(double a, double b) {
    if (a > b) return a;
    if (b > a) return b;
    if (a == b) return signbit(a) ? b : a; /* equal bits, or -0 and +0: +0 */
    return NAN;
}
static inline float max_f32(float a, float b) {
    if (a > b) return a;
    if (b > a) return b;
    if (a == b) return signbit(a) ? b : a;
    return NAN;
}

static void max_any(void *acc, const void *a, const void *b, size_t n, dt_dtype t) {
    if (t == DT_F32) {
        float *o = acc;
        const float *x = a, *y = b;
        for (size_t i = 0; i < n; i++) o[i] = max_f32(x[i], y[i]);
    } else if (t == DT_F64) {
        double *o = acc;
        const double *x = a, *y = b;
        for (size_t i = 0; i < n; i++) o[i] = max_f64(x[i], y[i]);
    } else { /* exact: the larger operand's bits, or the canonical NaN */
        uint16_t *o = acc;
        const uint16_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++) o[i] = dtc_f32_to_bf16(max_f32(dtc_bf16_to_f32(x[i]), dtc_bf16_to_f32(y[i])));
    }
}

void dtc_combine(void *acc, const void *a, const void *b, size_t n, dt_dtype t, dt_redop op, double scale) {
    if (op == DT_MAX) {
        max_any(acc, a, b, n, t);
        return;
    }
    int scaled = scale != 1.0;
    if (t == DT_BF16) {
        add_bf16(acc, a, b, n, (float)scale, scaled);
        return;
    }
    /* x + y == y + x exactly, so swapping operands keeps results bitwise identical */
    if (acc == b) {
        const void *tmp = a;
        a = b;
        b = tmp;
    }
    if (t == DT_F32) {
        if (acc == a) add_to_f32(acc, b, n, (float)scale, scaled);
        else add3_f32(acc, a, b, n, (float)scale, scaled);
    } else {
        if (acc == a) add_to_f64(acc, b, n, scale, scaled);
        else add3_f64(acc, a, b, n, scale, scaled);
    }
}

void dtc_scale(void *buf, size_t n, dt_dtype t, double scale) {
    if (scale == 1.0) return;
    if (t == DT_F32) {
        float *p = buf, s = (float)scale;
        for (size_t i = 0; i < n; i++) p[i] *= s;
    } else if (t == DT_BF16) {
        uint16_t *p = buf;
        float s = (float)scale;
        for (size_t i = 0; i < n; i++) p[i] = dtc_f32_to_bf16(dtc_bf16_to_f32(p[i]) * s);
    } else {
        double *p = buf;
        for (size_t i = 0; i < n; i++) p[i] *= scale;
    }
}

/* The user-defined MPI_Ops for bf16 (inout = in op inout; both commutative). */
static void mpi_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    dtc_combine(inout, inout, in, (size_t)*len, DT_BF16, DT_SUM, 1.0);
}
static void mpi_bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    dtc_combine(inout, inout, in, (size_t)*len, DT_BF16, DT_MAX, 1.0);
}

dt_status dtc_sendrecv(dtc_ctx *x, const void *s, size_t sn, int dst, void *r, size_t rn, int src, dt_dtype t,
                       int tag) {
    size_t es = dt_dtype_size(t);
    size_t ns = (sn + DTC_PIECE - 1) / DTC_PIECE, nr = (rn + DTC_PIECE - 1) / DTC_PIECE;
    size_t np = ns > nr ? ns : nr;
    for (size_t i = 0; i < np; i++) {
        size_t o = i * DTC_PIECE;
        int sc = i < ns ? (int)(sn - o < DTC_PIECE ? sn - o : DTC_PIECE) : 0;
        int rc = i < nr ? (int)(rn - o < DTC_PIECE ? rn - o : DTC_PIECE) : 0;
        int e = MPI_Sendrecv(i < ns ? (const char *)s + o * es : NULL, sc, dtc_mpi_type(t), i < ns ? dst : MPI_PROC_NULL,
                             tag, i < nr ? (char *)r + o * es : NULL, rc, dtc_mpi_type(t),
                             i < nr ? src : MPI_PROC_NULL, tag, x->comm, MPI_STATUS_IGNORE);
        DT_TRY(dtc_mpi(x, e, "MPI_Sendrecv (to rank %d, from rank %d)", dst, src));
    }
    return DT_OK;
}

dt_status dtc_sendrecv_reduce(dtc_ctx *x, const void *s, size_t sn, int dst, const void *in, void *acc, size_t rn,
                              int src, dt_dtype t, dt_redop op, double scale, int tag) {
    size_t es = dt_dtype_size(t), seg = DTC_SEG_BYTES / es;
    size_t nseg = ((sn > rn ? sn : rn) + seg - 1) / seg;
    if (nseg == 0) return DT_OK;
    char *tmp = NULL;
    DT_TRY(dtc_scratch(x, 2 * (size_t)DTC_SEG_BYTES, (void **)&tmp));
    MPI_Request rq[2][2];
    MPI_Datatype mt = dtc_mpi_type(t);
    for (size_t j = 0; j <= nseg; j++) {
        /* post segment j (its receive buffer was freed by the reduction of j-2), then
         * reduce segment j-1 while j is in flight */
        if (j < nseg) {
            size_t o = j * seg;
            int b = (int)(j & 1);
            rq[b][0] = rq[b][1] = MPI_REQUEST_NULL;
            if (o < rn) {
                int n = (int)(rn - o < seg ? rn - o : seg);
                DT_TRY(dtc_mpi(x, MPI_Irecv(tmp + (size_t)b * DTC_SEG_BYTES, n, mt, src, tag, x->comm, &rq[b][0]),
                               "MPI_Irecv (from rank %d)", src));
            }
            if (o < sn) {
                int n = (int)(sn - o < seg ? sn - o : seg);
                DT_TRY(dtc_mpi(x, MPI_Isend((const char *)s + o * es, n, mt, dst, tag, x->comm, &rq[b][1]),
                               "MPI_Isend (to rank %d)", dst));
            }
        }
        if (j > 0) {
            size_t p = j - 1, o = p * seg;
            int b = (int)(p & 1);
            DT_TRY(dtc_mpi(x, MPI_Waitall(2, rq[b], MPI_STATUSES_IGNORE), "MPI_Waitall (to rank %d, from rank %d)",
                           dst, src));
            if (o < rn) {
                size_t n = rn - o < seg ? rn - o : seg;
                dtc_combine((char *)acc + o * es, (const char *)in + o * es, tmp + (size_t)b * DTC_SEG_BYTES, n, t, op,
                            scale);
            }
        }
    }
    return DT_OK;
}

/* ---- names, sizes, algorithm choice ---- */

static const char *const g_algo_names[DT_ALGO_N] = {"mpi", "ring", "rhd", "tree", "shm", "auto"};
static const char *const g_coll_names[DT_COLL_N] = {"allreduce", "reduce_scatter", "allgather", "bcast"};
/* what error messages call each collective */
static const char *const g_coll_ops[DT_COLL_N] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast"};

dt_status dt_algo_parse(const char *name, dt_algo *out) {
    for (int a = 0; a < DT_ALGO_N; a++)
        if (name && strcmp(name, g_algo_names[a]) == 0) {
            *out = (dt_algo)a;
            return DT_OK;
        }
    return dt_fail(DT_EINPUT, "unknown communication algorithm '%s' (expected mpi, ring, rhd, tree, shm or auto)",
                   name ? name : "(null)");
}

const char *dt_algo_name(dt_algo a) { return (unsigned)a < DT_ALGO_N ? g_algo_names[a] : "?"; }
const char *dt_coll_name(dt_coll c) { return (unsigned)c < DT_COLL_N ? g_coll_names[c] : "?"; }
size_t dt_dtype_size(dt_dtype t) { return t == DT_F64 ? 8 : t == DT_F32 ? 4 : t == DT_BF16 ? 2 : 0; }
const char *dt_dtype_name(dt_dtype t) {
    return t == DT_F64 ? "f64" : t == DT_F32 ? "f32" : t == DT_BF16 ? "bf16" : "?";
}
static int dtype_ok(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_BF16; }

int dt_algo_supports(dt_algo a, dt_coll c) {
    if ((unsigned)c >= DT_COLL_N) return 0;
    switch (a) {
    case DT_ALGO_MPI:
    case DT_ALGO_SHM:
    case DT_ALGO_AUTO: return 1;
    case DT_ALGO_RING: return c != DT_COLL_BCAST;
    case DT_ALGO_RHD: return c == DT_COLL_ALLREDUCE;
    case DT_ALGO_TREE: return c == DT_COLL_ALLREDUCE || c == DT_COLL_BCAST;
    default: return 0;
    }
}

dt_status dt_comm_set_algo(dt_comm *c, dt_coll coll, dt_algo algo) {
    if ((unsigned)coll >= DT_COLL_N) return dt_fail(DT_EINPUT, "set_algo: unknown collective %d", (int)coll);
    if ((unsigned)algo >= DT_ALGO_N) return dt_fail(DT_EINPUT, "set_algo: unknown algorithm %d", (int)algo);
    if (!dt_algo_supports(algo, coll))
        return dt_fail(DT_EINPUT, "communication algorithm '%s' does not implement %s", dt_algo_name(algo),
                       dt_coll_name(coll));
    if (algo == DT_ALGO_SHM && !c->fg.one_node)
        return dt_fail(DT_EINPUT,
                       "communication algorithm 'shm' needs every rank on one node (%d of the %d ranks are on this "
                       "node)",
                       c->local_size, c->size);
    c->algo[coll] = algo;
    return DT_OK;
}

dt_algo dt_comm_get_algo(const dt_comm *c, dt_coll coll) {
    return (unsigned)coll < DT_COLL_N ? c->algo[coll] : DT_ALGO_MPI;
}

/* ---- communicators ---- */

static void ctx_free(dtc_ctx *x) {
    dtc_shm_free(x);
    free(x->shm.seg);
    free(x->peer);
    free(x->scratch);
    if (x->node != MPI_COMM_NULL) MPI_Comm_free(&x->node);
    if (x->comm != MPI_COMM_NULL) MPI_Comm_free(&x->comm);
    memset(x, 0, sizeof *x);
    x->comm = x->node = MPI_COMM_NULL;
}

/* A lane over a private duplicate of `from` (MPI_COMM_NULL: a lane of one, no MPI). */
static dt_status ctx_init(dtc_ctx *x, MPI_Comm from, int rank, int size) {
    memset(x, 0, sizeof *x);
    x->comm = x->node = MPI_COMM_NULL;
    x->shm.win = MPI_WIN_NULL;
    x->rank = rank;
    x->size = size;
    x->one_node = 1;
    x->shm.seg = calloc((size_t)size, sizeof *x->shm.seg);
    x->peer = calloc((size_t)size, sizeof *x->peer);
    if (!x->shm.seg || !x->peer) return dtc_fail(x, DT_ERUNTIME, "out of memory");
    if (from == MPI_COMM_NULL) return DT_OK;
    DT_TRY(dtc_mpi(x, MPI_Comm_dup(from, &x->comm), "MPI_Comm_dup"));
    MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
    DT_TRY(dtc_mpi(x, MPI_Comm_split_type(x->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &x->node),
                   "MPI_Comm_split_type"));
    MPI_Comm_set_errhandler(x->node, MPI_ERRORS_RETURN);
    int ls = 1;
    DT_TRY(dtc_mpi(x, MPI_Comm_size(x->node, &ls), "MPI_Comm_size"));
    x->one_node = ls == size;
    return DT_OK;
}

/* Wraps `user` (owned from here on; MPI_COMM_NULL for a world of one without MPI). */
static dt_status comm_make(MPI_Comm user, int mpi, int threads, dt_comm **out) {
    *out = NULL;
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) {
        if (user != MPI_COMM_NULL) MPI_Comm_free(&user);
        return dt_fail(DT_ERUNTIME, "communicator: out of memory");
    }
    c->mpi = mpi;
    c->fl.slot = -1;
    c->threads = threads;
    c->user = user;
    c->rank = 0;
    c->size = 1;
    c->fg.comm = c->fg.node = MPI_COMM_NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    dt_status st = DT_OK;
    if (mpi) {
        MPI_Comm_set_errhandler(user, MPI_ERRORS_RETURN);
        st = dtc_mpi(&c->fg, MPI_Comm_rank(user, &c->rank), "MPI_Comm_rank");
        if (!st) st = dtc_mpi(&c->fg, MPI_Comm_size(user, &c->size), "MPI_Comm_size");
    }
    if (!st) st = ctx_init(&c->fg, user, c->rank, c->size);
    if (st) {
        st = dt_fail(st, "communicator setup: %s", c->fg.err);
        dt_comm_free(c);
        return st;
    }
    c->world_of = calloc((size_t)c->size, sizeof *c->world_of);
    if (!c->world_of) {
        dt_comm_free(c);
        return dt_fail(DT_ERUNTIME, "communicator: out of memory");
    }
    if (mpi) { /* the members as world ranks, for the watchdog's messages */
        MPI_Group g, w;
        int *idx = malloc((size_t)c->size * sizeof *idx);
        if (idx && MPI_Comm_group(user, &g) == MPI_SUCCESS) {
            if (MPI_Comm_group(MPI_COMM_WORLD, &w) == MPI_SUCCESS) {
                for (int i = 0; i < c->size; i++) idx[i] = i;
                MPI_Group_translate_ranks(g, c->size, idx, w, c->world_of);
                MPI_Group_free(&w);
            }
            MPI_Group_free(&g);
        }
        free(idx);
    }
    snprintf(c->name, sizeof c->name, "%s", "world");
    c->fl.size = c->size;
    c->fl.name = c->name;
    c->local_rank = c->rank;
    c->local_size = c->size;
    if (c->fg.node != MPI_COMM_NULL) {
        MPI_Comm_rank(c->fg.node, &c->local_rank);
        MPI_Comm_size(c->fg.node, &c->local_size);
    }
    *out = c;
    return DT_OK;
}

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

dt_status dt_comm_init(dt_comm **world, int *argc, char ***argv) {
    *world = NULL;
    if (!launched_by_mpi()) {
        dtc_watch_open(MPI_COMM_NULL, 0, 1);
        return comm_make(MPI_COMM_NULL, 0, 0, world);
    }
    int inited = 0, provided = MPI_THREAD_SINGLE, owns = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return dt_fail(DT_ERUNTIME, "MPI_Init_thread failed");
        owns = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (g_bf16_op[0] == MPI_OP_NULL &&
        (MPI_Op_create(mpi_bf16_sum, 1, &g_bf16_op[0]) != MPI_SUCCESS ||
         MPI_Op_create(mpi_bf16_max, 1, &g_bf16_op[1]) != MPI_SUCCESS)) {
        if (owns) MPI_Finalize();
        return dt_fail(DT_ERUNTIME, "communicator setup: MPI_Op_create failed");
    }
    MPI_Comm user;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &user) != MPI_SUCCESS) {
        if (owns) MPI_Finalize();
        return dt_fail(DT_ERUNTIME, "communicator setup: MPI_Comm_dup of MPI_COMM_WORLD failed");
    }
    dt_status st = comm_make(user, 1, provided >= MPI_THREAD_MULTIPLE, world);
    if (st) {
        if (owns) MPI_Finalize();
        return st;
    }
    (*world)->owns_mpi = owns;
    dtc_watch_open(user, (*world)->rank, (*world)->size);
    (*world)->fl.slot = 0;
    dtc_watch_register(0, (*world)->size, (*world)->world_of);
    return DT_OK;
}

void dt_comm_free(dt_comm *c) {
    if (!c) return;
    if (c->thr_on) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->work);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thr, NULL);
    }
    if (c->bg) {
        ctx_free(c->bg);
        free(c->bg);
    }
    while (c->nreg > 0) dt_comm_free_shared(c, c->reg[c->nreg - 1].base[c->rank]); /* collective, like the rest */
    ctx_free(&c->fg);
    if (c->user != MPI_COMM_NULL) MPI_Comm_free(&c->user);
    if (c->fl.slot >= 0) dtc_watch_forget(c->fl.slot);
    free(c->world_of);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->work);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void dt_comm_finalize(dt_comm *world) {
    if (!world) return;
    int owns = world->owns_mpi;
    dt_comm_free(world);
    dtc_watch_close();
    if (owns) {
        for (int i = 0; i < 2; i++)
            if (g_bf16_op[i] != MPI_OP_NULL) MPI_Op_free(&g_bf16_op[i]);
        MPI_Finalize();
    }
}

void dt_comm_abort(dt_comm *c, int code) {
    if (c && c->mpi) MPI_Abort(c->user, code);
    exit(code); /* a world without MPI is this process */
}

void dt_comm_set_name(dt_comm *c, const char *name) {
    if (c) snprintf(c->name, sizeof c->name, "%s", name);
}

int dt_comm_rank(const dt_comm *c) { return c->rank; }
int dt_comm_size(const dt_comm *c) { return c->size; }
int dt_comm_local_rank(const dt_comm *c) { return c->local_rank; }
int dt_comm_local_size(const dt_comm *c) { return c->local_size; }

dt_status dt_comm_node_allgather(dt_comm *c, const void *send, void *recv, size_t bytes) {
    if (c->fg.node == MPI_COMM_NULL || c->local_size == 1) {
        memcpy(recv, send, bytes);
        return DT_OK;
    }
    if (bytes > INT_MAX) return dt_fail(DT_ERUNTIME, "node all-gather: %zu bytes is too large", bytes);
    dt_status st = dtc_mpi(&c->fg, MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->fg.node),
                           "MPI_Allgather (node)");
    return st ? dt_fail(st, "node all-gather: %s", c->fg.err) : DT_OK;
}

dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
    *out = NULL;
    if (color < 0 && color != DT_COMM_NO_GROUP) return dt_fail(DT_EINPUT, "split: color %d is negative", color);
    if (!c->mpi) return color == DT_COMM_NO_GROUP ? DT_OK : comm_make(MPI_COMM_NULL, 0, 0, out);
    MPI_Comm nc;
    uint64_t fid = rec_begin(c, DT_FOP_SPLIT, 0, -1, 1);
    dt_status st = dtc_mpi(
        &c->fg, MPI_Comm_split(c->user, color == DT_COMM_NO_GROUP ? MPI_UNDEFINED : color, key, &nc), "MPI_Comm_split");
    dtc_watch_end(fid, !st);
    if (st) {
        st = dt_fail(st, "split: %s", c->fg.err);
        c->fg.err[0] = 0;
        return st;
    }
    if (nc == MPI_COMM_NULL) return DT_OK;
    st = comm_make(nc, 1, c->threads, out);
    if (!st) { /* a flight-recorder slot every member agrees on: the highest next free one */
        dt_comm *n = *out;
        int slot = g_next_slot;
        if (MPI_Allreduce(MPI_IN_PLACE, &slot, 1, MPI_INT, MPI_MAX, n->user) == MPI_SUCCESS) {
            g_next_slot = slot + 1;
            if (slot < DT_FLIGHT_MAX_COMMS) {
                n->fl.slot = slot;
                dtc_watch_register(slot, n->size, n->world_of);
            }
        }
        snprintf(n->name, sizeof n->name, "%s", "split");
    }
    if (!st) memcpy((*out)->algo, c->algo, sizeof c->algo);
    if (!st && !(*out)->fg.one_node)
        for (int k = 0; k < DT_COLL_N; k++)
            if ((*out)->algo[k] == DT_ALGO_SHM) (*out)->algo[k] = DT_ALGO_MPI;
    return st;
}

/* ---- dispatch ---- */

static dt_status check_args(const dt_comm *c, const char *op, const void *a, const void *b, size_t count,
                            dt_dtype t, dt_redop redop, int root) {
    if (!dtype_ok(t)) return dt_fail(DT_EINPUT, "%s: unknown dtype %d", op, (int)t);
    if (redop != DT_SUM && redop != DT_AVG && redop != DT_MAX)
        return dt_fail(DT_EINPUT, "%s: unknown reduction %d", op, (int)redop);
    if (root < 0 || root >= c->size)
        return dt_fail(DT_EINPUT, "%s: root %d is outside the communicator of size %d", op, root, c->size);
    if (count > SIZE_MAX / 8 / (size_t)c->size)
        return dt_fail(DT_EINPUT, "%s: count %zu is too large", op, count);
    if (count && (!a || !b)) return dt_fail(DT_EINPUT, "%s: NULL buffer with count %zu", op, count);
    return DT_OK;
}

/* Moves the lane's message into dt_fail, naming the operation. */
static dt_status lane_fail(dtc_ctx *x, dt_status st, const char *op, dt_algo a, size_t count, dt_dtype t) {
    if (st == DT_OK) return DT_OK;
    st = dt_fail(st, "%s (%s, %zu x %s): %s", op, dt_algo_name(a), count, dt_dtype_name(t),
                 x->err[0] ? x->err : "failed");
    x->err[0] = 0;
    return st;
}

/* Size one: every collective is a copy at most. */
static void local_coll(dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t) {
    if ((coll == DT_COLL_REDUCE_SCATTER || coll == DT_COLL_ALLGATHER) && send != recv && count)
        memmove(recv, send, count * dt_dtype_size(t));
}

static dt_status run_ours(dtc_ctx *x, dt_coll coll, dt_algo a, const void *send, void *recv, size_t count,
                          dt_dtype t, dt_redop op, double scale, int root, const dtc_region *reg, size_t off) {
    if (reg && a == DT_ALGO_SHM) {
        if (coll == DT_COLL_ALLREDUCE) return dtc_shm_allreduce_reg(x, reg, off, count, t, op, scale);
        if (coll == DT_COLL_REDUCE_SCATTER) return dtc_shm_reduce_scatter_reg(x, reg, off, recv, count, t, op, scale);
        if (coll == DT_COLL_ALLGATHER) return dtc_shm_allgather_reg(x, send, reg, off, count, t);
    }
    switch (coll) {
    case DT_COLL_ALLREDUCE:
        switch (a) {
        case DT_ALGO_RING: return dtc_ring_allreduce(x, recv, count, t, op, scale);
        case DT_ALGO_RHD: return dtc_rhd_allreduce(x, recv, count, t, op, scale);
        case DT_ALGO_TREE: return dtc_tree_allreduce(x, recv, count, t, op, scale);
        case DT_ALGO_SHM: return dtc_shm_allreduce(x, recv, count, t, op, scale);
        default: break;
        }
        break;
    case DT_COLL_REDUCE_SCATTER:
        if (a == DT_ALGO_RING) return dtc_ring_reduce_scatter(x, send, recv, count, t, op, scale);
        if (a == DT_ALGO_SHM) return dtc_shm_reduce_scatter(x, send, recv, count, t, op, scale);
        break;
    case DT_COLL_ALLGATHER:
        if (a == DT_ALGO_RING) return dtc_ring_allgather(x, send, recv, count, t);
        if (a == DT_ALGO_SHM) return dtc_shm_allgather(x, send, recv, count, t);
        break;
    case DT_COLL_BCAST:
        if (a == DT_ALGO_TREE) return dtc_tree_bcast(x, recv, count, t, root);
        if (a == DT_ALGO_SHM) return dtc_shm_bcast(x, recv, count, t, root);
        break;
    default: break;
    }
    return dtc_fail(x, DT_EINPUT, "algorithm does not implement this collective");
}

static double scale_of(const dt_comm *c, dt_redop op) { return op == DT_AVG ? 1.0 / c->size : 1.0; }

/* A reduce-scatter in place (comm.h): recv is this rank's block of send. */
static int rs_in_place(const dt_comm *c, const void *send, const void *recv, size_t count, dt_dtype t) {
    return (const char *)send + (size_t)c->rank * count * dt_dtype_size(t) == (const char *)recv;
}

static dt_status mpi_coll(dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_redop op, int root) {
    dtc_ctx *x = &c->fg;
    MPI_Datatype mt = dtc_mpi_type(t);
    size_t es = dt_dtype_size(t);
    switch (coll) {
    case DT_COLL_ALLREDUCE:
        for (size_t o = 0; o < count; o += DTC_PIECE) {
            int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
            DT_TRY(dtc_mpi(x, MPI_Allreduce(MPI_IN_PLACE, (char *)recv + o * es, n, mt, mpi_op(t, op), c->user),
                           "MPI_Allreduce"));
        }
        dtc_scale(recv, count, t, scale_of(c, op));
        return DT_OK;
    case DT_COLL_REDUCE_SCATTER: {
        if (count > INT_MAX) return dtc_fail(x, DT_EINPUT, "count exceeds MPI's int limit");
        /* MPI_IN_PLACE leaves the result at the front of the buffer, not at this rank's block */
        char *front = rs_in_place(c, send, recv, count, t) ? (char *)recv - (size_t)c->rank * count * es : NULL;
        DT_TRY(dtc_mpi(x,
                       MPI_Reduce_scatter_block(front ? MPI_IN_PLACE : send, front ? front : recv, (int)count, mt,
                                                mpi_op(t, op), c->user),
                       "MPI_Reduce_scatter_block"));
        if (front && front != recv) memcpy(recv, front, count * es); /* blocks do not overlap */
        dtc_scale(recv, count, t, scale_of(c, op));
        return DT_OK;
    }
    case DT_COLL_ALLGATHER: {
        if (count > INT_MAX) return dtc_fail(x, DT_EINPUT, "count exceeds MPI's int limit");
        int inplace = send == (const char *)recv + (size_t)c->rank * count * es;
        return dtc_mpi(x, MPI_Allgather(inplace ? MPI_IN_PLACE : send, (int)count, mt, recv, (int)count, mt, c->user),
                       "MPI_Allgather");
    }
    case DT_COLL_BCAST:
        for (size_t o = 0; o < count; o += DTC_PIECE) {
            int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
            DT_TRY(dtc_mpi(x, MPI_Bcast((char *)recv + o * es, n, mt, root, c->user), "MPI_Bcast"));
        }
        return DT_OK;
    default: return dtc_fail(x, DT_EINPUT, "unknown collective");
    }
}

/* The registered buffer that the collective's peers read (all-reduce: buf; reduce-scatter:
 * send; all-gather: recv), when it lies wholly inside one, for the shm algorithm. */
static const dtc_region *find_region(const dt_comm *c, dt_coll coll, dt_algo a, const void *send, void *recv,
                                     size_t count, dt_dtype t, size_t *off) {
    if (a != DT_ALGO_SHM || c->nreg == 0 || coll == DT_COLL_BCAST) return NULL;
    const char *p = coll == DT_COLL_REDUCE_SCATTER ? send : recv;
    size_t bytes = count * dt_dtype_size(t) * (coll == DT_COLL_ALLREDUCE ? 1 : (size_t)c->size);
    for (int i = 0; i < c->nreg; i++) {
        if (!c->reg[i].base) continue;
        const char *b = c->reg[i].base[c->rank];
        if (p >= b && p <= b + c->reg[i].bytes && bytes <= c->reg[i].bytes - (size_t)(p - b)) {
            *off = (size_t)(p - b);
            return &c->reg[i];
        }
    }
    return NULL;
}

/* The algorithm this call runs (DT_ALGO_AUTO resolved; see comm.h) and, for shm, the
 * registered buffer it reads peers' data from (NULL: ordinary memory). */
static dt_algo pick(const dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                    const dtc_region **reg, size_t *off) {
    dt_algo a = c->algo[coll];
    int autopick = a == DT_ALGO_AUTO;
    if (autopick) a = c->fg.one_node && coll != DT_COLL_BCAST ? DT_ALGO_SHM : DT_ALGO_MPI;
    *reg = find_region(c, coll, a, send, recv, count, t, off);
    if (autopick && coll == DT_COLL_ALLGATHER && !*reg) a = DT_ALGO_MPI;
    return a;
}

/* The flight recorder's names and sizes of a collective (its largest buffer). */
static dt_fop fop_of(dt_coll coll) {
    static const dt_fop f[DT_COLL_N] = {DT_FOP_ALLREDUCE, DT_FOP_REDUCE_SCATTER, DT_FOP_ALLGATHER, DT_FOP_BCAST};
    return f[coll];
}
static size_t coll_bytes(const dt_comm *c, dt_coll coll, size_t count, dt_dtype t) {
    size_t b = count * dt_dtype_size(t);
    return coll == DT_COLL_REDUCE_SCATTER || coll == DT_COLL_ALLGATHER ? b * (size_t)c->size : b;
}

/* Blocking collective: validation, size one, MPI's or ours on the caller's lane. */
static dt_status coll_run(dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_redop op, int root) {
    const char *name = g_coll_ops[coll];
    DT_TRY(check_args(c, name, send, recv, count, t, op, root));
    if (c->size == 1) {
        local_coll(coll, send, recv, count, t);
        return DT_OK;
    }
    size_t off = 0;
    const dtc_region *reg;
    dt_algo a = pick(c, coll, send, recv, count, t, &reg, &off);
    uint64_t fid = rec_begin(c, fop_of(coll), coll_bytes(c, coll, count, t), -1, 1);
    dt_status st = a == DT_ALGO_MPI
                       ? mpi_coll(c, coll, send, recv, count, t, op, root)
                       : run_ours(&c->fg, coll, a, send, recv, count, t, op, scale_of(c, op), root, reg, off);
    dtc_watch_end(fid, !st);
    return lane_fail(&c->fg, st, name, a, count, t);
}

dt_status dt_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op) {
    return coll_run(c, DT_COLL_ALLREDUCE, buf, buf, count, t, op, 0);
}

dt_status dt_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op) {
    return coll_run(c, DT_COLL_REDUCE_SCATTER, send, recv, recvcount, t, op, 0);
}

dt_status dt_allgather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t) {
    return coll_run(c, DT_COLL_ALLGATHER, send, recv, sendcount, t, DT_SUM, 0);
}

dt_status dt_bcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
    return coll_run(c, DT_COLL_BCAST, buf, buf, count, t, DT_SUM, root);
}

dt_status dt_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op, int root) {
    DT_TRY(check_args(c, "reduce", buf, buf, count, t, op, root));
    if (c->size == 1) return DT_OK;
    dtc_ctx *x = &c->fg;
    dt_algo ar = c->algo[DT_COLL_ALLREDUCE];
    dt_algo a = ar == DT_ALGO_MPI || ar == DT_ALGO_AUTO ? DT_ALGO_MPI : DT_ALGO_TREE;
    dt_status st = DT_OK;
    uint64_t fid = rec_begin(c, DT_FOP_REDUCE, count * dt_dtype_size(t), -1, 1);
    if (a == DT_ALGO_MPI) {
        size_t es = dt_dtype_size(t);
        for (size_t o = 0; o < count && !st; o += DTC_PIECE) {
            int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
            char *p = (char *)buf + o * es;
            st = dtc_mpi(x,
                         MPI_Reduce(c->rank == root ? MPI_IN_PLACE : p, c->rank == root ? p : NULL, n, dtc_mpi_type(t),
                                    mpi_op(t, op), root, c->user),
                         "MPI_Reduce");
        }
        if (!st && c->rank == root) dtc_scale(buf, count, t, scale_of(c, op));
    } else {
        st = dtc_tree_reduce(x, buf, count, t, op, scale_of(c, op), root);
    }
    dtc_watch_end(fid, !st);
    return lane_fail(x, st, "reduce", a, count, t);
}

/* self: whether the peer may be this rank (the non-blocking calls) */
static dt_status check_peer(const dt_comm *c, const char *op, const void *buf, size_t count, dt_dtype t, int peer,
                            int tag, int self) {
    if (!dtype_ok(t)) return dt_fail(DT_EINPUT, "%s: unknown dtype %d", op, (int)t);
    if (peer < 0 || peer >= c->size || (peer == c->rank && !self))
        return dt_fail(DT_EINPUT, "%s: peer rank %d is not %s rank of this communicator (rank %d of %d)", op, peer,
                       self ? "a" : "another", c->rank, c->size);
    if (tag < 0) return dt_fail(DT_EINPUT, "%s: tag %d is negative", op, tag);
    if (count && !buf) return dt_fail(DT_EINPUT, "%s: NULL buffer with count %zu", op, count);
    return DT_OK;
}

dt_status dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag) {
    DT_TRY(check_peer(c, "send", buf, count, t, dst, tag, 0));
    size_t es = dt_dtype_size(t);
    size_t o = 0;
    uint64_t fid = rec_begin(c, DT_FOP_SEND, count * es, dst, 1);
    do { /* a zero count still sends one (empty) message to match the receive */
        int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
        dt_status st = dtc_mpi(&c->fg, MPI_Send((const char *)buf + o * es, n, dtc_mpi_type(t), dst, tag, c->user),
                               "MPI_Send");
        if (st) {
            dtc_watch_end(fid, 0);
            return lane_fail(&c->fg, st, "send", DT_ALGO_MPI, count, t);
        }
        o += DTC_PIECE;
    } while (o < count);
    dtc_watch_end(fid, 1);
    return DT_OK;
}

dt_status dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag) {
    DT_TRY(check_peer(c, "recv", buf, count, t, src, tag, 0));
    size_t es = dt_dtype_size(t);
    size_t o = 0;
    uint64_t fid = rec_begin(c, DT_FOP_RECV, count * es, src, 1);
    do {
        int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
        dt_status st = dtc_mpi(
            &c->fg, MPI_Recv((char *)buf + o * es, n, dtc_mpi_type(t), src, tag, c->user, MPI_STATUS_IGNORE),
            "MPI_Recv");
        if (st) {
            dtc_watch_end(fid, 0);
            return lane_fail(&c->fg, st, "recv", DT_ALGO_MPI, count, t);
        }
        o += DTC_PIECE;
    } while (o < count);
    dtc_watch_end(fid, 1);
    return DT_OK;
}

dt_status dt_gather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t, int root) {
    int at_root = root == c->rank;
    /* recv matters at the root only: elsewhere check send twice */
    DT_TRY(check_args(c, "gather", send, at_root ? recv : send, sendcount, t, DT_SUM, root));
    size_t es = dt_dtype_size(t);
    if (c->size == 1) {
        if (sendcount && send != recv) memmove(recv, send, sendcount * es);
        return DT_OK;
    }
    dtc_ctx *x = &c->fg;
    dt_status st;
    if (sendcount > INT_MAX) {
        st = dtc_fail(x, DT_EINPUT, "count exceeds MPI's int limit");
    } else {
        MPI_Datatype mt = dtc_mpi_type(t);
        int inplace = at_root && send == (const char *)recv + (size_t)root * sendcount * es;
        uint64_t fid = rec_begin(c, DT_FOP_GATHER, sendcount * es * (size_t)c->size, -1, 1);
        st = dtc_mpi(x,
                     MPI_Gather(inplace ? MPI_IN_PLACE : send, (int)sendcount, mt, at_root ? recv : NULL,
                                (int)sendcount, mt, root, c->user),
                     "MPI_Gather");
        dtc_watch_end(fid, !st);
    }
    return lane_fail(x, st, "gather", DT_ALGO_MPI, sendcount, t);
}

dt_status dt_barrier(dt_comm *c) {
    if (!c->mpi || c->size == 1) return DT_OK;
    uint64_t fid = rec_begin(c, DT_FOP_BARRIER, 0, -1, 1);
    dt_status st = dtc_mpi(&c->fg, MPI_Barrier(c->user), "MPI_Barrier");
    dtc_watch_end(fid, !st);
    if (st) {
        st = dt_fail(st, "barrier: %s", c->fg.err);
        c->fg.err[0] = 0;
    }
    return st;
}

/* ---- non-blocking ---- */

static void *comm_thread(void *arg) {
    dt_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stop) pthread_cond_wait(&c->work, &c->mu);
        dt_request *r = c->head;
        if (!r) break; /* stopping, queue drained */
        c->head = r->next;
        if (!c->head) c->tail = NULL;
        pthread_mutex_unlock(&c->mu);
        dtc_ctx *x = c->bg;
        dt_status st = run_ours(x, r->coll, r->algo, r->send, r->recv, r->count, r->t, r->op, scale_of(c, r->op), 0,
                                r->reg, r->reg_off);
        if (st)
            snprintf(r->err, sizeof r->err, "%s (%s, %zu x %s): %s", g_coll_ops[r->coll], dt_algo_name(r->algo),
                     r->count, dt_dtype_name(r->t), x->err[0] ? x->err : "failed");
        x->err[0] = 0;
        pthread_mutex_lock(&c->mu);
        r->st = st;
        r->done = 1; /* r may be freed by its waiter as soon as mu is released */
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* The background lane and thread, made at the first non-blocking call of ours (every
 * rank makes the same calls in the same order, so the collective dup matches). */
static dt_status start_thread(dt_comm *c) {
    if (!c->bg) {
        dtc_ctx *x = calloc(1, sizeof *x);
        if (!x) return dt_fail(DT_ERUNTIME, "communication thread: out of memory");
        dt_status st = ctx_init(x, c->user, c->rank, c->size);
        if (st) {
            st = dt_fail(st, "communication thread setup: %s", x->err);
            ctx_free(x);
            free(x);
            return st;
        }
        c->bg = x;
    }
    if (!c->thr_on) {
        c->stop = 0;
        if (pthread_create(&c->thr, NULL, comm_thread, c) != 0)
            return dt_fail(DT_ERUNTIME, "communication thread: pthread_create failed");
        c->thr_on = 1;
    }
    return DT_OK;
}

static dt_status istart(dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                        dt_redop op, dt_request **req) {
    const char *name = g_coll_ops[coll];
    *req = NULL;
    DT_TRY(check_args(c, name, send, recv, count, t, op, 0));
    dt_request *r = calloc(1, sizeof *r);
    if (!r) return dt_fail(DT_ERUNTIME, "%s: out of memory", name);
    r->c = c;
    r->kind = REQ_DONE;
    dt_algo a = pick(c, coll, send, recv, count, t, &r->reg, &r->reg_off);
    dt_status st = DT_OK;
    if (c->size > 1) r->fid = rec_begin(c, fop_of(coll), coll_bytes(c, coll, count, t), -1, 0);
    if (c->size == 1) {
        local_coll(coll, send, recv, count, t);
    } else if (a == DT_ALGO_MPI) {
        dtc_ctx *x = &c->fg;
        MPI_Datatype mt = dtc_mpi_type(t);
        size_t es = dt_dtype_size(t);
        r->kind = REQ_MPI;
        if (coll == DT_COLL_ALLREDUCE) {
            if (count > DTC_PIECE * DTC_MAX_MREQ) st = dtc_fail(x, DT_EINPUT, "count too large for MPI_Iallreduce");
            for (size_t o = 0; o < count && !st; o += DTC_PIECE) {
                int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
                st = dtc_mpi(x,
                             MPI_Iallreduce(MPI_IN_PLACE, (char *)recv + o * es, n, mt, mpi_op(t, op), c->user,
                                            &r->mreq[r->nmreq++]),
                             "MPI_Iallreduce");
            }
        } else if (count > INT_MAX) {
            st = dtc_fail(x, DT_EINPUT, "count exceeds MPI's int limit");
        } else if (coll == DT_COLL_REDUCE_SCATTER) {
            /* in place: the result arrives at the front of the buffer (see mpi_coll) */
            char *front = rs_in_place(c, send, recv, count, t) ? (char *)recv - (size_t)c->rank * count * es : NULL;
            st = dtc_mpi(x,
                         MPI_Ireduce_scatter_block(front ? MPI_IN_PLACE : send, front ? front : recv, (int)count, mt,
                                                   mpi_op(t, op), c->user, &r->mreq[r->nmreq++]),
                         "MPI_Ireduce_scatter_block");
            if (front && front != recv) {
                r->move_src = front;
                r->move_dst = recv;
            }
        } else {
            int inplace = send == (const char *)recv + (size_t)c->rank * count * es;
            st = dtc_mpi(x,
                         MPI_Iallgather(inplace ? MPI_IN_PLACE : send, (int)count, mt, recv, (int)count, mt, c->user,
                                        &r->mreq[r->nmreq++]),
                         "MPI_Iallgather");
        }
        if (coll != DT_COLL_ALLGATHER) {
            r->scale_buf = recv;
            r->scale_n = count;
            r->scale = scale_of(c, op);
        }
        r->t = t;
        if (st) st = lane_fail(x, st, name, a, count, t); /* started pieces are abandoned with the error */
    } else if (!c->threads) {
        /* MPI without thread support: ours run here, before returning */
        dtc_watch_waiting(r->fid);
        st = lane_fail(&c->fg,
                       run_ours(&c->fg, coll, a, send, recv, count, t, op, scale_of(c, op), 0, r->reg, r->reg_off),
                       name, a, count, t);
    } else {
        st = start_thread(c);
        if (!st) {
            r->kind = REQ_THREAD;
            r->coll = coll;
            r->algo = a;
            r->send = send;
            r->recv = recv;
            r->count = count;
            r->t = t;
            r->op = op;
            pthread_mutex_lock(&c->mu);
            if (c->tail) c->tail->next = r;
            else c->head = r;
            c->tail = r;
            pthread_cond_signal(&c->work);
            pthread_mutex_unlock(&c->mu);
        }
    }
    if (st || r->kind == REQ_DONE) dtc_watch_end(r->fid, !st);
    if (st) {
        free(r);
        return st;
    }
    *req = r;
    return DT_OK;
}

dt_status dt_iallreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op, dt_request **req) {
    return istart(c, DT_COLL_ALLREDUCE, buf, buf, count, t, op, req);
}

dt_status dt_ireduce_scatter(dt_comm *c, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op,
                             dt_request **req) {
    return istart(c, DT_COLL_REDUCE_SCATTER, send, recv, recvcount, t, op, req);
}

dt_status dt_iallgather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t, dt_request **req) {
    return istart(c, DT_COLL_ALLGATHER, send, recv, sendcount, t, DT_SUM, req);
}

/* A world without MPI: r (a send to or receive from self) completes with the oldest
 * unmatched opposite request of its tag, as MPI would match them, or waits in c->self_q. */
static dt_status self_post(dt_comm *c, dt_request *r) {
    for (dt_request **pp = &c->self_q; *pp; pp = &(*pp)->next) {
        dt_request *q = *pp;
        if (q->is_send == r->is_send || q->tag != r->tag) continue;
        if (q->count != r->count || q->t != r->t)
            return dt_fail(DT_EINPUT, "%s self (tag %d): %zu x %s, but the matching %s has %zu x %s",
                           r->is_send ? "send to" : "receive from", r->tag, r->count, dt_dtype_name(r->t),
                           q->is_send ? "send" : "receive", q->count, dt_dtype_name(q->t));
        const dt_request *s = r->is_send ? r : q;
        dt_request *d = r->is_send ? q : r;
        if (r->count) memcpy(d->recv, s->send, r->count * dt_dtype_size(r->t));
        *pp = q->next;
        q->kind = REQ_DONE;
        r->kind = REQ_DONE;
        return DT_OK;
    }
    r->kind = REQ_SELF;
    r->next = NULL;
    dt_request **tail = &c->self_q;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    return DT_OK;
}

static dt_status p2p_start(dt_comm *c, int is_send, void *buf, size_t count, dt_dtype t, int peer, int tag,
                           dt_request **req) {
    const char *name = is_send ? "isend" : "irecv";
    *req = NULL;
    DT_TRY(check_peer(c, name, buf, count, t, peer, tag, 1));
    if (count > DTC_PIECE * DTC_MAX_MREQ) return dt_fail(DT_EINPUT, "%s: count %zu is too large", name, count);
    dt_request *r = calloc(1, sizeof *r);
    if (!r) return dt_fail(DT_ERUNTIME, "%s: out of memory", name);
    r->c = c;
    r->is_send = is_send;
    r->tag = tag;
    r->count = count;
    r->t = t;
    r->send = buf;
    r->recv = buf;
    dt_status st = DT_OK;
    if (!c->mpi) {
        st = self_post(c, r);
    } else {
        /* the same pieces as dt_send/dt_recv, so either side may be blocking */
        dtc_ctx *x = &c->fg;
        size_t es = dt_dtype_size(t), o = 0;
        r->kind = REQ_MPI;
        r->fid = rec_begin(c, is_send ? DT_FOP_SEND : DT_FOP_RECV, count * es, peer, 0);
        do {
            int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
            char *p = (char *)buf + o * es;
            MPI_Request *mr = &r->mreq[r->nmreq++];
            st = is_send ? dtc_mpi(x, MPI_Isend(p, n, dtc_mpi_type(t), peer, tag, c->user, mr), "MPI_Isend")
                         : dtc_mpi(x, MPI_Irecv(p, n, dtc_mpi_type(t), peer, tag, c->user, mr), "MPI_Irecv");
            o += DTC_PIECE;
        } while (!st && o < count);
        if (st) {
            dtc_watch_end(r->fid, 0);
            st = lane_fail(x, st, name, DT_ALGO_MPI, count, t); /* started pieces are abandoned */
        }
    }
    if (st) {
        free(r);
        return st;
    }
    *req = r;
    return DT_OK;
}

dt_status dt_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request **req) {
    return p2p_start(c, 1, (void *)buf, count, t, dst, tag, req); /* never written through */
}

dt_status dt_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request **req) {
    return p2p_start(c, 0, buf, count, t, src, tag, req);
}

/* MPI's requests finished: move an in-place reduce-scatter's result into place, apply
 * the mean and mark done. */
static void mpi_finish(dt_request *r) {
    if (r->move_src) memcpy(r->move_dst, r->move_src, r->scale_n * dt_dtype_size(r->t));
    if (r->scale_buf) dtc_scale(r->scale_buf, r->scale_n, r->t, r->scale);
    r->kind = REQ_DONE;
}

dt_status dt_test(dt_request *r, int *done) {
    *done = 0;
    if (!r) return dt_fail(DT_EINPUT, "test: NULL request");
    if (r->kind == REQ_DONE) {
        *done = 1;
    } else if (r->kind == REQ_MPI) {
        int flag = 0;
        dtc_ctx *x = &r->c->fg;
        dt_status st = dtc_mpi(x, MPI_Testall(r->nmreq, r->mreq, &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
        if (st) {
            st = dt_fail(st, "non-blocking collective: %s", x->err);
            x->err[0] = 0;
            return st;
        }
        if (flag) {
            mpi_finish(r);
            *done = 1;
        }
    } else if (r->kind == REQ_THREAD) {
        pthread_mutex_lock(&r->c->mu);
        *done = r->done;
        pthread_mutex_unlock(&r->c->mu);
    } /* REQ_SELF: not until its match is posted */
    if (*done && r->fid) {
        dtc_watch_end(r->fid, 1);
        r->fid = 0;
    }
    return DT_OK;
}

dt_status dt_wait(dt_request *r) {
    if (!r) return dt_fail(DT_EINPUT, "wait: NULL request");
    dt_status st = DT_OK;
    if (r->fid) dtc_watch_waiting(r->fid); /* from here this rank waits on it */
    if (r->kind == REQ_MPI) {
        dtc_ctx *x = &r->c->fg;
        st = dtc_mpi(x, MPI_Waitall(r->nmreq, r->mreq, MPI_STATUSES_IGNORE), "MPI_Waitall");
        if (st) {
            st = dt_fail(st, "non-blocking collective: %s", x->err);
            x->err[0] = 0;
        } else {
            mpi_finish(r);
        }
    } else if (r->kind == REQ_THREAD) {
        dt_comm *c = r->c;
        pthread_mutex_lock(&c->mu);
        while (!r->done) pthread_cond_wait(&c->done, &c->mu);
        pthread_mutex_unlock(&c->mu);
        st = r->st;
        if (st) dt_fail(st, "%s", r->err);
    } else if (r->kind == REQ_SELF) { /* nothing else could ever match it */
        dt_request **pp = &r->c->self_q;
        while (*pp && *pp != r) pp = &(*pp)->next;
        if (*pp) *pp = r->next;
        st = dt_fail(DT_ERUNTIME, "wait: %s self (tag %d) has no matching %s posted, so it would never complete",
                     r->is_send ? "send to" : "receive from", r->tag, r->is_send ? "receive" : "send");
    }
    if (r->fid) dtc_watch_end(r->fid, !st);
    free(r);
    return st;
}

/* ---- node-shared buffers ---- */

dt_status dt_comm_alloc_shared(dt_comm *c, size_t bytes, const char *what, void **out) {
    *out = NULL;
    int slot = 0; /* a free slot: every rank's table is alike, so all pick the same */
    while (slot < DTC_MAX_REGIONS && c->reg[slot].base) slot++;
    if (!c->mpi || c->size == 1 || !c->fg.one_node || slot == DTC_MAX_REGIONS) return dt_alloc(out, bytes, what);
    dtc_ctx *x = &c->fg;
    /* the same size everywhere, or offsets would not match across ranks */
    long long mm[2] = {(long long)bytes, -(long long)bytes};
    uint64_t fid = rec_begin(c, DT_FOP_ALLOC_SHARED, bytes, -1, 1);
    dt_status st = dtc_mpi(x, MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_LONG_LONG, MPI_MAX, c->user), "MPI_Allreduce");
    if (!st && (mm[0] != (long long)bytes || -mm[1] != (long long)bytes))
        st = dtc_fail(x, DT_EINPUT, "ranks asked for different sizes (%lld to %lld bytes)", -mm[1], mm[0]);
    dtc_region *r = &c->reg[slot];
    memset(r, 0, sizeof *r);
    r->win = MPI_WIN_NULL;
    size_t rounded = ((bytes ? bytes : 1) + 4095u) / 4096u * 4096u;
    char *mine = NULL;
    if (!st) {
        r->base = calloc((size_t)c->size, sizeof *r->base);
        if (!r->base) st = dtc_fail(x, DT_ERUNTIME, "out of memory");
    }
    if (!st) {
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "alloc_shared_noncontig", "true"); /* each copy in its own rank's pages */
        st = dtc_mpi(x, MPI_Win_allocate_shared((MPI_Aint)rounded, 1, info, x->node, &mine, &r->win),
                     "MPI_Win_allocate_shared (%zu bytes)", rounded);
        MPI_Info_free(&info);
    }
    for (int q = 0; q < c->size && !st; q++) {
        MPI_Aint sz;
        int du;
        void *p;
        st = dtc_mpi(x, MPI_Win_shared_query(r->win, q, &sz, &du, &p), "MPI_Win_shared_query");
        r->base[q] = p;
    }
    dtc_watch_end(fid, !st);
    if (st) {
        if (r->win != MPI_WIN_NULL) MPI_Win_free(&r->win);
        free(r->base);
        r->base = NULL;
        st = dt_fail(st, "shared buffer for %s: %s", what, x->err);
        x->err[0] = 0;
        return st;
    }
    memset(mine, 0, rounded); /* fault this rank's pages in now, once */
    r->bytes = bytes;
    if (slot >= c->nreg) c->nreg = slot + 1;
    *out = mine;
    return DT_OK;
}

void dt_comm_free_shared(dt_comm *c, void *p) {
    if (!p) return;
    for (int i = 0; i < c->nreg; i++)
        if (c->reg[i].base && c->reg[i].base[c->rank] == p) {
            /* slots stay put: in-flight requests point at them */
            MPI_Win_free(&c->reg[i].win);
            free(c->reg[i].base);
            c->reg[i].base = NULL;
            while (c->nreg > 0 && !c->reg[c->nreg - 1].base) c->nreg--;
            return;
        }
    dt_free(p);
}

dt_status dt_comm_agree(dt_comm *c, dt_status s, int *first) {
    int n = dt_comm_size(c), rank = dt_comm_rank(c);
    if (first) *first = s != DT_OK ? rank : n;
    if (n == 1) return s;
    /* [any input error, any runtime error, lowest failing rank]: min via max of -rank */
    long long v[3] = {s == DT_EINPUT, s != DT_OK && s != DT_EINPUT, s != DT_OK ? -(long long)rank : -(long long)n};
    if (!c->mpi) return s;
    uint64_t fid = rec_begin(c, DT_FOP_AGREE, sizeof v, -1, 1);
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_LONG_LONG, MPI_MAX, c->user);
    dtc_watch_end(fid, rc == MPI_SUCCESS);
    if (rc != MPI_SUCCESS) return s != DT_OK ? s : dt_fail(DT_ERUNTIME, "MPI_Allreduce failed (agreeing on errors)");
    int low = (int)-v[2];
    if (first) *first = low;
    if (s != DT_OK) return s;
    if (!v[0] && !v[1]) return DT_OK;
    char msg[64];
    snprintf(msg, sizeof msg, "rank %d failed", low);
    return dt_fail_secondary(v[0] ? DT_EINPUT : DT_ERUNTIME, msg);
}
