/* Frozen parameter groups (train.freeze; docs/parallelism.md, "Frozen parameter groups"):
 * shell globs over the Hugging Face names mark tensors frozen. The backward computes no
 * gradient for them (their weight-gradient GEMMs are not run) and stops where nothing
 * below it trains; the strategies neither reduce nor keep optimizer moments for them. */
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

#include "gpt_internal.h"

/* The next pattern of a comma-separated list into buf ("" at the end); returns the rest. */
static const char *next_pattern(const char *list, char *buf, size_t cap) {
    while (*list == ',' || *list == ' ') list++;
    size_t n = strcspn(list, ",");
    while (n > 0 && list[n - 1] == ' ') n--;
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), list);
    list += n;
    while (*list && *list != ',') list++;
    return list;
}

static int matches(const char *name, void *pattern) { return fnmatch((const char *)pattern, name, 0) == 0; }

/* Whether any pattern of the list matches name. */
static int frozen_name(const char *patterns, const char *name) {
    char pat[128];
    for (const char *p = next_pattern(patterns, pat, sizeof pat); pat[0]; p = next_pattern(p, pat, sizeof pat))
        if (matches(name, pat)) return 1;
    return 0;
}

dt_status gpt_freeze_check(const gpt_shape *s, const char *patterns) {
    char pat[128];
    for (const char *p = next_pattern(patterns, pat, sizeof pat); pat[0]; p = next_pattern(p, pat, sizeof pat))
        if (!gpt_each_name(s, matches, pat))
            return dt_fail(DT_EINPUT, "train.freeze: '%s' matches no tensor of the model (names as Hugging Face's: "
                           "wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight, ..., ln_f.bias)", pat);
    return DT_OK;
}

/* The lowest trainable place of the whole model: -1 for the embeddings, a block's index,
 * or n_layer for what is above the blocks (every rank of every stage sees the same). */
typedef struct {
    const char *patterns;
    int lowest;
} lowest_ctx;
static int note_lowest(const char *name, int layer, void *ctx) {
    lowest_ctx *c = ctx;
    if (layer < c->lowest && !frozen_name(c->patterns, name)) c->lowest = layer;
    return 0;
}

void gpt_freeze(gpt_model *m, const char *patterns, size_t *n) {
    size_t total = 0;
    for (int i = 0; i < m->ntensors; i++) {
        gpt_tensor *t = &m->tensors[i];
        t->frozen = frozen_name(patterns, t->name);
        if (t->frozen) total += t->numel;
    }
    lowest_ctx c = {patterns, m->shape.n_layer};
    (void)gpt_each_tensor(&m->shape, note_lowest, &c);
    m->first_trainable = c.lowest;
    if (n) *n = total;
}

int gpt_unit_frozen(const gpt_model *m, int u) {
    int any = 0;
    for (int i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].unit != u) continue;
        if (!m->tensors[i].frozen) return 0;
        any = 1;
    }
    return any;
}

size_t gpt_frozen_count(const gpt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].frozen) n += m->tensors[i].numel;
    return n;
}

void gpt_zero_frozen(gpt_model *m, int i, float *g) {
    if (i >= 0 && m->tensors[i].frozen) m->ops->zero(g ? g : tg(m, i), m->tensors[i].numel * m->esz);
}

int gpt_block_skipped(const gpt_model *m, int j) {
    return m->tensors[m->block0 + j * m->layer_tensors].layer < m->first_trainable;
}

void gpt_count_skipped(gpt_model *m, int j) {
    for (int k = 0; k < m->layer_tensors; k++) {
        const gpt_tensor *t = &m->tensors[m->block0 + j * m->layer_tensors + k];
        if (t->frozen && t->ndim == 2) m->dw_skipped++;
    }
}

ln_grads gpt_norm_grads(gpt_model *m, int iw, int ib) {
    int fw = m->tensors[iw].frozen, fb = ib < 0 || m->tensors[ib].frozen;
    if (fw && fb) return (ln_grads){NULL, NULL};
    return (ln_grads){tg(m, iw), ib >= 0 ? tg(m, ib) : NULL};
}

int gpt_trainable_run(const gpt_model *m, size_t a, size_t b, size_t *lo, size_t *hi) {
    size_t top = b;
    for (int i = m->ntensors - 1; i >= 0 && top > a; i--) { /* tensors lie in ascending offsets */
        const gpt_tensor *t = &m->tensors[i];
        size_t s = t->offset, e = s + t->numel;
        if (!t->frozen || s >= top) continue;
        if (e <= a) break;
        if (e < top) {
            *lo = e;
            *hi = top;
            return 1;
        }
        top = s > a ? s : a;
    }
    if (top <= a) return 0;
    *lo = a;
    *hi = top;
    return 1;
}
