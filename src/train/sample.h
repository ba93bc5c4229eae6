/* Text generation from a trained model: temperature, top-k, seeded. */
#ifndef DT_SAMPLE_H
#define DT_SAMPLE_H
#include <stdint.h>
#include <stdio.h>

#include "../core/rng.h"
#include "../core/status.h"
#include "../data/tokenizer.h"
#include "../model/gpt.h"

typedef struct {
    int length;         /* tokens to generate */
    double temperature; /* 0: greedy */
    int top_k;          /* 0: whole vocabulary */
} dt_sample_opts;

/* Encodes prompt (may be empty: starts from the end-of-text token, or a newline for
 * byte tokenizers), generates, and writes the continuation (not the prompt) to out. */
dt_status dt_generate(gpt_model *m, const dt_tokenizer *tok, const char *prompt, const dt_sample_opts *o, dt_rng *rng,
                      FILE *out);
/* The same with the next token's logits (V floats) from next(ctx, tokens, T, logits), T at
 * most max_T: a model cut over ranks runs its own pass there (parallelize.h). */
typedef dt_status (*dt_next_logits_fn)(void *ctx, const dt_token *tokens, int T, float *logits);
dt_status dt_generate_with(dt_next_logits_fn next, void *ctx, int V, int max_T, const dt_tokenizer *tok,
                           const char *prompt, const dt_sample_opts *o, dt_rng *rng, FILE *out);

#endif
