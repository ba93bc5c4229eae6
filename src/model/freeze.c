/* Frozen parameter groups (train.freeze; docs/parallelism.md, "Frozen parameter groups"):
 * shell globs over the Hugging Face names mark tensors frozen; the backward zeroes their
 * gradients before a unit is handed over. */
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

dt_status gpt_freeze_check(const gpt_shape *s, const char *patterns) {
    char pat[128];
    for (const char *p = next_pattern(patterns, pat, sizeof pat); pat[0]; p = next_pattern(p, pat, sizeof pat))
        if (!gpt_each_name(s, matches, pat))
            return dt_fail(DT_EINPUT, "train.freeze: '%s' matches no tensor of the model (names as Hugging Face's: "
                           "wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight, ..., ln_f.bias)", pat);
    return DT_OK;
}

void gpt_freeze(gpt_model *m, const char *patterns, size_t *n) {
    char pat[128];
    size_t total = 0;
    for (int i = 0; i < m->ntensors; i++) {
        gpt_tensor *t = &m->tensors[i];
        for (const char *p = next_pattern(patterns, pat, sizeof pat); pat[0] && !t->frozen;
             p = next_pattern(p, pat, sizeof pat))
            t->frozen = matches(t->name, pat);
        if (t->frozen) total += t->numel;
    }
    if (n) *n = total;
}

void gpt_zero_frozen(gpt_model *m, int i, float *g) {
    if (m->tensors[i].frozen) m->ops->zero(g ? g : tg(m, i), m->tensors[i].numel * m->esz);
}

void gpt_zero_frozen_block(gpt_model *m, int j) {
    for (int k = 0; k < m->layer_tensors; k++) gpt_zero_frozen(m, m->block0 + j * m->layer_tensors + k, NULL);
}
