#include "aio.h"

#include <errno.h>
#include <liburing.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* io_uring takes 32-bit lengths (and read/write stop near 2 GiB): larger transfers go in
 * pieces, through the same path as a short transfer's rest. */
#define AIO_PIECE ((size_t)1 << 30)

typedef enum { OP_IDLE, OP_BUSY, OP_DONE } op_state;

typedef struct {
    unsigned char *buf;
    size_t len, done;
    off_t off;
    int write, err, ended; /* err: errno; ended: a transfer moved 0 bytes (end of file, no room) */
    op_state st;
} aio_op;

struct dt_aio {
    struct io_uring ring;
    int fd, depth;
    aio_op *op;
    _Atomic double read_bytes, write_bytes; /* read by the metrics while a delayed update's thread does I/O */
    char path[]; /* for messages */
};

/* Queues the rest of the tag's transfer and submits it; a failure finishes the op. */
static void push(dt_aio *a, int tag) {
    aio_op *o = &a->op[tag];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&a->ring);
    if (!sqe) { /* cannot happen: at most depth ops, each with one entry queued */
        o->err = EBUSY;
        o->st = OP_DONE;
        return;
    }
    size_t len = o->len - o->done;
    if (len > AIO_PIECE) len = AIO_PIECE;
    if (o->write)
        io_uring_prep_write(sqe, a->fd, o->buf + o->done, (unsigned)len, (uint64_t)(o->off + (off_t)o->done));
    else
        io_uring_prep_read(sqe, a->fd, o->buf + o->done, (unsigned)len, (uint64_t)(o->off + (off_t)o->done));
    io_uring_sqe_set_data(sqe, (void *)(uintptr_t)tag);
    int r;
    do r = io_uring_submit(&a->ring);
    while (r == -EINTR || r == -EAGAIN);
    if (r < 0) {
        o->err = -r;
        o->st = OP_DONE;
    }
}

/* One completion: progress, a resubmission of the rest, or the op's end. */
static void reap(dt_aio *a, struct io_uring_cqe *cqe) {
    uintptr_t tag = (uintptr_t)io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&a->ring, cqe);
    if (tag >= (uintptr_t)a->depth || a->op[tag].st != OP_BUSY) return;
    aio_op *o = &a->op[tag];
    if (res == -EINTR || res == -EAGAIN) {
        push(a, (int)tag);
    } else if (res < 0) {
        o->err = -res;
        o->st = OP_DONE;
    } else if (res == 0) {
        o->ended = 1;
        o->st = OP_DONE;
    } else {
        o->done += (size_t)res;
        *(o->write ? &a->write_bytes : &a->read_bytes) += res;
        if (o->done < o->len)
            push(a, (int)tag);
        else
            o->st = OP_DONE;
    }
}

/* Blocks for one completion; -errno when the ring itself fails. */
static int reap_one(dt_aio *a) {
    struct io_uring_cqe *cqe;
    int r;
    do r = io_uring_wait_cqe(&a->ring, &cqe);
    while (r == -EINTR);
    if (r < 0) return r;
    reap(a, cqe);
    return 0;
}

dt_status dt_aio_open(dt_aio **out, int fd, int depth, const char *path) {
    *out = NULL;
    if (depth < 1) return dt_fail(DT_ERUNTIME, "offload file '%s': I/O queue depth %d", path, depth);
    dt_aio *a = calloc(1, sizeof *a + strlen(path) + 1);
    if (!a || !(a->op = calloc((size_t)depth, sizeof *a->op))) {
        free(a);
        return dt_fail(DT_ERUNTIME, "offload file '%s': out of memory for the I/O queue", path);
    }
    int r = io_uring_queue_init((unsigned)depth, &a->ring, 0);
    if (r < 0) {
        free(a->op);
        free(a);
        if (r == -ENOSYS || r == -EPERM)
            return dt_fail(DT_EINPUT,
                           "offload file '%s': io_uring is not available here (io_uring_queue_init: %s): the kernel "
                           "or the container forbids it (sysctl kernel.io_uring_disabled, seccomp); nvme offload "
                           "needs it (use offload cpu)",
                           path, strerror(-r));
        return dt_fail(DT_ERUNTIME, "offload file '%s': io_uring_queue_init: %s", path, strerror(-r));
    }
    a->fd = fd;
    a->depth = depth;
    strcpy(a->path, path);
    *out = a;
    return DT_OK;
}

void dt_aio_close(dt_aio *a) {
    if (!a) return;
    for (int t = 0; t < a->depth; t++)
        while (a->op[t].st == OP_BUSY)
            if (reap_one(a) < 0) goto out; /* the ring is broken: nothing more will complete */
out:
    io_uring_queue_exit(&a->ring);
    free(a->op);
    free(a);
}

static dt_status start(dt_aio *a, int tag, int write, void *buf, size_t len, off_t off) {
    if (tag < 0 || tag >= a->depth || a->op[tag].st != OP_IDLE)
        return dt_fail(DT_ERUNTIME, "offload file '%s': I/O tag %d is not idle", a->path, tag);
    a->op[tag] = (aio_op){.buf = buf, .len = len, .off = off, .write = write, .st = OP_BUSY};
    if (len == 0)
        a->op[tag].st = OP_DONE;
    else
        push(a, tag);
    return DT_OK;
}

dt_status dt_aio_read(dt_aio *a, int tag, void *buf, size_t len, off_t off) { return start(a, tag, 0, buf, len, off); }

dt_status dt_aio_write(dt_aio *a, int tag, const void *buf, size_t len, off_t off) {
    return start(a, tag, 1, (void *)buf, len, off); /* the kernel only reads it */
}

void dt_aio_poll(dt_aio *a) {
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&a->ring, &cqe) == 0) reap(a, cqe);
}

int dt_aio_busy(const dt_aio *a, int tag) { return a->op[tag].st == OP_BUSY; }
int dt_aio_pending(const dt_aio *a, int tag) { return a->op[tag].st != OP_IDLE; }

/* The finished op's outcome; the tag becomes idle. */
static dt_status collect(dt_aio *a, int tag) {
    aio_op *o = &a->op[tag];
    o->st = OP_IDLE;
    const char *what = o->write ? "write" : "read";
    if (o->err)
        return dt_fail(DT_ERUNTIME, "offload file '%s': %s of %zu bytes at offset %lld failed: %s", a->path, what,
                       o->len, (long long)o->off, strerror(o->err));
    if (o->ended)
        return dt_fail(DT_ERUNTIME, "offload file '%s': %s of %zu bytes at offset %lld stopped after %zu bytes (%s)",
                       a->path, what, o->len, (long long)o->off, o->done,
                       o->write ? "no room?" : "the file is shorter than the store: changed by another program?");
    return DT_OK;
}

dt_status dt_aio_wait(dt_aio *a, int tag) {
    while (a->op[tag].st == OP_BUSY) {
        int r = reap_one(a);
        if (r < 0) return dt_fail(DT_ERUNTIME, "offload file '%s': io_uring_wait_cqe: %s", a->path, strerror(-r));
    }
    return a->op[tag].st == OP_DONE ? collect(a, tag) : DT_OK;
}

dt_status dt_aio_wait_any(dt_aio *a, int *tag) {
    for (;;) {
        int busy = 0;
        for (int t = 0; t < a->depth; t++) {
            if (a->op[t].st == OP_DONE) {
                *tag = t;
                return collect(a, t);
            }
            busy |= a->op[t].st == OP_BUSY;
        }
        if (!busy) {
            *tag = -1;
            return DT_OK;
        }
        int r = reap_one(a);
        if (r < 0) {
            *tag = -1;
            return dt_fail(DT_ERUNTIME, "offload file '%s': io_uring_wait_cqe: %s", a->path, strerror(-r));
        }
    }
}

double dt_aio_read_bytes(const dt_aio *a) { return a->read_bytes; }
double dt_aio_write_bytes(const dt_aio *a) { return a->write_bytes; }
