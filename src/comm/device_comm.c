#include "device_comm.h"

#include <stdlib.h>

struct dt_dcomm {
    const dt_dcomm_impl *ops;
    void *impl;
};

dt_status dt_dcomm_wrap(const dt_dcomm_impl *ops, void *impl, dt_dcomm **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) {
        ops->destroy(impl, 0);
        return dt_fail(DT_ERUNTIME, "out of memory (device communicator)");
    }
    (*out)->ops = ops;
    (*out)->impl = impl;
    return DT_OK;
}

void dt_dcomm_free(dt_dcomm *d, int abort) {
    if (!d) return;
    d->ops->destroy(d->impl, abort);
    free(d);
}

const char *dt_dcomm_name(const dt_dcomm *d) { return d->ops->name; }

dt_status dt_dcomm_allreduce(dt_dcomm *d, void *buf, size_t count, dt_dtype t, dt_redop op) {
    return d->ops->allreduce(d->impl, buf, count, t, op);
}
dt_status dt_dcomm_reduce_scatter(dt_dcomm *d, const void *send, void *recv, size_t recvcount, dt_dtype t,
                                  dt_redop op) {
    return d->ops->reduce_scatter(d->impl, send, recv, recvcount, t, op);
}
dt_status dt_dcomm_allgather(dt_dcomm *d, const void *send, void *recv, size_t sendcount, dt_dtype t) {
    return d->ops->allgather(d->impl, send, recv, sendcount, t);
}
dt_status dt_dcomm_join(dt_dcomm *d) { return d->ops->join(d->impl); }
dt_status dt_dcomm_mark(dt_dcomm *d) { return d->ops->mark(d->impl); }
dt_status dt_dcomm_join_mark(dt_dcomm *d) { return d->ops->join_mark(d->impl); }

/* ---- the emulated device: its kernels run synchronously, so each collective runs at
 * once, blocking, on the host memory behind the device addresses ---- */

typedef struct {
    dt_comm *c;
    void *(*to_host)(const void *dev);
} emulated;

static dt_status em_allreduce(void *p, void *buf, size_t count, dt_dtype t, dt_redop op) {
    emulated *e = p;
    return dt_allreduce(e->c, e->to_host(buf), count, t, op);
}
static dt_status em_reduce_scatter(void *p, const void *send, void *recv, size_t recvcount, dt_dtype t, dt_redop op) {
    emulated *e = p;
    return dt_reduce_scatter(e->c, e->to_host(send), e->to_host(recv), recvcount, t, op);
}
static dt_status em_allgather(void *p, const void *send, void *recv, size_t sendcount, dt_dtype t) {
    emulated *e = p;
    return dt_allgather(e->c, e->to_host(send), e->to_host(recv), sendcount, t);
}
static dt_status em_join(void *p) {
    (void)p;
    return DT_OK;
}
static void em_destroy(void *p, int abort) {
    (void)abort;
    free(p);
}

static const dt_dcomm_impl EMULATED = {em_allreduce, em_reduce_scatter, em_allgather, em_join, em_join, em_join,
                                       em_destroy, "emulated device"};

dt_status dt_dcomm_emulated(dt_comm *c, void *(*to_host)(const void *dev), dt_dcomm **out) {
    emulated *e = calloc(1, sizeof *e);
    if (!e) return dt_fail(DT_ERUNTIME, "out of memory (device communicator)");
    e->c = c;
    e->to_host = to_host;
    return dt_dcomm_wrap(&EMULATED, e, out);
}
