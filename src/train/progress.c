#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/timer.h"

static int g_line_open;

static int under_launcher(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

void dt_progress_init(dt_progress *p, long long total_steps, int every, const char *mode) {
    if (!strcmp(mode, "tty")) p->tty = 1;
    else if (!strcmp(mode, "plain")) p->tty = 0;
    else p->tty = isatty(STDOUT_FILENO) && !under_launcher();
    p->every = every > 0 ? every : 1;
    p->total = total_steps;
    p->t_start = dt_now();
}

static void fmt_eta(char *buf, size_t n, double s) {
    if (s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

void dt_progress_step(dt_progress *p, long long step, double loss, double lr, double grad_norm, double tokens_per_s,
                      double ms, double eta_s) {
    char eta[32];
    fmt_eta(eta, sizeof eta, eta_s);
    if (p->tty) {
        printf("\r\033[Kstep %lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | ETA %s", step,
               p->total, loss, lr, grad_norm, tokens_per_s, ms, eta);
        g_line_open = 1;
    } else if (step % p->every == 0 || step == p->total || step == 1) {
        printf("step %lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | ETA %s\n", step, p->total,
               loss, lr, grad_norm, tokens_per_s, ms, eta);
    }
    fflush(stdout);
}

void dt_progress_note(dt_progress *p, const char *fmt, ...) {
    if (p->tty && g_line_open) printf("\n");
    g_line_open = 0;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

void dt_progress_end(dt_progress *p) {
    if (p->tty && g_line_open) printf("\n");
    g_line_open = 0;
    fflush(stdout);
}
