#include "outer_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../comm/outer_link.h"
#include "../core/timer.h"
#include "../parallel/data_parallel/local_sgd.h"
#include "launch.h"

#define MAX_CONNS 4096
#define MAX_SLOTS 65536

typedef struct {
    int fd, replica, slot;
    int state; /* 0: no hello yet; 1: hello waiting for its slot's round to end; 2: in the rounds */
    int contributed, with_momentum;
    long long step; /* its hello's or its change's */
    double seen;    /* when its last message arrived */
    size_t n;
    float *buf; /* its change; a hello's weights and momentum until they start the slot */
} conn;

typedef struct {
    int init, with_momentum;
    long long step; /* of the synchronised weights */
    size_t n;
    float *theta, *mom, *sum;
    double since; /* when the round's first change arrived; 0: no round open */
} slot_state;

typedef struct {
    const dt_outer_server_opts *o;
    conn conns[MAX_CONNS];
    int nconns;
    slot_state *slots;
    int nslots;
    char expected[4096]; /* replicas every round waits for until their job ends: all at the start */
} server;

dt_status dt_outer_listen(int *fd, int *port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (s < 0) return dt_fail(DT_ERUNTIME, "launch: outer server: socket: %s", strerror(errno));
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = 0};
    socklen_t len = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 256) || getsockname(s, (struct sockaddr *)&a, &len)) {
        int e = errno;
        close(s);
        return dt_fail(DT_ERUNTIME, "launch: outer server: cannot listen: %s", strerror(e));
    }
    *fd = s;
    *port = ntohs(a.sin_port);
    return DT_OK;
}

/* Replica j's job ended (or one of its connections failed, so it is ending): no round
 * waits for it any more; restarted, it joins as a latecomer. */
static void ended(server *S, int j, const char *why) {
    int said = 0;
    for (int i = 0; i < S->nconns; i++) {
        conn *c = &S->conns[i];
        if (c->state < 1 || c->replica != j) continue;
        if (!said && (S->expected[j] || c->state == 2))
            dt_launch_say("outer server: replica %d left (%s); the others go on", j, why);
        said = 1;
        close(c->fd);
        free(c->buf);
        *c = S->conns[--S->nconns]; /* the last takes its place */
        i--;
    }
    S->expected[j] = 0;
}

static void drop(server *S, conn *c, const char *why) {
    if (c->state >= 1) {
        ended(S, c->replica, why);
        return;
    }
    close(c->fd);
    free(c->buf);
    *c = S->conns[--S->nconns];
}

static int send_join(server *S, conn *c) {
    slot_state *s = &S->slots[c->slot];
    dt_outer_msg h = {DT_OUTER_MAGIC, DT_OUTER_JOIN, c->replica, c->slot, s->step, s->n, 0, s->with_momentum};
    if (dt_outer_send(c->fd, &h, s->theta, s->with_momentum ? s->mom : NULL) != DT_OK) return -1;
    if (c->slot == 0 && !S->expected[c->replica])
        dt_launch_say("outer server: replica %d joins the others at step %lld", c->replica, s->step);
    c->state = 2;
    c->contributed = 0;
    return 0;
}

/* Whether replica r has sent its change for slot `slot`'s open round; -1: it is not in
 * the round (not expected, not joined to the slot). */
static int contributed(server *S, int slot, int r, int *at) {
    for (int i = 0; i < S->nconns; i++) {
        conn *c = &S->conns[i];
        if (c->slot == slot && c->state == 2 && c->replica == r) {
            *at = i;
            return c->contributed;
        }
    }
    return S->expected[r] ? 0 : -1;
}

/* A slot's round ends when every replica in it has sent its change (replicas expected
 * from the start, and those joined to the slot): the sum in replica order, the outer
 * step, the answers. Connections that fail on the way end their replica. */
static void close_round(server *S, int slot) {
    slot_state *s = &S->slots[slot];
    int count = 0, ends[4096], nends = 0;
    long long step = -1;
    for (int r = 0; r < S->o->replicas; r++) {
        int i = -1, got = contributed(S, slot, r, &i);
        if (got == 0) return;
        if (got < 0) continue;
        conn *c = &S->conns[i];
        if (step < 0) step = c->step;
        if (c->step != step) { /* cannot happen with replicas of one run: end the odd one */
            ends[nends++] = r;
            continue;
        }
        if (!count++) memcpy(s->sum, c->buf, s->n * sizeof(float));
        else
            for (size_t k = 0; k < s->n; k++) s->sum[k] += c->buf[k];
    }
    if (!count) return;
    dt_outer_step(s->theta, s->with_momentum ? s->mom : NULL, s->sum, s->n, count, (float)S->o->lr, (float)S->o->mu);
    s->step = step;
    s->since = 0.0;
    dt_outer_msg h = {DT_OUTER_MAGIC, DT_OUTER_SUM, 0, slot, step, s->n, count, 0};
    for (int i = 0; i < S->nconns; i++) {
        conn *c = &S->conns[i];
        if (c->slot != slot || c->state != 2 || !c->contributed) continue;
        c->contributed = 0;
        h.replica = c->replica;
        if (dt_outer_send(c->fd, &h, s->sum, NULL) != DT_OK) ends[nends++] = c->replica;
    }
    for (int e = 0; e < nends; e++) ended(S, ends[e], "its connection failed or its step was another's");
}

/* Hellos: a replica expected from the start joins a slot as soon as the slot has weights
 * (no round ends without it, so its ranks all get the same step); a latecomer (restarted)
 * joins when every slot is between rounds at the same step, all its slots at once. */
static void admit(server *S) {
    int quiet = S->nslots > 0;
    for (int sl = 0; sl < S->nslots && quiet; sl++)
        quiet = S->slots[sl].init && S->slots[sl].since == 0.0 && S->slots[sl].step == S->slots[0].step;
    for (int i = 0; i < S->nconns; i++) {
        conn *c = &S->conns[i];
        if (c->state != 1 || !S->slots[c->slot].init || !(S->expected[c->replica] || quiet)) continue;
        if (send_join(S, c)) {
            ended(S, c->replica, "its connection failed");
            i = -1; /* the table changed: again from the start */
        }
    }
}

static void settle(server *S) {
    for (int sl = 0; sl < S->nslots; sl++)
        if (S->slots[sl].init && S->slots[sl].since > 0.0) close_round(S, sl);
    admit(S);
}

static int fail(conn *c, const char *what) {
    fprintf(stderr, "dtrain launch: outer server: replica %d slot %d: %s\n", c->replica, c->slot, what);
    return -1;
}

/* One message from c; -1: drop it. */
static int on_message(server *S, conn *c) {
    dt_outer_msg h;
    if (dt_outer_read(c->fd, &h, sizeof h)) return -1;
    c->seen = dt_now();
    if (h.magic == DT_OUTER_MAGIC && h.kind == DT_OUTER_PROGRESS && c->state == 2) return 0; /* alive */
    if (h.magic != DT_OUTER_MAGIC || h.slot < 0 || h.slot >= MAX_SLOTS || h.replica < 0 ||
        h.replica >= S->o->replicas || h.count == 0 || h.count > ((size_t)1 << 34))
        return fail(c, "not an outer-server message");
    if (h.slot >= S->nslots) {
        int n = h.slot + 1;
        slot_state *g = realloc(S->slots, (size_t)n * sizeof *g);
        if (!g) return fail(c, "out of memory");
        memset(g + S->nslots, 0, (size_t)(n - S->nslots) * sizeof *g);
        S->slots = g;
        S->nslots = n;
    }
    slot_state *s = &S->slots[h.slot];
    size_t n = (size_t)h.count;
    if (s->init && n != s->n) return fail(c, "its piece of the model has another size");
    if (h.kind == DT_OUTER_HELLO) {
        if (c->state) return fail(c, "a second hello");
        c->replica = h.replica;
        c->slot = h.slot;
        c->step = h.step;
        c->n = n;
        c->with_momentum = h.with_momentum != 0;
        c->buf = malloc(n * sizeof(float) * (c->with_momentum ? 2 : 1));
        if (!c->buf) return fail(c, "out of memory");
        if (h.step >= 0 && dt_outer_read(c->fd, c->buf, n * sizeof(float) * (c->with_momentum ? 2 : 1))) return -1;
        c->state = 1;
        if (!s->init && h.step >= 0) { /* the slot starts from this replica's weights */
            s->n = n;
            s->with_momentum = c->with_momentum;
            s->theta = malloc(n * sizeof(float));
            s->mom = malloc(n * sizeof(float));
            s->sum = malloc(n * sizeof(float));
            if (!s->theta || !s->mom || !s->sum) return fail(c, "out of memory");
            memcpy(s->theta, c->buf, n * sizeof(float));
            if (c->with_momentum) memcpy(s->mom, c->buf + n, n * sizeof(float));
            else memset(s->mom, 0, n * sizeof(float));
            s->step = h.step;
            s->init = 1;
        }
        return 0;
    }
    if (h.kind != DT_OUTER_DELTA) return fail(c, "an unknown message");
    if (c->state != 2 || c->contributed || h.step <= s->step)
        return fail(c, "a change out of turn (not joined, sent twice, or for a step already synchronised)");
    if (dt_outer_read(c->fd, c->buf, n * sizeof(float))) return -1;
    c->step = h.step;
    c->contributed = 1;
    if (s->since == 0.0) s->since = dt_now();
    return 0;
}

void dt_outer_serve(int listen_fd, int ctl_fd, const dt_outer_server_opts *o) {
    static server S; /* large: not on the stack */
    static struct pollfd p[MAX_CONNS + 2];
    S.o = o;
    memset(S.expected, 1, sizeof S.expected);
    for (;;) {
        p[0] = (struct pollfd){listen_fd, POLLIN, 0};
        p[1] = (struct pollfd){ctl_fd, POLLIN, 0};
        int polled = S.nconns;
        for (int i = 0; i < polled; i++) p[i + 2] = (struct pollfd){S.conns[i].fd, POLLIN, 0};
        if (poll(p, (nfds_t)polled + 2, 1000) < 0 && errno != EINTR) return;
        if (p[1].revents) { /* the launcher: replica j's job ended; EOF: the launcher is gone */
            int j;
            if (read(ctl_fd, &j, sizeof j) != (ssize_t)sizeof j) return;
            if (j >= 0 && j < o->replicas) ended(&S, j, "its job ended");
        }
        if (p[0].revents & POLLIN) {
            int fd = accept(listen_fd, NULL, NULL);
            if (fd >= 0 && S.nconns == MAX_CONNS) close(fd);
            else if (fd >= 0) {
                struct timeval tv = {60, 0}; /* a message half sent by a stopped process does not stall the rest */
                int one = 1;
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                S.conns[S.nconns++] = (conn){.fd = fd, .slot = -1, .seen = dt_now()};
            }
        }
        /* by fd: an ended replica's connections leave the table, the last ones moving */
        int fds[MAX_CONNS], nready = 0;
        for (int i = 0; i < polled; i++)
            if (p[i + 2].revents) fds[nready++] = p[i + 2].fd;
        for (int k = 0; k < nready; k++) {
            int i = 0;
            while (i < S.nconns && S.conns[i].fd != fds[k]) i++;
            if (i == S.nconns) continue;
            if (on_message(&S, &S.conns[i])) drop(&S, &S.conns[i], "its connection closed: its job ended or failed");
        }
        double now = dt_now();
        for (int sl = 0; o->timeout > 0 && sl < S.nslots; sl++) {
            if (S.slots[sl].since == 0.0 || now - S.slots[sl].since < o->timeout) continue;
            for (int r = 0; r < o->replicas; r++) { /* silent (no change, no progress) for comm.timeout */
                int at = -1;
                if (contributed(&S, sl, r, &at) != 0 || (at >= 0 && now - S.conns[at].seen < o->timeout)) continue;
                ended(&S, r, "neither its change nor progress for comm.timeout while the others waited");
                if (write(ctl_fd, &r, sizeof r) != (ssize_t)sizeof r) return; /* the launcher ends its job */
            }
        }
        settle(&S);
    }
}
