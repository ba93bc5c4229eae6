/* `dtrain launch`: supervision on top of mpirun (torchrun's agent, DeepSpeed's elastic
 * launcher). It starts the job, watches it, and after a failure restarts it from the
 * newest checkpoint, on as many ranks as the hostfile then offers (elastic), keeping the
 * global batch. A rank that hangs is found by per-rank heartbeats: every rank rewrites
 * its own file after every step (heartbeat.h), so the watchdog names the ranks that
 * stopped. */
#ifndef DT_LAUNCH_H
#define DT_LAUNCH_H

#include "core/config.h"
#include "launch/hostfile.h"
#include "core/status.h"

typedef struct {
    int nproc;               /* -n: ranks wanted */
    int min_ranks;           /* --min-ranks: smallest world a restart may take (default nproc) */
    int max_restarts;        /* --max-restarts (default 3) */
    double restart_delay;    /* --restart-delay seconds before a restart (default 1) */
    double heartbeat_timeout; /* --heartbeat-timeout seconds without a step (0: off) */
    double startup_timeout;  /* --startup-timeout: seconds from a start to every rank's first step
                              * (-1: max(600, 10 x heartbeat_timeout) when that is on, else off) */
    double stop_timeout;     /* --stop-timeout: seconds the job has to save and exit once asked
                              * (-1: max(300, heartbeat_timeout)) */
    const char *hostfile;    /* --hostfile: Open MPI hostfile, read again before every start */
    int grow;                /* --grow: restart on a larger world when the hostfile offers one */
    double wait_timeout;     /* --wait-timeout: seconds to wait for a world of min_ranks (default 600) */
    const char *mpirun;      /* --mpirun (default "mpirun") */
    const char *mpi_args[64]; /* --mpi-arg, in order */
    int n_mpi_args;
    int replicas;            /* --replicas R: local SGD's / DiLoCo's replicas as R separate jobs (0, 1: one job) */
    const char *outer_addr;  /* --outer-addr: the launcher's address as the replicas' hosts reach it */
} dt_launch_opts;

/* Parses the options before `--`; *consumed = how many arguments they took. */
dt_status dt_launch_parse(dt_launch_opts *o, int argc, char **argv, int *consumed);

/* The largest world of at most `slots` ranks (and at most o->nproc) that the job's layout
 * runs with the fixed global batch `gb` (a multiple of tp*pp*cp whose dp divides it with
 * the config's micro-batch or micro-batch count), or 0 if none reaches o->min_ranks. */
int dt_launch_world(const dt_launch_opts *o, const dt_config *c, long long gb, int slots);

/* Slots a hostfile offers, read as Open MPI's mpirun reads it (hostfile.h), or -1 with
 * the error recorded (DT_EINPUT naming the file and line). */
int dt_launch_hostfile_slots(const char *path);
/* Its hosts in file order with their slots (hostfile.h), the first max of them; -1 as above. */
int dt_launch_hostfile_hosts(const char *path, dt_hostfile_host *hosts, int max);

/* Elastic growth (--grow): while the job runs the launcher reads the hostfile again (when
 * it changes, and every few seconds); when it offers a larger world, the launcher waits for
 * the next checkpoint to commit (checkpoint.dir's `latest` changes), then asks the job to
 * save and stop (SIGUSR1) and restarts it on the larger world from that checkpoint, the
 * global batch unchanged. A growth is not a failure: it uses none of --max-restarts.
 * Waiting (--wait-timeout): when the hostfile offers fewer slots than a world of
 * --min-ranks needs, before the first start or a restart, the launcher says so and reads
 * it again every second until it does or the timeout passes (then one error line). */

/* An error of the launcher itself (not the job's), printed as main prints errors; returns code. */
int dt_launch_fail(dt_status code);
/* Where a restart resumes in checkpoint dir `dir`: dir once it has `latest`, else its
 * newest step directory (a save killed before committing); 0: none. */
int dt_launch_resume_point(const char *dir, char *out, size_t cap);
/* Appends a restart's `--resume FROM --set checkpoint.overwrite=false` at argv[k]; returns
 * the next free index. */
int dt_launch_resume_args(const char **argv, int k, const char *from);
/* --replicas R (replicas.c): R jobs of -n / R ranks, each one replica of local SGD or
 * DiLoCo, meeting at an outer server the launcher runs (outer_server.h); a failed replica
 * is restarted alone and joins the others, who go on. Returns the exit code. */
int dt_launch_replicas(const dt_launch_opts *o, const dt_config *c, const char *self, int argc, char **argv);

/* The launcher's own lines on stderr, "dtrain launch: ..." (for its modules: elastic.c). */
void dt_launch_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sleeps s seconds; a signal cuts it short, so a polling loop looks at it at once. */
void dt_launch_nap(double s);

/* Runs `mpirun ... self train TRAIN_ARGS` under supervision until it succeeds, fails
 * with bad input (exit 2, never retried), is stopped by a signal (forwarded to the job
 * as SIGUSR1: the ranks save and exit), or has failed max_restarts + 1 times. c is the
 * train arguments' config (checked before anything starts). Returns the exit code. */
int dt_launch_run(const dt_launch_opts *o, const dt_config *c, const char *self, int train_argc, char **train_argv);

#endif
