/* Non-blocking collectives and the completion of every request: MPI's own non-blocking
 * collectives, or a per-communicator thread that runs our algorithms in issue order on
 * its own lane (comm_core.h). */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_core.h"

dt_status dtc_request_new(dt_comm *c, const char *op, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_request **out) {
    dt_request *r = calloc(1, sizeof *r);
    if (!r) return dt_fail(DT_ERUNTIME, "%s: out of memory", op);
    r->c = c;
    r->kind = REQ_DONE;
    r->send = send;
    r->recv = recv;
    r->count = count;
    r->t = t;
    *out = r;
    return DT_OK;
}

dt_status dtc_request_out(dt_request *r, dt_status st, dt_request **req) {
    if (st) {
        free(r);
        return st;
    }
    *req = r;
    return DT_OK;
}

static void *comm_thread(void *arg) {
    dt_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stop) pthread_cond_wait(&c->work, &c->mu);
        dt_request *r = c->head;
        if (!r) break; /* stopping, queue drained */
        c->head = r->next;
        if (!c->head) c->tail = NULL;
        pthread_mutex_unlock(&c->mu);
        dtc_ctx *x = c->bg;
        dt_status st = dtc_run_ours(x, r->coll, r->algo, r->send, r->recv, r->count, r->t, r->op,
                                    dtc_scale_of(c, r->op), 0, r->reg, r->reg_off);
        if (st)
            snprintf(r->err, sizeof r->err, "%s (%s, %zu x %s): %s", dtc_coll_op(r->coll), dt_algo_name(r->algo),
                     r->count, dt_dtype_name(r->t), x->err[0] ? x->err : "failed");
        x->err[0] = 0;
        pthread_mutex_lock(&c->mu);
        r->st = st;
        r->done = 1; /* r may be freed by its waiter as soon as mu is released */
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* The background lane and thread, made at the first non-blocking call of ours (every
 * rank makes the same calls in the same order, so the collective dup matches). */
static dt_status start_thread(dt_comm *c) {
    if (!c->bg) {
        dtc_ctx *x = calloc(1, sizeof *x);
        if (!x) return dt_fail(DT_ERUNTIME, "communication thread: out of memory");
        dt_status st = dtc_ctx_init(x, c->user, c->rank, c->size);
        if (st) {
            st = dt_fail(st, "communication thread setup: %s", x->err);
            dtc_ctx_free(x);
            free(x);
            return st;
        }
        c->bg = x;
    }
    if (!c->thr_on) {
        c->stop = 0;
        if (pthread_create(&c->thr, NULL, comm_thread, c) != 0)
            return dt_fail(DT_ERUNTIME, "communication thread: pthread_create failed");
        c->thr_on = 1;
    }
    return DT_OK;
}

static dt_status istart(dt_comm *c, dt_coll coll, const void *send, void *recv, size_t count, dt_dtype t,
                        dt_redop op, dt_request **req) {
    const char *name = dtc_coll_op(coll);
    *req = NULL;
    DT_TRY(dtc_check_args(c, name, send, recv, count, t, op, 0));
    dt_request *r = NULL;
    DT_TRY(dtc_request_new(c, name, send, recv, count, t, &r));
    dt_algo a = dtc_pick(c, coll, send, recv, count, t, &r->reg, &r->reg_off);
    dt_status st = DT_OK;
    if (c->size > 1) r->fid = dtc_rec_begin(c, dtc_fop_of(coll), dtc_coll_bytes(c, coll, count, t), -1, 0);
    if (c->size == 1) {
        dtc_local_coll(coll, send, recv, count, t);
    } else if (a == DT_ALGO_MPI) {
        dtc_ctx *x = &c->fg;
        MPI_Datatype mt = dtc_mpi_type(t);
        size_t es = dt_dtype_size(t);
        r->kind = REQ_MPI;
        if (coll == DT_COLL_ALLREDUCE) {
            if (count > DTC_PIECE * DTC_MAX_MREQ) st = dtc_fail(x, DT_EINPUT, "count too large for MPI_Iallreduce");
            for (size_t o = 0; o < count && !st; o += DTC_PIECE) {
                int n = (int)(count - o < DTC_PIECE ? count - o : DTC_PIECE);
                st = dtc_mpi(x,
                             MPI_Iallreduce(MPI_IN_PLACE, (char *)recv + o * es, n, mt, dtc_mpi_op(t, op), c->user,
                                            &r->mreq[r->nmreq++]),
                             "MPI_Iallreduce");
            }
        } else if (count > INT_MAX) {
            st = dtc_fail(x, DT_EINPUT, "count exceeds MPI's int limit");
        } else if (coll == DT_COLL_REDUCE_SCATTER) {
            /* in place: the result arrives at the front of the buffer (see mpi_coll) */
            char *front = dtc_rs_in_place(c, send, recv, count, t) ? (char *)recv - (size_t)c->rank * count * es : NULL;
            st = dtc_mpi(x,
                         MPI_Ireduce_scatter_block(front ? MPI_IN_PLACE : send, front ? front : recv, (int)count, mt,
                                                   dtc_mpi_op(t, op), c->user, &r->mreq[r->nmreq++]),
                         "MPI_Ireduce_scatter_block");
            if (front && front != recv) {
                r->move_src = front;
                r->move_dst = recv;
            }
        } else {
            int inplace = send == (const char *)recv + (size_t)c->rank * count * es;
            st = dtc_mpi(x,
                         MPI_Iallgather(inplace ? MPI_IN_PLACE : send, (int)count, mt, recv, (int)count, mt, c->user,
                                        &r->mreq[r->nmreq++]),
                         "MPI_Iallgather");
        }
        if (coll != DT_COLL_ALLGATHER) {
            r->scale_buf = recv;
            r->scale_n = count;
            r->scale = dtc_scale_of(c, op);
        }
        r->t = t;
        if (st) st = dtc_lane_fail(x, st, name, a, count, t); /* started pieces are abandoned with the error */
    } else if (!c->threads) {
        /* MPI without thread support: ours run here, before returning */
        dtc_watch_waiting(r->fid);
        st = dtc_lane_fail(
            &c->fg, dtc_run_ours(&c->fg, coll, a, send, recv, count, t, op, dtc_scale_of(c, op), 0, r->reg, r->reg_off),
            name, a, count, t);
    } else {
        st = start_thread(c);
        if (!st) {
            r->kind = REQ_THREAD;
            r->coll = coll;
            r->algo = a;
            r->op = op;
            pthread_mutex_lock(&c->mu);
            if (c->tail) c->tail->next = r;
            else c->head = r;
            c->tail = r;
            pthread_cond_signal(&c->work);
            pthread_mutex_unlock(&c->mu);
        }
    }
    if (st || r->kind == REQ_DONE) dtc_watch_end(r->fid, !st);
    return dtc_request_out(r, st, req);
}

dt_status dt_iallreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op, dt_request **req) {
    return istart(c, DT_COLL_ALLREDUCE, buf, buf, count, t, op, req);
}

dt_status dt_ireduce_scatter(dt_comm *c, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op,
                             dt_request **req) {
    return istart(c, DT_COLL_REDUCE_SCATTER, send, recv, recvcount, t, op, req);
}

dt_status dt_iallgather(dt_comm *c, const void *send, void *recv, size_t sendcount, dt_dtype t, dt_request **req) {
    return istart(c, DT_COLL_ALLGATHER, send, recv, sendcount, t, DT_SUM, req);
}
/* MPI's requests finished: move an in-place reduce-scatter's result into place, apply
 * the mean and mark done. */
static void mpi_finish(dt_request *r) {
    if (r->move_src) memcpy(r->move_dst, r->move_src, r->scale_n * dt_dtype_size(r->t));
    if (r->scale_buf) dtc_scale(r->scale_buf, r->scale_n, r->t, r->scale);
    r->kind = REQ_DONE;
}

dt_status dt_test(dt_request *r, int *done) {
    *done = 0;
    if (!r) return dt_fail(DT_EINPUT, "test: NULL request");
    if (r->kind == REQ_DONE) {
        *done = 1;
    } else if (r->kind == REQ_MPI) {
        int flag = 0;
        dtc_ctx *x = &r->c->fg;
        dt_status st = dtc_mpi(x, MPI_Testall(r->nmreq, r->mreq, &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
        if (st) {
            st = dt_fail(st, "non-blocking collective: %s", x->err);
            x->err[0] = 0;
            return st;
        }
        if (flag) {
            mpi_finish(r);
            *done = 1;
        }
    } else if (r->kind == REQ_THREAD) {
        pthread_mutex_lock(&r->c->mu);
        *done = r->done;
        pthread_mutex_unlock(&r->c->mu);
    } /* REQ_SELF: not until its match is posted */
    if (*done && r->fid) {
        dtc_watch_end(r->fid, 1);
        r->fid = 0;
    }
    return DT_OK;
}

dt_status dt_wait(dt_request *r) {
    if (!r) return dt_fail(DT_EINPUT, "wait: NULL request");
    dt_status st = DT_OK;
    if (r->fid) dtc_watch_waiting(r->fid); /* from here this rank waits on it */
    if (r->kind == REQ_MPI) {
        dtc_ctx *x = &r->c->fg;
        st = dtc_mpi(x, MPI_Waitall(r->nmreq, r->mreq, MPI_STATUSES_IGNORE), "MPI_Waitall");
        if (st) {
            st = dt_fail(st, "non-blocking collective: %s", x->err);
            x->err[0] = 0;
        } else {
            mpi_finish(r);
        }
    } else if (r->kind == REQ_THREAD) {
        dt_comm *c = r->c;
        pthread_mutex_lock(&c->mu);
        while (!r->done) pthread_cond_wait(&c->done, &c->mu);
        pthread_mutex_unlock(&c->mu);
        st = r->st;
        if (st) dt_fail(st, "%s", r->err);
    } else if (r->kind == REQ_SELF) { /* nothing else could ever match it */
        dt_request **pp = &r->c->self_q;
        while (*pp && *pp != r) pp = &(*pp)->next;
        if (*pp) *pp = r->next;
        st = dt_fail(DT_ERUNTIME, "wait: %s self (tag %d) has no matching %s posted, so it would never complete",
                     r->is_send ? "send to" : "receive from", r->tag, r->is_send ? "receive" : "send");
    }
    if (r->fid) dtc_watch_end(r->fid, !st);
    free(r);
    return st;
}
