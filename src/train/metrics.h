/* JSON Lines metrics (interface.md): one object per optimizer step, per validation,
 * and a final summary; rank 0 writes, flushed every line. */
#ifndef DT_METRICS_H
#define DT_METRICS_H
#include <stddef.h>
#include <stdio.h>

#include "../core/status.h"

typedef struct {
    size_t params, grads, optim, activations, peak_rss;
    size_t workspace; /* communication buckets, gathered ZeRO-3 units, gradient scratch */
} dt_mem_report;

typedef struct { FILE *fp; } dt_metrics;

/* path "" disables; append when resuming so earlier steps are kept */
dt_status dt_metrics_open(dt_metrics *m, const char *path, int append);
/* comm_ms: wall time the step waited on data-parallel collectives (< 0: not written) */
void dt_metrics_step(dt_metrics *m, long long step, double loss, double lr, double grad_norm, double tokens_per_s,
                     double ms, double comm_ms);
void dt_metrics_val(dt_metrics *m, long long step, double val_loss);
void dt_metrics_summary(dt_metrics *m, long long steps, double final_loss, double tokens_per_s,
                        const dt_mem_report *mem, int nranks);
void dt_metrics_close(dt_metrics *m);

#endif
