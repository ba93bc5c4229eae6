#include "runlog.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/input_file.h"

/* Largest metrics file read: about 10M steps. */
#define MAX_METRICS_BYTES ((size_t)2 << 30)

/* A step row, or a validation row (its val_loss in loss, the rest unused). */
typedef struct {
    double step, loss, lr, grad_norm, tokens_per_s, ms, tokens, mfu;
    size_t seq; /* line order: among rows of one step the last one wins */
} step_row;

/* Room for one more element: the array itself (possibly moved) or NULL when out of
 * memory (the old one is then still valid); *cap grows on success. */
static void *grow(void *arr, size_t *cap, size_t size) {
    size_t nc = *cap ? *cap * 2 : 256;
    void *p = realloc(arr, nc * size);
    if (p) *cap = nc;
    return p;
}

#define PUSH(arr, n, cap, item, ok)                            \
    do {                                                       \
        if ((n) == (cap)) {                                    \
            void *grown_ = grow((arr), &(cap), sizeof *(arr)); \
            if (!grown_) {                                     \
                (ok) = 0;                                      \
                break;                                         \
            }                                                  \
            (arr) = grown_;                                    \
        }                                                      \
        (arr)[(n)++] = (item);                                 \
    } while (0)

static double num(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(it) && isfinite(it->valuedouble) ? it->valuedouble : NAN;
}

static int cmp_step_row(const void *a, const void *b) {
    const step_row *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Sorts rows by step and keeps the last written row of each step; returns how many. */
static size_t last_per_step(step_row *rows, size_t nrows) {
    if (nrows > 1) qsort(rows, nrows, sizeof *rows, cmp_step_row);
    size_t n = 0;
    for (size_t i = 0; i < nrows; i++)
        if (i + 1 == nrows || rows[i + 1].step != rows[i].step) rows[n++] = rows[i];
    return n;
}

/* Each column an array of n doubles (room for one when n is 0). */
static dt_status alloc_cols(double **const *cols, size_t ncols, size_t n) {
    for (size_t c = 0; c < ncols; c++)
        if (!(*cols[c] = malloc((n ? n : 1) * sizeof(double)))) return dt_fail(DT_ERUNTIME, "out of memory");
    return DT_OK;
}

void dt_run_free(dt_run *r) {
    free(r->step), free(r->loss), free(r->lr), free(r->grad_norm), free(r->tokens_per_s), free(r->tokens), free(r->mfu);
    free(r->val_step), free(r->val_loss), free(r->val_tokens);
    free(r->resume_step), free(r->resume_tokens);
    free(r->mem);
    memset(r, 0, sizeof *r);
}

double dt_run_tokens_at(const dt_run *r, double step) {
    if (!r->n || !(step >= r->step[0]) || !(step <= r->step[r->n - 1])) return NAN;
    size_t lo = 0, hi = r->n - 1; /* step[lo] <= step <= step[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->step[mid] <= step) lo = mid;
        else hi = mid;
    }
    if (r->step[lo] == step) return r->tokens[lo];
    if (r->step[hi] == step) return r->tokens[hi];
    double f = (step - r->step[lo]) / (r->step[hi] - r->step[lo]);
    return r->tokens[lo] + f * (r->tokens[hi] - r->tokens[lo]);
}

/* The summary line: totals and the per-rank memory array (the last summary wins). */
static dt_status read_summary(dt_run *r, const cJSON *j) {
    r->has_summary = 1;
    r->summary_steps = num(j, "steps");
    r->final_loss = num(j, "final_loss");
    r->summary_tokens_per_s = num(j, "tokens_per_s");
    r->summary_mfu = num(j, "mfu");
    free(r->mem);
    r->mem = NULL;
    r->n_mem = 0;
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(j, "mem");
    int n = cJSON_IsArray(mem) ? cJSON_GetArraySize(mem) : 0;
    if (n <= 0) return DT_OK;
    r->mem = calloc((size_t)n, sizeof *r->mem);
    if (!r->mem) return dt_fail(DT_ERUNTIME, "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, mem) {
        if (!cJSON_IsObject(m)) continue;
        dt_rank_mem *o = &r->mem[r->n_mem];
        o->rank = num(m, "rank");
        if (isnan(o->rank)) o->rank = (double)r->n_mem;
        o->params = num(m, "params");
        o->grads = num(m, "grads");
        o->optim = num(m, "optim");
        o->activations = num(m, "activations");
        o->workspace = num(m, "workspace");
        o->peak_rss = num(m, "peak_rss");
        r->n_mem++;
    }
    return DT_OK;
}

/* Sorted, one row per step (the last written), with cumulative tokens. */
static dt_status build_steps(dt_run *r, step_row *rows, size_t nrows) {
    size_t n = last_per_step(rows, nrows);
    double **cols[] = {&r->step, &r->loss, &r->lr, &r->grad_norm, &r->tokens_per_s, &r->tokens, &r->mfu};
    DT_TRY(alloc_cols(cols, sizeof cols / sizeof cols[0], n));
    r->n = n;
    /* Without a "tokens" field, a step's tokens are tokens_per_s * ms (the batch; an
     * integer, so rounded), carried over steps that lack them and over step gaps. */
    double prev_step = 0, prev_tokens = 0, per_step = NAN;
    for (size_t i = 0; i < n; i++) {
        const step_row *w = &rows[i];
        r->step[i] = w->step, r->loss[i] = w->loss, r->lr[i] = w->lr;
        r->grad_norm[i] = w->grad_norm, r->tokens_per_s[i] = w->tokens_per_s, r->mfu[i] = w->mfu;
        double per = round(w->tokens_per_s * w->ms / 1000);
        if (isfinite(per)) per_step = per;
        double t = w->tokens;
        if (!isfinite(t)) t = prev_tokens + (w->step - prev_step) * per_step;
        r->tokens[i] = t;
        if (isfinite(t)) prev_tokens = t, prev_step = w->step;
    }
    return DT_OK;
}

static dt_status build_vals(dt_run *r, step_row *rows, size_t nrows) {
    size_t n = last_per_step(rows, nrows);
    double **cols[] = {&r->val_step, &r->val_loss, &r->val_tokens};
    DT_TRY(alloc_cols(cols, sizeof cols / sizeof cols[0], n));
    for (size_t i = 0; i < n; i++) {
        r->val_step[i] = rows[i].step;
        r->val_loss[i] = rows[i].loss;
        r->val_tokens[i] = dt_run_tokens_at(r, rows[i].step);
    }
    r->n_val = n;
    return DT_OK;
}

static int blank(const char *p, const char *end) {
    for (; p < end; p++)
        if (!isspace((unsigned char)*p)) return 0;
    return 1;
}

/* A record cut short (a full disk, a run killed mid-write): a line that begins an object
 * and does not parse. Either the line ends there (the writer ends such a line before it
 * appends), or, written by an older dtrain, a resumed run's record is glued to it: then
 * *rest is that record, the last part of the line from a '{' on that parses whole. */
static int torn_record(const char *line, const char *le, const char **rest) {
    *rest = NULL;
    while (line < le && isspace((unsigned char)*line)) line++;
    const char *q = le;
    while (q > line && isspace((unsigned char)q[-1])) q--;
    if (q == line || *line != '{') return 0;
    if (q[-1] != '}') return 1;
    for (const char *k = line + 1; k < q; k++) {
        if (*k != '{') continue;
        const char *stop = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(k, (size_t)(le - k), &stop, 0);
        int whole = cJSON_IsObject(j) && stop && blank(stop, le);
        cJSON_Delete(j);
        if (whole) {
            *rest = k;
            return 1;
        }
    }
    return 0; /* ends like a record: a bad one, not a torn one */
}

dt_status dt_run_parse(dt_run *r, const char *name, const char *origin, const char *text, size_t len) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    step_row *rows = NULL;
    step_row *vals = NULL;
    size_t nrows = 0, caprows = 0, nvals = 0, capvals = 0, capres = 0, lineno = 0;
    dt_status s = DT_OK;
    const char *p = text, *end = text + len;
    while (s == DT_OK && p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p)), *le = nl ? nl : end;
        const char *line = p;
        p = nl ? nl + 1 : end;
        lineno++;
        if (blank(line, le)) continue;
        const char *stop = NULL, *rest = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(line, (size_t)(le - line), &stop, 0);
        if (!j || !stop || !blank(stop, le)) {
            int parsed = j != NULL; /* a whole value, then more text: not a torn record */
            cJSON_Delete(j);
            j = NULL;
            /* an unterminated last line, or a record cut short further up (then a resumed
             * run appended): skipped and counted, not a bad file */
            if (!nl || (!parsed && torn_record(line, le, &rest))) {
                if (!r->n_torn++) r->torn_line = lineno;
                if (!nl) r->torn_tail = 1;
                if (!nl || !rest) continue;
                j = cJSON_ParseWithLengthOpts(rest, (size_t)(le - rest), &stop, 0); /* whole: checked */
            } else {
                s = dt_fail(DT_EINPUT, "%s:%zu: not valid JSON", origin, lineno);
                break;
            }
        }
        if (!cJSON_IsObject(j)) {
            cJSON_Delete(j);
            s = dt_fail(DT_EINPUT, "%s:%zu: not a JSON object", origin, lineno);
            break;
        }
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "event");
        int ok = 1;
        if (!ev) {
            step_row w = {num(j, "step"), num(j, "loss"), num(j, "lr"), num(j, "grad_norm"),
                          num(j, "tokens_per_s"), num(j, "ms"), num(j, "tokens"), num(j, "mfu"), lineno};
            if (isnan(w.step)) s = dt_fail(DT_EINPUT, "%s:%zu: a step row without a numeric \"step\"", origin, lineno);
            else PUSH(rows, nrows, caprows, w, ok);
        } else if (cJSON_IsString(ev) && !strcmp(ev->valuestring, "val")) {
            step_row v = {.step = num(j, "step"), .loss = num(j, "val_loss"), .seq = lineno};
            if (!isnan(v.step)) PUSH(vals, nvals, capvals, v, ok);
        } else if (cJSON_IsString(ev) && !strcmp(ev->valuestring, "resume")) {
            double st = num(j, "step");
            if (!isnan(st)) PUSH(r->resume_step, r->n_resume, capres, st, ok);
        } else if (cJSON_IsString(ev) && !strcmp(ev->valuestring, "summary")) {
            s = read_summary(r, j);
        } /* other events: not plotted */
        cJSON_Delete(j);
        if (!ok) s = dt_fail(DT_ERUNTIME, "out of memory");
    }
    if (s == DT_OK) s = build_steps(r, rows, nrows);
    if (s == DT_OK) s = build_vals(r, vals, nvals);
    if (s == DT_OK && !(r->resume_tokens = malloc((r->n_resume ? r->n_resume : 1) * sizeof(double))))
        s = dt_fail(DT_ERUNTIME, "out of memory");
    for (size_t i = 0; s == DT_OK && i < r->n_resume; i++) r->resume_tokens[i] = dt_run_tokens_at(r, r->resume_step[i]);
    free(rows);
    free(vals);
    if (s != DT_OK) dt_run_free(r);
    return s;
}

dt_status dt_run_load(dt_run *r, const char *path) {
    memset(r, 0, sizeof *r);
    char *text = NULL;
    size_t len = 0;
    DT_TRY(dt_input_read(path, "report", &text, &len, MAX_METRICS_BYTES));
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[sizeof r->name];
    snprintf(name, sizeof name, "%s", base);
    size_t n = strlen(name);
    if (n > 6 && !strcmp(name + n - 6, ".jsonl")) name[n - 6] = 0;
    dt_status s = dt_run_parse(r, name, path, text, len);
    free(text);
    if (s == DT_OK && r->n == 0) {
        dt_run_free(r);
        s = dt_fail(DT_EINPUT, "%s: no step rows (not a dtrain metrics file?)", path);
    }
    return s;
}
