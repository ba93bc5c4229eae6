/* Point-to-point: blocking dt_send/dt_recv and non-blocking dt_isend/dt_irecv (MPI's, in
 * pieces of DTC_PIECE elements; in a world without MPI, sends to self matched to receives
 * from self). Their completion is nonblocking.c's dt_wait/dt_test. */
#include <stdlib.h>
#include <string.h>

#include "comm_core.h"

/* self: whether the peer may be this rank (the non-blocking calls) */
static dt_status check_peer(const dt_comm *c, const char *op, const void *buf, size_t count, dt_dtype t, int peer,
                            int tag, int self) {
    if (!dtc_dtype_ok(t)) return dt_fail(DT_EINPUT, "%s: unknown dtype %d", op, (int)t);
    if (peer < 0 || peer >= c->size || (peer == c->rank && !self))
        return dt_fail(DT_EINPUT, "%s: peer rank %d is not %s rank of this communicator (rank %d of %d)", op, peer,
                       self ? "a" : "another", c->rank, c->size);
    if (tag < 0) return dt_fail(DT_EINPUT, "%s: tag %d is negative", op, tag);
    if (count && !buf) return dt_fail(DT_EINPUT, "%s: NULL buffer with count %zu", op, count);
    return DT_OK;
}

/* Blocking send or receive, in the same pieces as dt_isend/dt_irecv (so either side may
 * be non-blocking). */
static dt_status p2p_blocking(dt_comm *c, int is_send, void *buf, size_t count, dt_dtype t, int peer, int tag) {
    const char *name = is_send ? "send" : "recv";
    DT_TRY(check_peer(c, name, buf, count, t, peer, tag, 0));
    size_t es = dt_dtype_size(t);
    size_t o = 0;
    uint64_t fid = dtc_rec_begin(c, is_send ? DT_FOP_SEND : DT_FOP_RECV, count * es, peer, 1);
    do { /* a zero count still sends one (empty) message to match the receive */
        int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
        char *p = (char *)buf + o * es;
        dt_status st = is_send ? dtc_mpi(&c->fg, MPI_Send(p, n, dtc_mpi_type(t), peer, tag, c->user), "MPI_Send")
                               : dtc_mpi(&c->fg, MPI_Recv(p, n, dtc_mpi_type(t), peer, tag, c->user, MPI_STATUS_IGNORE),
                                         "MPI_Recv");
        if (st) {
            dtc_watch_end(fid, 0);
            return dtc_lane_fail(&c->fg, st, name, DT_ALGO_MPI, count, t);
        }
        o += DTC_PIECE;
    } while (o < count);
    dtc_watch_end(fid, 1);
    return DT_OK;
}

dt_status dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag) {
    return p2p_blocking(c, 1, (void *)buf, count, t, dst, tag); /* never written through */
}

dt_status dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag) {
    return p2p_blocking(c, 0, buf, count, t, src, tag);
}

/* A world without MPI: r (a send to or receive from self) completes with the oldest
 * unmatched opposite request of its tag, as MPI would match them, or waits in c->self_q. */
static dt_status self_post(dt_comm *c, dt_request *r) {
    for (dt_request **pp = &c->self_q; *pp; pp = &(*pp)->next) {
        dt_request *q = *pp;
        if (q->is_send == r->is_send || q->tag != r->tag) continue;
        if (q->count != r->count || q->t != r->t)
            return dt_fail(DT_EINPUT, "%s self (tag %d): %zu x %s, but the matching %s has %zu x %s",
                           r->is_send ? "send to" : "receive from", r->tag, r->count, dt_dtype_name(r->t),
                           q->is_send ? "send" : "receive", q->count, dt_dtype_name(q->t));
        const dt_request *s = r->is_send ? r : q;
        dt_request *d = r->is_send ? q : r;
        if (r->count) memcpy(d->recv, s->send, r->count * dt_dtype_size(r->t));
        *pp = q->next;
        q->kind = REQ_DONE;
        r->kind = REQ_DONE;
        return DT_OK;
    }
    r->kind = REQ_SELF;
    r->next = NULL;
    dt_request **tail = &c->self_q;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    return DT_OK;
}

static dt_status p2p_start(dt_comm *c, int is_send, void *buf, size_t count, dt_dtype t, int peer, int tag,
                           dt_request **req) {
    const char *name = is_send ? "isend" : "irecv";
    *req = NULL;
    DT_TRY(check_peer(c, name, buf, count, t, peer, tag, 1));
    if (count > DTC_PIECE * DTC_MAX_MREQ) return dt_fail(DT_EINPUT, "%s: count %zu is too large", name, count);
    dt_request *r = NULL;
    DT_TRY(dtc_request_new(c, name, buf, buf, count, t, &r));
    r->is_send = is_send;
    r->tag = tag;
    dt_status st = DT_OK;
    if (!c->mpi) {
        st = self_post(c, r);
    } else {
        /* the same pieces as dt_send/dt_recv, so either side may be blocking */
        dtc_ctx *x = &c->fg;
        size_t es = dt_dtype_size(t), o = 0;
        r->kind = REQ_MPI;
        r->fid = dtc_rec_begin(c, is_send ? DT_FOP_SEND : DT_FOP_RECV, count * es, peer, 0);
        do {
            int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
            char *p = (char *)buf + o * es;
            MPI_Request *mr = &r->mreq[r->nmreq++];
            st = is_send ? dtc_mpi(x, MPI_Isend(p, n, dtc_mpi_type(t), peer, tag, c->user, mr), "MPI_Isend")
                         : dtc_mpi(x, MPI_Irecv(p, n, dtc_mpi_type(t), peer, tag, c->user, mr), "MPI_Irecv");
            o += DTC_PIECE;
        } while (!st && o < count);
        if (st) {
            dtc_watch_end(r->fid, 0);
            st = dtc_lane_fail(x, st, name, DT_ALGO_MPI, count, t); /* started pieces are abandoned */
        }
    }
    return dtc_request_out(r, st, req);
}

dt_status dt_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request **req) {
    return p2p_start(c, 1, (void *)buf, count, t, dst, tag, req); /* never written through */
}

dt_status dt_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request **req) {
    return p2p_start(c, 0, buf, count, t, src, tag, req);
}
