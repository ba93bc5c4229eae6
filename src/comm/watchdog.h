/* The communication watchdog (as PyTorch's NCCL watchdog): a thread per process that
 * watches the flight recorder (flight_recorder.h) and, when this rank has been blocked in
 * one collective or point-to-point longer than comm.timeout, prints one line naming the
 * operation, its group, the training step and the ranks that have not arrived, dumps the
 * recorder to a file, and ends the process with exit code 1 so that mpirun (and
 * `dtrain launch`) end and restart the job instead of hanging forever.
 *
 * Who has not arrived: every rank's recorder lives in an MPI-3 shared-memory window over
 * its node (made by dt_comm_init), where it publishes, per communicator, how many
 * collectives it has entered; a waiting rank reads its peers' counts there, which needs
 * nothing from a stuck or stopped peer. Ranks on other nodes cannot be read: the line
 * says so (`dtrain launch`'s per-rank heartbeats name them).
 *
 * The waiting threads stay in their blocking MPI calls, so the fast path gains only the
 * record's few stores; the watchdog thread sleeps between ticks (a tenth of a second or
 * less), never spinning on a core that an oversubscribed peer needs. */
#ifndef DT_WATCHDOG_H
#define DT_WATCHDOG_H

#include "../core/status.h"

/* Arms the watchdog: a collective or point-to-point that this rank blocks on for more
 * than `timeout` seconds is diagnosed and ends the process; 0 disarms it. dump_dir: where
 * the recorder is written (NULL or "": /tmp; $DTRAIN_FLIGHT_DIR overrides it). Without MPI (a
 * world of one, which never waits) it does nothing. */
dt_status dt_watchdog_arm(double timeout, const char *dump_dir);
/* The training step (1-based: the one being computed) and micro-step the next records
 * carry; cheap (two relaxed stores). */
void dt_watchdog_step(long long step, int micro);
void dt_watchdog_micro(int micro);
/* The file the recorder is dumped to on a timeout, for this rank (for messages). */
const char *dt_watchdog_dump_path(void);

#endif
