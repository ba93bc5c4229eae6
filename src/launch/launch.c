#define _POSIX_C_SOURCE 200809L
#include "launch/launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/input_file.h"
#include "parallel/layout/layout.h"
#include "core/signals.h"
#include "core/timer.h"
#include "launch/elastic.h"
#include "launch/heartbeat.h"
#include "launch/hostfile.h"
#include "ckpt/ckpt_dir.h"

static dt_status parse_num(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || !*v || *end || errno || !(x >= lo && x <= hi))
        return dt_fail(DT_EINPUT, "launch: %s needs a number in [%.10g, %.10g], got '%s'", opt, lo, hi, v ? v : "");
    *out = x;
    return DT_OK;
}

dt_status dt_launch_parse(dt_launch_opts *o, int argc, char **argv, int *consumed) {
    memset(o, 0, sizeof *o);
    o->max_restarts = 3;
    o->restart_delay = 1.0;
    o->wait_timeout = 600.0; /* torchrun's rendezvous join timeout */
    o->startup_timeout = -1.0;
    o->stop_timeout = -1.0;
    o->mpirun = "mpirun";
    int i = 0;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0.0;
        if (!strcmp(a, "--grow")) { /* the one flag without a value */
            o->grow = 1;
            continue;
        }
        if (!strcmp(a, "-n") || !strcmp(a, "--nproc")) {
            DT_TRY(parse_num(a, v, 1, 1 << 20, &x));
            o->nproc = (int)x;
            if (x != (int)x) return dt_fail(DT_EINPUT, "launch: %s needs a whole number, got '%s'", a, v);
        } else if (!strcmp(a, "--min-ranks")) {
            DT_TRY(parse_num(a, v, 1, 1 << 20, &x));
            o->min_ranks = (int)x;
        } else if (!strcmp(a, "--replicas")) {
            DT_TRY(parse_num(a, v, 1, 4096, &x));
            o->replicas = (int)x;
        } else if (!strcmp(a, "--max-restarts")) {
            DT_TRY(parse_num(a, v, 0, 1e6, &x));
            o->max_restarts = (int)x;
        } else if (!strcmp(a, "--restart-delay")) {
            DT_TRY(parse_num(a, v, 0, 86400, &o->restart_delay));
        } else if (!strcmp(a, "--wait-timeout")) {
            DT_TRY(parse_num(a, v, 0, 1e7, &o->wait_timeout));
        } else if (!strcmp(a, "--heartbeat-timeout")) {
            DT_TRY(parse_num(a, v, 0, 1e7, &o->heartbeat_timeout));
        } else if (!strcmp(a, "--startup-timeout")) {
            DT_TRY(parse_num(a, v, 0, 1e7, &o->startup_timeout));
        } else if (!strcmp(a, "--stop-timeout")) {
            DT_TRY(parse_num(a, v, 0, 1e7, &o->stop_timeout));
        } else if (!strcmp(a, "--hostfile") || !strcmp(a, "--mpirun") || !strcmp(a, "--mpi-arg") ||
                   !strcmp(a, "--outer-addr")) {
            if (!v) return dt_fail(DT_EINPUT, "launch: option %s needs a value", a);
            if (!strcmp(a, "--hostfile")) o->hostfile = v;
            else if (!strcmp(a, "--outer-addr")) o->outer_addr = v;
            else if (!strcmp(a, "--mpirun")) o->mpirun = v;
            else if (o->n_mpi_args == (int)(sizeof o->mpi_args / sizeof o->mpi_args[0]))
                return dt_fail(DT_EINPUT, "launch: more than %d --mpi-arg options", o->n_mpi_args);
            else o->mpi_args[o->n_mpi_args++] = v;
        } else {
            return dt_fail(DT_EINPUT, "launch: unknown option '%s' (see dtrain launch --help)", a);
        }
        i++; /* every option takes a value */
    }
    if (i == argc) return dt_fail(DT_EINPUT, "launch: expected `-- train [train options]` after the launcher's options");
    if (o->nproc < 1) return dt_fail(DT_EINPUT, "launch: -n N (ranks to start) is required");
    if (o->min_ranks == 0) o->min_ranks = o->nproc;
    if (o->min_ranks > o->nproc)
        return dt_fail(DT_EINPUT, "launch: --min-ranks %d exceeds -n %d", o->min_ranks, o->nproc);
    if (o->grow && !o->hostfile)
        return dt_fail(DT_EINPUT, "launch: --grow needs --hostfile FILE (the slots that may grow)");
    if (o->startup_timeout < 0) /* first steps load, compile and warm up: a generous allowance */
        o->startup_timeout = o->heartbeat_timeout > 0 ? (o->heartbeat_timeout * 10 > 600 ? o->heartbeat_timeout * 10 : 600) : 0;
    if (o->stop_timeout < 0) /* a save must fit in it, and saves fit in the heartbeat timeout */
        o->stop_timeout = o->heartbeat_timeout > 300 ? o->heartbeat_timeout : 300;
    *consumed = i + 1;
    return DT_OK;
}

/* The hostfile's text (at most 1 MiB, NUL-terminated); NULL with the error recorded. */
static char *read_hostfile(const char *path, size_t *n) {
    FILE *f;
    if (dt_input_fopen(path, "launch: --hostfile", &f) != DT_OK) return NULL;
    enum { CAP = 1 << 20 };
    char *text = malloc(CAP + 1);
    *n = text ? fread(text, 1, CAP + 1, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (!text) return dt_fail(DT_ERUNTIME, "out of memory"), NULL;
    if (err || *n > CAP) {
        dt_fail(DT_EINPUT, "launch: hostfile '%s': %s", path, err ? "read error" : "larger than 1 MiB: not a hostfile");
        free(text);
        return NULL;
    }
    text[*n] = 0;
    return text;
}

/* This host's name as hostfiles name it (up to the first dot). */
static void short_hostname(char *self, size_t cap) {
    self[0] = 0;
    if (gethostname(self, cap - 1) == 0 && strchr(self, '.')) *strchr(self, '.') = 0;
    self[cap - 1] = 0;
}

int dt_launch_hostfile_slots(const char *path) {
    size_t n;
    char *text = read_hostfile(path, &n), self[256];
    if (!text) return -1;
    short_hostname(self, sizeof self);
    int slots = dt_hostfile_slots(text, n, path, self[0] ? self : NULL);
    free(text);
    return slots;
}

int dt_launch_hostfile_hosts(const char *path, dt_hostfile_host *hosts, int max) {
    size_t n;
    char *text = read_hostfile(path, &n), self[256];
    if (!text) return -1;
    short_hostname(self, sizeof self);
    int count = dt_hostfile_hosts(text, n, path, self[0] ? self : NULL, hosts, max);
    free(text);
    return count;
}

int dt_launch_world(const dt_launch_opts *o, const dt_config *c, long long gb, int slots) {
    int top = slots < o->nproc ? slots : o->nproc;
    for (int w = top; w >= o->min_ranks && w >= 1; w--) {
        dt_layout L; /* the layout of w ranks (its batch keys as the ranks will resolve them) */
        dt_layout_derive(&L, c, w);
        if (w % dt_layout_model_ranks(&L)) continue;
        long long dp = L.dp;
        long long per = c->parallel.micro_batches > 0 ? dp * c->parallel.micro_batches : dp * c->train.micro_batch;
        if (gb % per == 0) return w;
    }
    return 0;
}

/* ---- supervision ---- */

static volatile sig_atomic_t g_stop_sig, g_again_sig; /* the first stop signal; a second one */
static void on_signal(int sig) {
    if (!g_stop_sig) g_stop_sig = sig;
    else if (!g_again_sig) g_again_sig = sig;
}

void dt_launch_say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dtrain launch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void dt_launch_nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* file times are on this clock */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Exit status as a shell reports it. */
static int code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

/* The launcher's children other than the job's mpirun: ranks (and their helpers) that
 * outlived it, adopted by the launcher as their subreaper. Returns how many (at most max). */
static int adopted(pid_t *out, int max) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    pid_t me = getpid();
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char path[64], buf[512];
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%.20s/stat", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (k <= 0) continue;
        buf[k] = 0;
        const char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ...": comm may hold anything */
        char state;
        long ppid;
        if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == (long)me && state != 'Z')
            out[n++] = (pid_t)atol(e->d_name);
    }
    closedir(d);
    return n;
}

/* Once the job's mpirun has exited: waits until every process of the attempt on this host is
 * gone (the ranks die with mpirun, dt_signals_die_with_parent; the launcher is their
 * subreaper, so the last one gone is the last child reaped), at most `grace` seconds, then
 * kills those left. A restart must not start while a rank of the last attempt still trains
 * or saves into the checkpoint directory. */
static void reap_attempt(double grace) {
    double until = dt_now() + grace;
    int said = 0, killed = 0;
    for (;;) {
        int st;
        pid_t r = waitpid(-1, &st, WNOHANG);
        if (r > 0) continue;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return; /* ECHILD: all gone */
        pid_t left[64];
        int n = adopted(left, 64);
        if (n > 0 && !said) {
            dt_launch_say("waiting for %d process%s of the last attempt to exit (pid %d%s)",
                n, n == 1 ? "" : "es", (int)left[0],
                n > 1 ? ", ..." : "");
            said = 1;
        }
        if (!killed && dt_now() > until) {
            dt_launch_say("%d process%s of the last attempt still running after %g s: killing them (SIGKILL)", n,
                n == 1 ? "" : "es", grace);
            for (int i = 0; i < n; i++) kill(left[i], SIGKILL);
            killed = 1;
            until = dt_now() + 10.0;
        } else if (killed && dt_now() > until) {
            /* SIGKILL is pending: they run no more user code (stuck in the kernel) */
            dt_launch_say("%d process%s of the last attempt killed but not yet gone (in the kernel): going on", n,
                n == 1 ? "" : "es");
            return;
        }
        dt_launch_nap(0.05);
    }
}

/* Ends the job at once: mpirun (its ranks die with it) and any adopted process. */
static void kill_job(pid_t pid) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    pid_t left[256];
    int n = adopted(left, 256);
    for (int i = 0; i < n; i++) kill(left[i], SIGKILL);
}

/* Waits for the job; sends it SIGUSR1 when the launcher is asked to stop or the job is to
 * grow (*grew), kills it when its heartbeat goes stale, when a rank has not finished its
 * first step within the start-up timeout, when it has not stopped within --stop-timeout of
 * being asked to, or at once on a second stop signal. *hung: ended by the watchdog. */
static int supervise(const dt_launch_opts *o, pid_t pid, const char *beat, int world, double started, int *hung,
                     dt_grow *grow, int *grew) {
    int status, forwarded = 0, again = 0;
    double kill_at = 0.0, stop_by = 0.0;
    *hung = 0;
    *grew = 0;
    for (;;) {
        pid_t r = waitpid(-1, &status, WNOHANG); /* the job's mpirun, or an adopted orphan */
        if (r == pid) return code_of(status);
        if (r > 0) continue;
        if (r < 0 && errno != EINTR) return 1;
        if (g_again_sig && !again) { /* a second signal: no more waiting for the save */
            again = 1;
            dt_launch_say("%s again: killing the job at once", dt_signal_name(g_again_sig));
            kill_job(pid);
        }
        if (g_stop_sig && !forwarded) { /* the ranks save and exit (the trainer's SIGUSR1) */
            forwarded = 1;
            stop_by = dt_now() + o->stop_timeout;
            dt_launch_say(
                "%s: asking the job to save and stop (SIGUSR1 to %s; up to %g s, --stop-timeout; signal again to "
                "kill it at once)", dt_signal_name(g_stop_sig), o->mpirun, o->stop_timeout);
            kill(pid, SIGUSR1);
        }
        if (!forwarded && !*hung && dt_grow_due(grow)) { /* a restart on more ranks, from the save it makes */
            forwarded = *grew = 1;
            stop_by = dt_now() + o->stop_timeout;
            dt_launch_say("a checkpoint committed: asking the job to save and stop (SIGUSR1 to %s) to grow to %d ranks",
                o->mpirun, grow->target);
            kill(pid, SIGUSR1);
        }
        if (forwarded && !again && !kill_at && stop_by > 0.0 && dt_now() > stop_by) {
            dt_launch_say("the job has not stopped %g s after SIGUSR1 (--stop-timeout): killing it", o->stop_timeout);
            *hung = 1;
            kill_job(pid);
            stop_by = 0.0;
        }
        if (beat && !*hung && !again) { /* per-rank beats: name the ranks that stopped (saves count as steps) */
            dt_beat beats[256];
            char why[1024];
            int nb = dt_heartbeat_read(beat, beats, 256);
            double now = wall_now();
            if ((o->heartbeat_timeout > 0 &&
                 dt_heartbeat_verdict(beats, nb, started, now, o->heartbeat_timeout, why, sizeof why)) ||
                (o->startup_timeout > 0 &&
                 dt_heartbeat_startup_verdict(beats, nb, world, started, now, o->startup_timeout, why, sizeof why))) {
                dt_launch_say("%s: killing the job", why);
                *hung = 1;
                kill(pid, SIGTERM);
                kill_at = dt_now() + 15.0;
            }
        }
        if (kill_at > 0.0 && dt_now() > kill_at) { /* mpirun did not end it */
            kill_job(pid);
            kill_at = 0.0;
        }
        dt_launch_nap(0.1);
    }
}

/* Where a restart resumes: dir itself once it has `latest`; else its newest step directory
 * (a save killed between its step directory's rename and `latest`, the first save of a run
 * above all, leaves a complete step that nothing points to: resuming from it, rather than
 * from step 0 into a directory that now holds checkpoints, which the job refuses). 0: none. */
int dt_launch_resume_point(const char *dir, char *out, size_t cap) {
    if (!dir[0]) return 0;
    char p[DT_PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/latest", dir);
    if (access(p, F_OK) == 0) {
        snprintf(out, cap, "%s", dir);
        return 1;
    }
    DIR *d = opendir(dir);
    if (!d) return 0;
    long long best = -1;
    char name[256] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        long long st = dt_ckpt_step_of(e->d_name);
        if (st > best || (st == best && strcmp(e->d_name, name) > 0)) { /* step_N.vK: the newer copy */
            best = st;
            snprintf(name, sizeof name, "%s", e->d_name);
        }
    }
    closedir(d);
    if (best < 0) return 0;
    snprintf(out, cap, "%s/%s", dir, name);
    dt_launch_say("%s has no `latest` (a save was killed before committing it): resuming from its newest step, %s",
        dir, name);
    return 1;
}

/* Heartbeat directories of launchers that died (SIGKILL, the OOM killer) without removing
 * them: /tmp/dtrain-beat.PID.XXXXXX whose PID is gone. */
static void remove_stale_beats(void) {
    DIR *d = opendir("/tmp");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid;
        char rest[64];
        if (sscanf(e->d_name, "dtrain-beat.%ld.%63s", &pid, rest) != 2 || pid <= 0) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its launcher lives (or is not ours) */
        char path[DT_PATH_MAX];
        snprintf(path, sizeof path, "/tmp/%s", e->d_name);
        dt_heartbeat_clear(path);
        if (rmdir(path) == 0) dt_launch_say("removed %s (its launcher, pid %ld, is gone)", path, pid);
    }
    closedir(d);
}

int dt_launch_resume_args(const char **argv, int k, const char *from) {
    argv[k++] = "--resume";
    argv[k++] = from;
    argv[k++] = "--set"; /* a restart never replaces what the run saved */
    argv[k++] = "checkpoint.overwrite=false";
    return k;
}

int dt_launch_fail(dt_status code) {
    fprintf(stderr, "dtrain: error: %s\n", dt_error_message());
    return (int)code;
}

int dt_launch_run(const dt_launch_opts *o, const dt_config *c, const char *self, int train_argc, char **train_argv) {
    if (o->replicas > 1) return dt_launch_replicas(o, c, self, train_argc, train_argv);
    dt_layout L;
    dt_layout_derive(&L, c, o->nproc);
    if (o->nproc % dt_layout_model_ranks(&L)) {
        dt_fail(DT_EINPUT, "launch: -n %d is not a multiple of tp x pp x cp = %lld", o->nproc, dt_layout_model_ranks(&L));
        return dt_launch_fail(DT_EINPUT);
    }
    long long gb = L.global_batch; /* what it is on -n ranks, whatever world a restart gets */
    if (!dt_launch_world(o, c, gb, o->nproc)) {
        dt_fail(DT_EINPUT, "launch: no world from --min-ranks %d to -n %d divides the global batch %lld", o->min_ranks,
                o->nproc, gb);
        return dt_launch_fail(DT_EINPUT);
    }
    if (o->grow && (!c->checkpoint.dir[0] || c->checkpoint.every <= 0)) {
        dt_fail(DT_EINPUT, "launch: --grow needs checkpoint.dir and checkpoint.every (--save DIR --save-every N): "
                "the job grows at its next checkpoint");
        return dt_launch_fail(DT_EINPUT);
    }
    if (!c->checkpoint.dir[0])
        dt_launch_say("note: no checkpoint.dir (--save DIR): a restart starts the run again from step 0");

    /* The launcher adopts what its job leaves behind (a rank whose mpirun died): it waits
     * for the last of them before a restart (reap_attempt). */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    char me[32];
    snprintf(me, sizeof me, "%ld", (long)getpid());
    setenv("DTRAIN_LAUNCHER_PID", me, 1); /* a rank whose parent died before its prctl knows it */
    remove_stale_beats();
    char beat[64] = ""; /* a directory: each rank beats in its own file (heartbeat.h) */
    if (o->heartbeat_timeout > 0 || o->startup_timeout > 0) {
        snprintf(beat, sizeof beat, "/tmp/dtrain-beat.%ld.XXXXXX", (long)getpid()); /* the pid: stale once it is gone */
        if (!mkdtemp(beat)) {
            dt_fail(DT_ERUNTIME, "launch: cannot create a heartbeat directory in /tmp: %s", strerror(errno));
            return dt_launch_fail(DT_ERUNTIME);
        }
        setenv("DTRAIN_HEARTBEAT", beat, 1);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    int n = 18 + o->n_mpi_args + train_argc, code = 1;
    char **argv = calloc((size_t)n, sizeof *argv);
    if (!argv) {
        dt_fail(DT_ERUNTIME, "out of memory");
        return dt_launch_fail(DT_ERUNTIME);
    }
    char np[32], gbs[64], from[DT_PATH_MAX + 272];
    snprintf(gbs, sizeof gbs, "train.global_batch=%lld", gb);
    int grown = 0, grew_from = 0; /* restarts onto a larger world (--grow, not failures); the last one's old world */
    for (int attempt = 0;; attempt++) {
        dt_status werr = DT_OK;
        int world = dt_elastic_wait_world(o, c, gb, &g_stop_sig, &werr);
        if (world < 0) {
            code = dt_launch_fail(werr);
            break;
        }
        if (!world) { /* stopped while waiting */
            code = 128 + g_stop_sig;
            break;
        }
        int resume = attempt + grown > 0 && dt_launch_resume_point(c->checkpoint.dir, from, sizeof from);
        int k = 0;
        snprintf(np, sizeof np, "%d", world);
        argv[k++] = (char *)o->mpirun;
        argv[k++] = "-np";
        argv[k++] = np;
        if (o->hostfile) {
            argv[k++] = "--hostfile";
            argv[k++] = (char *)o->hostfile;
        }
        for (int i = 0; i < o->n_mpi_args; i++) argv[k++] = (char *)o->mpi_args[i];
        if (beat[0]) { /* Open MPI's way to pass a variable to ranks on other hosts */
            argv[k++] = "-x";
            argv[k++] = "DTRAIN_HEARTBEAT";
        }
        argv[k++] = (char *)self;
        argv[k++] = "train";
        for (int i = 0; i < train_argc; i++) argv[k++] = train_argv[i];
        argv[k++] = "--set";
        argv[k++] = gbs;
        argv[k++] = "--set"; /* the global batch is fixed: a restart's dp re-derives the accumulation */
        argv[k++] = "train.grad_accum=0";
        if (resume) k = dt_launch_resume_args((const char **)argv, k, from);
        argv[k] = NULL;
        if (!attempt && !grown) dt_launch_say("starting %d ranks", world);
        else if (grew_from) dt_launch_say("growing to %d ranks (from %d), resuming from %s",
            world, grew_from, c->checkpoint.dir);
        else dt_launch_say("restart %d of at most %d: %d ranks, %s%s", attempt, o->max_restarts, world,
                 resume ? "resuming from " : "from step 0 (no checkpoint yet)", resume ? from : "");
        grew_from = 0;
        double started = wall_now(), t0 = dt_now();
        if (beat[0]) dt_heartbeat_clear(beat); /* the last attempt's: the watchdog arms at the first fresh beat */
        pid_t pid = fork();
        if (pid < 0) {
            dt_fail(DT_ERUNTIME, "launch: fork: %s", strerror(errno));
            code = dt_launch_fail(DT_ERUNTIME);
            break;
        }
        if (pid == 0) {
            /* mpirun dies with the launcher (its ranks with it): a job is never left unsupervised */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != (pid_t)atol(me)) _exit(127); /* the launcher died before prctl */
            setpgid(0, 0); /* a terminal's Ctrl-C reaches the launcher only; it asks the job to stop */
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGUSR1, SIG_DFL);
            execvp(argv[0], argv);
            fprintf(stderr, "dtrain launch: cannot run %s: %s\n", argv[0], strerror(errno));
            _exit(127);
        }
        int hung, grew;
        dt_grow grow;
        dt_grow_start(&grow, o, c, gb, world);
        code = supervise(o, pid, beat[0] ? beat : NULL, world, started, &hung, &grow, &grew);
        double took = dt_now() - t0;
        reap_attempt(5.0);
        if (g_again_sig) {
            dt_launch_say("stopped by %s, then %s: the job was killed",
                dt_signal_name(g_stop_sig), dt_signal_name(g_again_sig));
            code = 128 + g_again_sig;
            break;
        }
        if (g_stop_sig) {
            dt_launch_say("stopped by %s (the job exited with %d)", dt_signal_name(g_stop_sig), code);
            code = 128 + g_stop_sig;
            break;
        }
        if (code == 0) break;
        if (grew && code == 128 + SIGUSR1) { /* saved and stopped as asked: on to the larger world */
            grown++;
            grew_from = world;
            attempt--; /* not a failure: the restarts left stay as they were */
            continue;
        }
        if (code == DT_EINPUT) { /* bad config, data or checkpoint: a restart would fail alike */
            dt_launch_say("the job refused its input (exit 2): not restarting");
            break;
        }
        if (!hung && (code == 128 + SIGINT || code == 128 + SIGTERM || code == 128 + SIGUSR1)) {
            dt_launch_say("the job was stopped by a signal (exit %d) and saved: not restarting", code);
            break;
        }
        if (code == 127) {
            dt_launch_say("could not start %s: not restarting", o->mpirun);
            break;
        }
        if (attempt >= o->max_restarts) {
            if (code == 0 || code == DT_EINPUT) code = 1;
            dt_fail(DT_ERUNTIME, "launch: the job failed %d times (last exit %d%s); giving up", attempt + 1, code,
                    hung ? ", hung" : "");
            dt_launch_fail(DT_ERUNTIME);
            break;
        }
        dt_launch_say("the job failed after %.1f s (exit %d%s); restarting in %g s", took, code, hung ? ", hung" : "",
            o->restart_delay);
        dt_launch_nap(o->restart_delay);
        if (g_stop_sig) {
            code = 128 + g_stop_sig;
            break;
        }
    }
    free(argv);
    if (beat[0]) {
        dt_heartbeat_clear(beat);
        rmdir(beat);
    }
    return code;
}
