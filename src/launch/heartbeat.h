/* The trainer's side of `dtrain launch`'s watchdog (per-rank heartbeats, and the
 * launcher's reading of them), and a fault-injection hook for its tests. The trainer's
 * calls cost nothing when their environment variable is unset. */
#ifndef DT_HEARTBEAT_H
#define DT_HEARTBEAT_H
#include <stddef.h>

/* Every rank calls this after every step: it rewrites its own file in $DTRAIN_HEARTBEAT
 * (a directory the launcher created), `rank.R`, with "step S pid P", so the launcher can
 * tell a hung job from a slow one and name the ranks that stopped beating. */
void dt_heartbeat(long long step, int rank);

/* One rank's last beat, as the launcher reads it. */
typedef struct {
    int rank;
    long long step;
    int pid;
    double mtime; /* wall-clock seconds of the last beat */
} dt_beat;

/* Reads the beats in dir (at most max, in rank order); returns how many. */
int dt_heartbeat_read(const char *dir, dt_beat *out, int max);
/* Removes the beats in dir (before a restart: the watchdog arms at the first fresh one). */
void dt_heartbeat_clear(const char *dir);
/* The launcher's verdict over n beats at wall-clock time now: 1 (hung) when some rank
 * beat since `started` and has not beaten for more than timeout seconds, with msg =
 * "no heartbeat for 31 s from rank 1 (last step 4, 31 s ago), stopped first; the others:
 * rank 0 at step 5 (30 s ago)". 0 otherwise. */
int dt_heartbeat_verdict(const dt_beat *b, int n, double started, double now, double timeout, char *msg, size_t cap);

/* Test hook: DT_TEST_FAULT="exit:STEP:RANK" ends rank RANK at once (exit 9) when it has
 * finished step STEP, "hang:STEP:RANK" stops it there forever (as a rank stuck in a
 * collective), "stop:STEP:RANK" sends the whole process SIGSTOP there (after a line
 * on stderr saying so; SIGCONT resumes it). With DT_TEST_FAULT_ONCE=FILE it fires only
 * if FILE does not exist, and creates it first, so the restarted job runs on. */
void dt_test_fault(long long step, int rank);

#endif
