/* The launcher's elastic worlds beyond a restart's shrink: waiting for enough slots
 * (--wait-timeout) and growing onto more (--grow); see launch.h. */
#ifndef DT_ELASTIC_H
#define DT_ELASTIC_H

#include <signal.h>
#include <sys/types.h>

#include "core/config.h"
#include "launch/launch.h"

/* The world to start (dt_launch_world on the hostfile's slots), waiting up to
 * o->wait_timeout seconds for the hostfile to offer one, rereading it every second; *stop
 * (a signal to the launcher) ends the wait. Returns the world, 0 when stopped, or -1 with
 * the error recorded (a hostfile that cannot be read, DT_EINPUT; the timeout, DT_ERUNTIME). */
int dt_elastic_wait_world(const dt_launch_opts *o, const dt_config *c, long long gb, volatile sig_atomic_t *stop,
                          dt_status *err);

typedef struct {
    const dt_launch_opts *o;
    const dt_config *c;
    long long gb;
    int world;        /* the running job's */
    int target;       /* a larger world the hostfile offers (0: none): waiting for a checkpoint */
    char latest[256]; /* checkpoint.dir's `latest` when the target was first seen */
    double next_read; /* the hostfile is read when it changes, and at least this often */
    double host_mtime;
    long long host_size;
} dt_grow;

void dt_grow_start(dt_grow *g, const dt_launch_opts *o, const dt_config *c, long long gb, int world);
/* Polled while the job runs: 1 once the hostfile offers a larger world and a checkpoint
 * has committed since (then stop the job and restart it on g->target ranks). */
int dt_grow_due(dt_grow *g);

#endif
