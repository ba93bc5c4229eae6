/* Private to the files that implement comm.h (comm.c, collectives.c, nonblocking.c,
 * point_to_point.c, node_shared.c, error_agree.c, reduction.c): the communicator and
 * request objects, and the helpers those files share. The algorithms below them see only
 * their lane (comm_internal.h). */
#ifndef DT_COMM_CORE_H
#define DT_COMM_CORE_H
#include <mpi.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "comm_internal.h"

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

/* Starts the flight record of an operation on c (peer: a rank of c, or -1). */
static inline uint64_t dtc_rec_begin(dt_comm *c, dt_fop op, size_t bytes, int peer, int waiting) {
    return dtc_watch_begin(&c->fl, op, bytes, peer >= 0 ? c->world_of[peer] : -1, waiting);
}

static inline int dtc_dtype_ok(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_BF16; }

static inline double dtc_scale_of(const dt_comm *c, dt_redop op) { return op == DT_AVG ? 1.0 / c->size : 1.0; }

/* A reduce-scatter in place (comm.h): recv is this rank's block of send. */
static inline int dtc_rs_in_place(const dt_comm *c, const void *send, const void *recv, size_t count, dt_dtype t) {
    return (const char *)send + (size_t)c->rank * count * dt_dtype_size(t) == (const char *)recv;
}

/* nonblocking.c: a new request of c for operation op (kind REQ_DONE, the buffers, count
 * and dtype filled in), and its hand-over: *req = r, or r freed when st is a failure. */
dt_status dtc_request_new(dt_comm *c, const char *op, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_request **out);
dt_status dtc_request_out(dt_request *r, dt_status st, dt_request **req);

/* reduction.c: MPI's operation for a reduction, and the bf16 MPI_Ops behind it (made by
 * dt_comm_init, freed by dt_comm_finalize; MPI has no bf16). */
MPI_Op dtc_mpi_op(dt_dtype t, dt_redop op);
int dtc_bf16_ops_create(void);
void dtc_bf16_ops_free(void);

/* collectives.c, shared with nonblocking.c. */
const char *dtc_coll_op(dt_coll coll); /* what error messages call it: "all-reduce", ... */
dt_status dtc_check_args(const dt_comm *c, const char *op, const void *a, const void *b, size_t count, dt_dtype t,
                         dt_redop redop, int root);
/* Moves the lane's message into dt_fail, naming the operation. */
dt_status dtc_lane_fail(dtc_ctx *x, dt_status st, const char *op, dt_algo a, size_t count, dt_dtype t);
/* Size one: every collective is a copy at most. */
void dtc_local_coll(dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t);
/* One of our algorithms on lane x (reg: the registered buffer found by dtc_pick). */
dt_status dtc_run_ours(dtc_ctx *x, dt_coll coll, dt_algo a, const void *send, void *recv, size_t count, dt_dtype t,
                       dt_redop op, double scale, int root, const dtc_region *reg, size_t off);
/* The algorithm this call runs (DT_ALGO_AUTO resolved; see comm.h) and, for shm, the
 * registered buffer it reads peers' data from (NULL: ordinary memory). */
dt_algo dtc_pick(const dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                 const dtc_region **reg, size_t *off);
/* The flight recorder's name and size of a collective (its largest buffer). */
dt_fop dtc_fop_of(dt_coll coll);
size_t dtc_coll_bytes(const dt_comm *c, dt_coll coll, size_t count, dt_dtype t);

#endif
