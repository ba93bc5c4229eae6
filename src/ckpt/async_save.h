/* Asynchronous checkpointing: a save's gather stays collective and synchronous, its write
 * (files, fsyncs, renames, `latest`) runs in a forked child while training goes on. fork's
 * copy-on-write pages are the snapshot: the child sees the state of the moment of the fork
 * however the parent's pages change afterwards, with no copy made up front. The child only
 * writes files (no MPI, no device, no threads) and commits as dt_ckpt_save does, so every
 * crash point of the commit protocol holds; it dies with its parent (PR_SET_PDEATHSIG),
 * leaving at most a temporary directory that the next run removes. */
#ifndef DT_ASYNC_SAVE_H
#define DT_ASYNC_SAVE_H

#include <sys/types.h>

#include "checkpoint.h"

typedef struct {
    pid_t pid;      /* the writing child, 0 when none */
    int fd;         /* read end of the child's error-message pipe */
    long long step; /* the step it writes */
} dt_ckpt_async;

/* Starts dt_ckpt_save(dir, m, exp_avg, exp_avg_sq, st, config_json, shard_mb) in a child;
 * waits for a previous one first. */
dt_status dt_ckpt_save_async(dt_ckpt_async *a, const char *dir, const gpt_model *m, float *const *exp_avg,
                             float *const *exp_avg_sq, const dt_train_state *st, const char *config_json,
                             double shard_mb);
/* Waits for the child in flight (DT_OK when none): its status, with its message. */
dt_status dt_ckpt_async_wait(dt_ckpt_async *a);

#endif
