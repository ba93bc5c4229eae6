/* Host staging of the training state for the collectives. MPI reduces host memory, and
 * reductions are fp32 whatever the storage precision: a device's or bf16 storage's
 * gradients are copied to an fp32 host buffer (bf16 widened), reduced there and copied
 * back (rounded to storage precision). Used by DDP, the central rank and ZeRO. */
#ifndef DT_STAGING_H
#define DT_STAGING_H
#include <stddef.h>

#include "../../backend/ops.h"

/* Whether the state's collectives go through host staging: device memory, or bf16
 * storage (reduced in fp32). */
static inline int dt_stage_needed(const dt_ops *ops) { return ops->on_device || ops->bf16; }
/* n storage-precision elements at src (the backend's memory) as fp32 at dst (host memory,
 * room for n floats). */
void dt_stage_widen(const dt_ops *ops, float *dst, const void *src, size_t n);
/* n fp32 values at src (host memory) into storage precision at dst (the backend's
 * memory). With bf16 storage src is the rounding buffer: its contents are lost. */
void dt_stage_narrow(const dt_ops *ops, void *dst, float *src, size_t n);

#endif
