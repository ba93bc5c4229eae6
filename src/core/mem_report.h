/* A rank's memory by kind, in bytes: what the data-parallel strategies report for their
 * state and the trainer prints and writes in the metrics summary. Here, below both, so
 * the strategies need not include the trainer's headers. */
#ifndef DT_MEM_REPORT_H
#define DT_MEM_REPORT_H
#include <stddef.h>

typedef struct {
    size_t params, grads, optim, activations, peak_rss;
    size_t workspace; /* communication buckets, gathered ZeRO-3 units, gradient scratch */
    size_t offload_host, offload_file; /* offloaded state: in host memory (or NVMe's buffers), in the offload file */
} dt_mem_report;

#endif
