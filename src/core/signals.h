/* Preemption: SIGINT, SIGTERM and SIGUSR1 ask the run to stop. The first one is recorded and
 * the trainer finishes its current step, saves and exits; a second one ends the
 * process at once (default action), as Ctrl-C twice does elsewhere. */
#ifndef DT_SIGNALS_H
#define DT_SIGNALS_H

/* Installs the handlers; quiet: do not print the "finishing the step" note (ranks > 0). */
void dt_signals_install(int quiet);
/* The first stop signal received (SIGINT, SIGTERM or SIGUSR1), or 0. */
int dt_signal_pending(void);
/* Records sig as received (a rank learning of another rank's signal). */
void dt_signal_record(int sig);
/* A rank started by mpirun (or Open MPI's orted, Slurm's step daemon) dies with it: the
 * kernel sends it SIGKILL when its parent exits (PR_SET_PDEATHSIG; as PyTorch's
 * multiprocessing does for its workers), so no rank of a killed job trains on, or saves
 * over the checkpoints of the job that replaces it. No effect outside MPI. */
void dt_signals_die_with_parent(void);
/* "SIGINT", "SIGTERM", "SIGUSR1" or "signal N". */
const char *dt_signal_name(int sig);

#endif
