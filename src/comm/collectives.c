/* Collectives dispatch: argument checks, the size-one copies, the algorithm each call
 * runs (DT_ALGO_AUTO resolved, registered buffers found), MPI's own implementations, and
 * the blocking collectives of comm.h. The non-blocking ones (nonblocking.c) share the
 * helpers declared in comm_core.h. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "comm_core.h"

/* what error messages call each collective */
static const char *const g_coll_ops[DT_COLL_N] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast"};

const char *dtc_coll_op(dt_coll coll) { return g_coll_ops[coll]; }

dt_status dtc_check_args(const dt_comm *c, const char *op, const void *a, const void *b, size_t count, dt_dtype t,
                         dt_redop redop, int root) {
    if (!dtc_dtype_ok(t)) return dt_fail(DT_EINPUT, "%s: unknown dtype %d", op, (int)t);
    if (redop != DT_SUM && redop != DT_AVG && redop != DT_MAX)
        return dt_fail(DT_EINPUT, "%s: unknown reduction %d", op, (int)redop);
    if (root < 0 || root >= c->size)
        return dt_fail(DT_EINPUT, "%s: root %d is outside the communicator of size %d", op, root, c->size);
    if (count > SIZE_MAX / 8 / (size_t)c->size)
        return dt_fail(DT_EINPUT, "%s: count %zu is too large", op, count);
    if (count && (!a || !b)) return dt_fail(DT_EINPUT, "%s: NULL buffer with count %zu", op, count);
    return DT_OK;
}

dt_status dtc_lane_fail(dtc_ctx *x, dt_status st, const char *op, dt_algo a, size_t count, dt_dtype t) {
    if (st == DT_OK) return DT_OK;
    st = dt_fail(st, "%s (%s, %zu x %s): %s", op, dt_algo_name(a), count, dt_dtype_name(t),
                 x->err[0] ? x->err : "failed");
    x->err[0] = 0;
    return st;
}

void dtc_local_coll(dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t) {
    if ((coll == DT_COLL_REDUCE_SCATTER || coll == DT_COLL_ALLGATHER) && send != recv && count)
        memmove(recv, send, count * dt_dtype_size(t));
}

dt_status dtc_run_ours(dtc_ctx *x, dt_coll coll, dt_algo a, const void *send, void *recv, size_t count, dt_dtype t,
                       dt_redop op, double scale, int root, const dtc_region *reg, size_t off) {
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

static dt_status mpi_coll(dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_redop op, int root) {
    dtc_ctx *x = &c->fg;
    MPI_Datatype mt = dtc_mpi_type(t);
    size_t es = dt_dtype_size(t);
    switch (coll) {
    case DT_COLL_ALLREDUCE:
        for (size_t o = 0; o < count; o += DTC_PIECE) {
            int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
            DT_TRY(dtc_mpi(x, MPI_Allreduce(MPI_IN_PLACE, (char *)recv + o * es, n, mt, dtc_mpi_op(t, op), c->user),
                           "MPI_Allreduce"));
        }
        dtc_scale(recv, count, t, dtc_scale_of(c, op));
        return DT_OK;
    case DT_COLL_REDUCE_SCATTER: {
        if (count > INT_MAX) return dtc_fail(x, DT_EINPUT, "count exceeds MPI's int limit");
        /* MPI_IN_PLACE leaves the result at the front of the buffer, not at this rank's block */
        char *front = dtc_rs_in_place(c, send, recv, count, t) ? (char *)recv - (size_t)c->rank * count * es : NULL;
        DT_TRY(dtc_mpi(x,
                       MPI_Reduce_scatter_block(front ? MPI_IN_PLACE : send, front ? front : recv, (int)count, mt,
                                                dtc_mpi_op(t, op), c->user),
                       "MPI_Reduce_scatter_block"));
        if (front && front != recv) memcpy(recv, front, count * es); /* blocks do not overlap */
        dtc_scale(recv, count, t, dtc_scale_of(c, op));
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

dt_algo dtc_pick(const dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                 const dtc_region **reg, size_t *off) {
    dt_algo a = c->algo[coll];
    int autopick = a == DT_ALGO_AUTO;
    if (autopick) a = c->fg.one_node && coll != DT_COLL_BCAST ? DT_ALGO_SHM : DT_ALGO_MPI;
    *reg = find_region(c, coll, a, send, recv, count, t, off);
    if (autopick && coll == DT_COLL_ALLGATHER && !*reg) a = DT_ALGO_MPI;
    return a;
}

dt_fop dtc_fop_of(dt_coll coll) {
    static const dt_fop f[DT_COLL_N] = {DT_FOP_ALLREDUCE, DT_FOP_REDUCE_SCATTER, DT_FOP_ALLGATHER, DT_FOP_BCAST};
    return f[coll];
}

size_t dtc_coll_bytes(const dt_comm *c, dt_coll coll, size_t count, dt_dtype t) {
    size_t b = count * dt_dtype_size(t);
    return coll == DT_COLL_REDUCE_SCATTER || coll == DT_COLL_ALLGATHER ? b * (size_t)c->size : b;
}

/* Blocking collective: validation, size one, MPI's or ours on the caller's lane. */
static dt_status coll_run(dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_redop op, int root) {
    const char *name = dtc_coll_op(coll);
    DT_TRY(dtc_check_args(c, name, send, recv, count, t, op, root));
    if (c->size == 1) {
        dtc_local_coll(coll, send, recv, count, t);
        return DT_OK;
    }
    size_t off = 0;
    const dtc_region *reg;
    dt_algo a = dtc_pick(c, coll, send, recv, count, t, &reg, &off);
    uint64_t fid = dtc_rec_begin(c, dtc_fop_of(coll), dtc_coll_bytes(c, coll, count, t), -1, 1);
    dt_status st = a == DT_ALGO_MPI
                       ? mpi_coll(c, coll, send, recv, count, t, op, root)
                       : dtc_run_ours(&c->fg, coll, a, send, recv, count, t, op, dtc_scale_of(c, op), root, reg, off);
    dtc_watch_end(fid, !st);
    return dtc_lane_fail(&c->fg, st, name, a, count, t);
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
    DT_TRY(dtc_check_args(c, "reduce", buf, buf, count, t, op, root));
    if (c->size == 1) return DT_OK;
    dtc_ctx *x = &c->fg;
    dt_algo ar = c->algo[DT_COLL_ALLREDUCE];
    dt_algo a = ar == DT_ALGO_MPI || ar == DT_ALGO_AUTO ? DT_ALGO_MPI : DT_ALGO_TREE;
    dt_status st = DT_OK;
    uint64_t fid = dtc_rec_begin(c, DT_FOP_REDUCE, count * dt_dtype_size(t), -1, 1);
    if (a == DT_ALGO_MPI) {
        size_t es = dt_dtype_size(t);
        for (size_t o = 0; o < count && !st; o += DTC_PIECE) {
            int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
            char *p = (char *)buf + o * es;
            st = dtc_mpi(x,
                         MPI_Reduce(c->rank == root ? MPI_IN_PLACE : p, c->rank == root ? p : NULL, n, dtc_mpi_type(t),
                                    dtc_mpi_op(t, op), root, c->user),
                         "MPI_Reduce");
        }
        if (!st && c->rank == root) dtc_scale(buf, count, t, dtc_scale_of(c, op));
    } else {
        st = dtc_tree_reduce(x, buf, count, t, op, dtc_scale_of(c, op), root);
    }
    dtc_watch_end(fid, !st);
    return dtc_lane_fail(x, st, "reduce", a, count, t);
}

dt_status dt_gather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t, int root) {
    int at_root = root == c->rank;
    /* recv matters at the root only: elsewhere check send twice */
    DT_TRY(dtc_check_args(c, "gather", send, at_root ? recv : send, sendcount, t, DT_SUM, root));
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
        uint64_t fid = dtc_rec_begin(c, DT_FOP_GATHER, sendcount * es * (size_t)c->size, -1, 1);
        st = dtc_mpi(x,
                     MPI_Gather(inplace ? MPI_IN_PLACE : send, (int)sendcount, mt, at_root ? recv : NULL,
                                (int)sendcount, mt, root, c->user),
                     "MPI_Gather");
        dtc_watch_end(fid, !st);
    }
    return dtc_lane_fail(x, st, "gather", DT_ALGO_MPI, sendcount, t);
}

dt_status dt_barrier(dt_comm *c) {
    if (!c->mpi || c->size == 1) return DT_OK;
    uint64_t fid = dtc_rec_begin(c, DT_FOP_BARRIER, 0, -1, 1);
    dt_status st = dtc_mpi(&c->fg, MPI_Barrier(c->user), "MPI_Barrier");
    dtc_watch_end(fid, !st);
    if (st) {
        st = dt_fail(st, "barrier: %s", c->fg.err);
        c->fg.err[0] = 0;
    }
    return st;
}
