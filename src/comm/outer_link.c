#include "outer_link.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/timer.h"

int dt_outer_read(int fd, void *buf, size_t bytes) {
    char *p = buf;
    while (bytes > 0) {
        ssize_t r = read(fd, p, bytes);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = ECONNRESET;
            return -1;
        }
        p += r;
        bytes -= (size_t)r;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t bytes) {
    const char *p = buf;
    while (bytes > 0) {
        ssize_t w = send(fd, p, bytes, MSG_NOSIGNAL); /* a closed peer is an error, not SIGPIPE */
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        bytes -= (size_t)w;
    }
    return 0;
}

dt_status dt_outer_send(int fd, const dt_outer_msg *h, const float *a, const float *b) {
    size_t bytes = (size_t)h->count * sizeof(float);
    if (write_all(fd, h, sizeof *h) || (a && write_all(fd, a, bytes)) || (b && write_all(fd, b, bytes)))
        return dt_fail(DT_ERUNTIME, "outer server link: send: %s", strerror(errno));
    return DT_OK;
}

dt_status dt_outer_connect(dt_outer_link *l, const char *addr, int replica, int slot, double wait) {
    l->fd = -1;
    l->replica = replica;
    l->slot = slot;
    char host[256], port[32];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || strlen(colon + 1) >= sizeof port)
        return dt_fail(DT_EINPUT, "DTRAIN_OUTER_ADDR '%s' is not host:port", addr);
    snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
    snprintf(port, sizeof port, "%s", colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) return dt_fail(DT_ERUNTIME, "outer server %s: %s", addr, gai_strerror(rc));
    double t0 = dt_now();
    int err = 0;
    for (;;) {
        for (struct addrinfo *a = res; a && l->fd < 0; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) l->fd = fd;
            else {
                err = errno;
                close(fd);
            }
        }
        if (l->fd >= 0 || dt_now() - t0 > wait) break;
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    freeaddrinfo(res);
    if (l->fd < 0) return dt_fail(DT_ERUNTIME, "outer server %s: cannot connect: %s", addr, strerror(err));
    int one = 1; /* a message is written whole, then waited for: no Nagle delay */
    setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return DT_OK;
}

void dt_outer_close(dt_outer_link *l) {
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
}

/* The server's answer of `kind` for `n` floats per array. */
static dt_status expect(dt_outer_link *l, uint32_t kind, size_t n, dt_outer_msg *h) {
    if (dt_outer_read(l->fd, h, sizeof *h))
        return dt_fail(DT_ERUNTIME, "outer server link (slot %d): the server closed the connection: %s", l->slot,
                       strerror(errno));
    if (h->magic != DT_OUTER_MAGIC || h->kind != kind || h->count != n)
        return dt_fail(DT_ERUNTIME, "outer server link (slot %d): unexpected answer (kind %u, %llu values; wanted "
                       "kind %u, %zu)", l->slot, h->kind, (unsigned long long)h->count, kind, n);
    return DT_OK;
}

dt_status dt_outer_join(dt_outer_link *l, long long step, float *theta, float *mom, size_t n, long long *at) {
    dt_outer_msg h = {DT_OUTER_MAGIC, DT_OUTER_HELLO, l->replica, l->slot, step, n, 0, mom != NULL};
    DT_TRY(dt_outer_send(l->fd, &h, step >= 0 ? theta : NULL, step >= 0 ? mom : NULL));
    DT_TRY(expect(l, DT_OUTER_JOIN, n, &h));
    if (dt_outer_read(l->fd, theta, n * sizeof(float)) ||
        (h.with_momentum && dt_outer_read(l->fd, mom, n * sizeof(float))))
        return dt_fail(DT_ERUNTIME, "outer server link (slot %d): reading the weights: %s", l->slot, strerror(errno));
    if (h.step < step)
        return dt_fail(DT_ERUNTIME, "outer server link (slot %d): the server is at step %lld, behind this "
                       "replica's %lld", l->slot, (long long)h.step, step);
    *at = h.step;
    return DT_OK;
}

dt_status dt_outer_reduce(dt_outer_link *l, long long step, float *delta, size_t n, int *contributors) {
    dt_outer_msg h = {DT_OUTER_MAGIC, DT_OUTER_DELTA, l->replica, l->slot, step, n, 0, 0};
    DT_TRY(dt_outer_send(l->fd, &h, delta, NULL));
    DT_TRY(expect(l, DT_OUTER_SUM, n, &h));
    if (h.step != step || h.contributors < 1)
        return dt_fail(DT_ERUNTIME, "outer server link (slot %d): answer for step %lld from %d replicas, wanted "
                       "step %lld", l->slot, (long long)h.step, h.contributors, step);
    if (dt_outer_read(l->fd, delta, n * sizeof(float)))
        return dt_fail(DT_ERUNTIME, "outer server link (slot %d): reading the sum: %s", l->slot, strerror(errno));
    *contributors = h.contributors;
    return DT_OK;
}

dt_status dt_outer_progress(dt_outer_link *l, long long step) {
    dt_outer_msg h = {DT_OUTER_MAGIC, DT_OUTER_PROGRESS, l->replica, l->slot, step, 0, 0, 0};
    return dt_outer_send(l->fd, &h, NULL, NULL);
}
