/* Packed documents (issue 27): rows of documents averaging T/8 tokens, each token seeing
 * only its own document and its position counted from the document's start, give every
 * document the loss it has when run alone (within 1e-6), and the gradients of running
 * them one by one (within 1e-5). A model built without documents ignores document starts
 * (the plain causal row: a different loss), and gpt_next_logits clears them. The same for
 * the Llama family (rotary positions restarting at each document; grouped heads, untied
 * head). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/rng.h"
#include "model/gpt.h"

enum { B = 2, T = 64 };

static gpt_shape SHAPE;

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(a), 1e-30); }

static void run(void) {
    static dt_token tok[B * T], tgt[B * T], one[B * T];
    static int seg[B * T], doc_row[B * T], doc_at[B * T], doc_len[B * T];
    int ndocs = 0;
    dt_rng rng;
    dt_rng_seed(&rng, 27);
    for (int b = 0; b < B; b++) /* documents of 1 to 15 tokens: T/8 on average */
        for (int t = 0, left = 0; t < T; t++) {
            if (left == 0) {
                left = 1 + (int)dt_rng_below(&rng, 15);
                if (left > T - t) left = T - t;
                doc_row[ndocs] = b, doc_at[ndocs] = t, doc_len[ndocs] = left;
                ndocs++;
            }
            seg[b * T + t] = doc_at[ndocs - 1];
            tok[b * T + t] = (dt_token)dt_rng_below(&rng, (uint64_t)SHAPE.vocab_size);
            left--;
        }
    for (int b = 0; b < B; b++) /* the next token of the same document; a document's last token predicts nothing */
        for (int t = 0; t < T; t++)
            tgt[b * T + t] = t + 1 < T && seg[b * T + t + 1] == seg[b * T + t] ? tok[b * T + t + 1] : DT_IGNORE;

    gpt_model packed, alone;
    gpt_layout docs = {.tp = 1, .documents = 1};
    CHECK(gpt_create_layout(&packed, &SHAPE, dt_ops_cpu(), B, T, 1, &docs) == DT_OK, "packed model");
    CHECK(gpt_create_layout(&alone, &SHAPE, dt_ops_cpu(), 1, T, 1, NULL) == DT_OK, "plain model");
    gpt_init(&packed, 5);
    gpt_init(&alone, 5);
    gpt_zero_grad(&packed);
    gpt_zero_grad(&alone);

    /* every document's loss in the packed rows (only its targets kept) against alone */
    double worst = 0, total_alone = 0;
    for (int d = 0; d < ndocs; d++) {
        for (int i = 0; i < B * T; i++) one[i] = DT_IGNORE;
        size_t r = (size_t)doc_row[d] * T + (size_t)doc_at[d];
        for (int t = 0; t < doc_len[d]; t++) one[r + t] = tgt[r + t];
        double lp, la;
        gpt_set_documents(&packed, 0, seg, B, T);
        CHECK(gpt_eval_loss(&packed, tok, one, B, T, &lp) == DT_OK, "packed eval, document %d", d);
        CHECK(gpt_forward_backward(&alone, tok + r, tgt + r, 1, doc_len[d], 1.0f, &la) == DT_OK, "alone, document %d", d);
        total_alone += la;
        if (doc_len[d] > 1) worst = fmax(worst, rel(la, lp));
    }
    CHECK(worst <= 1e-6, "%d documents: the packed loss of each is its loss alone (worst %.2e)", ndocs, worst);
    printf("%d documents in %d rows of %d (%.1f tokens each): per-document loss, worst relative difference %.2e\n",
           ndocs, B, T, (double)(B * T) / ndocs, worst);

    /* one packed pass: the sum of the documents' losses and their gradients */
    double total_packed;
    gpt_set_documents(&packed, 0, seg, B, T);
    CHECK(gpt_forward_backward(&packed, tok, tgt, B, T, 1.0f, &total_packed) == DT_OK, "packed pass");
    double eg = check_rel_diff(alone.grads, packed.grads, packed.nparams);
    CHECK(rel(total_alone, total_packed) <= 1e-6 && eg <= 1e-5,
          "the packed pass: loss %.9g vs %.9g alone, gradients within %.2e", total_packed, total_alone, eg);
    printf("packed pass: loss %.9g, alone %.9g; gradients %.2e\n", total_packed, total_alone, eg);

    /* without document starts the rows are plain causal rows: another loss */
    double plain;
    gpt_set_documents(&packed, 0, NULL, B, T);
    CHECK(gpt_eval_loss(&packed, tok, tgt, B, T, &plain) == DT_OK && rel(plain, total_packed) > 1e-5,
          "the same rows without documents: loss %.6g (attention across documents)", plain);
    /* sampling after a packed step sees one plain sequence */
    float *logits = malloc(SHAPE.vocab_size * sizeof(float)), *again = malloc(SHAPE.vocab_size * sizeof(float));
    gpt_set_documents(&packed, 0, seg, B, T);
    CHECK(gpt_next_logits(&packed, tok, 20, logits) == DT_OK && gpt_next_logits(&alone, tok, 20, again) == DT_OK &&
              check_rel_diff(again, logits, SHAPE.vocab_size) <= 1e-6,
          "gpt_next_logits ignores the last micro-batch's documents");
    /* a model built without documents ignores them */
    double ignored;
    gpt_set_documents(&alone, 0, seg, 1, T);
    CHECK(gpt_eval_loss(&alone, tok, tgt, 1, T, &ignored) == DT_OK, "plain model eval");
    free(logits);
    free(again);
    gpt_destroy(&packed);
    gpt_destroy(&alone);
}

int main(void) {
    SHAPE = (gpt_shape){2, 2, 32, 64, 90, .padded_vocab = 0};
    printf("GPT-2:\n");
    run();
    SHAPE = (gpt_shape){2, 4, 32, 64, 90, .family = GPT_FAMILY_LLAMA, .n_kv_head = 2, .intermediate = 48,
                        .tie = 0, .qkv_bias = 1, .rope_theta = 10000.0f, .norm_eps = 1e-5f};
    printf("Llama:\n");
    run();
    return check_finish();
}
