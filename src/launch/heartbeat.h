/* The trainer's side of `dtrain launch`'s watchdog, and a fault-injection hook for its
 * tests. Both cost nothing when their environment variable is unset. */
#ifndef DT_HEARTBEAT_H
#define DT_HEARTBEAT_H

/* Rank 0 calls this after setup and after every step: touches $DTRAIN_HEARTBEAT (a file
 * the launcher created) so a launcher can tell a hung job from a slow one. */
void dt_heartbeat(void);

/* Test hook: DT_TEST_FAULT="exit:STEP:RANK" ends rank RANK at once (exit 9) when it has
 * finished step STEP, "hang:STEP:RANK" stops it there forever (as a rank stuck in a
 * collective), "stop:STEP:RANK" sends the whole process SIGSTOP there (after a line
 * on stderr saying so; SIGCONT resumes it). With DT_TEST_FAULT_ONCE=FILE it fires only if FILE does not exist, and
 * creates it first, so the restarted job runs on. */
void dt_test_fault(long long step, int rank);

#endif
