/* Large, long-lived buffers (parameters, gradients, optimizer state, activations).
 * First touch of fresh pages is slow on small VMs, so these are allocated once,
 * 2 MiB aligned with transparent huge pages requested, and reused every step. */
#ifndef DT_MEM_H
#define DT_MEM_H
#include <stddef.h>
#include "status.h"

/* Zero-filled, 64-byte aligned (2 MiB when large). */
dt_status dt_alloc(void **out, size_t bytes, const char *what);
void dt_free(void *p);
/* Peak resident set size of this process in bytes (from /proc/self/status VmHWM). */
size_t dt_peak_rss(void);

#endif
