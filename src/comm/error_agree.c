/* Error agreement: every rank learns whether any rank failed, so all leave together. */
#include <stdio.h>

#include "comm_core.h"

dt_status dt_comm_agree(dt_comm *c, dt_status s, int *first) {
    int n = dt_comm_size(c), rank = dt_comm_rank(c);
    if (first) *first = s != DT_OK ? rank : n;
    if (n == 1) return s;
    /* [any input error, any runtime error, lowest failing rank]: min via max of -rank */
    long long v[3] = {s == DT_EINPUT, s != DT_OK && s != DT_EINPUT, s != DT_OK ? -(long long)rank : -(long long)n};
    if (!c->mpi) return s;
    uint64_t fid = dtc_rec_begin(c, DT_FOP_AGREE, sizeof v, -1, 1);
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
