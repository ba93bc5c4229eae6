/* The training loop: data, metrics, validation, checkpoints, around the layout value
 * (parallel/layout/layout.h) and the parallelized model (parallel/parallelize.h), whose
 * step runs every micro-batch of this rank, combines gradients, clips and updates: the
 * loop is the same for every layout. Rank 0 alone prints and writes metrics. */
#ifndef DT_TRAINER_H
#define DT_TRAINER_H
#include "../comm/comm.h"
#include "../core/config.h"
#include "../core/status.h"

/* Collective over world. On failure, *report is set on exactly one rank (the lowest
 * that failed), which should print the message; every rank returns the same code. */
dt_status dt_train_run(const dt_config *cfg, dt_comm *world, int *report);

#endif
