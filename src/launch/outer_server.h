/* The outer server of `dtrain launch --replicas R` (docs/parallelism.md, "Replicas as
 * separate jobs"): the launcher runs it in a child process while the replica jobs train.
 * Per slot (a piece of the model, src/comm/outer_link.h) it keeps the synchronised weights
 * and DiLoCo's momentum, and a round per synchronisation: it waits for the change of every
 * replica connected for that slot, sums them in replica order, runs the outer step on its
 * copy (the replicas run the same one on the sum it sends back, so all hold the same
 * bits) and answers each. A replica whose connection closes (its job died) is left out of
 * the rounds until its job, restarted, says hello again: it gets the current synchronised
 * weights and step and goes on from there (when every slot is between rounds, so all its
 * ranks get the same step). Every round waits for all R replicas until a replica's job
 * ends (the launcher says so) or its connection closes. A replica in a round that has sent
 * neither its change nor progress (a message per inner step) for `timeout` seconds while
 * the others wait is dropped and named to the launcher, which ends its job (then restarted
 * as any failed one), so a stopped replica cannot stall the others; a slow one that trains
 * on (a restarted one catching up) is waited for. Replica 0 alone starts the weights (its own
 * initialisation or checkpoint); the others wait for them. */
#ifndef DT_OUTER_SERVER_H
#define DT_OUTER_SERVER_H
#include "../core/status.h"

typedef struct {
    int replicas;   /* R */
    int diloco;     /* else local SGD */
    double lr, mu;  /* DiLoCo's outer rate and Nesterov momentum */
    double timeout; /* seconds a round waits for a replica (0: for ever) */
} dt_outer_server_opts;

/* A listening TCP socket on every interface, on a port the kernel picks. */
dt_status dt_outer_listen(int *fd, int *port);
/* Serves until the process is killed or ctl_fd closes: the launcher's socket, on which it
 * writes an int j when replica j's job ends, and reads an int j when the server dropped
 * replica j for its silence. */
void dt_outer_serve(int listen_fd, int ctl_fd, const dt_outer_server_opts *o);

#endif
