/* `dtrain report`: one self-contained HTML page (inline SVG, no scripts, no external
 * resources) that overlays one or more runs' metrics: losses against steps and tokens,
 * learning rate, gradient norm, throughput, and per-rank memory from the summary. */
#ifndef DT_REPORT_H
#define DT_REPORT_H
#include <stddef.h>

#include "../core/status.h"
#include "runlog.h"
#include "svg_plot.h"

extern const char *const DT_REPORT_USAGE;

/* `dtrain report METRICS.jsonl [MORE.jsonl ...] --out FILE.html` (argv after "report"):
 * reads every file, then replaces FILE.html atomically; prints one line on success. */
dt_status dt_report_cmd(int argc, char **argv);

/* Appends the whole page for runs[0..n) to out. */
dt_status dt_report_html(const dt_run *runs, size_t n, dt_sbuf *out);

#endif
