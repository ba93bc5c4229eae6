/* The per-unit sharding policy (policy.h): parsed over the model's tensor names. */
#include "policy.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RULES = 64 };
typedef struct {
    char glob[256];
    int mode;
    int used;
} rule;

static const char *const mode_names[] = {"ddp", "zero1", "zero2", "zero3"};

static dt_status parse(const char *policy, rule *r, int *n) {
    *n = 0;
    for (const char *p = policy; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0) { /* empty entries between commas: nothing */
            p += e ? 1 : 0;
            if (!e) break;
            continue;
        }
        const char *colon = memchr(p, ':', len);
        if (!colon || colon == p)
            return dt_fail(DT_EINPUT, "parallel.policy: rule '%.*s' is not GLOB:MODE (MODE ddp, zero1, zero2 or zero3)",
                           (int)len, p);
        if (*n == MAX_RULES) return dt_fail(DT_EINPUT, "parallel.policy: more than %d rules", MAX_RULES);
        size_t gl = (size_t)(colon - p), ml = len - gl - 1;
        if (gl >= sizeof r->glob) return dt_fail(DT_EINPUT, "parallel.policy: glob '%.*s' too long", (int)gl, p);
        rule *x = &r[(*n)++];
        memcpy(x->glob, p, gl);
        x->glob[gl] = 0;
        x->mode = -1;
        x->used = 0;
        for (int k = 0; k < 4; k++)
            if (strlen(mode_names[k]) == ml && !strncmp(colon + 1, mode_names[k], ml)) x->mode = k;
        if (x->mode < 0)
            return dt_fail(DT_EINPUT, "parallel.policy: mode '%.*s' of '%s' is not ddp, zero1, zero2 or zero3", (int)ml,
                           colon + 1, x->glob);
        if (!e) break;
        p = e + 1;
    }
    return DT_OK;
}

dt_status dt_policy_units(const char *policy, int zero, const gpt_model *m, signed char *mode) {
    rule *r = calloc(MAX_RULES, sizeof *r);
    if (!r) return dt_fail(DT_ERUNTIME, "out of memory (parallel.policy)");
    int n;
    dt_status s = parse(policy, r, &n);
    for (int u = 0; s == DT_OK && u < m->nunits; u++) {
        int um = -1;
        const char *first = NULL;
        for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            if (t->unit != u) continue;
            int tm = zero;
            for (int k = 0; k < n; k++)
                if (fnmatch(r[k].glob, t->name, 0) == 0) {
                    tm = r[k].mode;
                    r[k].used = 1;
                    break;
                }
            if (um >= 0 && tm != um)
                s = dt_fail(DT_EINPUT, "parallel.policy splits a unit between modes: %s is %s, %s is %s (a rule must "
                            "cover the whole unit: the embeddings, a block, a block's half with parallel.unit_split or "
                            "parallel.unit_blocks of them, ln_f)",
                            first, mode_names[um], t->name, mode_names[tm]);
            if (um < 0) um = tm, first = t->name;
        }
        if (mode) mode[u] = (signed char)(um < 0 ? zero : um);
    }
    for (int k = 0; s == DT_OK && k < n; k++)
        if (!r[k].used) s = dt_fail(DT_EINPUT, "parallel.policy: '%s' matches no tensor of the model", r[k].glob);
    free(r);
    return s;
}

/* The whole model's policy in one pass over its unit table: dt_policy_stage's stage and
 * replicated flag, and the parameters and units of the ddp units (dt_policy_replicated). */
static dt_status policy_scan(const char *policy, int zero, const gpt_shape *shape, const gpt_layout *ul, int *stage,
                             int *replicated, size_t *params, int *units, size_t *kparams, int *kunits) {
    *stage = zero;
    *replicated = 0;
    *params = *kparams = 0;
    *units = *kunits = 0;
    if (!policy[0]) return DT_OK;
    gpt_model m;
    gpt_layout lay = {.unit_blocks = ul->unit_blocks, .split_blocks = ul->split_blocks};
    DT_TRY(gpt_table_layout(&m, shape, &lay, NULL));
    signed char *mode = malloc((size_t)m.nunits);
    dt_status s = mode ? dt_policy_units(policy, zero, &m, mode) : dt_fail(DT_ERUNTIME, "out of memory (policy)");
    int hi = 0, lo = 4;
    size_t rp = 0, kp = 0;
    int ru = 0, ku = 0;
    for (int u = 0; s == DT_OK && u < m.nunits; u++) {
        if (m.units[u].count == 0) continue;
        if (mode[u] == 0) rp += m.units[u].count, ru++;
        else if (mode[u] > hi) hi = mode[u];
        if (mode[u] == 2) kp += m.units[u].count, ku++;
        if (mode[u] > 0 && mode[u] < lo) lo = mode[u];
    }
    if (s == DT_OK && hi > 0 && lo != hi && !(lo == 2 && hi == 3))
        s = dt_fail(DT_EINPUT, "parallel.policy mixes zero%d and zero%d: one ZeRO stage with ddp units, or zero2 "
                    "units among zero3's, so far", lo, hi);
    *stage = hi;
    *replicated = s == DT_OK && hi > 0 && (ru || lo != hi);
    if (*replicated) *params = rp, *units = ru;
    if (*replicated && hi == 3) *kparams = kp, *kunits = ku; /* zero2 units among zero3's: kept whole */
    free(mode);
    gpt_destroy(&m);
    return s;
}

dt_status dt_policy_stage(const char *policy, int zero, const gpt_shape *shape, const gpt_layout *units, int *stage,
                          int *replicated) {
    size_t params, kp;
    int n, kn;
    return policy_scan(policy, zero, shape, units, stage, replicated, &params, &n, &kp, &kn);
}

dt_status dt_policy_replicated(const char *policy, int zero, const gpt_shape *shape, const gpt_layout *units,
                               size_t *params, int *units_out, size_t *kept_params, int *kept_units) {
    int stage, repl;
    return policy_scan(policy, zero, shape, units, &stage, &repl, params, units_out, kept_params, kept_units);
}

/* The first and last tensors of the unit (or block half) holding tensor i of m. */
static void span_of(const gpt_model *m, int i, const char **first, const char **last) {
    int a = i, b = i;
    while (a > 0 && m->tensors[a - 1].unit == m->tensors[i].unit) a--;
    while (b + 1 < m->ntensors && m->tensors[b + 1].unit == m->tensors[i].unit) b++;
    *first = m->tensors[a].name;
    *last = m->tensors[b].name;
}

dt_status dt_unit_split(const char *split, const gpt_shape *shape, int *split_blocks) {
    *split_blocks = 0;
    if (!split[0]) return DT_OK;
    gpt_model m; /* the blocks split: each half its unit, so a unit's start is a half's */
    gpt_layout lay = {.split_blocks = 1};
    DT_TRY(gpt_table_layout(&m, shape, &lay, NULL));
    unsigned char *at = calloc((size_t)shape->n_layer + 1, 1); /* block l begins a unit at its MLP half */
    dt_status s = at ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (parallel.unit_split)");
    for (const char *p = split; s == DT_OK && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char glob[256];
        if (len >= sizeof glob) s = dt_fail(DT_EINPUT, "parallel.unit_split: glob '%.*s' too long", (int)len, p);
        else if (len > 0) {
            memcpy(glob, p, len);
            glob[len] = 0;
            int used = 0;
            for (int i = 0; s == DT_OK && i < m.ntensors; i++) {
                const gpt_tensor *t = &m.tensors[i];
                if (fnmatch(glob, t->name, 0) != 0) continue;
                used = 1;
                if (i > 0 && m.tensors[i - 1].unit == t->unit) { /* inside a half (or the embeddings, ln_f) */
                    const char *a, *b;
                    span_of(&m, i, &a, &b);
                    s = dt_fail(DT_EINPUT, "parallel.unit_split: a unit beginning at %s would cut %s .. %s, whose "
                                "tensors one pass uses together (a block splits at its second norm only)",
                                t->name, a, b);
                } else if (t->layer >= 0 && t->layer < shape->n_layer && i > 0 &&
                           m.tensors[i - 1].layer == t->layer) {
                    at[t->layer] = 1; /* the MLP half's first tensor */
                }
            }
            if (s == DT_OK && !used) s = dt_fail(DT_EINPUT, "parallel.unit_split: '%s' matches no tensor of the model", glob);
        }
        if (!e) break;
        p = e + 1;
    }
    int n = 0, first_not = -1;
    for (int l = 0; at && l < shape->n_layer; l++) {
        n += at[l];
        if (!at[l] && first_not < 0) first_not = l;
    }
    if (s == DT_OK && n > 0 && n < shape->n_layer)
        s = dt_fail(DT_EINPUT, "parallel.unit_split splits %d of the %d blocks (not block %d): every block splits "
                    "alike (a glob over all of them, as h.*.ln_2.weight)", n, shape->n_layer, first_not);
    if (s == DT_OK) *split_blocks = n > 0;
    free(at);
    gpt_destroy(&m);
    return s;
}

gpt_layout dt_unit_layout(const char *split, int unit_blocks, const gpt_shape *shape) {
    gpt_layout lay = {.unit_blocks = unit_blocks};
    if (dt_unit_split(split, shape, &lay.split_blocks) != DT_OK) dt_error_clear();
    return lay;
}
