/* Communicator: the one interface parallel strategies use to move tensors between
 * ranks. Backed by MPI (Debian's Open MPI); a process started without mpirun is a
 * world of size 1 and every collective is a local no-op/copy.
 *
 * Each collective can run MPI's own implementation or one of ours, written over
 * point-to-point (ring.c: ring all-reduce = reduce-scatter + all-gather, moving
 * 2(N-1)/N·M bytes per rank; rhd.c: recursive halving-doubling; tree.c: binomial
 * tree; shm.c: intra-node shared-memory path over MPI-3 shared windows). The choice
 * is per collective (dt_comm_set_algo), from config `comm.*`.
 *
 * Buffers are host memory. Counts are elements. Reductions of one algorithm are
 * deterministic: the same inputs on the same ranks give bitwise the same result, on
 * every rank. Sum order: shm adds in rank order (x0 + x1 + ... per element); ring, rhd
 * and tree use fixed but different orders (see each file); MPI's is Open MPI's. DT_AVG
 * is the sum times 1/N. Every rank must make the same calls with the same counts and
 * the same algorithm choices.
 *
 * Reductions: DT_SUM, DT_AVG and DT_MAX, every algorithm, every dtype. Ours take the
 * maximum so that operand order cannot change its bits: NaN (the canonical quiet NaN) if
 * any rank has one, +0 over -0; MPI's MPI_MAX treats NaN and signed zeros Open MPI's way.
 * DT_BF16 (bfloat16: the top 16 bits of an IEEE fp32, in a uint16_t) reduces by converting
 * both operands to fp32, adding (or comparing) and scaling there, and rounding each partial
 * result back to bf16, to nearest-even; so a bf16 sum over N ranks is rounded N-1 times, in
 * the algorithm's order (MPI's implementations get these as our user-defined MPI_Ops).
 *
 * Files: comm.c (world, communicators, algorithm choice), collectives.c (dispatch and the
 * blocking collectives), nonblocking.c, point_to_point.c, node_shared.c (node all-gather,
 * node-shared buffers), error_agree.c, reduction.c (the element-wise reductions); below
 * them the algorithms (ring.c, rhd.c, tree.c, shm.c) over a lane (lane.c, comm_internal.h). */
#ifndef DT_COMM_H
#define DT_COMM_H
#include <stddef.h>

#include "../core/status.h"

typedef struct dt_comm dt_comm;
typedef struct dt_request dt_request;

typedef enum { DT_F32, DT_F64, DT_BF16 } dt_dtype;
typedef enum { DT_SUM, DT_AVG, DT_MAX } dt_redop;
typedef enum { DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER, DT_COLL_BCAST, DT_COLL_N } dt_coll;
/* DT_ALGO_AUTO picks per call what measured fastest here (docs/benchmarks.md): within one
 * node shm for all-reduce and reduce-scatter, and for all-gather into a node-shared buffer
 * (see dt_comm_alloc_shared; into ordinary memory Open MPI's single-copy path wins);
 * MPI's own otherwise (across nodes, and broadcast). */
typedef enum { DT_ALGO_MPI, DT_ALGO_RING, DT_ALGO_RHD, DT_ALGO_TREE, DT_ALGO_SHM, DT_ALGO_AUTO, DT_ALGO_N } dt_algo;

/* MPI_Init (thread level MULTIPLE) when launched by an MPI launcher; size 1 otherwise. */
dt_status dt_comm_init(dt_comm **world, int *argc, char ***argv);
/* Frees the world (and MPI_Finalize) after every sub-communicator is freed. */
void dt_comm_finalize(dt_comm *world);
/* Ends every rank's process with `code` (MPI_Abort): for fatal errors seen by one rank. */
void dt_comm_abort(dt_comm *c, int code);

int dt_comm_rank(const dt_comm *c);
int dt_comm_size(const dt_comm *c);
/* Ranks sharing this node (for shared-memory paths and the launcher). */
int dt_comm_local_rank(const dt_comm *c);
int dt_comm_local_size(const dt_comm *c);
/* Gathers `bytes` bytes from each rank of this node into recv (local rank order): a
 * setup-time exchange (CPU affinity), blocking, not for the training path. */
dt_status dt_comm_node_allgather(dt_comm *c, const void *send, void *recv, size_t bytes);
/* Ranks with equal color (>= 0) form a sub-communicator, ordered by key. It starts with
 * c's algorithm choices (shm becomes mpi if the new communicator spans nodes). A rank
 * passing DT_COMM_NO_GROUP joins none and gets *out = NULL (still collective over c). */
#define DT_COMM_NO_GROUP (-1)
dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out);
void dt_comm_free(dt_comm *c);
/* Names the communicator in the watchdog's messages and the flight recorder ("dp",
 * "tp", ...: "<name> group"; the world is "world", others "split" until named). */
void dt_comm_set_name(dt_comm *c, const char *name);

/* Parses "mpi", "ring", "rhd", "tree", "shm", "auto". */
dt_status dt_algo_parse(const char *name, dt_algo *out);
const char *dt_algo_name(dt_algo a);
/* Chooses the algorithm for one collective; fails if it does not implement it.
 * Every rank must make the same choices (collectives must match across ranks).
 * The default is DT_ALGO_MPI for every collective. dt_reduce follows the all-reduce
 * choice: MPI_Reduce for DT_ALGO_MPI and DT_ALGO_AUTO, our binomial tree otherwise. */
dt_status dt_comm_set_algo(dt_comm *c, dt_coll coll, dt_algo algo);
dt_algo dt_comm_get_algo(const dt_comm *c, dt_coll coll);
/* Whether the algorithm implements the collective (shm also needs a one-node communicator):
 * mpi, shm and auto: all four; ring: all-reduce, reduce-scatter, all-gather; rhd: all-reduce;
 * tree: all-reduce, bcast. */
int dt_algo_supports(dt_algo algo, dt_coll coll);
/* "allreduce", "reduce_scatter", "allgather", "bcast". */
const char *dt_coll_name(dt_coll coll);

size_t dt_dtype_size(dt_dtype t);
const char *dt_dtype_name(dt_dtype t); /* "f32", "f64", "bf16" */

/* In place: buf (count elements) becomes the sum (mean, maximum) over ranks. */
dt_status dt_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op);
/* send holds size·recvcount elements; rank r receives the reduced block r. In place:
 * recv == send + rank·recvcount (this rank's own block, as for dt_allgather); the result
 * then replaces that block and the other blocks are left unspecified (every algorithm
 * may write partial sums there; MPI's leaves its result at the front of the buffer, moved
 * into place afterwards). No other overlap of send and recv is allowed. In place gives
 * the same bits as out of place with ours (ring, shm); MPI may reduce in another order.
 * Same for dt_ireduce_scatter. */
dt_status dt_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op);
/* recv (size·sendcount elements) = concatenation of every rank's send, in rank order.
 * send may alias recv + rank·sendcount (in place). */
dt_status dt_allgather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t);
dt_status dt_bcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
/* Sum (mean, maximum) to root only; other ranks' buf is unchanged. */
dt_status dt_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op, int root);
/* At root, recv (size·sendcount elements) = every rank's send in rank order; recv is not
 * used elsewhere (may be NULL). send may alias recv + root·sendcount at root. MPI's
 * implementation whatever the algorithm choices; sendcount at most INT_MAX. */
dt_status dt_gather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t, int root);
/* Blocking point-to-point with another rank (not self); tag >= 0. The receive's count
 * must equal the send's. Matches dt_isend/dt_irecv on the other side. */
dt_status dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag);
dt_status dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag);
dt_status dt_barrier(dt_comm *c);
/* Collective: every rank learns whether any rank's local step failed, so all leave
 * together instead of some waiting in the next collective. Returns s on a failing rank;
 * on the others DT_EINPUT if any rank had bad input, else DT_ERUNTIME, with the message
 * "rank R failed" (R the lowest failing rank, also in *first when first is not NULL). */
dt_status dt_comm_agree(dt_comm *c, dt_status s, int *first);

/* Node-shared buffers. dt_comm_alloc_shared places the buffer in an MPI-3 shared-memory
 * window that every rank of c maps, so the shm algorithm reads peers' data where it lies
 * instead of copying it through staging buffers (about half the memory traffic): for
 * all-reduce when buf, for reduce-scatter when send, and for all-gather when recv lies
 * inside such a buffer, at the same offset on every rank. Results are bitwise the same
 * as with ordinary memory; other algorithms see ordinary memory. Collective over c:
 * every rank asks for the same size (else an error on every rank). Zero-filled. Where no
 * window can be had (no MPI, one rank, ranks on several nodes, 64 buffers already) it
 * is ordinary memory from dt_alloc. dt_comm_free_shared is collective too (every rank
 * frees the same buffers in the same order, with no operation on them in flight);
 * dt_comm_free frees any left. */
dt_status dt_comm_alloc_shared(dt_comm *c, size_t bytes, const char *what, void **out);
void dt_comm_free_shared(dt_comm *c, void *p);

/* Non-blocking variants: the operation progresses in the background (MPI's own
 * non-blocking collectives, or a communication thread for ours) while the caller
 * computes; buffers must not be touched until dt_wait returns. Ours run one at a time
 * in issue order on a per-communicator thread with its own MPI communicators and
 * shared-memory window, so blocking calls may be made while they are in flight.
 * MPI's non-blocking collectives progress mostly inside MPI calls (dt_test drives
 * them). Without MPI_THREAD_MULTIPLE ours complete before the call returns. */
dt_status dt_iallreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op, dt_request **req);
dt_status dt_ireduce_scatter(dt_comm *c, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op,
                             dt_request **req);
dt_status dt_iallgather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t, dt_request **req);
/* Non-blocking point-to-point (MPI_Isend/MPI_Irecv): complete with dt_wait/dt_test, in any
 * order; messages between two ranks with one tag arrive in the order sent. Counts as for
 * dt_send/dt_recv, at most 2^33 elements. The peer may be this rank: with MPI as usual;
 * in a world without MPI a send to self is matched to a receive from self with the same
 * tag, in posting order, when the second of the two is posted (counts and dtypes must
 * match, else DT_EINPUT), and dt_wait on one still unmatched fails (DT_ERUNTIME) rather
 * than wait forever. Wait for every request before freeing c. */
dt_status dt_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request **req);
dt_status dt_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request **req);
dt_status dt_wait(dt_request *req);          /* frees req */
dt_status dt_test(dt_request *req, int *done); /* done: req may be waited on without blocking */

#endif
