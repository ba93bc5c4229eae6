/* A lane (comm_internal.h): its setup over a private duplicate communicator, the
 * failure record, the scratch, and the point-to-point transfers the algorithm files
 * build on. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

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

void dtc_ctx_free(dtc_ctx *x) {
    dtc_shm_free(x);
    free(x->shm.seg);
    free(x->peer);
    free(x->scratch);
    if (x->node != MPI_COMM_NULL) MPI_Comm_free(&x->node);
    if (x->comm != MPI_COMM_NULL) MPI_Comm_free(&x->comm);
    memset(x, 0, sizeof *x);
    x->comm = x->node = MPI_COMM_NULL;
}

dt_status dtc_ctx_init(dtc_ctx *x, MPI_Comm from, int rank, int size) {
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
