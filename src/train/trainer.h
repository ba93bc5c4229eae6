/* The training loop: data, model, optimizer, metrics, validation, checkpoints.
 * One optimizer step = accumulation over micro-batches of the global batch, then
 * gradient clipping and AdamW. */
#ifndef DT_TRAINER_H
#define DT_TRAINER_H
#include "../core/config.h"
#include "../core/status.h"

dt_status dt_train_run(const dt_config *cfg);

#endif
