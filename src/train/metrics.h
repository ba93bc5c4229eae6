/* JSON Lines metrics (interface.md): one object per optimizer step, per validation,
 * a marker where a resumed run starts and where the data begins a new epoch, and a
 * final summary; rank 0 writes, flushed
 * every line. Non-finite numbers are written as null (JSON has no NaN). A failed
 * write is reported once as a warning when it happens and as an error at the end. */
#ifndef DT_METRICS_H
#define DT_METRICS_H
#include <stddef.h>
#include <stdio.h>

#include "../comm/comm.h"
#include "../core/config.h"
#include "../core/mem_report.h"
#include "../core/status.h"

typedef struct {
    FILE *fp;
    char path[512];
    long long fail_step; /* first step whose line could not be written (-1: none) */
    int fail_errno;
} dt_metrics;

/* path "" disables; append when resuming so earlier steps are kept */
dt_status dt_metrics_open(dt_metrics *m, const char *path, int append);
/* tokens: tokens trained on since step 0; comm_ms: wall time the step waited on
 * data-parallel collectives; mfu: model FLOP/s over the job's peak (either < 0: not
 * written). Every line also gets "time", the wall clock in Unix seconds. */
/* A step's offload I/O (written when on): MB read from and written to the offload files,
 * ms waited for them, ms of the update (the streamed pass, I/O included), MB of gradients
 * handed to the host as they became final (a device's or bf16's; 0 where the pass reads them), and
 * of those, MB handed over during backward. */
typedef struct {
    int on;
    double read_mb, write_mb, wait_ms, update_ms, grads_early_mb, grads_backward_mb;
} dt_metrics_io;
/* A step's data-parallel traffic (written when on): bytes of gradients this rank put into
 * the data-parallel reductions (fp32, what they reduce in; frozen tensors' are not among
 * them), bytes of parameters it all-gathered (the sharded units', fp32), and the weight-gradient
 * GEMMs it skipped because their weights are frozen. */
typedef struct {
    int on;
    double grad_comm_bytes, dw_gemms_skipped, param_comm_bytes;
} dt_metrics_traffic;
void dt_metrics_step(dt_metrics *m, long long step, double loss, double lr, double grad_norm, long long tokens,
                     long long loss_tokens, double tokens_per_s, double ms, double comm_ms, double mfu, const dt_metrics_io *io,
                     const dt_metrics_traffic *tr);
void dt_metrics_val(dt_metrics *m, long long step, double val_loss);
/* The batch of `step` starts pass `epoch` (1-based) over the training file. */
void dt_metrics_epoch(dt_metrics *m, long long step, long long epoch);
/* A resumed run starts after `step` (from the checkpoint at dir). */
void dt_metrics_resume(dt_metrics *m, long long step, const char *dir);
/* steps: the step reached; ran: steps this run trained (final_loss is null when 0) */
void dt_metrics_summary(dt_metrics *m, long long steps, long long ran, double final_loss, double tokens_per_s,
                        double mfu, const dt_mem_report *mem, int nranks);
/* MFU's denominator, the job's peak FLOP/s (collective over world): log.peak_gflops per
 * rank when set, else a GPU's dense bf16 datasheet rate, else each rank's SGEMM rate
 * measured now with its threads, all ranks at once (ranks sharing cores share them here as
 * in training), summed over ranks. Unknown on any rank (a GPU not in the table): 0, no MFU.
 * *source: where it came from. */
dt_status dt_metrics_peak_flops(const dt_config *c, int on_gpu, dt_comm *world, double *flops, const char **source);
/* Closes; DT_ERUNTIME naming the file if any write failed. */
dt_status dt_metrics_close(dt_metrics *m);

#endif
