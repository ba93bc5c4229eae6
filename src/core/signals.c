#include "signals.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static volatile sig_atomic_t g_pending, g_quiet;

static void on_stop(int sig) {
    if (g_pending) { /* the second signal: leave now */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_pending = sig;
    if (!g_quiet) {
        static const char msg[] = "dtrain: stop requested: finishing this step, then saving; "
                                  "signal again to exit at once\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1); /* async-signal-safe */
        (void)w;
    }
}

void dt_signals_install(int quiet) {
    g_quiet = quiet;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* a step's I/O and collectives carry on */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* SIGUSR1: what Open MPI's mpirun forwards to every rank as it is (SIGTERM and
     * SIGINT make mpirun kill the job itself), and what Slurm's --signal sends ahead
     * of a time limit. */
    sigaction(SIGUSR1, &sa, NULL);
    /* A launcher that is going away (mpirun forwarding a SIGTERM) closes our stdout
     * before the save is done: a write there must fail, not kill the process. */
    signal(SIGPIPE, SIG_IGN);
}

int dt_signal_pending(void) { return g_pending; }

void dt_signal_record(int sig) {
    if (!g_pending) g_pending = sig;
}

void dt_signals_die_with_parent(void) {
    if (!getenv("OMPI_COMM_WORLD_RANK") && !getenv("PMIX_RANK") && !getenv("PMI_RANK")) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* the parent may have died before prctl: then we are an orphan, adopted by init or by
     * `dtrain launch` (a subreaper, DTRAIN_LAUNCHER_PID) */
    const char *l = getenv("DTRAIN_LAUNCHER_PID");
    pid_t pp = getppid();
    if (pp == 1 || (l && atol(l) == (long)pp)) _exit(1);
}

const char *dt_signal_name(int sig) {
    static char buf[32];
    if (sig == SIGINT) return "SIGINT";
    if (sig == SIGTERM) return "SIGTERM";
    if (sig == SIGUSR1) return "SIGUSR1";
    snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}
