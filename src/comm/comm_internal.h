/* Private to src/comm: the state our algorithms run on and the helpers they share.
 *
 * A dt_comm owns up to two "lanes" (dtc_ctx): one for blocking calls from the caller's
 * thread and one for the communication thread that runs non-blocking operations. Each
 * lane has its own duplicated MPI communicators, scratch and shared-memory window, so
 * the two threads never share a communicator, a window or a buffer. Algorithm code
 * records errors in its lane (dtc_fail) instead of the process-wide dt_fail message,
 * which is not thread-safe; the dispatch (collectives.c) moves the message into dt_fail on the caller's thread. */
#ifndef DT_COMM_INTERNAL_H
#define DT_COMM_INTERNAL_H
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "flight_recorder.h"

/* Point-to-point algorithms move large messages in segments of this many bytes, through
 * two scratch buffers, so the reduction of one segment overlaps the transfer of the next
 * and scratch stays small (and warm in cache). */
#define DTC_SEG_BYTES (256u << 10)
/* MPI counts are int: larger messages go in pieces of this many elements. */
#define DTC_PIECE ((size_t)1 << 30)

/* Shared-memory window of one lane (shm.c). Rank q's segment is a 4 KiB header (its sync
 * counter) followed by two buffers of `cap` bytes used alternately by successive chunks. */
typedef struct {
    MPI_Win win;
    int have;
    size_t cap;      /* bytes per buffer per rank */
    char **seg;      /* seg[q]: base of rank q's segment in this process's address space */
    uint64_t seq;    /* syncs done by this rank since the window was made */
    uint64_t chunks; /* chunks processed: selects the buffer */
} dtc_shm;

/* A node-shared buffer from dt_comm_alloc_shared: one MPI-3 shared window whose segment
 * q is rank q's copy of the buffer. Every rank allocated the same size, so a buffer at
 * offset o in one rank's copy is at offset o in every rank's copy. */
typedef struct {
    MPI_Win win;
    char **base;  /* base[q]: rank q's copy, mapped in this process */
    size_t bytes; /* of each rank's copy */
} dtc_region;

typedef struct {
    MPI_Comm comm; /* MPI_COMM_NULL in a world without MPI */
    MPI_Comm node; /* the ranks of comm on this node, ordered by rank in comm */
    int rank, size;
    int one_node; /* every rank of comm is on this node */
    void *scratch;
    size_t scratch_cap;
    dtc_shm shm;
    char **peer;   /* size entries: the peers' copies of a registered buffer (shm.c) */
    char err[512]; /* first failure of the current operation ("" when none) */
} dtc_ctx;

/* A lane over a private duplicate of `from` (MPI_COMM_NULL: a lane of one, no MPI), and
 * its release (lane.c). */
dt_status dtc_ctx_init(dtc_ctx *x, MPI_Comm from, int rank, int size);
void dtc_ctx_free(dtc_ctx *x);
/* Records a failure in the lane (first one wins) and returns code. */
dt_status dtc_fail(dtc_ctx *x, dt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* DT_OK when rc is MPI_SUCCESS, else DT_ERUNTIME with "<what>: <MPI's error string>". */
dt_status dtc_mpi(dtc_ctx *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Lane scratch of at least `bytes`, grown (rarely) and kept across calls. */
dt_status dtc_scratch(dtc_ctx *x, size_t bytes, void **out);
/* MPI_FLOAT, MPI_DOUBLE, or MPI_UINT16_T for bf16 (bytes to MPI: it has no bf16). */
MPI_Datatype dtc_mpi_type(dt_dtype t);

/* bf16 <-> fp32: exact one way; to nearest-even the other (NaN stays a quiet NaN). */
static inline float dtc_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}
static inline uint16_t dtc_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* acc[i] = op(a[i], b[i]) for n elements: for DT_SUM and DT_AVG the sum times scale (1, or
 * 1/size on the mean's last pass), for DT_MAX the maximum (scale unused; see comm.h for NaN
 * and signed zeros: the same bits whatever the operand order). acc may equal a or b. */
void dtc_combine(void *acc, const void *a, const void *b, size_t n, dt_dtype t, dt_redop op, double scale);
void dtc_scale(void *buf, size_t n, dt_dtype t, double scale);

/* Sends sn elements of s to dst while receiving rn elements from src into r (a zero
 * count sends or receives nothing; the peer's counts must mirror these). */
dt_status dtc_sendrecv(dtc_ctx *x, const void *s, size_t sn, int dst, void *r, size_t rn, int src, dt_dtype t,
                       int tag);
/* Sends sn elements of s to dst while receiving rn elements from src, and writes
 * acc[i] = op(in[i], received[i]) (see dtc_combine). Pipelined in DTC_SEG_BYTES segments through
 * lane scratch. s may alias acc (segment j+1 is sent while segment j is written).
 * Messages are per segment, so the peer must use this function too (rn = 0 or sn = 0
 * for a one-way transfer). */
dt_status dtc_sendrecv_reduce(dtc_ctx *x, const void *s, size_t sn, int dst, const void *in, void *acc, size_t rn,
                              int src, dt_dtype t, dt_redop op, double scale, int tag);

/* Algorithms. Callers handle size 1 and validate arguments; op is the caller's, scale is 1
 * or 1/size (DT_AVG), applied once, on the last pass (see dtc_combine). Reduce-scatters
 * accept the in-place form recv == send + rank·n (comm.h). */
dt_status dtc_ring_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale);
dt_status dtc_ring_reduce_scatter(dtc_ctx *x, const void *send, void *recv, size_t n, dt_dtype t, dt_redop op,
                                  double scale);
dt_status dtc_ring_allgather(dtc_ctx *x, const void *send, void *recv, size_t n, dt_dtype t);
dt_status dtc_rhd_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale);
dt_status dtc_tree_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale);
dt_status dtc_tree_reduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale, int root);
dt_status dtc_tree_bcast(dtc_ctx *x, void *buf, size_t count, dt_dtype t, int root);
dt_status dtc_shm_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale);
dt_status dtc_shm_reduce_scatter(dtc_ctx *x, const void *send, void *recv, size_t n, dt_dtype t, dt_redop op,
                                 double scale);
dt_status dtc_shm_allgather(dtc_ctx *x, const void *send, void *recv, size_t n, dt_dtype t);
dt_status dtc_shm_bcast(dtc_ctx *x, void *buf, size_t count, dt_dtype t, int root);
/* The same collectives on registered buffers (dtc_region): the buffer that other ranks
 * must read (all-reduce: buf; reduce-scatter: send; all-gather: recv) is at byte offset
 * off of region r on every rank, so peers read it where it lies, with no copy through the
 * staging buffers; two syncs per call. Same results, bitwise, as the unregistered
 * versions. Fails on every rank alike if the ranks passed different offsets. */
dt_status dtc_shm_allreduce_reg(dtc_ctx *x, const dtc_region *r, size_t off, size_t count, dt_dtype t, dt_redop op,
                                double scale);
dt_status dtc_shm_reduce_scatter_reg(dtc_ctx *x, const dtc_region *r, size_t off, void *recv, size_t n, dt_dtype t,
                                     dt_redop op, double scale);
dt_status dtc_shm_allgather_reg(dtc_ctx *x, const void *send, const dtc_region *r, size_t off, size_t n,
                                dt_dtype t);
/* Frees the lane's window (collective over x->node). */
void dtc_shm_free(dtc_ctx *x);

/* The watchdog's side for the communicator files (watchdog.c). dtc_watch_open: collective over the
 * world (MPI_COMM_NULL: a world of one): every rank's flight-recorder book in node-shared
 * memory (a private one where that cannot be had). dtc_watch_close: before MPI_Finalize. */
void dtc_watch_open(MPI_Comm world, int rank, int size);
void dtc_watch_close(void);
/* A communicator's members as world ranks, for naming the ranks a collective on comm slot
 * `slot` waits for (world_of stays valid until dtc_watch_forget). */
void dtc_watch_register(int slot, int size, const int *world_of);
void dtc_watch_forget(int slot);
/* Records of this rank's operations (flight_recorder.h's begin/waiting/end on its book). */
uint64_t dtc_watch_begin(dt_flight_comm *fc, dt_fop op, size_t bytes, int peer_world, int waiting);
void dtc_watch_waiting(uint64_t id);
void dtc_watch_end(uint64_t id, int ok);

#endif
