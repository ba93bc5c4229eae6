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
/* Every rank calls this once at its start, before any work: "start 0 pid P", so the
 * launcher knows every rank's pid and can tell a rank still starting (loading, its first
 * step) from one that has not started at all. */
void dt_heartbeat_start(int rank);

/* One rank's last beat, as the launcher reads it. */
typedef struct {
    int rank;
    long long step;
    int pid;
    double mtime; /* wall-clock seconds of the last beat */
    int start;    /* 1: only the start beat (no step finished yet) */
} dt_beat;

/* Reads the beats in dir (at most max, in rank order); returns how many. */
int dt_heartbeat_read(const char *dir, dt_beat *out, int max);
/* Removes the beats in dir (before a restart: the watchdog arms at the first fresh one). */
void dt_heartbeat_clear(const char *dir);
/* The launcher's verdict over n beats at wall-clock time now: 1 (hung) when some rank
 * finished a step since `started` and has not beaten for more than timeout seconds, with msg =
 * "no heartbeat for 31 s from rank 1 (last step 4, 31 s ago), stopped first; the others:
 * rank 0 at step 5 (30 s ago)". 0 otherwise. */
int dt_heartbeat_verdict(const dt_beat *b, int n, double started, double now, double timeout, char *msg, size_t cap);
/* Start-up (a Kubernetes startupProbe): 1 when more than `startup` seconds have passed
 * since `started` and some rank of the world has finished no step since, with msg =
 * "no step within 600 s of the start (--startup-timeout): rank 1 started (pid 7) but has
 * finished no step; rank 2 has not started; the others: rank 0 at step 5". 0 otherwise. */
int dt_heartbeat_startup_verdict(const dt_beat *b, int n, int world, double started, double now, double startup,
                                 char *msg, size_t cap);

/* Test hook: DT_TEST_FAULT="exit:STEP:RANK" ends rank RANK at once (exit 9) when it has
 * finished step STEP (STEP "start": at its start, before any work: the trainer calls
 * this with step -1 there), "hang:STEP:RANK" stops it there forever (as a rank stuck in a
 * collective), "stop:STEP:RANK" sends the whole process SIGSTOP there (after a line
 * on stderr saying so; SIGCONT resumes it). With DT_TEST_FAULT_ONCE=FILE it fires only
 * if FILE does not exist, and creates it first, so the restarted job runs on. */
void dt_test_fault(long long step, int rank);
/* Test hook for stragglers: with DT_TEST_STRAGGLER="RANK:FACTOR[:MIN_S]" (FACTOR > 1), world
 * rank RANK sleeps (FACTOR - 1) x `seconds` (the compute it just did), so it computes FACTOR
 * times slower, and at least MIN_S seconds (a tiny model's step is shorter than the
 * scheduler's noise on a loaded machine; the floor keeps the slow rank slow); nothing
 * otherwise. */
void dt_test_straggle(int rank, double seconds);

#endif
