/* The training loop: data, model, data-parallel engine (which owns the optimizer),
 * metrics, validation, checkpoints. One optimizer step = every data-parallel rank runs
 * its accumulation micro-batches of the global batch, then the engine combines
 * gradients, clips and updates. Rank 0 alone prints and writes metrics. */
#ifndef DT_TRAINER_H
#define DT_TRAINER_H
#include "../comm/comm.h"
#include "../core/config.h"
#include "../core/status.h"

/* Collective over world. On failure, *report is set on exactly one rank (the lowest
 * that failed), which should print the message; every rank returns the same code. */
dt_status dt_train_run(const dt_config *cfg, dt_comm *world, int *report);

#endif
