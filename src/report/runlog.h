/* Reads one run's metrics file (JSON Lines, src/train/metrics.c) into per-step series
 * for the report. Tolerant of what real files contain: null values (non-finite numbers)
 * become NaN, unknown events are ignored, and steps written again after a resume keep
 * their last value, and a line cut short (a run killed mid-write, a full disk: an
 * unterminated last line, or one that begins an object and does not parse) is skipped
 * and counted. Strict about what is not a metrics file: any other line that is not a
 * JSON object, or a step row without a numeric "step", is an error naming file and line. */
#ifndef DT_RUNLOG_H
#define DT_RUNLOG_H
#include <stddef.h>

#include "../core/status.h"

typedef struct {
    double rank, params, grads, optim, activations, workspace, peak_rss; /* bytes; NaN if missing */
} dt_rank_mem;

typedef struct {
    char name[256]; /* the file's basename without ".jsonl" */

    /* one entry per step, ascending; NaN where the value was null or missing */
    size_t n;
    double *step, *loss, *lr, *grad_norm, *tokens_per_s;
    /* cumulative tokens at the end of each step: the row's "tokens" field when present,
     * else the previous point's plus tokens_per_s * ms / 1000 per step since it */
    double *tokens;
    double *mfu; /* model FLOPs utilization, a fraction (NaN: not written, older runs) */

    size_t n_val; /* validations, ascending step, last value per step */
    double *val_step, *val_loss, *val_tokens;

    size_t n_resume; /* {"event": "resume", "step"} markers, in file order */
    double *resume_step, *resume_tokens;

    int torn_tail; /* the last line was cut short (a killed run) and was skipped */
    size_t n_torn, torn_line; /* lines cut short and skipped (the tail's included); the first's number */
    int has_summary; /* from the last summary line */
    double summary_steps, final_loss, summary_tokens_per_s, summary_mfu;
    size_t n_mem;
    dt_rank_mem *mem;
} dt_run;

/* Parses text (len bytes, need not be NUL-terminated) as the metrics of a run called
 * name; origin names the file in error messages. On failure *r holds nothing to free. */
dt_status dt_run_parse(dt_run *r, const char *name, const char *origin, const char *text, size_t len);
/* Reads path and parses it; the run is named after the file. No step rows: DT_EINPUT. */
dt_status dt_run_load(dt_run *r, const char *path);
void dt_run_free(dt_run *r);

/* Cumulative tokens at `step` (interpolated between logged steps; NaN outside them). */
double dt_run_tokens_at(const dt_run *r, double step);

#endif
