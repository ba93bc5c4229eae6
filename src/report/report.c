#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/atomic_file.h"

const char *const DT_REPORT_USAGE =
    "usage: dtrain report METRICS.jsonl [MORE.jsonl ...] --out FILE.html\n"
    "  one self-contained HTML page (inline SVG, nothing loaded from elsewhere) overlaying the runs:\n"
    "  training and validation loss against steps and tokens, learning rate, gradient norm,\n"
    "  tokens/s, MFU, and per-rank memory from each run's summary line; runs are named after their files\n"
    "  --out FILE.html   the page to write (replaced atomically)\n";

enum { PLOT_W = 500, PLOT_H = 300, MAX_POINTS = 2000 };

/* Run colours (Tableau 10); memory categories use a different palette (Set2) so a run's
 * colour means that run everywhere on the page. */
static const char *const RUN_COLORS[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_RUN_COLORS (sizeof RUN_COLORS / sizeof RUN_COLORS[0])
static const char *const MEM_NAMES[] = {"params", "grads", "optim", "activations", "workspace", "peak RSS"};
static const char *const MEM_COLORS[] = {"#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#b3b3b3"};
#define N_MEM 6

static const char *run_color(size_t i) { return RUN_COLORS[i % N_RUN_COLORS]; }

enum { Y_LOSS, Y_VAL, Y_LR, Y_GRAD_NORM, Y_TPS, Y_MFU };

typedef struct {
    const char *id, *title, *xlabel, *ylabel;
    int by_tokens, what;
} plot_def;

static const plot_def PLOTS[] = {
    {"train-loss-steps", "Training loss", "step", "loss", 0, Y_LOSS},
    {"train-loss-tokens", "Training loss against tokens", "tokens", "loss", 1, Y_LOSS},
    {"val-loss-steps", "Validation loss", "step", "validation loss", 0, Y_VAL},
    {"val-loss-tokens", "Validation loss against tokens", "tokens", "validation loss", 1, Y_VAL},
    {"lr", "Learning rate", "step", "learning rate", 0, Y_LR},
    {"grad-norm", "Gradient norm", "step", "global L2 norm", 0, Y_GRAD_NORM},
    {"tokens-per-s", "Throughput", "step", "tokens/s", 0, Y_TPS},
    {"mfu", "Model FLOPs utilization", "step", "MFU (fraction of peak)", 0, Y_MFU},
};
#define N_PLOTS (sizeof PLOTS / sizeof PLOTS[0])

static dt_plot_series series_for(const plot_def *d, const dt_run *r, size_t i) {
    dt_plot_series s = {r->name, run_color(i), NULL, NULL, r->n, NULL, r->n_resume};
    if (d->what == Y_VAL) {
        s.x = d->by_tokens ? r->val_tokens : r->val_step;
        s.y = r->val_loss;
        s.n = r->n_val;
    } else {
        s.x = d->by_tokens ? r->tokens : r->step;
        s.y = d->what == Y_LOSS ? r->loss : d->what == Y_LR ? r->lr : d->what == Y_GRAD_NORM ? r->grad_norm
                                                                  : d->what == Y_MFU       ? r->mfu
                                                                                          : r->tokens_per_s;
    }
    s.marks = d->by_tokens ? r->resume_tokens : r->resume_step;
    return s;
}

static double last_finite(const double *v, size_t n) {
    for (size_t i = n; i-- > 0;)
        if (isfinite(v[i])) return v[i];
    return NAN;
}

static void cell_num(dt_sbuf *b, double v, const char *fmt) {
    if (isfinite(v)) {
        dt_sbuf_puts(b, "<td>");
        dt_sbuf_printf(b, fmt, v);
        dt_sbuf_puts(b, "</td>");
    } else {
        dt_sbuf_puts(b, "<td>-</td>");
    }
}

/* Binary unit for a byte count: the largest of B, KiB, MiB, GiB, TiB not above it. */
static double byte_unit(double max, const char **name) {
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (k < 4 && max >= pow(1024, k + 1)) k++;
    *name = names[k];
    return pow(1024, k);
}

static void runs_table(dt_sbuf *b, const dt_run *runs, size_t n) {
    dt_sbuf_puts(b, "<table class=\"runs\"><tr><th>run</th><th>last step</th><th>final loss</th><th>last val loss</th>"
                    "<th>tokens</th><th>tokens/s</th><th>MFU</th><th>ranks</th><th>peak RSS (max rank)</th><th>resumed at step</th>"
                    "</tr>\n");
    for (size_t i = 0; i < n; i++) {
        const dt_run *r = &runs[i];
        dt_sbuf_printf(b, "<tr><td><span class=\"swatch\" style=\"background:%s\"></span>", run_color(i));
        dt_sbuf_escaped(b, r->name);
        dt_sbuf_puts(b, "</td>");
        cell_num(b, r->step[r->n - 1], "%.0f");
        double fl = r->has_summary && isfinite(r->final_loss) ? r->final_loss : last_finite(r->loss, r->n);
        cell_num(b, fl, "%.4f");
        cell_num(b, last_finite(r->val_loss, r->n_val), "%.4f");
        char tok[64] = "-";
        double t = last_finite(r->tokens, r->n);
        if (isfinite(t)) dt_format_tick(tok, sizeof tok, t, t >= 1e4 ? pow(10, floor(log10(t)) - 2) : 1);
        dt_sbuf_printf(b, "<td>%s</td>", tok);
        double tps = r->summary_tokens_per_s;
        if (!(r->has_summary && isfinite(tps))) { /* no summary: the mean over steps */
            double sum = 0;
            size_t k = 0;
            for (size_t j = 0; j < r->n; j++)
                if (isfinite(r->tokens_per_s[j])) sum += r->tokens_per_s[j], k++;
            tps = k ? sum / (double)k : NAN;
        }
        cell_num(b, tps, "%.0f");
        double mfu = r->has_summary && isfinite(r->summary_mfu) ? r->summary_mfu : last_finite(r->mfu, r->n);
        cell_num(b, 100.0 * mfu, "%.1f%%");
        double rss = NAN;
        for (size_t j = 0; j < r->n_mem; j++)
            if (isfinite(r->mem[j].peak_rss) && !(r->mem[j].peak_rss <= rss)) rss = r->mem[j].peak_rss;
        if (r->n_mem) dt_sbuf_printf(b, "<td>%zu</td>", r->n_mem);
        else dt_sbuf_puts(b, "<td>-</td>");
        cell_num(b, rss / (1024.0 * 1024.0), "%.1f MiB");
        dt_sbuf_puts(b, "<td>");
        for (size_t j = 0; j < r->n_resume; j++) dt_sbuf_printf(b, "%s%.0f", j ? ", " : "", r->resume_step[j]);
        dt_sbuf_puts(b, r->n_resume ? "</td></tr>\n" : "-</td></tr>\n");
    }
    dt_sbuf_puts(b, "</table>\n");
}

static dt_status memory_chart(dt_sbuf *b, const dt_run *r, size_t i) {
    if (!r->n_mem) return DT_OK;
    double *vals = malloc(r->n_mem * N_MEM * sizeof *vals);
    char(*labels)[32] = malloc(r->n_mem * sizeof *labels);
    const char **groups = malloc(r->n_mem * sizeof *groups);
    if (!vals || !labels || !groups) {
        free(vals), free(labels), free(groups);
        return dt_fail(DT_ERUNTIME, "out of memory");
    }
    double max = 0;
    for (size_t g = 0; g < r->n_mem; g++) {
        const dt_rank_mem *m = &r->mem[g];
        double v[N_MEM] = {m->params, m->grads, m->optim, m->activations, m->workspace, m->peak_rss};
        for (int k = 0; k < N_MEM; k++) {
            vals[g * N_MEM + k] = v[k];
            if (isfinite(v[k]) && v[k] > max) max = v[k];
        }
        snprintf(labels[g], sizeof labels[g], "rank %.0f", m->rank);
        groups[g] = labels[g];
    }
    const char *unit;
    double scale = byte_unit(max, &unit);
    for (size_t k = 0; k < r->n_mem * N_MEM; k++) vals[k] /= scale;
    char id[64], title[300];
    snprintf(id, sizeof id, "mem-%zu", i);
    snprintf(title, sizeof title, "Memory per rank: %s", r->name);
    dt_bar_chart c = {id, title, unit, PLOT_W, PLOT_H, r->n_mem, N_MEM, groups, MEM_NAMES, MEM_COLORS, vals};
    dt_svg_bar_chart(b, &c);
    free(vals), free(labels), free(groups);
    return DT_OK;
}

dt_status dt_report_html(const dt_run *runs, size_t n, dt_sbuf *b) {
    dt_sbuf_puts(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>dtrain report: ");
    for (size_t i = 0; i < n; i++) {
        if (i) dt_sbuf_puts(b, ", ");
        dt_sbuf_escaped(b, runs[i].name);
    }
    dt_sbuf_puts(b, "</title>\n<style>\n"
                    "body{font-family:sans-serif;margin:16px;color:#222;background:#f4f4f4}\n"
                    "h1{font-size:20px;margin:0 0 10px}\n"
                    "table{border-collapse:collapse;background:#fff;font-size:13px;margin-bottom:14px}\n"
                    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\n"
                    "td:first-child,th:first-child{text-align:left}\n"
                    ".swatch{display:inline-block;width:11px;height:11px;margin-right:6px}\n"
                    ".grid{display:flex;flex-wrap:wrap;gap:10px}svg{border:1px solid #ccc}\n"
                    "</style>\n</head>\n<body>\n<h1>dtrain report</h1>\n");
    runs_table(b, runs, n);
    /* one flowing grid (two charts a row in a ~1100 px window): the line plots, then
     * each run's memory chart; runs without per-rank memory are listed below it */
    dt_plot_series *s = malloc(n * sizeof *s);
    if (!s) return dt_fail(DT_ERUNTIME, "out of memory");
    dt_sbuf_puts(b, "<div class=\"grid\">\n");
    int any_mfu = 0; /* runs before MFU was written have none: no empty chart for them */
    for (size_t i = 0; i < n; i++) any_mfu |= isfinite(last_finite(runs[i].mfu, runs[i].n));
    for (size_t p = 0; p < N_PLOTS; p++) {
        const plot_def *d = &PLOTS[p];
        if (d->what == Y_MFU && !any_mfu) continue;
        for (size_t i = 0; i < n; i++) s[i] = series_for(d, &runs[i], i);
        dt_line_plot lp = {d->id, d->title, d->xlabel, d->ylabel, PLOT_W, PLOT_H, MAX_POINTS, d->what == Y_VAL};
        dt_svg_line_plot(b, &lp, s, n);
    }
    free(s);
    for (size_t i = 0; i < n; i++) DT_TRY(memory_chart(b, &runs[i], i));
    dt_sbuf_puts(b, "</div>\n");
    for (size_t i = 0; i < n; i++)
        if (!runs[i].n_mem) {
            dt_sbuf_puts(b, "<p class=\"nomem\">No per-rank memory for ");
            dt_sbuf_escaped(b, runs[i].name);
            dt_sbuf_puts(b, runs[i].has_summary ? ": its summary line has none.</p>\n"
                                                : ": no summary line (the run did not finish).</p>\n");
        }
    dt_sbuf_puts(b, "</body>\n</html>\n");
    return b->failed ? dt_fail(DT_ERUNTIME, "out of memory") : DT_OK;
}

/* Fails early, before any input is read, when out cannot be created: its directory
 * must exist and be writable, and out must not be a directory. */
static dt_status check_output(const char *out) {
    struct stat st;
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
        return dt_fail(DT_EINPUT, "report: output '%s' is a directory", out);
    char dir[1024];
    const char *slash = strrchr(out, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == out ? 1 : (int)(slash - out), out);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_fail(DT_EINPUT, "report: cannot write '%s': directory '%s' does not exist", out, dir);
    if (access(dir, W_OK) != 0)
        return dt_fail(DT_EINPUT, "report: cannot write '%s': directory '%s' is not writable (%s)", out, dir,
                       strerror(errno));
    return DT_OK;
}

/* Two files with one basename get " (2)", " (3)"... so the legend tells them apart. */
static void unique_names(dt_run *runs, size_t n) {
    for (size_t i = 1; i < n; i++) {
        int dup = 1;
        char base[sizeof runs[i].name];
        snprintf(base, sizeof base, "%s", runs[i].name);
        for (int k = 2; dup; k++) {
            dup = 0;
            for (size_t j = 0; j < i && !dup; j++) dup = !strcmp(runs[i].name, runs[j].name);
            if (dup) snprintf(runs[i].name, sizeof runs[i].name, "%.200s (%d)", base, k);
        }
    }
}

dt_status dt_report_cmd(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(DT_REPORT_USAGE, stdout);
            return DT_OK;
        }
    const char *out = NULL;
    const char **inputs = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!inputs) return dt_fail(DT_ERUNTIME, "out of memory");
    size_t n = 0;
    dt_status s = DT_OK;
    for (int i = 0; i < argc && s == DT_OK; i++) {
        if (!strcmp(argv[i], "--out") || !strcmp(argv[i], "-o")) {
            if (i + 1 >= argc) s = dt_fail(DT_EINPUT, "option %s needs a value", argv[i]);
            else out = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            s = dt_fail(DT_EINPUT, "unknown option '%s' (see dtrain report --help)", argv[i]);
        } else {
            inputs[n++] = argv[i];
        }
    }
    if (s == DT_OK && !n) s = dt_fail(DT_EINPUT, "report: no metrics files given (see dtrain report --help)");
    if (s == DT_OK && !out) s = dt_fail(DT_EINPUT, "report: --out FILE.html is required");
    if (s == DT_OK) s = check_output(out);
    dt_run *runs = s == DT_OK ? calloc(n, sizeof *runs) : NULL;
    if (s == DT_OK && !runs) s = dt_fail(DT_ERUNTIME, "out of memory");
    size_t loaded = 0;
    for (; s == DT_OK && loaded < n; loaded++)
        if ((s = dt_run_load(&runs[loaded], inputs[loaded])) != DT_OK) break;
        else if (runs[loaded].n_torn == 1 && runs[loaded].torn_tail)
            fprintf(stderr, "dtrain: warning: %s: the last line is cut short (a run stopped while writing it); "
                    "skipped\n", inputs[loaded]);
        else if (runs[loaded].n_torn == 1) /* once per file */
            fprintf(stderr, "dtrain: warning: %s:%zu: a torn line (a run killed mid-write?) skipped\n", inputs[loaded],
                    runs[loaded].torn_line);
        else if (runs[loaded].n_torn)
            fprintf(stderr, "dtrain: warning: %s:%zu: a torn line (a run killed mid-write?) skipped, %zu in all\n",
                    inputs[loaded], runs[loaded].torn_line, runs[loaded].n_torn);
    dt_sbuf page = {0};
    if (s == DT_OK) {
        unique_names(runs, n);
        s = dt_report_html(runs, n, &page);
    }
    if (s == DT_OK) s = dt_write_file_atomic(out, page.data, page.len);
    if (s == DT_OK) {
        size_t steps = 0;
        for (size_t i = 0; i < n; i++) steps += runs[i].n;
        printf("report: %zu run%s, %zu steps -> %s (%zu KiB)\n", n, n == 1 ? "" : "s", steps, out, page.len / 1024);
    }
    dt_sbuf_free(&page);
    for (size_t i = 0; i < loaded; i++) dt_run_free(&runs[i]);
    free(runs);
    free(inputs);
    return s;
}
