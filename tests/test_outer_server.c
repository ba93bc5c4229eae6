/* The outer server of `dtrain launch --replicas` (src/launch/outer_server.c) driven over
 * its TCP protocol by fake replicas: replica 0 brings the weights and the others take
 * them; a round waits for every replica expected, sums in replica order and runs the outer
 * step; a replica whose connection closes or whose job the launcher reports ended is left
 * out; a latecomer waits until no round is open and joins at the synchronised step; a
 * replica that sends progress is waited for, one silent past the timeout is dropped and
 * named to the launcher. */
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "check.h"
#include "comm/outer_link.h"
#include "launch/outer_server.h"
#include "parallel/data_parallel/local_sgd.h"

enum { N = 4 };

static pid_t serve(int replicas, double timeout, int *port, int *ctl) {
    int lfd, p[2];
    if (dt_outer_listen(&lfd, port) != DT_OK || socketpair(AF_UNIX, SOCK_STREAM, 0, p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[1]);
        dt_outer_server_opts o = {replicas, 1, 0.7, 0.9, timeout}; /* DiLoCo's outer step */
        dt_outer_serve(lfd, p[0], &o);
        _exit(0);
    }
    close(lfd);
    close(p[0]);
    *ctl = p[1];
    return pid;
}

static dt_outer_link replica(int port, int r) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    dt_outer_link l;
    if (dt_outer_connect(&l, addr, r, 0, 5.0) != DT_OK) l.fd = -1;
    return l;
}

static void send_hello(dt_outer_link *l, long long step, const float *theta, const float *mom) {
    dt_outer_msg h = {DT_OUTER_MAGIC, DT_OUTER_HELLO, l->replica, 0, step, N, 0, 1};
    dt_outer_send(l->fd, &h, step >= 0 ? theta : NULL, step >= 0 ? mom : NULL);
}
static void send_delta(dt_outer_link *l, long long step, const float *d) {
    dt_outer_msg h = {DT_OUTER_MAGIC, DT_OUTER_DELTA, l->replica, 0, step, N, 0, 0};
    dt_outer_send(l->fd, &h, d, NULL);
}
/* The next answer: its header, and its first array into a (and its second into b). */
static int answer(dt_outer_link *l, dt_outer_msg *h, float *a, float *b) {
    if (dt_outer_read(l->fd, h, sizeof *h)) return -1;
    if (dt_outer_read(l->fd, a, N * sizeof(float))) return -1;
    if (h->kind == DT_OUTER_JOIN && h->with_momentum && dt_outer_read(l->fd, b, N * sizeof(float))) return -1;
    return 0;
}
static int waiting(dt_outer_link *l, int ms) { /* nothing to read within ms */
    struct pollfd p = {l->fd, POLLIN, 0};
    return poll(&p, 1, ms) == 0;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    int port, ctl;
    pid_t srv = serve(3, 0.0, &port, &ctl);
    CHECK(srv > 0, "server started");
    float theta[N] = {1, 2, 3, 4}, mom[N] = {0}, got[N], gm[N], th[N], m[N] = {0};
    dt_outer_msg h;
    dt_outer_link a = replica(port, 0), b = replica(port, 1), c = replica(port, 2);
    CHECK(a.fd >= 0 && b.fd >= 0 && c.fd >= 0, "three replicas connected");

    /* replica 1 says hello before replica 0 has brought the weights: it waits for them */
    send_hello(&b, -1, NULL, NULL);
    CHECK(waiting(&b, 200), "no weights before replica 0's");
    send_hello(&a, 0, theta, mom);
    CHECK(!answer(&a, &h, got, gm) && h.kind == DT_OUTER_JOIN && h.step == 0 && !memcmp(got, theta, sizeof got),
          "replica 0 joins with its own weights");
    CHECK(!answer(&b, &h, got, gm) && h.kind == DT_OUTER_JOIN && h.step == 0 && !memcmp(got, theta, sizeof got),
          "replica 1 gets replica 0's weights");

    /* replica 2 is expected from the start: the round waits for it until the launcher says
     * its job ended; then 2 contribute */
    float d0[N] = {0.5f, -1, 2, 0}, d1[N] = {0.25f, 1, -1, 8}, sum[N];
    send_delta(&a, 4, d0);
    send_delta(&b, 4, d1);
    CHECK(waiting(&a, 200), "the round waits for replica 2 (expected, not yet joined)");
    int two = 2;
    CHECK(write(ctl, &two, sizeof two) == (ssize_t)sizeof two, "the launcher: replica 2's job ended");
    for (int i = 0; i < N; i++) sum[i] = d0[i] + d1[i];
    memcpy(th, theta, sizeof th);
    dt_outer_step(th, m, sum, N, 2, 0.7f, 0.9f);
    CHECK(!answer(&a, &h, got, NULL) && h.kind == DT_OUTER_SUM && h.step == 4 && h.contributors == 2 &&
              !memcmp(got, sum, sizeof got), "replica 0: the sum of 2 in replica order");
    CHECK(!answer(&b, &h, got, NULL) && h.contributors == 2 && !memcmp(got, sum, sizeof got), "replica 1 alike");

    /* replica 2's job restarted: a latecomer, while a round is open it waits; it joins at the
     * round's step with the server's weights and momentum (the outer step's, bit for bit) */
    dt_outer_close(&c);
    c = replica(port, 2);
    send_delta(&a, 8, d1);
    send_hello(&c, -1, NULL, NULL);
    CHECK(waiting(&c, 200), "a latecomer waits while a round is open");
    send_delta(&b, 8, d0);
    CHECK(!answer(&a, &h, got, NULL) && h.step == 8 && h.contributors == 2, "round at step 8 of the two");
    CHECK(!answer(&b, &h, got, NULL) && h.step == 8, "replica 1 answered");
    for (int i = 0; i < N; i++) sum[i] = d1[i] + d0[i];
    dt_outer_step(th, m, sum, N, 2, 0.7f, 0.9f);
    CHECK(!answer(&c, &h, got, gm) && h.kind == DT_OUTER_JOIN && h.step == 8 && !memcmp(got, th, sizeof got) &&
              !memcmp(gm, m, sizeof gm), "the latecomer joins at step 8 with the outer step's weights and momentum");

    /* now three in the round; replica 1's connection closes mid-round: the others go on */
    send_delta(&a, 12, d0);
    send_delta(&c, 12, d1);
    CHECK(waiting(&a, 200), "the round waits for replica 1");
    dt_outer_close(&b);
    CHECK(!answer(&a, &h, got, NULL) && h.step == 12 && h.contributors == 2 && got[3] == d0[3] + d1[3],
          "replica 1 gone: the round of replicas 0 and 2 (contributors %d)", h.contributors);
    CHECK(!answer(&c, &h, got, NULL) && h.contributors == 2, "replica 2 answered");

    /* a change for a step already synchronised ends that replica */
    send_delta(&c, 12, d1);
    CHECK(answer(&c, &h, got, NULL) != 0, "a stale change: the server closes the connection");
    dt_outer_close(&a);
    dt_outer_close(&c);
    close(ctl);
    int st;
    CHECK(waitpid(srv, &st, 0) == srv, "the server ends when the launcher's pipe closes");

    /* a round that waits past the timeout drops the silent replica */
    srv = serve(2, 0.5, &port, &ctl);
    a = replica(port, 0);
    b = replica(port, 1);
    send_hello(&a, 0, theta, mom);
    send_hello(&b, -1, NULL, NULL);
    CHECK(!answer(&a, &h, got, gm) && !answer(&b, &h, got, gm), "both joined");
    send_delta(&a, 4, d0);
    for (int i = 0; i < 6; i++) { /* replica 1 slow but training: 0.9 s of progress, past the 0.5 s timeout */
        dt_outer_progress(&b, i + 1);
        usleep(150000);
    }
    CHECK(waiting(&a, 0), "a replica that sends progress is waited for past the timeout");
    send_delta(&b, 4, d1);
    for (int i = 0; i < N; i++) sum[i] = d0[i] + d1[i];
    CHECK(!answer(&a, &h, got, NULL) && h.step == 4 && h.contributors == 2 && !memcmp(got, sum, sizeof got),
          "its change arrives: the round of both");
    CHECK(!answer(&b, &h, got, NULL) && h.contributors == 2, "replica 1 answered");
    send_delta(&a, 8, d0);
    CHECK(!answer(&a, &h, got, NULL) && h.step == 8 && h.contributors == 1 && !memcmp(got, d0, sizeof got),
          "replica 1 silent past the timeout: the round of replica 0 alone");
    CHECK(answer(&b, &h, got, NULL) != 0, "the silent replica's connection is closed");
    int dropped = -1;
    CHECK(read(ctl, &dropped, sizeof dropped) == (ssize_t)sizeof dropped && dropped == 1,
          "the launcher is told which replica was dropped (%d)", dropped);
    dt_outer_close(&a);
    dt_outer_close(&b);
    close(ctl);
    waitpid(srv, &st, 0);
    return check_finish();
}
