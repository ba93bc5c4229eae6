/* What ranks of one node share: the node all-gather of setup data, and node-shared
 * buffers (MPI-3 shared windows) that the shm algorithm reads in place. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mem.h"
#include "comm_core.h"

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

dt_status dt_comm_alloc_shared(dt_comm *c, size_t bytes, const char *what, void **out) {
    *out = NULL;
    int slot = 0; /* a free slot: every rank's table is alike, so all pick the same */
    while (slot < DTC_MAX_REGIONS && c->reg[slot].base) slot++;
    if (!c->mpi || c->size == 1 || !c->fg.one_node || slot == DTC_MAX_REGIONS) return dt_alloc(out, bytes, what);
    dtc_ctx *x = &c->fg;
    /* the same size everywhere, or offsets would not match across ranks */
    long long mm[2] = {(long long)bytes, -(long long)bytes};
    uint64_t fid = dtc_rec_begin(c, DT_FOP_ALLOC_SHARED, bytes, -1, 1);
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
