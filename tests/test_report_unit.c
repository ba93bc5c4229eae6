/* dtrain report internals: the metrics reader (null values, repeated steps after a
 * resume, unknown events, token axis from the "tokens" field or from tokens_per_s * ms,
 * errors naming file and line), min/max downsampling, tick labels, and the SVG/HTML
 * output (one polyline per run with data). Usage: test_report_unit */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "report/report.h"

#include "check.h"

static size_t count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static dt_status parse(dt_run *r, const char *text) {
    dt_error_clear();
    return dt_run_parse(r, "run", "m.jsonl", text, strlen(text));
}

static void test_reader(void) {
    /* steps 1-4, a val at 2, then a resume from step 2 that writes 3 and 4 again with a
     * "tokens" field; a null loss, an unknown event, blank lines, CRLF */
    const char *text =
        "{\"step\": 1, \"loss\": 5.0, \"lr\": 0.001, \"grad_norm\": 2.0, \"tokens_per_s\": 1000.0, \"ms\": 256.0}\n"
        "{\"step\": 2, \"loss\": null, \"lr\": 0.001, \"grad_norm\": null, \"tokens_per_s\": 2000.0, \"ms\": 128.0}\r\n"
        "{\"event\": \"val\", \"step\": 2, \"val_loss\": 4.5}\n"
        "\n"
        "{\"step\": 3, \"loss\": 4.0, \"lr\": 0.001, \"grad_norm\": 1.0, \"tokens_per_s\": 1000.0, \"ms\": 256.0}\n"
        "{\"step\": 4, \"loss\": 3.9, \"lr\": 0.001, \"grad_norm\": 1.0, \"tokens_per_s\": 1000.0, \"ms\": 256.0}\n"
        "{\"event\": \"resume\", \"step\": 2}\n"
        "{\"event\": \"checkpoint\", \"step\": 2, \"dir\": \"x\"}\n"
        "{\"step\": 3, \"loss\": 3.5, \"lr\": 0.002, \"grad_norm\": 1.5, \"tokens_per_s\": 1000.0, \"ms\": 256.0, "
        "\"tokens\": 700}\n"
        "{\"step\": 4, \"loss\": 3.4, \"lr\": 0.002, \"grad_norm\": 1.5, \"tokens_per_s\": 1000.0, \"ms\": 256.0}\n"
        "{\"event\": \"val\", \"step\": 4, \"val_loss\": null}\n"
        "{\"event\": \"val\", \"step\": 4, \"val_loss\": 3.6}\n"
        "{\"event\": \"summary\", \"steps\": 4, \"final_loss\": 3.4, \"tokens_per_s\": 999.5, \"mem\": ["
        "{\"rank\": 0, \"params\": 100, \"grads\": 100, \"optim\": 200, \"activations\": 50, \"workspace\": 0, "
        "\"peak_rss\": 4096}, {\"rank\": 1, \"params\": 100, \"grads\": 100, \"optim\": 200, \"activations\": 50, "
        "\"workspace\": 8, \"peak_rss\": null}]}";
    dt_run r;
    CHECK(parse(&r, text) == DT_OK, "parse");
    CHECK(r.n == 4, "one row per step: %zu", r.n);
    double steps[] = {1, 2, 3, 4}, loss3 = 3.5, lr4 = 0.002;
    for (size_t i = 0; i < 4 && i < r.n; i++) CHECK(r.step[i] == steps[i], "step %zu = %g", i, r.step[i]);
    if (r.n == 4) {
        CHECK(isnan(r.loss[1]) && isnan(r.grad_norm[1]), "null is NaN");
        CHECK(r.loss[2] == loss3 && r.lr[3] == lr4, "the resumed rows win: %g %g", r.loss[2], r.lr[3]);
        /* 256 per step from tokens_per_s * ms; the field (700) wins at step 3; step 4 continues from it */
        CHECK(r.tokens[0] == 256 && r.tokens[1] == 512 && r.tokens[2] == 700 && r.tokens[3] == 956,
              "tokens %g %g %g %g", r.tokens[0], r.tokens[1], r.tokens[2], r.tokens[3]);
        CHECK(dt_run_tokens_at(&r, 2.5) == 606 && isnan(dt_run_tokens_at(&r, 9)), "tokens_at");
    }
    CHECK(r.n_val == 2 && r.val_step[0] == 2 && r.val_loss[0] == 4.5 && r.val_step[1] == 4 && r.val_loss[1] == 3.6,
          "val rows, last per step");
    CHECK(r.n_val == 2 && r.val_tokens[0] == 512 && r.val_tokens[1] == 956, "val tokens");
    CHECK(r.n_resume == 1 && r.resume_step[0] == 2 && r.resume_tokens[0] == 512, "resume marker");
    CHECK(r.has_summary && r.final_loss == 3.4 && r.summary_tokens_per_s == 999.5, "summary");
    CHECK(r.n_mem == 2 && r.mem[1].rank == 1 && r.mem[0].optim == 200 && r.mem[1].workspace == 8 &&
              isnan(r.mem[1].peak_rss),
          "per-rank memory");

    /* the page: one polyline per run per plot, both names, nothing external */
    dt_run two[2] = {r, r};
    snprintf(two[1].name, sizeof two[1].name, "other<&>");
    dt_sbuf b = {0};
    CHECK(dt_report_html(two, 2, &b) == DT_OK && b.data, "html");
    if (b.data) {
        CHECK(count(b.data, "<polyline") == 7 * 2, "polylines: %zu", count(b.data, "<polyline"));
        CHECK(count(b.data, "<svg class=\"plot\"") == 7 && count(b.data, "<svg class=\"bars\"") == 2, "charts");
        CHECK(count(b.data, "<rect class=\"bar\"") == 2 * 2 * 6, "bars: %zu", count(b.data, "<rect class=\"bar\""));
        CHECK(strstr(b.data, "other&lt;&amp;&gt;") && !strstr(b.data, "other<&>"), "names are escaped");
        CHECK(!strstr(b.data, "http") && !strstr(b.data, "<script"), "nothing external, no scripts");
        CHECK(count(b.data, "class=\"mark\"") == 2 * 7, "resume markers: %zu", count(b.data, "class=\"mark\""));
    }
    dt_sbuf_free(&b);
    dt_run_free(&r);
}

static void test_reader_errors(void) {
    dt_run r;
    CHECK(parse(&r, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": nan}\n") == DT_EINPUT &&
              strstr(dt_error_message(), "m.jsonl:2:") && strstr(dt_error_message(), "JSON"),
          "bad JSON names file and line: %s", dt_error_message());
    CHECK(parse(&r, "\n\n{\"step\": 1} trailing\n") == DT_EINPUT && strstr(dt_error_message(), "m.jsonl:3:"),
          "text after the object: %s", dt_error_message());
    CHECK(parse(&r, "[1, 2]\n") == DT_EINPUT && strstr(dt_error_message(), "m.jsonl:1: not a JSON object"),
          "not an object: %s", dt_error_message());
    CHECK(parse(&r, "{\"loss\": 2}\n") == DT_EINPUT && strstr(dt_error_message(), "\"step\""),
          "step row without step: %s", dt_error_message());
    CHECK(parse(&r, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"lo") == DT_OK && r.n == 1 && r.torn_tail,
          "an unterminated torn last line (a killed run) is skipped and flagged");
    dt_run_free(&r);
    /* a record cut short further up (a full disk; the resumed run that appended ended the
     * line first) is skipped and counted, like the tail; the rows after it are kept */
    CHECK(parse(&r, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"lo\n{\"step\": 2, \"loss\": 1.5}\n"
                    "{\"step\": 3, \"l\n{\"step\": 4, \"loss\": 1}\n") == DT_OK &&
              r.n == 3 && r.n_torn == 2 && r.torn_line == 2 && !r.torn_tail && r.loss[1] == 1.5,
          "torn lines inside the file: skipped, the first one's number kept: %s", dt_error_message());
    dt_run_free(&r);
    /* an older writer glued the resumed run's record to the torn line: that record is kept */
    CHECK(parse(&r, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"lo{\"event\": \"resume\", \"step\": 1}\n"
                    "{\"step\": 2, \"loss\": 1.5}\n") == DT_OK &&
              r.n == 2 && r.n_torn == 1 && r.torn_line == 2 && r.n_resume == 1 && r.resume_step[0] == 1,
          "a record glued to a torn line is read: %s", dt_error_message());
    dt_run_free(&r);
    /* what is not a record cut short is still an error: a line that ends like a whole
     * object, a line that is not an object at all */
    CHECK(parse(&r, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": nan}\n{\"step\": 3}\n") == DT_EINPUT &&
              strstr(dt_error_message(), "m.jsonl:2: not valid JSON"),
          "a bad line that ends like an object: %s", dt_error_message());
    CHECK(parse(&r, "{\"step\": 1, \"loss\": 2}\nnot json\n") == DT_EINPUT &&
              strstr(dt_error_message(), "m.jsonl:2: not valid JSON"),
          "a line that is not JSON: %s", dt_error_message());
    CHECK(parse(&r, "{\"event\": \"summary\", \"steps\": 0}\n") == DT_OK && r.n == 0 && r.has_summary,
          "no step rows parses (the command rejects it)");
    dt_run_free(&r);
}

static void test_downsample(void) {
    size_t n = 100000, max = 2000;
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *ox = malloc(max * sizeof *ox),
           *oy = malloc(max * sizeof *oy);
    for (size_t i = 0; i < n; i++) x[i] = (double)i, y[i] = sin((double)i / 1000);
    y[31337] = 50, y[77777] = -50; /* spikes */
    size_t m = dt_downsample_minmax(x, y, n, max, ox, oy);
    int hi = 0, lo = 0, sorted = 1;
    for (size_t i = 0; i < m; i++) {
        hi |= oy[i] == 50 && ox[i] == 31337;
        lo |= oy[i] == -50 && ox[i] == 77777;
        if (i && ox[i] <= ox[i - 1]) sorted = 0;
    }
    CHECK(m <= max && m > max / 2, "kept %zu of %zu", m, n);
    CHECK(hi && lo, "spikes survive");
    CHECK(sorted, "x order kept");
    CHECK(dt_downsample_minmax(x, y, 10, max, ox, oy) == 10 && oy[3] == y[3], "short series copied");
    free(x), free(y), free(ox), free(oy);
}

static void test_ticks(void) {
    struct { double v, step; const char *want; } cases[] = {
        {0.0015, 0.0005, "0.0015"}, {15000, 5000, "15k"}, {2.5e6, 5e5, "2.5M"}, {3.5, 0.5, "3.5"},
        {40, 10, "40"},             {2.5e-5, 5e-6, "2.5e-5"}, {0, 0.5, "0"},     {5000, 5000, "5k"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_format_tick(buf, sizeof buf, cases[i].v, cases[i].step);
        CHECK(!strcmp(buf, cases[i].want), "tick %g step %g: '%s', want '%s'", cases[i].v, cases[i].step, buf,
              cases[i].want);
    }
    double t[32];
    int nt;
    double step = dt_nice_ticks(1, 60, 6, t, 32, &nt);
    CHECK(step == 10 && nt == 6 && t[0] == 10 && t[5] == 60, "ticks of [1, 60]: step %g, %d ticks", step, nt);
    step = dt_nice_ticks(-0.3, 0.3, 5, t, 32, &nt);
    CHECK(step == 0.1 && nt == 7, "ticks of [-0.3, 0.3]: step %g, %d ticks", step, nt);
}

static void test_plot_empty_series(void) {
    double x[] = {1, 2, 3}, y[] = {NAN, NAN, NAN}, y2[] = {1, NAN, 3};
    dt_plot_series s[2] = {{"a", "#1f77b4", x, y, 3, NULL, 0}, {"b", "#ff7f0e", x, y2, 3, NULL, 0}};
    dt_line_plot p = {"p", "T", "step", "loss", 500, 300, 2000, 0};
    dt_sbuf b = {0};
    dt_svg_line_plot(&b, &p, s, 2);
    CHECK(!b.failed && b.data, "plot");
    if (b.data) {
        CHECK(count(b.data, "<polyline") == 1, "only the series with data gets a line");
        CHECK(strstr(b.data, "a (no data)") != NULL, "legend says which run has no data");
        CHECK(count(b.data, "points=\"") == 1 && strstr(b.data, "data-run=\"b\""), "b's line");
    }
    dt_sbuf_free(&b);
}

int main(void) {
    test_reader();
    test_reader_errors();
    test_downsample();
    test_ticks();
    test_plot_empty_series();
    return check_finish();
}
