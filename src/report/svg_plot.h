/* Inline SVG charts for the HTML report: line plots (several series overlaid, legend,
 * tick labels, optional vertical markers) and grouped bar charts, written into a
 * growing string buffer. No dependencies beyond libc; no scripts in the output. */
#ifndef DT_SVG_PLOT_H
#define DT_SVG_PLOT_H
#include <stddef.h>

/* Growing NUL-terminated text. An allocation failure sets `failed` and later appends do
 * nothing, so a writer checks once at the end. Zero-initialised = empty. */
typedef struct {
    char *data;
    size_t len, cap;
    int failed;
} dt_sbuf;

void dt_sbuf_printf(dt_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_sbuf_puts(dt_sbuf *b, const char *s);
/* Appends s with & < > " ' replaced by entities: safe in HTML/SVG text and attributes. */
void dt_sbuf_escaped(dt_sbuf *b, const char *s);
void dt_sbuf_free(dt_sbuf *b);

/* One run's curve in a line plot. */
typedef struct {
    const char *name;           /* legend text (escaped on output) */
    const char *color;          /* "#rrggbb" */
    const double *x, *y;        /* n points in ascending x; points with a non-finite x or y are skipped */
    size_t n;
    const double *marks;        /* x positions of vertical dashed markers (resumes); may be NULL */
    size_t n_marks;
} dt_plot_series;

typedef struct {
    const char *id, *title, *xlabel, *ylabel;
    int width, height;          /* pixels */
    size_t max_points;          /* per series after downsampling (>= 2) */
    int dots;                   /* also mark each point with a dot (sparse series such as validation) */
} dt_line_plot;

/* An <svg class="plot" id=...> with one <polyline class="series"> per series that has a
 * finite point, a legend naming every series, axes with tick labels and a title. */
void dt_svg_line_plot(dt_sbuf *b, const dt_line_plot *p, const dt_plot_series *s, size_t ns);

typedef struct {
    const char *id, *title, *ylabel;
    int width, height;
    size_t n_groups, n_cats;
    const char *const *group_names; /* n_groups labels under the groups */
    const char *const *cat_names;   /* n_cats legend entries, one bar each per group */
    const char *const *cat_colors;
    const double *values;           /* [group * n_cats + cat], already in the unit of ylabel */
} dt_bar_chart;

/* An <svg class="bars" id=...> with one <rect class="bar"> per (group, category). */
void dt_svg_bar_chart(dt_sbuf *b, const dt_bar_chart *c);

/* Reduces n finite points (ascending x) to at most max_points (>= 2): split into
 * max_points/2 runs of consecutive points and keep each run's lowest and highest y, in x
 * order, so spikes stay visible. n <= max_points copies. Returns the count in ox, oy. */
size_t dt_downsample_minmax(const double *x, const double *y, size_t n, size_t max_points, double *ox, double *oy);

/* Tick positions for [lo, hi]: about `target` multiples of 1, 2 or 5 x 10^k; returns the
 * step, writes up to cap ticks and their count. */
double dt_nice_ticks(double lo, double hi, int target, double *ticks, int cap, int *count);
/* A tick label for v on a grid of the given step: as few digits as tell ticks apart,
 * k/M/G/T suffixes from 10^4 up, exponent notation for tiny steps. */
void dt_format_tick(char *buf, size_t cap, double v, double step);

#endif
