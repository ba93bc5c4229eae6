/* Human progress output: one updating line on an interactive terminal, plain lines
 * otherwise (log.progress: auto, tty, plain). Under an MPI launcher stdout is the
 * launcher's pseudo-terminal even when the job's output goes to a file, so auto
 * means plain lines there. */
#ifndef DT_PROGRESS_H
#define DT_PROGRESS_H

typedef struct {
    int tty, every;
    long long total;
    double t_start;
} dt_progress;

/* mode: "auto", "tty" or "plain" */
void dt_progress_init(dt_progress *p, long long total_steps, int every, const char *mode);
void dt_progress_step(dt_progress *p, long long step, double loss, double lr, double grad_norm, double tokens_per_s,
                      double ms, double eta_s);
/* A message on its own line (validation, checkpoint), not clobbered by the progress line. */
void dt_progress_note(dt_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_progress_end(dt_progress *p);

#endif
