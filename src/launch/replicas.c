/* `dtrain launch --replicas R` (docs/parallelism.md, "Replicas as separate jobs"): local
 * SGD's or DiLoCo's replicas as R separate MPI jobs, which meet only at the outer server
 * (outer_server.h), run here in a child process. A replica job that fails is restarted
 * alone (at most --max-restarts times each) and joins the others where they are; the
 * others go on meanwhile, as an MPI job without ULFM cannot. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../core/signals.h"
#include "../core/timer.h"
#include "../parallel/layout/layout.h"
#include "launch.h"
#include "outer_server.h"

#define MAX_REPLICAS 256

typedef struct {
    pid_t pid;         /* its mpirun; 0: not running */
    int done, restarts;
    double restart_at; /* > 0: to be restarted then */
} replica;

static volatile sig_atomic_t g_sig;
static void on_signal(int sig) { g_sig = sig; }

static int code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

/* mpirun -np k ... self train ARGS for replica j (its own process group: the launcher
 * alone gets a terminal's Ctrl-C). Replica 0, restarted, resumes from its newest checkpoint:
 * the directory holds the run's saves (the outer server's weights then take over). */
static pid_t start(const dt_launch_opts *o, const dt_config *c, const char *self, int argc, char **argv, int j,
                   int k, int restarted, const char *hosts) {
    char np[32], rj[32], from[DT_PATH_MAX + 272];
    int resume = j == 0 && restarted && dt_launch_resume_point(c->checkpoint.dir, from, sizeof from);
    snprintf(np, sizeof np, "%d", k);
    snprintf(rj, sizeof rj, "%d", j);
    pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    setenv("DTRAIN_REPLICA", rj, 1);
    const char **a = calloc((size_t)(argc + o->n_mpi_args + 24), sizeof *a);
    if (!a) _exit(127);
    int n = 0;
    a[n++] = o->mpirun;
    a[n++] = "-np";
    a[n++] = np;
    if (hosts[0]) { /* its share of the hostfile's slots */
        a[n++] = "--host";
        a[n++] = hosts;
    }
    for (int i = 0; i < o->n_mpi_args; i++) a[n++] = o->mpi_args[i];
    const char *vars[] = {"DTRAIN_REPLICA", "DTRAIN_REPLICAS", "DTRAIN_OUTER_ADDR"}; /* to ranks on other hosts */
    for (int i = 0; i < 3; i++) {
        a[n++] = "-x";
        a[n++] = vars[i];
    }
    a[n++] = self;
    a[n++] = "train";
    for (int i = 0; i < argc; i++) a[n++] = argv[i];
    if (resume) n = dt_launch_resume_args(a, n, from);
    a[n] = NULL;
    execvp(a[0], (char **)a);
    fprintf(stderr, "dtrain launch: cannot run %s: %s\n", a[0], strerror(errno));
    _exit(127);
}

static void stop_all(replica *r, int R, int sig) {
    for (int j = 0; j < R; j++)
        if (r[j].pid > 0) kill(r[j].pid, sig);
}

int dt_launch_replicas(const dt_launch_opts *o, const dt_config *c, const char *self, int argc, char **argv) {
    int R = o->replicas, k = o->nproc / R;
    if (R > MAX_REPLICAS || o->nproc % R)
        return dt_launch_fail(dt_fail(DT_EINPUT, "launch: --replicas %d must divide -n %d (at most %d replicas)", R,
                                      o->nproc, MAX_REPLICAS));
    if (o->grow || o->heartbeat_timeout > 0 || o->min_ranks != o->nproc)
        return dt_launch_fail(dt_fail(DT_EINPUT, "launch: --replicas restarts each replica's job whole: not yet with "
                                      "--grow, --min-ranks or --heartbeat-timeout"));
    static char hosts[MAX_REPLICAS][1024]; /* each replica's --host list (empty: mpirun's default) */
    if (o->hostfile) { /* replica j takes slots j k .. (j + 1) k - 1 of the file, in order */
        static dt_hostfile_host h[4096];
        int nh = dt_launch_hostfile_hosts(o->hostfile, h, 4096);
        if (nh < 0) return dt_launch_fail(DT_EINPUT);
        for (int j = 0; j < R; j++)
            if (dt_hostfile_take(h, nh < 4096 ? nh : 4096, j * k, k, hosts[j], sizeof hosts[j]))
                return dt_launch_fail(dt_fail(DT_EINPUT, "launch: hostfile '%s' offers fewer than -n %d slots for "
                                              "%d replicas of %d", o->hostfile, o->nproc, R, k));
    }
    int lfd, port;
    if (dt_outer_listen(&lfd, &port) != DT_OK) return dt_launch_fail(DT_ERUNTIME);
    char rs[32], addr[300], me[256] = "127.0.0.1";
    if (!o->outer_addr && o->hostfile && gethostname(me, sizeof me - 1)) snprintf(me, sizeof me, "127.0.0.1");
    snprintf(rs, sizeof rs, "%d", R);
    snprintf(addr, sizeof addr, "%s:%d", o->outer_addr ? o->outer_addr : me, port);
    setenv("DTRAIN_REPLICAS", rs, 1);
    setenv("DTRAIN_REPLICA", "0", 1);
    setenv("DTRAIN_OUTER_ADDR", addr, 1);
    dt_layout L; /* one replica's job, as its ranks will see it */
    dt_status st = dt_layout_build(&L, c, k);
    if (st == DT_OK) st = dt_layout_check(&L, DT_CHECK_RUN);
    if (st != DT_OK) return dt_launch_fail(st);
    dt_outer_server_opts so = {R, L.sync == DT_SYNC_DILOCO, c->parallel.outer_lr, c->parallel.outer_momentum,
                               c->comm.timeout};
    int ctl[2]; /* the launcher tells the server which replica's job ended, the server which it dropped */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, ctl))
        return dt_launch_fail(dt_fail(DT_ERUNTIME, "launch: socketpair: %s", strerror(errno)));
    pid_t server = fork();
    if (server == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGINT, SIG_IGN); /* the launcher stops it when the replicas are done */
        signal(SIGTERM, SIG_IGN);
        close(ctl[1]);
        dt_outer_serve(lfd, ctl[0], &so);
        _exit(1);
    }
    close(lfd);
    close(ctl[0]);
    fcntl(ctl[1], F_SETFL, fcntl(ctl[1], F_GETFL) | O_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    if (server < 0) return dt_launch_fail(dt_fail(DT_ERUNTIME, "launch: fork: %s", strerror(errno)));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    replica r[MAX_REPLICAS];
    memset(r, 0, sizeof r);
    dt_launch_say("starting %d replicas of %d ranks, each its own job; they meet at the outer server (%s)", R, k,
        addr);
    for (int j = 0; j < R; j++) {
        if (hosts[j][0]) dt_launch_say("replica %d on %s", j, hosts[j]);
        r[j].pid = start(o, c, self, argc, argv, j, k, 0, hosts[j]);
    }
    int code = 0, forwarded = 0, left = R;
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p == server) {
            code = dt_launch_fail(dt_fail(DT_ERUNTIME, "launch: the outer server exited (%d)", code_of(status)));
            stop_all(r, R, SIGKILL);
            server = 0;
            break;
        }
        int j = 0;
        while (p > 0 && j < R && r[j].pid != p) j++;
        if (p > 0 && j < R) {
            int rc = code_of(status);
            r[j].pid = 0;
            if (write(ctl[1], &j, sizeof j) != (ssize_t)sizeof j) { /* the server's exit is seen below */
            }
            if (rc == 0 || forwarded || rc == DT_EINPUT || rc == 127 || r[j].restarts >= o->max_restarts) {
                r[j].done = 1;
                left--;
                if (rc && !code) code = rc;
                if (rc && !forwarded && rc != 0) { /* given up: the run cannot end as asked */
                    dt_launch_say("replica %d failed (exit %d)%s: stopping the others", j, rc,
                        rc == DT_EINPUT ? " on its input" : r[j].restarts ? ", out of restarts" : "");
                    forwarded = 1;
                    stop_all(r, R, SIGUSR1);
                }
            } else {
                r[j].restarts++;
                r[j].restart_at = dt_now() + o->restart_delay;
                dt_launch_say("replica %d failed (exit %d): restarting it alone in %g s (%d of at most %d); the "
                    "others go on", j, rc, o->restart_delay, r[j].restarts, o->max_restarts);
            }
            continue;
        }
        int silent;
        if (read(ctl[1], &silent, sizeof silent) == (ssize_t)sizeof silent && silent >= 0 && silent < R &&
            r[silent].pid > 0) { /* stopped or stuck: the server dropped it; its job ends and restarts */
            dt_launch_say("replica %d was silent for comm.timeout while the others waited: killing its job", silent);
            kill(-r[silent].pid, SIGKILL);
            kill(r[silent].pid, SIGKILL);
        }
        if (g_sig && !forwarded) {
            forwarded = 1;
            dt_launch_say("%s: asking every replica to save and stop (SIGUSR1)", dt_signal_name(g_sig));
            stop_all(r, R, SIGUSR1);
            code = 128 + g_sig;
            for (int i = 0; i < R; i++)
                if (!r[i].pid && !r[i].done) { /* waiting for its restart: it will not come */
                    r[i].done = 1;
                    left--;
                }
        }
        for (int i = 0; i < R; i++)
            if (!forwarded && !r[i].pid && !r[i].done && r[i].restart_at > 0 && dt_now() >= r[i].restart_at) {
                r[i].restart_at = 0;
                dt_launch_say("restarting replica %d: it joins the others at their last synchronisation", i);
                r[i].pid = start(o, c, self, argc, argv, i, k, 1, hosts[i]);
            }
        dt_launch_nap(0.05);
    }
    close(ctl[1]);
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
    if (g_sig) code = 128 + g_sig;
    return code;
}
