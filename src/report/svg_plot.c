#include "svg_plot.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- string buffer ---- */

static int sbuf_reserve(dt_sbuf *b, size_t extra) {
    if (b->failed) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1) {
        if (cap > (size_t)-1 / 2) {
            b->failed = 1;
            return 0;
        }
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = 1;
        return 0;
    }
    b->data = d;
    b->cap = cap;
    return 1;
}

void dt_sbuf_printf(dt_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !sbuf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void dt_sbuf_puts(dt_sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (!sbuf_reserve(b, n)) return;
    memcpy(b->data + b->len, s, n + 1);
    b->len += n;
}

void dt_sbuf_escaped(dt_sbuf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': dt_sbuf_puts(b, "&amp;"); break;
        case '<': dt_sbuf_puts(b, "&lt;"); break;
        case '>': dt_sbuf_puts(b, "&gt;"); break;
        case '"': dt_sbuf_puts(b, "&quot;"); break;
        case '\'': dt_sbuf_puts(b, "&#39;"); break;
        default: {
            char c[2] = {*s, 0};
            dt_sbuf_puts(b, c);
        }
        }
    }
}

void dt_sbuf_free(dt_sbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}

/* ---- numbers ---- */

size_t dt_downsample_minmax(const double *x, const double *y, size_t n, size_t max_points, double *ox, double *oy) {
    if (max_points < 2) max_points = 2;
    if (n <= max_points) {
        memcpy(ox, x, n * sizeof *x);
        memcpy(oy, y, n * sizeof *y);
        return n;
    }
    size_t nb = max_points / 2, m = 0;
    for (size_t k = 0; k < nb; k++) {
        size_t i0 = k * n / nb, i1 = (k + 1) * n / nb, lo = i0, hi = i0;
        for (size_t i = i0 + 1; i < i1; i++) {
            if (y[i] < y[lo]) lo = i;
            if (y[i] > y[hi]) hi = i;
        }
        size_t a = lo < hi ? lo : hi, c = lo < hi ? hi : lo;
        ox[m] = x[a], oy[m++] = y[a];
        if (c != a) ox[m] = x[c], oy[m++] = y[c];
    }
    return m;
}

static double nice_step(double range, int target) {
    double raw = range / (target > 0 ? target : 1);
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

double dt_nice_ticks(double lo, double hi, int target, double *ticks, int cap, int *count) {
    *count = 0;
    if (!(hi > lo) || !isfinite(hi - lo)) return 1;
    double step = nice_step(hi - lo, target);
    double k0 = ceil(lo / step - 1e-9), k1 = floor(hi / step + 1e-9);
    for (double k = k0; k <= k1 && *count < cap; k++) {
        double v = k * step;
        if (fabs(v) < step * 1e-9) v = 0; /* no "-0" label */
        ticks[(*count)++] = v;
    }
    return step;
}

/* (int)d limited to [lo, hi]; NaN and infinities (a zero step's log) land on a bound. */
static int clamp_int(double d, int lo, int hi) { return !(d > lo) ? lo : !(d < hi) ? hi : (int)d; }

void dt_format_tick(char *buf, size_t cap, double v, double step) {
    double a = fabs(v);
    if (v == 0) {
        snprintf(buf, cap, "0");
    } else if (a >= 1e4 || (step >= 1e3 && a >= 1e3)) {
        static const char *const suffix[] = {"", "k", "M", "G", "T"};
        int e = clamp_int(floor(log10(a) / 3), 0, 4);
        double scale = pow(10, 3 * e);
        int dec = clamp_int(ceil(-log10(step / scale) - 1e-9), 0, 3);
        snprintf(buf, cap, "%.*f%s", dec, v / scale, suffix[e]);
    } else if (step >= 1e-4) {
        int dec = clamp_int(ceil(-log10(step) - 1e-9), 0, 6);
        snprintf(buf, cap, "%.*f", dec, v);
    } else {
        int p = clamp_int(floor(log10(a)) - floor(log10(step)), 0, 6);
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.*e", p, v);
        /* "2.5e-05" -> "2.5e-5" */
        char *e = strchr(tmp, 'e');
        if (e && (e[1] == '-' || e[1] == '+')) {
            char *d = e + 2;
            while (d[0] == '0' && d[1]) memmove(d, d + 1, strlen(d));
            if (e[1] == '+') memmove(e + 1, e + 2, strlen(e + 1));
        }
        snprintf(buf, cap, "%s", tmp);
    }
}

/* ---- shared chart parts ---- */

enum { LEGEND_Y0 = 40, LEGEND_ROW = 16, MARGIN_L = 66, MARGIN_R = 16, MARGIN_B = 42, MAX_TICKS = 32 };

/* Lays out legend entries left to right, wrapping at the chart width; draws them when b
 * is not NULL. Returns the number of rows. */
static int legend(dt_sbuf *b, int width, size_t n, const char *const *names, const char *const *colors,
                  const int *empty) {
    double x = MARGIN_L, right = width - MARGIN_R;
    int row = 0;
    if (b) dt_sbuf_puts(b, "<g class=\"legend\" font-size=\"12\">");
    for (size_t i = 0; i < n; i++) {
        double w = 18 + 7.0 * (double)(strlen(names[i]) + (empty && empty[i] ? 10 : 0)) + 16;
        if (x + w > right && x > MARGIN_L) {
            row++;
            x = MARGIN_L;
        }
        if (b) {
            double y = LEGEND_Y0 + row * LEGEND_ROW;
            dt_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y - 10,
                           colors[i]);
            dt_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\">", x + 17, y);
            dt_sbuf_escaped(b, names[i]);
            if (empty && empty[i]) dt_sbuf_puts(b, " (no data)");
            dt_sbuf_puts(b, "</text>");
        }
        x += w;
    }
    if (b) dt_sbuf_puts(b, "</g>\n");
    return n ? row + 1 : 0;
}

static void chart_open(dt_sbuf *b, const char *cls, const char *id, const char *title, int w, int h) {
    dt_sbuf_printf(b, "<svg class=\"%s\" id=\"", cls);
    dt_sbuf_escaped(b, id);
    dt_sbuf_printf(b,
                   "\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\" "
                   "fill=\"#333\">\n<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n"
                   "<text class=\"title\" x=\"%d\" y=\"17\" text-anchor=\"middle\" font-size=\"14\" "
                   "font-weight=\"bold\">",
                   w, h, w, h, w, h, w / 2);
    dt_sbuf_escaped(b, title);
    dt_sbuf_puts(b, "</text>\n");
}

/* Horizontal grid lines and labels for the y ticks of [lo, hi] mapped onto [bottom, top]. */
static void y_axis(dt_sbuf *b, double lo, double hi, const double *ticks, int nt, double step, double left,
                   double right, double top, double bottom) {
    char lab[64];
    for (int i = 0; i < nt; i++) {
        double y = bottom - (ticks[i] - lo) / (hi - lo) * (bottom - top);
        dt_format_tick(lab, sizeof lab, ticks[i], step);
        dt_sbuf_printf(b,
                       "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>"
                       "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                       left, right, y, y, left - 5, y + 4, lab);
    }
}

static void axis_labels(dt_sbuf *b, const char *xlabel, const char *ylabel, double left, double right, double top,
                        double bottom, int h) {
    dt_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n",
                   left, top, right - left, bottom - top);
    if (xlabel && *xlabel) {
        dt_sbuf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", (left + right) / 2, h - 8);
        dt_sbuf_escaped(b, xlabel);
        dt_sbuf_puts(b, "</text>\n");
    }
    if (ylabel && *ylabel) {
        dt_sbuf_printf(b, "<text transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\">",
                       (top + bottom) / 2);
        dt_sbuf_escaped(b, ylabel);
        dt_sbuf_puts(b, "</text>\n");
    }
}

/* Widens a degenerate range so it can be drawn. */
static void widen(double *lo, double *hi) {
    if (*hi > *lo) return;
    double d = fabs(*lo) > 0 ? fabs(*lo) * 0.05 : 1;
    *lo -= d;
    *hi += d;
}

/* ---- line plot ---- */

void dt_svg_line_plot(dt_sbuf *b, const dt_line_plot *p, const dt_plot_series *s, size_t ns) {
    double **px = calloc(ns ? ns : 1, sizeof *px), **py = calloc(ns ? ns : 1, sizeof *py);
    size_t *pn = calloc(ns ? ns : 1, sizeof *pn);
    const char **names = calloc(ns ? ns : 1, sizeof *names), **colors = calloc(ns ? ns : 1, sizeof *colors);
    int *empty = calloc(ns ? ns : 1, sizeof *empty);
    if (!px || !py || !pn || !names || !colors || !empty) {
        b->failed = 1;
        goto done;
    }
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    size_t maxp = p->max_points < 2 ? 2 : p->max_points;
    for (size_t k = 0; k < ns; k++) {
        names[k] = s[k].name;
        colors[k] = s[k].color;
        double *fx = malloc((s[k].n ? s[k].n : 1) * sizeof *fx), *fy = malloc((s[k].n ? s[k].n : 1) * sizeof *fy);
        size_t m = 0;
        if (fx && fy)
            for (size_t i = 0; i < s[k].n; i++)
                if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                    fx[m] = s[k].x[i], fy[m++] = s[k].y[i];
                    if (fx[m - 1] < xlo) xlo = fx[m - 1];
                    if (fx[m - 1] > xhi) xhi = fx[m - 1];
                    if (fy[m - 1] < ylo) ylo = fy[m - 1];
                    if (fy[m - 1] > yhi) yhi = fy[m - 1];
                }
        size_t cap = m < maxp ? m : maxp;
        px[k] = malloc((cap ? cap : 1) * sizeof **px);
        py[k] = malloc((cap ? cap : 1) * sizeof **py);
        if (!fx || !fy || !px[k] || !py[k]) {
            free(fx), free(fy);
            b->failed = 1;
            goto done;
        }
        pn[k] = dt_downsample_minmax(fx, fy, m, maxp, px[k], py[k]);
        empty[k] = pn[k] == 0;
        free(fx), free(fy);
    }
    int w = p->width, h = p->height;
    chart_open(b, "plot", p->id, p->title, w, h);
    int rows = legend(NULL, w, ns, names, colors, empty);
    legend(b, w, ns, names, colors, empty);
    double left = MARGIN_L, right = w - MARGIN_R, top = LEGEND_Y0 + (rows - 1) * LEGEND_ROW + 12;
    double bottom = h - MARGIN_B;
    if (rows == 0) top = 28;
    int have = xlo <= xhi;
    if (!have) xlo = 0, xhi = 1, ylo = 0, yhi = 1;
    widen(&xlo, &xhi);
    widen(&ylo, &yhi);
    /* y: extend to whole ticks; x: the data's own range */
    double yt[MAX_TICKS], xt[MAX_TICKS];
    int nyt, nxt;
    double ystep = dt_nice_ticks(ylo, yhi, 5, yt, MAX_TICKS, &nyt);
    ylo = floor(ylo / ystep + 1e-9) * ystep;
    yhi = ceil(yhi / ystep - 1e-9) * ystep;
    ystep = dt_nice_ticks(ylo, yhi, 5, yt, MAX_TICKS, &nyt);
    double xstep = dt_nice_ticks(xlo, xhi, 6, xt, MAX_TICKS, &nxt);
    y_axis(b, ylo, yhi, yt, nyt, ystep, left, right, top, bottom);
    char lab[64];
    for (int i = 0; i < nxt; i++) {
        double x = left + (xt[i] - xlo) / (xhi - xlo) * (right - left);
        dt_format_tick(lab, sizeof lab, xt[i], xstep);
        dt_sbuf_printf(b,
                       "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>"
                       "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                       x, x, top, bottom, x, bottom + 15, lab);
    }
    axis_labels(b, p->xlabel, p->ylabel, left, right, top, bottom, h);
#define MAPX(v) (left + ((v) - xlo) / (xhi - xlo) * (right - left))
#define MAPY(v) (bottom - ((v) - ylo) / (yhi - ylo) * (bottom - top))
    for (size_t k = 0; k < ns; k++)
        for (size_t i = 0; i < s[k].n_marks; i++) {
            double v = s[k].marks[i];
            if (!(v >= xlo && v <= xhi)) continue;
            dt_sbuf_printf(b,
                           "<line class=\"mark\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                           "stroke-dasharray=\"4 3\"><title>resumed at %g</title></line>\n",
                           MAPX(v), MAPX(v), top, bottom, s[k].color, v);
        }
    for (size_t k = 0; k < ns; k++) {
        if (!pn[k]) continue;
        dt_sbuf_puts(b, "<polyline class=\"series\" data-run=\"");
        dt_sbuf_escaped(b, s[k].name);
        dt_sbuf_printf(b, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"",
                       s[k].color);
        for (size_t i = 0; i < pn[k]; i++)
            dt_sbuf_printf(b, "%s%.1f,%.1f", i ? " " : "", MAPX(px[k][i]), MAPY(py[k][i]));
        dt_sbuf_puts(b, "\"/>\n");
        if ((p->dots && pn[k] <= 200) || pn[k] == 1)
            for (size_t i = 0; i < pn[k]; i++)
                dt_sbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>", MAPX(px[k][i]),
                               MAPY(py[k][i]), s[k].color);
    }
#undef MAPX
#undef MAPY
    if (!have)
        dt_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"13\">no data</text>\n",
                       (left + right) / 2, (top + bottom) / 2);
    dt_sbuf_puts(b, "</svg>\n");
done:
    for (size_t k = 0; px && py && k < ns; k++) free(px[k]), free(py[k]);
    free(px), free(py), free(pn), free(names), free(colors), free(empty);
}

/* ---- bar chart ---- */

void dt_svg_bar_chart(dt_sbuf *b, const dt_bar_chart *c) {
    int w = c->width, h = c->height;
    chart_open(b, "bars", c->id, c->title, w, h);
    int rows = legend(NULL, w, c->n_cats, c->cat_names, c->cat_colors, NULL);
    legend(b, w, c->n_cats, c->cat_names, c->cat_colors, NULL);
    double left = MARGIN_L, right = w - MARGIN_R, top = LEGEND_Y0 + (rows - 1) * LEGEND_ROW + 12;
    double bottom = h - MARGIN_B;
    if (rows == 0) top = 28;
    double hi = 0;
    for (size_t i = 0; i < c->n_groups * c->n_cats; i++)
        if (isfinite(c->values[i]) && c->values[i] > hi) hi = c->values[i];
    if (!(hi > 0)) hi = 1;
    double yt[MAX_TICKS];
    int nyt;
    double step = dt_nice_ticks(0, hi, 5, yt, MAX_TICKS, &nyt);
    hi = ceil(hi / step - 1e-9) * step;
    step = dt_nice_ticks(0, hi, 5, yt, MAX_TICKS, &nyt);
    y_axis(b, 0, hi, yt, nyt, step, left, right, top, bottom);
    double gw = (right - left) / (double)(c->n_groups ? c->n_groups : 1);
    double bw = gw * 0.8 / (double)(c->n_cats ? c->n_cats : 1);
    size_t label_every = c->n_groups > 16 ? (c->n_groups + 15) / 16 : 1;
    char lab[64];
    for (size_t g = 0; g < c->n_groups; g++) {
        double gx = left + (double)g * gw + gw * 0.1;
        for (size_t k = 0; k < c->n_cats; k++) {
            double v = c->values[g * c->n_cats + k];
            if (!isfinite(v) || v < 0) v = 0;
            double y = bottom - v / hi * (bottom - top);
            dt_format_tick(lab, sizeof lab, v, v > 0 ? pow(10, floor(log10(v)) - 2) : 1);
            dt_sbuf_printf(b, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>",
                           gx + (double)k * bw, y, bw > 1.5 ? bw - 0.5 : bw, bottom - y, c->cat_colors[k]);
            dt_sbuf_escaped(b, c->group_names[g]);
            dt_sbuf_puts(b, " ");
            dt_sbuf_escaped(b, c->cat_names[k]);
            dt_sbuf_printf(b, ": %s ", lab);
            dt_sbuf_escaped(b, c->ylabel);
            dt_sbuf_puts(b, "</title></rect>\n");
        }
        if (g % label_every == 0) {
            dt_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", left + ((double)g + 0.5) * gw,
                           bottom + 15);
            dt_sbuf_escaped(b, c->group_names[g]);
            dt_sbuf_puts(b, "</text>\n");
        }
    }
    axis_labels(b, NULL, c->ylabel, left, right, top, bottom, h);
    dt_sbuf_puts(b, "</svg>\n");
}
