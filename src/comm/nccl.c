/* NCCL behind device_comm.h: one GPU per rank, the unique id made at rank 0 and broadcast
 * over the host communicator, collectives on a stream of their own ordered after the
 * compute stream's work by events. libnccl is opened when a run asks for it (like
 * cuBLASLt in gemm.cu), by the soname of the major version compiled against, so a CPU
 * run never loads it. */
#include "device_comm.h"

#if defined(DT_HAVE_CUDA) && defined(DT_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/ops.h"
#include "../core/library.h"

#define DT_STR_(x) #x
#define DT_STR(x) DT_STR_(x)

/* the NCCL functions used, opened from the library */
static struct {
    const char *(*GetErrorString)(ncclResult_t);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                  cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
} nc;

static dt_status load_nccl(void) {
    static int loaded;
    if (loaded) return DT_OK;
    static const char *names[] = {"libnccl.so." DT_STR(NCCL_MAJOR),
#ifdef DT_NCCL_DIR
                                  DT_NCCL_DIR "/libnccl.so." DT_STR(NCCL_MAJOR),
#endif
    };
    const dt_symbol syms[] = {
        {"ncclGetErrorString", (void **)&nc.GetErrorString}, {"ncclGetUniqueId", (void **)&nc.GetUniqueId},
        {"ncclCommInitRank", (void **)&nc.CommInitRank},     {"ncclCommDestroy", (void **)&nc.CommDestroy},
        {"ncclCommAbort", (void **)&nc.CommAbort},           {"ncclCommGetAsyncError", (void **)&nc.CommGetAsyncError},
        {"ncclAllReduce", (void **)&nc.AllReduce},           {"ncclReduceScatter", (void **)&nc.ReduceScatter},
        {"ncclAllGather", (void **)&nc.AllGather},
    };
    char why[512];
    if (!dt_library_open(names, sizeof names / sizeof *names, syms, sizeof syms / sizeof *syms, why, sizeof why)) {
        memset(&nc, 0, sizeof nc); /* no half-filled table */
        return dt_fail(DT_EINPUT, "comm.backend nccl: libnccl.so.%d: %s", NCCL_MAJOR, why);
    }
    loaded = 1;
    return DT_OK;
}

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream, compute;
    cudaEvent_t computed, communicated, marked;
} nccl_comm;

static ncclDataType_t nc_type(dt_dtype t) { return t == DT_F64 ? ncclFloat64 : t == DT_BF16 ? ncclBfloat16 : ncclFloat32; }
static ncclRedOp_t nc_op(dt_redop op) { return op == DT_AVG ? ncclAvg : op == DT_MAX ? ncclMax : ncclSum; }

static dt_status cuda_ok(cudaError_t e, const char *what) {
    return e == cudaSuccess ? DT_OK : dt_fail(DT_ERUNTIME, "nccl: %s: %s", what, cudaGetErrorString(e));
}
static dt_status nccl_ok(ncclResult_t r, const char *what) {
    return r == ncclSuccess ? DT_OK : dt_fail(DT_ERUNTIME, "nccl %s: %s", what, nc.GetErrorString(r));
}

/* The collective's stream waits for the compute issued so far. */
static dt_status after_compute(nccl_comm *n) {
    DT_TRY(cuda_ok(cudaEventRecord(n->computed, n->compute), "event"));
    return cuda_ok(cudaStreamWaitEvent(n->stream, n->computed, 0), "stream wait");
}

static dt_status nc_allreduce(void *p, void *buf, size_t count, dt_dtype t, dt_redop op) {
    nccl_comm *n = p;
    DT_TRY(after_compute(n));
    return nccl_ok(nc.AllReduce(buf, buf, count, nc_type(t), nc_op(op), n->comm, n->stream), "all-reduce");
}
static dt_status nc_reduce_scatter(void *p, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op) {
    nccl_comm *n = p;
    DT_TRY(after_compute(n));
    return nccl_ok(nc.ReduceScatter(send, recv, recvcount, nc_type(t), nc_op(op), n->comm, n->stream),
                   "reduce-scatter");
}
static dt_status nc_allgather(void *p, const void *send, void *recv, size_t sendcount, dt_dtype t) {
    nccl_comm *n = p;
    DT_TRY(after_compute(n));
    return nccl_ok(nc.AllGather(send, recv, sendcount, nc_type(t), n->comm, n->stream), "all-gather");
}
static dt_status nc_join(void *p) {
    nccl_comm *n = p;
    ncclResult_t async = ncclSuccess;
    DT_TRY(nccl_ok(nc.CommGetAsyncError(n->comm, &async), "error query"));
    DT_TRY(nccl_ok(async, "collective"));
    DT_TRY(cuda_ok(cudaEventRecord(n->communicated, n->stream), "event"));
    return cuda_ok(cudaStreamWaitEvent(n->compute, n->communicated, 0), "stream wait");
}
static dt_status nc_mark(void *p) {
    nccl_comm *n = p;
    return cuda_ok(cudaEventRecord(n->marked, n->stream), "event");
}
static dt_status nc_join_mark(void *p) {
    nccl_comm *n = p;
    return cuda_ok(cudaStreamWaitEvent(n->compute, n->marked, 0), "stream wait");
}
static void nc_destroy(void *p, int abort) {
    nccl_comm *n = p;
    if (!n) return;
    if (n->comm && abort) nc.CommAbort(n->comm); /* cancels what is queued; no wait on peers */
    else if (n->comm) {
        cudaStreamSynchronize(n->stream);
        nc.CommDestroy(n->comm);
    }
    if (n->computed) cudaEventDestroy(n->computed);
    if (n->communicated) cudaEventDestroy(n->communicated);
    if (n->marked) cudaEventDestroy(n->marked);
    if (n->stream) cudaStreamDestroy(n->stream);
    free(n);
}

static const dt_dcomm_impl NCCL = {nc_allreduce, nc_reduce_scatter, nc_allgather, nc_join,
                                   nc_mark,      nc_join_mark,      nc_destroy,   "nccl"};

/* The rank-local part: the library, the GPU count, the stream and events. */
static dt_status nccl_local(dt_comm *c, nccl_comm *n, ncclUniqueId *id) {
    DT_TRY(load_nccl());
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
    if (dt_comm_local_size(c) > gpus)
        return dt_fail(DT_EINPUT, "comm.backend nccl needs a GPU per rank: %d ranks on this node, %d GPU%s",
                       dt_comm_local_size(c), gpus, gpus == 1 ? "" : "s");
    n->compute = (cudaStream_t)dt_gpu_stream();
    if (!n->compute) return dt_fail(DT_EINPUT, "comm.backend nccl needs backend cuda");
    DT_TRY(cuda_ok(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking), "stream"));
    DT_TRY(cuda_ok(cudaEventCreateWithFlags(&n->computed, cudaEventDisableTiming), "event"));
    DT_TRY(cuda_ok(cudaEventCreateWithFlags(&n->communicated, cudaEventDisableTiming), "event"));
    DT_TRY(cuda_ok(cudaEventCreateWithFlags(&n->marked, cudaEventDisableTiming), "event"));
    if (dt_comm_rank(c) == 0) DT_TRY(nccl_ok(nc.GetUniqueId(id), "unique id"));
    return DT_OK;
}

dt_status dt_dcomm_nccl(dt_comm *c, dt_dcomm **out) {
    *out = NULL;
    nccl_comm *n = calloc(1, sizeof *n);
    ncclUniqueId id = {0};
    dt_status s = n ? nccl_local(c, n, &id) : dt_fail(DT_ERUNTIME, "out of memory (nccl)");
    s = dt_comm_agree(c, s, NULL); /* what follows is collective */
    /* the 128-byte id travels as 64 two-byte elements (a broadcast moves them as they are) */
    if (s == DT_OK) s = dt_bcast(c, &id, sizeof id / 2, DT_BF16, 0);
    if (s == DT_OK) s = nccl_ok(nc.CommInitRank(&n->comm, dt_comm_size(c), id, dt_comm_rank(c)), "init");
    s = dt_comm_agree(c, s, NULL);
    if (s != DT_OK) {
        nc_destroy(n, 1);
        return s;
    }
    return dt_dcomm_wrap(&NCCL, n, out);
}

#else

dt_status dt_dcomm_nccl(dt_comm *c, dt_dcomm **out) {
    (void)c;
    *out = NULL;
    return dt_fail(DT_EINPUT, "comm.backend nccl: this dtrain was built without CUDA and NCCL");
}

#endif
