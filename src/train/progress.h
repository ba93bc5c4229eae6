/* Human progress output: one updating line on a terminal, plain lines otherwise. */
#ifndef DT_PROGRESS_H
#define DT_PROGRESS_H

typedef struct {
    int tty, every;
    long long total;
    double t_start;
} dt_progress;

void dt_progress_init(dt_progress *p, long long total_steps, int every);
void dt_progress_step(dt_progress *p, long long step, double loss, double lr, double grad_norm, double tokens_per_s,
                      double ms, double eta_s);
/* A message on its own line (validation, checkpoint), not clobbered by the progress line. */
void dt_progress_note(dt_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_progress_end(dt_progress *p);

#endif
