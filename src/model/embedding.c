/* The embeddings (first stage): token rows of wte plus positions of wpe, vocabulary-
 * parallel (each rank embeds the tokens in its rows, piece 0 adds the positions, the sum
 * completed over the tensor-parallel group); with context parallelism this rank's
 * positions come in runs (context_parallel.h). */
#include "gpt_internal.h"

/* Context parallelism: the end of the run of consecutive positions starting at t0. */
static int run_end(const int *cpos, int T, int t0) {
    int t1 = t0 + 1;
    while (t1 < T && cpos[t1] == cpos[t1 - 1] + 1) t1++;
    return t1;
}

dt_status gpt_embed_forward(gpt_model *m, gpt_slot *a, const dt_token *tokens, int B, int T, int pos0) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, N = B * T;
    const int *cpos = m->cp_comm.positions;
    HOOK(before_forward, 0);
    o->upload(a->tok, tokens, (size_t)N * sizeof(dt_token));
    int Vl = m->shape.padded_vocab / m->tp;
    float *emb = m->sp ? m->acts->proj : a->encoded, *done;
    const float *wpe = m->tp_rank == 0 ? S(m, tp(m, 1), (size_t)pos0 * C) : NULL;
    if (!cpos) {
        o->embed_fwd(emb, a->tok, tp(m, 0), wpe, B, T, C, m->tp_rank * Vl, Vl);
    } else { /* context parallelism: each run of consecutive positions of each sequence */
        for (int b = 0; b < B; b++)
            for (int t0 = 0, t1; t0 < T; t0 = t1) {
                t1 = run_end(cpos, T, t0);
                size_t r = (size_t)b * T + t0;
                o->embed_fwd(S(m, emb, r * C), a->tok + r, tp(m, 0), wpe ? S(m, wpe, (size_t)cpos[t0] * C) : NULL, 1,
                             t1 - t0, C, m->tp_rank * Vl, Vl);
            }
    }
    return gpt_tp_complete(m, emb, a->encoded, N, &done);
}

/* The embeddings' gradients (first stage) from the residual stream's gradient. */
dt_status gpt_embed_backward(gpt_model *m, gpt_slot *s) {
    int C = m->shape.n_embd, N = s->B * s->T;
    if (!m->has_head) HOOK(before_backward, 0); /* else the head asked for it */
    int Vl = m->shape.padded_vocab / m->tp;     /* dwpe on every rank: dres is replicated (or gathered) */
    float *dall;
    DT_TRY(gpt_seq_gather(m, s->dres, N, &dall));
    const int *cpos = m->cp_comm.positions;
    if (!cpos) {
        m->ops->embed_bwd(tg(m, 0), S(m, tg(m, 1), (size_t)s->pos0 * C), dall, s->tok, s->B, s->T, C, m->tp_rank * Vl,
                          Vl);
        gpt_zero_frozen(m, 0, NULL);
        gpt_zero_frozen(m, 1, NULL);
        HOOK(after_backward, 0);
        return DT_OK;
    }
    for (int b = 0; b < s->B; b++) /* context parallelism: as in the forward, run by run */
        for (int t0 = 0, t1; t0 < s->T; t0 = t1) {
            t1 = run_end(cpos, s->T, t0);
            size_t r = (size_t)b * s->T + t0;
            m->ops->embed_bwd(tg(m, 0), S(m, tg(m, 1), (size_t)cpos[t0] * C), S(m, dall, r * C), s->tok + r, 1, t1 - t0, C,
                              m->tp_rank * Vl, Vl);
        }
    gpt_zero_frozen(m, 0, NULL);
    gpt_zero_frozen(m, 1, NULL);
    HOOK(after_backward, 0);
    return DT_OK;
}
