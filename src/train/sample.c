#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Picks the next token from logits[V] (modified in place). */
static int pick(float *logits, int V, const dt_sample_opts *o, dt_rng *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (o->temperature <= 0.0) return best;
    float thresh = -INFINITY;
    if (o->top_k > 0 && o->top_k < V) {
        /* k-th largest by repeated selection on a copy is O(V·k); use a partial sort instead */
        float *tmp = malloc((size_t)V * sizeof(float));
        if (tmp) {
            memcpy(tmp, logits, (size_t)V * sizeof(float));
            int lo = 0, hi = V - 1, k = o->top_k - 1; /* quickselect for the k-th largest */
            while (lo < hi) {
                float pv = tmp[(lo + hi) / 2];
                int i = lo, j = hi;
                while (i <= j) {
                    while (tmp[i] > pv) i++;
                    while (tmp[j] < pv) j--;
                    if (i <= j) {
                        float t = tmp[i];
                        tmp[i++] = tmp[j];
                        tmp[j--] = t;
                    }
                }
                if (k <= j) hi = j;
                else if (k >= i) lo = i;
                else break;
            }
            thresh = tmp[k];
            free(tmp);
        }
    }
    double sum = 0.0;
    float mx = logits[best];
    for (int i = 0; i < V; i++) {
        double p = logits[i] >= thresh ? exp((logits[i] - mx) / o->temperature) : 0.0;
        logits[i] = (float)p;
        sum += p;
    }
    double u = (double)dt_rng_uniform(rng) * sum, acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += logits[i];
        if (u < acc && logits[i] > 0) return i;
    }
    return best;
}

static dt_status model_logits(void *ctx, const dt_token *tokens, int T, float *logits) {
    return gpt_next_logits(ctx, tokens, T, logits);
}

dt_status dt_generate(gpt_model *m, const dt_tokenizer *tok, const char *prompt, const dt_sample_opts *o, dt_rng *rng,
                      FILE *out) {
    return dt_generate_with(model_logits, m, m->shape.vocab_size, m->max_T, tok, prompt, o, rng, out);
}

dt_status dt_generate_with(dt_next_logits_fn next, void *ctx_fn, int V, int maxT, const dt_tokenizer *tok,
                           const char *prompt, const dt_sample_opts *o, dt_rng *rng, FILE *out) {
    size_t n = 0, cap = 0;
    uint32_t *ids = NULL; /* the tokenizer's ids */
    DT_TRY(dt_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n, &cap));
    if (n == 0) {
        int eot = dt_tokenizer_eot(tok);
        DT_TRY(dt_tokenizer_encode(tok, "\n", 1, &ids, &n, &cap));
        if (eot >= 0) ids[0] = (uint32_t)eot;
        n = 1;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= (uint32_t)V) {
            free(ids);
            return dt_fail(DT_EINPUT, "prompt token %u is outside the model's vocabulary (%d)", ids[i], V);
        }
    dt_token *all = malloc((n + (size_t)o->length) * sizeof(dt_token));
    float *logits = malloc((size_t)V * sizeof(float));
    for (size_t i = 0; all && i < n; i++) all[i] = ids[i];
    free(ids);
    if (!all || !logits) {
        free(all);
        free(logits);
        return dt_fail(DT_ERUNTIME, "out of memory (sampling)");
    }
    char buf[256]; /* GPT-2 tokens decode to at most 128 bytes */
    dt_status st = DT_OK;
    for (int s = 0; s < o->length && st == DT_OK; s++) {
        int ctx = (int)n < maxT ? (int)n : maxT;
        if ((st = next(ctx_fn, all + n - ctx, ctx, logits)) != DT_OK) break;
        int t = pick(logits, V, o, rng);
        all[n++] = (dt_token)t;
        size_t k = dt_tokenizer_decode(tok, t, buf, sizeof buf);
        fwrite(buf, 1, k, out);
        fflush(out);
    }
    fputc('\n', out);
    free(all);
    free(logits);
    return st;
}
