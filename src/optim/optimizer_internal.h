/* Between the optimizer (adamw.c) and its delayed update (delayed_update.c). */
#ifndef DT_OPTIMIZER_INTERNAL_H
#define DT_OPTIMIZER_INTERNAL_H
#include "optimizer.h"

/* n storage-precision elements at src (the backend's memory, at most o->chunk of them
 * when staged) as fp32 in host memory dst. */
void dt_optimizer_to_host_f32(const dt_optimizer *o, float *dst, const void *src, size_t n);

/* Host memory for the optimizer's buffers: the store's allocator (page-locked for a
 * device with offload.pin_memory), else zeroed page-aligned memory; dt_optimizer_host_free
 * gives it back. */
dt_status dt_optimizer_host_alloc(dt_optimizer *o, const dt_store_opts *so, void **p, size_t bytes, const char *what);
void dt_optimizer_host_free(const dt_optimizer *o, void *p);
/* The delayed update's state (NULL until created) and the thread that runs its pass. */
dt_status dt_delayed_create(dt_optimizer *o, const dt_store_opts *so);
void dt_delayed_free(dt_optimizer *o);
/* A delayed pass: start (no pieces), record each piece (its gradients copied now), launch
 * (the thread runs the pass over the store). */
void dt_delayed_start(dt_optimizer *o);
dt_status dt_delayed_record(dt_optimizer *o, long long step, int decay, double lr, float gscale, size_t k,
                            float *param, const float *g, size_t n);
dt_status dt_delayed_launch(dt_optimizer *o);
/* Waits for the pass in flight, if any, and writes the weights it produced to the
 * parameters; its error, if it failed. */
dt_status dt_delayed_settle(dt_optimizer *o);
/* A pass launched and not settled yet. */
int dt_delayed_pending(const dt_optimizer *o);
/* Host bytes of the two fp32 copies (0 without a delayed update). */
size_t dt_delayed_host_bytes(const dt_optimizer *o);

#endif
