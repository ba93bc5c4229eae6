/* The link between replicas that run as separate jobs (`dtrain launch --replicas R`;
 * docs/parallelism.md, "Replicas as separate jobs") and the launcher's outer server, over
 * TCP. An MPI job cannot lose a rank and go on (Debian's Open MPI has no ULFM), so local
 * SGD's and DiLoCo's replicas run as separate MPI jobs and meet only here: a replica that
 * dies leaves the others training. Every rank of a replica job has its own connection for
 * its piece of the model, its slot: its rank in its job (the same piece in every replica).
 *
 * Messages are a fixed header then `count` floats (twice `count` with momentum), in the
 * host's byte order: the replicas and the launcher run the same binary on like hosts. */
#ifndef DT_OUTER_LINK_H
#define DT_OUTER_LINK_H
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

#define DT_OUTER_MAGIC 0x534f5444u /* "DTOS" */
enum {
    DT_OUTER_HELLO = 1, /* replica -> server: its synchronised weights (and momentum) at `step`; -1: it has none */
    DT_OUTER_DELTA,     /* replica -> server: its change since the synchronisation, for the one at `step` */
    DT_OUTER_JOIN,      /* server -> replica: the synchronised weights (and momentum) at `step`, to go on from */
    DT_OUTER_SUM,       /* server -> replica: the changes summed in replica order over `contributors` replicas */
    DT_OUTER_PROGRESS,  /* replica -> server: it finished inner step `step` (no answer): alive, if slow */
};

typedef struct {
    uint32_t magic, kind;
    int32_t replica, slot;
    int64_t step;
    uint64_t count;
    int32_t contributors, with_momentum;
} dt_outer_msg;

typedef struct {
    int fd; /* -1: none */
    int replica, slot;
} dt_outer_link;

/* Connects to "host:port", retrying for up to `wait` seconds (the server may still be starting). */
dt_status dt_outer_connect(dt_outer_link *l, const char *addr, int replica, int slot, double wait);
void dt_outer_close(dt_outer_link *l);
/* Says hello with this replica's synchronised weights `theta` (and `mom`, NULL: none) at
 * `step` (-1: none: it waits for the first replica's) and replaces them with the server's,
 * which are at *at >= step (a replica that joins late goes on from there). */
dt_status dt_outer_join(dt_outer_link *l, long long step, float *theta, float *mom, size_t n, long long *at);
/* Sends this replica's change for the synchronisation at `step` and replaces it with the
 * sum over the replicas still training (*contributors of them, this one included). */
dt_status dt_outer_reduce(dt_outer_link *l, long long step, float *delta, size_t n, int *contributors);

/* Tells the server this replica finished inner step `step`: a replica that trains slowly
 * (one that restarted and has a whole interval to catch up) is not taken for a stuck one. */
dt_status dt_outer_progress(dt_outer_link *l, long long step);

/* The wire, shared with the server: a header and up to two arrays of h->count floats. */
dt_status dt_outer_send(int fd, const dt_outer_msg *h, const float *a, const float *b);
/* Reads exactly `bytes` (0: done; -1: the peer closed or failed; errno says). */
int dt_outer_read(int fd, void *buf, size_t bytes);

#endif
