/* Binomial tree reduce and broadcast (all-reduce = reduce to rank 0 + broadcast), over
 * point-to-point, pipelined in DTC_SEG_BYTES segments so the tree depth costs latency
 * per segment rather than per message. log2 N steps: the choice for small messages;
 * each rank moves up to log2 N copies of the buffer, so large messages prefer ring/shm.
 *
 * In relative rank v = (rank - root) mod N, the parent of v is v minus its lowest set
 * bit; its children are v + m for each power of two m below that bit (v + m < N).
 *
 * Sum order (deterministic, but not rank order): each rank adds its children's partial
 * sums to its own in increasing order of m, e.g. for N = 4 and root 0:
 * (x0 + x1) + (x2 + x3). */
#include <string.h>

#include "comm_internal.h"

enum { TAG_REDUCE = 121, TAG_BCAST = 122 };
#define MAX_CHILDREN 32

/* parent (-1 for the root) and children (ascending m) as real ranks */
static int tree_links(int r, int n, int root, int *parent, int *child) {
    int v = (r - root + n) % n, nc = 0;
    *parent = -1;
    for (int m = 1; m < n; m *= 2) {
        if (v & m) {
            *parent = (v - m + root) % n;
            break;
        }
        if (v + m < n) child[nc++] = (v + m + root) % n;
    }
    return nc;
}

/* inplace: non-root ranks may overwrite buf with their partial sums (all-reduce);
 * otherwise they build them in scratch so buf is left as it was. */
static dt_status tree_reduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale, int root,
                             int inplace) {
    int n = x->size, parent, child[MAX_CHILDREN];
    int nc = tree_links(x->rank, n, root, &parent, child);
    size_t es = dt_dtype_size(t), seg = DTC_SEG_BYTES / es, nseg = (count + seg - 1) / seg;
    if (count == 0) return DT_OK;
    /* scratch: two segments per child (receive j+1 while adding j), two work segments */
    char *scr = NULL;
    DT_TRY(dtc_scratch(x, (size_t)(2 * nc + 2) * DTC_SEG_BYTES, (void **)&scr));
    char *work = scr + (size_t)2 * nc * DTC_SEG_BYTES;
    MPI_Request rrq[2][MAX_CHILDREN], srq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Datatype mt = dtc_mpi_type(t);
    char *b = buf;
    for (size_t j = 0; j <= nseg; j++) {
        if (j < nseg) { /* post the receives of segment j */
            int sb = (int)(j & 1), len = (int)(count - j * seg < seg ? count - j * seg : seg);
            for (int i = 0; i < nc; i++)
                DT_TRY(dtc_mpi(x,
                               MPI_Irecv(scr + (size_t)(2 * i + sb) * DTC_SEG_BYTES, len, mt, child[i], TAG_REDUCE,
                                         x->comm, &rrq[sb][i]),
                               "MPI_Irecv (from rank %d)", child[i]));
        }
        if (j == 0) continue;
        size_t p = j - 1, len = count - p * seg < seg ? count - p * seg : seg;
        int sb = (int)(p & 1);
        char *mine = b + p * seg * es;
        /* the partial sum goes to buf at the root and in place, else to a work segment
         * whose previous send (segment p-2) must have finished */
        char *acc = mine;
        if (parent >= 0 && !inplace && nc > 0) {
            acc = work + (size_t)sb * DTC_SEG_BYTES;
            DT_TRY(dtc_mpi(x, MPI_Wait(&srq[sb], MPI_STATUS_IGNORE), "MPI_Wait (send to rank %d)", parent));
        }
        for (int i = 0; i < nc; i++) {
            DT_TRY(dtc_mpi(x, MPI_Wait(&rrq[sb][i], MPI_STATUS_IGNORE), "MPI_Wait (receive from rank %d)", child[i]));
            dtc_combine(acc, i == 0 ? mine : acc, scr + (size_t)(2 * i + sb) * DTC_SEG_BYTES, len, t, op,
                        parent < 0 && i == nc - 1 ? scale : 1.0);
        }
        if (parent < 0) {
            if (nc == 0) dtc_scale(acc, len, t, scale);
        } else {
            DT_TRY(dtc_mpi(x, MPI_Wait(&srq[sb], MPI_STATUS_IGNORE), "MPI_Wait (send to rank %d)", parent));
            DT_TRY(dtc_mpi(x, MPI_Isend(acc, (int)len, mt, parent, TAG_REDUCE, x->comm, &srq[sb]),
                           "MPI_Isend (to rank %d)", parent));
        }
    }
    DT_TRY(dtc_mpi(x, MPI_Waitall(2, srq, MPI_STATUSES_IGNORE), "MPI_Waitall (send to rank %d)", parent));
    return DT_OK;
}

dt_status dtc_tree_reduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale, int root) {
    return tree_reduce(x, buf, count, t, op, scale, root, 0);
}

dt_status dtc_tree_bcast(dtc_ctx *x, void *buf, size_t count, dt_dtype t, int root) {
    int n = x->size, parent, child[MAX_CHILDREN];
    int nc = tree_links(x->rank, n, root, &parent, child);
    size_t es = dt_dtype_size(t), seg = DTC_SEG_BYTES / es, nseg = (count + seg - 1) / seg;
    MPI_Request srq[2][MAX_CHILDREN];
    MPI_Datatype mt = dtc_mpi_type(t);
    char *b = buf;
    for (int i = 0; i < nc; i++) srq[0][i] = srq[1][i] = MPI_REQUEST_NULL;
    for (size_t j = 0; j < nseg; j++) {
        int sb = (int)(j & 1), len = (int)(count - j * seg < seg ? count - j * seg : seg);
        char *p = b + j * seg * es;
        if (parent >= 0)
            DT_TRY(dtc_mpi(x, MPI_Recv(p, len, mt, parent, TAG_BCAST, x->comm, MPI_STATUS_IGNORE),
                           "MPI_Recv (from rank %d)", parent));
        /* at most two segments in flight per child */
        DT_TRY(dtc_mpi(x, MPI_Waitall(nc, srq[sb], MPI_STATUSES_IGNORE), "MPI_Waitall (bcast sends)"));
        for (int i = nc - 1; i >= 0; i--) /* largest subtree first */
            DT_TRY(dtc_mpi(x, MPI_Isend(p, len, mt, child[i], TAG_BCAST, x->comm, &srq[sb][i]),
                           "MPI_Isend (to rank %d)", child[i]));
    }
    for (int sb = 0; sb < 2; sb++)
        DT_TRY(dtc_mpi(x, MPI_Waitall(nc, srq[sb], MPI_STATUSES_IGNORE), "MPI_Waitall (bcast sends)"));
    return DT_OK;
}

dt_status dtc_tree_allreduce(dtc_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op, double scale) {
    DT_TRY(tree_reduce(x, buf, count, t, op, scale, 0, 1));
    return dtc_tree_bcast(x, buf, count, t, 0);
}
