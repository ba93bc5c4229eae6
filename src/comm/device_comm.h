/* Collectives on device memory: the data-parallel reductions of DDP and ZeRO without
 * staging through the host (config comm.backend = nccl). Two implementations behind one
 * table: NCCL on GPUs (nccl.c: one GPU per rank, unique id broadcast over MPI), and on
 * the emulated device (ops_emulated.c) the host communicator run on the memory behind its
 * addresses, so the device-direct paths of the strategies are tested, bit for bit
 * against the CPU, without a GPU.
 *
 * A device communicator spans the same ranks as the host communicator it is made from.
 * Buffers are device memory; counts are elements; in-place rules are comm.h's. Calls are
 * ordered after the compute work issued so far and run in issue order on the
 * communicator's own stream, so a collective started during backward overlaps the rest
 * of it; dt_dcomm_join makes compute issued afterwards wait for them (an event, not a
 * device-wide sync). A buffer a collective reads or writes must not be touched by compute
 * before the join. Failures are returned by the call or by the next join. */
#ifndef DT_DEVICE_COMM_H
#define DT_DEVICE_COMM_H
#include <stddef.h>

#include "comm.h"

typedef struct dt_dcomm dt_dcomm;

typedef struct {
    dt_status (*allreduce)(void *impl, void *buf, size_t count, dt_dtype t, dt_redop op);
    dt_status (*reduce_scatter)(void *impl, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op);
    dt_status (*allgather)(void *impl, const void *send, void *recv, size_t sendcount, dt_dtype t);
    dt_status (*join)(void *impl);
    dt_status (*mark)(void *impl);
    dt_status (*join_mark)(void *impl);
    void (*destroy)(void *impl, int abort);
    const char *name;
} dt_dcomm_impl;

/* The emulated device: host collectives over c on to_host(buffer). */
dt_status dt_dcomm_emulated(dt_comm *c, void *(*to_host)(const void *dev), dt_dcomm **out);
/* NCCL over c's ranks on this process's GPU (the CUDA backend started); collective over c.
 * A one-line input error without NCCL in the build or with more ranks on a node than GPUs. */
dt_status dt_dcomm_nccl(dt_comm *c, dt_dcomm **out);
/* Wraps an implementation (nccl.c); impl is destroyed with the communicator. */
dt_status dt_dcomm_wrap(const dt_dcomm_impl *ops, void *impl, dt_dcomm **out);
/* Waits (on the host) for the collectives queued, then frees; abort: after a failure,
 * cancels them instead (a peer may never issue its side). */
void dt_dcomm_free(dt_dcomm *d, int abort);
const char *dt_dcomm_name(const dt_dcomm *d);

dt_status dt_dcomm_allreduce(dt_dcomm *d, void *buf, size_t count, dt_dtype t, dt_redop op);
dt_status dt_dcomm_reduce_scatter(dt_dcomm *d, const void *send, void *recv, size_t recvcount, dt_dtype t,
                                  dt_redop op);
dt_status dt_dcomm_allgather(dt_dcomm *d, const void *send, void *recv, size_t sendcount, dt_dtype t);
dt_status dt_dcomm_join(dt_dcomm *d);
/* Remembers the point the communicator's stream has reached; dt_dcomm_join_mark makes
 * compute wait up to that point only (a prefetched gather, not what was queued after it). */
dt_status dt_dcomm_mark(dt_dcomm *d);
dt_status dt_dcomm_join_mark(dt_dcomm *d);

#endif
