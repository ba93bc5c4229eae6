/* The deterministic delayed mode (parallel.staleness s with dp_mode ddp or ps; docs/
 * parallelism.md, "Stale gradients"): the gradient applied at update t was computed at
 * the weights of update t - s, on the run's fixed data order, the way an asynchronous
 * parameter server with every gradient exactly s updates old would apply it. Each step's
 * reduced gradients (and their norm, for clipping) wait in a queue of s; the first s steps
 * update nothing, and the optimizer counts the updates it applies (AdamW's bias correction
 * at update t - s + 1). s = 0 is synchronous training, untouched. Reproducible: the tool to
 * check asynchronous training against. */
#ifndef DT_STALENESS_H
#define DT_STALENESS_H
#include <stddef.h>

#include "../../backend/ops.h"
#include "../../core/status.h"

typedef struct dt_stale dt_stale;

/* A queue of s gradients of n storage-precision elements in the backend's memory. */
dt_status dt_stale_create(dt_stale **out, const dt_ops *ops, size_t n, int s);
void dt_stale_free(dt_stale *q);
/* Step t (0-based) computed grads (norm: their global norm): queued; when a gradient s
 * steps old is due, grads becomes it and *norm its norm, and 1 is returned; 0 while the
 * queue fills (nothing to apply). */
int dt_stale_exchange(dt_stale *q, long long t, void *grads, double *norm);
/* Bytes it holds. */
size_t dt_stale_bytes(const dt_stale *q);
/* The gradients still waiting after `steps` steps (those of steps steps - s .. steps - 1),
 * as this rank's checkpoint state (ckpt/rank_state.h), and back. */
dt_status dt_stale_save(dt_stale *q, long long steps, const char *dir, int rank, const char *layout);
dt_status dt_stale_load(dt_stale *q, long long steps, const char *step_dir, int rank, const char *layout);

#endif
